"""Smoke test of benchmarks/fleet_replay.py: a small synthetic fleet (3 sites, 6 desks) under
every placement policy, through the real `schedule()`. Invariants only, no timings: every job
finishes, no gang is split, no site holds more than it has, cellscale keeps every desk within
its cloud budget, and the burst dollars are the sum of the per-job cloud bills."""

from __future__ import annotations

import pytest

from tests.bench import load_benchmark

fr = load_benchmark("fleet_replay")
HOUR = 3600.0
VCS = ("vc-a", "vc-b")


def synthetic(n: int = 160):
    """Waves of 1-16 GPU jobs from two VCs, more than the datacenters hold at the peaks."""
    out = []
    for i in range(n):
        gpus = (1, 2, 4, 8, 16)[fr.crc(f"g{i}") % 5]
        duration = 600.0 + fr.crc(f"d{i}") % 7200
        submit = (i // 40) * 4 * HOUR + (i % 40) * 30.0
        out.append(fr.FleetJob(VCS[i % 2], "", gpus, submit, duration))
    return out


@pytest.fixture(scope="module")
def fleet():
    cfg = fr.FleetConfig(east=64, west=32, burst=32, desks=6, budget_fraction=0.05, budget_period="day")
    raw = synthetic()
    from trace_replay import TraceJob

    trace = [TraceJob(j.vc, j.gpus, j.submit, j.duration) for j in raw]
    jobs, desks = fr.fleet_jobs(trace, fr.FleetConfig(desks=6, replicas=1, compress=1.0, east=64, west=32))
    return cfg, jobs, desks


@pytest.mark.parametrize("policy", fr.POLICIES)
def test_every_job_finishes_and_the_invariants_hold(fleet, policy):
    cfg, jobs, desks = fleet
    assert sum(len(d) for d in desks.values()) == 6
    sim = fr.make_sim([fr.replace(j) for j in jobs], desks, cfg, policy)
    sim.run()
    sim.check()
    m = sim.metrics()
    assert m["jobs"] == len(jobs) == 160
    for i, job in enumerate(jobs):
        assert sim.first_start[i] >= job.submit
        assert sim.finish[i] >= sim.first_start[i] + 0
    assert m["split_gangs"] == 0
    assert sum(m["admitted_per_site"].values()) >= len(jobs)
    # the burst identity: the dollars charged to the desks' periods are the per-job cloud bills
    assert m["burst_usd"] == pytest.approx(m["burst_usd_by_period_sum"], rel=1e-9, abs=1e-6)
    assert m["burst_usd"] == pytest.approx(sum(sim.bills), rel=1e-12)
    if policy == "sites":
        assert m["desks_over_budget"] == 0, m["over_budget_desks"]
    if policy == "slurm-M":
        assert all(c is not None for c in sim.chosen)  # sent to one cluster when first seen


def test_the_trace_is_split_into_desks_deterministically():
    from trace_replay import TraceJob

    trace = [TraceJob(j.vc, j.gpus, j.submit, j.duration) for j in synthetic(40)]
    cfg = fr.FleetConfig(desks=6, replicas=2, compress=2.0, east=64, west=32)
    a, desks = fr.fleet_jobs(trace, cfg)
    b, _ = fr.fleet_jobs(trace, cfg)
    assert [(j.desk, j.submit) for j in a] == [(j.desk, j.submit) for j in b]
    assert len(a) == 80 and a[0].submit == 0.0
    assert {j.desk for j in a} <= {d for ds in desks.values() for d in ds}
    assert max(j.submit for j in a) == pytest.approx((max(t.submit for t in trace) + 12 * HOUR) / 2)


def test_a_replay_stopped_and_resumed_decides_the_same(fleet):
    """`run(until)` then `run()` (how progress is printed, and how a saved contended state is
    replayed) makes exactly the decisions of one `run()`."""
    cfg, jobs, desks = fleet
    whole = fr.make_sim([fr.replace(j) for j in jobs], desks, cfg, "sites")
    assert whole.run() is True
    parts = fr.make_sim([fr.replace(j) for j in jobs], desks, cfg, "sites")
    steps = 0
    while not parts.run(until=parts.now + 2 * HOUR):
        steps += 1
    assert steps > 3
    assert parts.digest() == whole.digest() and len(parts.decisions) == len(whole.decisions)


def test_a_warm_up_is_replayed_but_not_measured(fleet):
    cfg, jobs, desks = fleet
    cut = jobs[len(jobs) // 2].submit
    sim = fr.make_sim([fr.replace(j) for j in jobs], desks, cfg, "skypilot", measured_from=cut)
    sim.run()
    m = sim.metrics()
    measured = [i for i, j in enumerate(jobs) if j.submit >= cut]
    assert m["jobs"] == len(measured) and m["warm_up_jobs"] == len(jobs) - len(measured)
    assert m["burst_usd"] == pytest.approx(sum(sim.bills[i] for i in measured))
    assert m["moved_tb"] == pytest.approx(sum(sim.moved_gb[i] for i in measured) / 1000)
    assert m["burst_usd_all_jobs"] == pytest.approx(sum(sim.bills))
