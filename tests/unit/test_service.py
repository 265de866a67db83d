"""Least attained service inside a queue (`scheduling.service` and its use in `schedule()`):
levels, aging, the victims a waiting job may take for service, and the reasons."""

from __future__ import annotations

import dataclasses

import pytest

from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.tenancy import Ordering, ResourceWeights, Tenancy

HOUR = 3600.0
ORDERING = Ordering(service_levels_gpu_hours=[1.0, 10.0], preempt_levels_apart=1)


def desk(gpus: int = 8, ordering: Ordering = ORDERING) -> Tenancy:
    return Tenancy.single("a", {"gpu": gpus}).model_copy(update={"ordering": ordering})


def service(now: float = 0.0, ordering: Ordering = ORDERING) -> Service:
    return Service(ordering, ResourceWeights(), now)


def job(job_id: str, gpus: int = 1, at: float = 0.0, attained_h: float = 0.0, queued_at=None) -> Workload:
    return Workload(job_id, "a", gpus, 0, at, None, "a", attained=attained_h * HOUR, queued_at=queued_at)


def holder(job_id, gpus=4, started=0.0, ckpt=None, attained_h=0.0, preemptions=0, preempting=False) -> Holder:
    return Holder(
        job_id,
        "a",
        "gpu",
        gpus,
        0,
        started,
        ckpt,
        None,
        preempting,
        "a",
        attained=attained_h * HOUR,
        preemptions=preemptions,
    )


@pytest.mark.parametrize("attained_h, level", [(0.0, 0), (0.99, 0), (1.0, 1), (9.9, 1), (10.0, 2), (500.0, 2)], ids=str)
def test_level_counts_the_thresholds_passed(attained_h, level):
    assert service().level(attained_h * HOUR) == level


def test_a_holder_counts_its_running_attempt_weighted():
    s = service(now=1800.0)
    assert s.received(holder("h", gpus=4, started=0.0, attained_h=1.0)) == HOUR + 4 * 1800
    assert s.of_holder(holder("h", gpus=4, started=0.0, attained_h=1.0)) == 1  # 3 GPU-hours


def test_a_job_that_waited_long_enough_goes_back_to_level_0():
    s = service(now=9 * HOUR)
    assert s.of_job(job("j", attained_h=50.0, queued_at=2 * HOUR)) == 2  # waited 7 h
    assert s.of_job(job("j", attained_h=50.0, queued_at=0.5 * HOUR)) == 0  # waited 8.5 h


@pytest.mark.parametrize(
    "case, h, ok",
    [
        ("higher level, fresh checkpoint", holder("h", started=0, ckpt=5 * HOUR - 60, attained_h=20), True),
        ("no checkpoint in this attempt", holder("h", started=HOUR, ckpt=HOUR - 60, attained_h=20), False),
        ("never checkpointed", holder("h", started=0, attained_h=20), False),
        ("checkpoint too old", holder("h", started=0, ckpt=5 * HOUR - 3600, attained_h=20), False),
        ("same level", holder("h", gpus=1, started=4.5 * HOUR, ckpt=5 * HOUR - 60), False),
        ("preempted enough already", holder("h", ckpt=5 * HOUR - 60, attained_h=20, preemptions=2), False),
        ("already leaving", holder("h", ckpt=5 * HOUR - 60, attained_h=20, preempting=True), False),
    ],
)
def test_who_may_be_preempted_for_service(case, h, ok):
    assert service(now=5 * HOUR).victim_for(h, 0) is ok, case


def test_levels_apart_spares_jobs_only_one_level_up():
    s = service(now=5 * HOUR, ordering=ORDERING.model_copy(update={"preempt_levels_apart": 2}))
    assert not s.victim_for(holder("h", gpus=1, started=0, ckpt=5 * HOUR - 60), 0)  # 5 GPU-h: level 1
    assert s.victim_for(holder("h", gpus=4, started=0, ckpt=5 * HOUR - 60), 0)  # 20 GPU-h: level 2


def test_a_queue_is_ordered_by_service_then_submit_time():
    pending = [job("trained", at=0.0, attained_h=20.0), job("fresh", at=5.0), job("some", at=1.0, attained_h=2.0)]
    decision = schedule(Snapshot(desk(1), {"gpu": 1}, (), tuple(pending), {}, 100.0))
    assert [a.job_id for a in decision.admit] == ["fresh"]
    assert decision.pending["some"].position == 1 and decision.pending["trained"].position == 2
    assert "1 waiting job goes before it (1 with less service received)" in decision.pending["trained"].message


