"""The pure parts of benchmarks/slurm_vs_cellscale.py: fitting a Philly slice onto the dev
cluster's 32 GPUs (desks, shapes, one time factor, clamped durations, time limits) and the
metrics (JCT, queueing, utilization, the fair-share gap). No Slurm, no control plane."""

from __future__ import annotations

import math

import pytest

from tests.bench import load_benchmark

svc = load_benchmark("slurm_vs_cellscale")
TraceJob = svc.TraceJob
Outcome = svc.Outcome


def test_gpus_fit_the_dev_partition_as_whole_nodes_above_eight():
    assert [svc.fit_gpus(g) for g in (1, 2, 4, 8)] == [(1, 1), (1, 2), (1, 4), (1, 8)]
    assert [svc.fit_gpus(g) for g in (12, 16, 24, 32, 64, 128)] == [(2, 8), (2, 8), (3, 8), (4, 8), (4, 8), (4, 8)]


def test_time_limits_overestimate_and_round_up_to_minutes():
    assert [svc.time_limit_min(d) for d in (15, 24, 24.1, 48, 59.2, 72)] == [1, 1, 2, 2, 3, 3]
    assert svc.time_limit_min(15, factor=4) == 1 and svc.time_limit_min(16, factor=4) == 2


def test_every_vc_lands_on_one_desk_and_one_of_its_users():
    for vc in ("6214e9", "11cb48", "103959", "ee9e8c", "7f04ca"):
        desk, user = svc.desk_of(vc), svc.user_of(vc)
        assert user in svc.DESK_USERS[desk]
        assert (svc.desk_of(vc), svc.user_of(vc)) == (desk, user)  # stable
    assert svc.desk_of("11cb48") == "desk-a" and svc.desk_of("6214e9") == "desk-b"


def test_one_factor_compresses_submits_and_durations_within_the_bounds():
    jobs = [
        TraceJob("11cb48", 1, 1000.0, 10.0),  # far below the floor once compressed
        TraceJob("6214e9", 16, 1600.0, 3000.0),
        TraceJob("6214e9", 2, 2200.0, 100000.0),  # far above the cap
        TraceJob("11cb48", 4, 4600.0, 2400.0),
    ]
    out, info = svc.scale_slice(jobs, arrival_s=60, budget_s=1000)
    k = 3600 / 60
    assert info["factor"] == pytest.approx(k)
    assert [j.submit for j in out] == [0.0, 10.0, 20.0, 60.0]
    assert info["cap_s"] == 30.0  # half the arrival window: the budget does not bind
    assert [j.duration for j in out] == [15.0, 30.0, 30.0, 30.0]
    assert [(j.nodes, j.gpus_per_node, j.cpus_per_node) for j in out] == [(1, 1, 4), (2, 8, 32), (1, 2, 8), (1, 4, 16)]
    assert [j.limit_min for j in out] == [1, 2, 2, 2]
    assert info["raised_to_floor"] == 1 and info["cut_to_cap"] == 3
    assert info["gpu_s"] == 1 * 15 + 16 * 30 + 2 * 30 + 4 * 30
    assert {j.desk for j in out} == {"desk-a", "desk-b"}


def test_the_cap_comes_down_until_the_work_fits_the_budget():
    jobs = [TraceJob("6214e9", 8, float(i), 1e6) for i in range(10)]  # ten 8-GPU jobs, all capped
    out, info = svc.scale_slice(jobs, arrival_s=40, budget_s=40, capacity=32, floor=1.0)
    assert sum(j.gpus * j.duration for j in out) <= 32 * 40 + 1e-6
    assert info["cap_s"] == pytest.approx(16.0, abs=0.1)  # 10 x 8 GPUs x 16 s = 32 x 40
    out, info = svc.scale_slice(jobs, arrival_s=40, budget_s=1, capacity=32, floor=2.0)
    assert info["cap_s"] == 2.0 and {j.duration for j in out} == {2.0}  # never below the floor


