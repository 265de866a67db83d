"""Smoke test of benchmarks/trace_replay.py's simulator: a 200-job contiguous slice of the
Philly trace (times rebased to 0) on a small fleet, under both policies, through the real
`schedule()`. It checks that the replay finishes every job; it asserts no timings."""

from __future__ import annotations

import pytest

from tests.bench import load_benchmark

tr = load_benchmark("trace_replay")
pytestmark = pytest.mark.skipif(not tr.TRACE.exists(), reason=f"no trace at {tr.TRACE}")
FLEET = 48


@pytest.fixture(scope="module")
def jobs():
    jobs, _ = tr.cap_jobs(tr.slice_jobs(tr.load_trace(), skip_days=40, limit=200), FLEET)
    return jobs


@pytest.mark.parametrize("policy", ["cellscale", "fifo"])
def test_every_job_of_a_slice_finishes(jobs, policy):
    assert len(jobs) == 200 and jobs[0].submit == 0.0
    nominal = tr.nominal_quotas(jobs, FLEET)
    assert sum(nominal.values()) == FLEET
    tenants = sorted(nominal)
    sim = tr.Sim(jobs, tr.policies(nominal, FLEET)[policy], FLEET, tenants, tuple(float(nominal[t]) for t in tenants))
    sim.run()
    for i, job in enumerate(jobs):
        assert sim.finish[i] is not None, f"job {i} never finished"
        assert sim.finish[i] - job.submit > 0
        assert sim.first_start[i] >= job.submit
        assert sim.remaining[i] == 0.0
    metrics = sim.metrics()
    assert metrics["jobs"] == 200 and metrics["jct_mean_h"] > 0
    assert 0 < metrics["utilization"] <= 1
    if policy == "fifo":
        assert metrics["preemptions"] == 0
    assert not any(sim.held_t) and not any(sim.pending_t)


def test_max_min_share_fills_the_fleet_by_weight():
    assert tr.max_min_share((10, 10), (1.0, 3.0), 8) == (2.0, 6.0)
    assert tr.max_min_share((1, 10, 0), (1.0, 1.0, 1.0), 8) == (1.0, 7.0, 0.0)
    assert tr.max_min_share((1, 2), (1.0, 1.0), 8) == (1.0, 2.0)