def test_a_short_cell_preempts_its_desks_long_training_that_just_checkpointed():
    now = 5 * HOUR
    holders = (
        holder("train", gpus=8, started=0.0, ckpt=now - 120, attained_h=0.0),  # 40 GPU-hours: level 2
        holder("stale", gpus=8, started=0.0, ckpt=now - 3 * HOUR, attained_h=0.0),
    )
    decision = schedule(Snapshot(desk(16), {"gpu": 16}, holders, (job("cell", gpus=2, at=now - 60),), {}, now))
    assert [p.job_id for p in decision.preempt] == ["train"]
    assert "which has received less service (0.0 vs 40.0 GPU-hours" in decision.preempt[0].reason
    assert "checkpointed 2 min ago" in decision.preempt[0].reason
    assert decision.pending["cell"].code == "Preempting"


def test_submit_order_never_preempts_for_service():
    now = 5 * HOUR
    holders = (holder("train", gpus=8, started=0.0, ckpt=now - 120),)
    t = desk(8, Ordering.submit_order())
    decision = schedule(Snapshot(t, {"gpu": 8}, holders, (job("cell", gpus=2, at=now - 60),), {}, now))
    assert decision.preempt == [] and decision.pending["cell"].code != "Preempting"


def test_ordering_refuses_thresholds_that_do_not_increase():
    with pytest.raises(ValueError, match="positive and increasing"):
        Ordering(service_levels_gpu_hours=[5.0, 1.0])


def test_idle_gpus_are_lent_to_the_least_served_work_first_whatever_the_fair_share():
    """Both desks would borrow desk c's idle GPUs; b has used far less (fair share would pick
    it) but a's job is fresh and b's has had 20 GPU-hours: a's goes first. Within nominal
    quota nothing changes: that order is fair share's."""
    t = Tenancy.model_validate(
        {
            "flavors": {"gpu": {"backend": "local"}},
            "cohorts": {"firm": {}},
            "cluster_queues": {q: {"cohort": "firm", "quotas": {"gpu": {"nominal": 2}}} for q in ("a", "b", "c")},
            "tenants": {q: {"queues": {"default": {"cluster_queue": q}}} for q in ("a", "b", "c")},
            "ordering": ORDERING.model_dump(),
        }
    )
    holders = (Holder("a-run", "a", "gpu", 2, 0, 0.0), Holder("b-run", "b", "gpu", 2, 0, 0.0))
    pending = (
        Workload("a-fresh", "a", 2, 0, 10.0, None, "a"),
        Workload("b-trained", "b", 2, 0, 5.0, None, "b", attained=20 * HOUR),
    )
    decision = schedule(Snapshot(t, {"gpu": 6}, holders, pending, {"a": 50.0, "b": 0.0}, 100.0))
    assert [a.job_id for a in decision.admit] == ["a-fresh"]


def three_desks(ordering: Ordering = ORDERING) -> Tenancy:
    return Tenancy.model_validate(
        {
            "flavors": {"gpu": {"backend": "local"}},
            "cohorts": {"firm": {}},
            "cluster_queues": {q: {"cohort": "firm", "quotas": {"gpu": {"nominal": 4}}} for q in ("a", "b", "c")},
            "tenants": {q: {"queues": {"default": {"cluster_queue": q}}} for q in ("a", "b", "c")},
            "ordering": ordering.model_dump(),
        }
    )


def test_a_loan_to_well_served_work_goes_to_less_served_work_of_another_desk():
    """a borrows c's idle GPUs for a training that has had 20 GPU-hours; b, at its own quota,
    has a fresh job that would borrow: it takes the loan (borrowing within the cohort by
    service, as Kueue's borrowWithinCohort does by priority). b's own job within its quota is
    never a victim, nor is a loan that has not checkpointed lately."""
    now = 5 * HOUR
    holders = (
        Holder("a-own", "a", "gpu", 4, 0, 0.0, now - 60, None, False, "a"),
        Holder("a-loan", "a", "gpu", 4, 0, 0.0, now - 60, None, False, "a", attained=20 * HOUR),
        Holder("b-own", "b", "gpu", 4, 0, now - 600, now - 60, None, False, "b"),
    )
    pending = (Workload("b-fresh", "b", 2, 0, now - 30, None, "b"),)
    decision = schedule(Snapshot(three_desks(), {"gpu": 12}, holders, pending, {}, now))
    assert decision.admit == [] and [p.job_id for p in decision.preempt] == ["a-loan"]
    assert "of queue b (borrowing gpu GPUs), which has received less service" in decision.preempt[0].reason
    stale = tuple(dataclasses.replace(h, last_checkpoint=now - 3 * HOUR) for h in holders)
    decision = schedule(Snapshot(three_desks(), {"gpu": 12}, stale, pending, {}, now))
    assert decision.preempt == []