def test_metrics_of_a_known_schedule():
    # capacity 4: desk-a's 4-GPU job runs at once although desk-b waits for its fair 2 GPUs
    a = Outcome("desk-a", 4, 10.0, submit=0.0, runs=[(0.0, 10.0)], end=10.0)
    b = Outcome("desk-b", 2, 10.0, submit=0.0, runs=[(10.0, 20.0)], end=20.0)
    m = svc.summarize([a, b], capacity=4, window=10.0)
    assert (m["jct_mean_s"], m["wait_mean_s"], m["makespan_s"]) == (15.0, 5.0, 20.0)
    assert m["utilization"] == m["useful_utilization"] == pytest.approx(60 / 80)
    assert m["utilization_while_waiting"] == 1.0 and m["time_with_jobs_waiting_s"] == 10.0
    fair = m["fair"]
    assert fair["contended_s"] == 10.0  # [0, 10): demand 6 of 4; after it only desk-b's 2
    assert fair["received_over_entitled"] == {"desk-a": 2.0, "desk-b": 0.0}
    assert fair["gap_instant"] == fair["gap_window_mean"] == 0.5
    assert fair["windows_contended"] == 1
    assert m["per_desk"]["desk-b"]["wait_mean_s"] == 10.0 and m["per_desk"]["desk-a"]["gpu_s_held"] == 40.0


def test_a_fair_schedule_has_no_gap():
    a = Outcome("desk-a", 2, 10.0, submit=0.0, runs=[(0.0, 10.0)], end=10.0)
    b = Outcome("desk-b", 2, 10.0, submit=0.0, runs=[(0.0, 10.0)], end=10.0)
    c = Outcome("desk-a", 2, 10.0, submit=0.0, runs=[(10.0, 20.0)], end=20.0)
    m = svc.summarize([a, b, c], capacity=4, window=10.0)
    assert m["fair"]["gap_instant"] == 0.0 and m["fair"]["received_over_entitled"] == {"desk-a": 1.0, "desk-b": 1.0}


def test_sacct_rounding_and_unfinished_jobs():
    early = Outcome("desk-a", 1, 15.0, submit=100.4, runs=[(100.0, 115.0)], end=115.0)  # whole-second Start
    lost = Outcome("desk-b", 1, 15.0, submit=101.0, runs=[], end=None)
    m = svc.summarize([early, lost], capacity=32)
    assert m["jobs"] == 2 and m["finished"] == 1
    assert m["wait_mean_s"] == 0.0 and m["jct_mean_s"] == pytest.approx(14.6)
    assert math.isnan(m["fair"]["gap_instant"])  # never contended


@pytest.mark.skipif(not svc.TRACE.exists(), reason=f"no trace at {svc.TRACE}")
def test_the_quick_slice_is_contended_by_both_desks():
    trace = svc.slice_jobs(svc.load_trace(), skip_days=svc.DEFAULT_SKIP_DAYS, limit=svc.QUICK["jobs"])
    jobs, info = svc.scale_slice(trace, svc.QUICK["arrival_s"], svc.QUICK["budget_s"])
    assert len(jobs) == 60 and jobs[0].submit == 0.0 and jobs[-1].submit == svc.QUICK["arrival_s"]
    assert info["offered_load"] > 1 and min(info["offered_load_per_desk"].values()) > 0.5
    assert all(svc.MIN_DURATION_S <= j.duration <= info["cap_s"] for j in jobs)
    assert sum(j.gpus * j.duration for j in jobs) <= svc.CAPACITY * svc.QUICK["budget_s"] + 1e-6
    assert all(j.gpus <= svc.CAPACITY and j.user in svc.DESK_USERS[j.desk] for j in jobs)


def test_reservations_run_from_each_admission_to_the_end_the_controller_saw():
    events = [
        (0.0, "PENDING"),
        (5.0, "ADMITTED"),
        (6.0, "STARTING"),
        (8.0, "RUNNING"),
        (20.0, "PENDING"),  # preempted, requeued
        (30.0, "ADMITTED"),
        (31.0, "STARTING"),
        (33.0, "RUNNING"),
        (50.0, "SUCCEEDED"),
    ]
    assert svc.reservations(events) == [(5.0, 20.0), (30.0, 50.0)]
    assert svc.reservations([(0.0, "PENDING"), (1.0, "CANCELLED")]) == []
