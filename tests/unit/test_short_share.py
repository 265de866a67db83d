"""The short-work share (`Cohort.short_work_share`): level-0 work of any desk may use idle GPUs
of its tree beyond its desk's quota, up to a fraction of the tree; such a job is not reclaimed
while it stays at level 0, and is borrowed work like any other once it passes it."""

from __future__ import annotations

import pydantic
import pytest

from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.engine import Engine
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.scheduling.service import HOUR
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.tenancy import Ordering, ResourceQuota, Tenancy

NOW = 10 * HOUR


def desks(share: float | None = None, a_limit: int = 0) -> Tenancy:
    """Desk a (8 GPUs, may borrow `a_limit`) and desk b (12) share a cohort of 20 GPUs: with
    the default share of 0.1, 2 GPUs of short work may go beyond a desk's quota."""
    cohort = {} if share is None else {"short_work_share": share}
    return Tenancy.model_validate(
        {
            "flavors": {"gpu": {"backend": "local"}},
            "cohorts": {"firm": cohort},
            "cluster_queues": {
                "a": {"cohort": "firm", "quotas": {"gpu": {"nominal": 8, "borrowing_limit": a_limit}}},
                "b": {"cohort": "firm", "quotas": {"gpu": {"nominal": 12}}},
            },
            "tenants": {d: {"queues": {"default": {"cluster_queue": d}}} for d in "ab"},
        }
    )


def job(job_id: str, cq: str, gpus: int, attained_gpu_h: float = 0.0) -> Workload:
    return Workload(job_id, cq, gpus, submitted=NOW - 60, tenant=cq, attained=attained_gpu_h * HOUR, queued_at=NOW - 60)


def holder(job_id: str, cq: str, gpus: int, ran_h: float = 0.1, short: bool = False, ckpt_ago_s: float = 60) -> Holder:
    started = NOW - ran_h * HOUR
    return Holder(job_id, cq, "gpu", gpus, 0, started, NOW - ckpt_ago_s, tenant=cq, short_share=short)


def decide(t: Tenancy, pending, holders, capacity: int = 20):
    return schedule(Snapshot(t, {"gpu": capacity}, tuple(holders), tuple(pending), {}, NOW))


SUBMIT_ORDER = desks().model_copy(update={"ordering": Ordering.submit_order()})
A_FULL = [holder("a-run", "a", 8, ran_h=5)]  # desk a at its quota (it may not borrow)


@pytest.mark.parametrize(
    "case, t, pending, holders, capacity, expect",
    [
        ("level 0 beyond its quota on idle GPUs", desks(), [job("s", "a", 1)], A_FULL, 20, ["s"]),
        ("up to the share, not beyond", desks(), [job("s1", "a", 1), job("s2", "a", 2)], A_FULL, 20, ["s1"]),
        ("larger than the share", desks(), [job("big", "a", 4)], A_FULL, 20, []),
        ("not at level 0", desks(), [job("old", "a", 1, attained_gpu_h=2)], A_FULL, 20, []),
        ("share off", desks(share=0), [job("s", "a", 1)], A_FULL, 20, []),
        ("no service levels: no level 0", SUBMIT_ORDER, [job("s", "a", 1)], A_FULL, 20, []),
        ("no idle GPUs", desks(), [job("s", "a", 1)], [*A_FULL, holder("b-run", "b", 12)], 20, []),
        ("the backend is short", desks(), [job("s", "a", 1)], A_FULL, 8, []),
        (
            "the share lends 2 already",
            desks(),
            [job("s", "a", 1)],
            [*A_FULL, holder("x", "a", 2, ran_h=0.1, short=True)],
            20,
            [],
        ),
        (
            "a holder past level 0 no longer counts",
            desks(),
            [job("s", "a", 1)],
            [*A_FULL, holder("x", "a", 2, ran_h=1.0, short=True)],
            20,
            ["s"],
        ),
    ],
)
def test_who_starts_on_the_short_work_share(case, t, pending, holders, capacity, expect):
    decision = decide(t, pending, holders, capacity)
    assert [a.job_id for a in decision.admit] == expect, case
    assert all(a.short_share for a in decision.admit), case


def test_a_job_within_its_quota_or_borrowing_normally_is_not_on_the_share():
    decision = decide(desks(a_limit=4), [job("s", "a", 1)], A_FULL)
    assert [(a.job_id, a.short_share, a.borrowed) for a in decision.admit] == [("s", False, 1)]


def test_a_lender_does_not_reclaim_a_job_on_the_share_while_it_is_at_level_0():
    holders = [*A_FULL, holder("short", "a", 2, ran_h=0.1, short=True), holder("b-run", "b", 8)]
    decision = decide(desks(), [job("lender", "b", 4)], holders)
    assert decision.admit == [] and decision.preempt == []
    reason = decision.pending["lender"]
    assert reason.ahead[0].job_id == "short"  # 2 GPUs x 0.1 h received: 0.8 GPU-hours left at 2 GPUs
    assert reason.ahead[0].why == "on the short-work share, reclaimable in 24 min"
    assert "job short (a) holds 2 GPUs on the short-work share, reclaimable in 24 min" in reason.message


def test_past_level_0_it_is_borrowed_work_the_lender_reclaims():
    holders = [*A_FULL, holder("short", "a", 2, ran_h=0.6, short=True), holder("b-run", "b", 8)]
    decision = decide(desks(), [job("lender", "b", 4)], holders)
    assert [p.job_id for p in decision.preempt] == ["short"]
    assert decision.preempt[0].reason.startswith("reclaimed by b")


def test_the_engine_keeps_what_the_share_lends_and_decides_as_the_oracle():
    t = desks()
    engine = Engine(t, backfill_depth=None)
    engine.add_many([job("s1", "a", 1), job("s2", "a", 1), job("s3", "a", 1)])
    for h in A_FULL:
        engine.hold(h)
    first = engine.cycle(NOW, {"gpu": 20})
    assert [(a.job_id, a.short_share) for a in first.admit] == [("s1", True), ("s2", True)]
    for a in first.admit:
        engine.remove(a.job_id)
        engine.hold(Holder(a.job_id, "a", "gpu", 1, 0, NOW, tenant="a", short_share=True))
    assert engine.cycle(NOW + 60, {"gpu": 20}).admit == []  # the share lends its 2 GPUs
    engine.release("s1", NOW + 120)
    assert [a.job_id for a in engine.cycle(NOW + 120, {"gpu": 20}).admit] == ["s3"]


def test_the_share_is_set_on_a_tree_root_only():
    with pytest.raises(pydantic.ValidationError, match="set short_work_share on its tree's root 'firm'"):
        Tenancy.model_validate(
            {"cohorts": {"firm": {}, "div": {"parent": "firm", "short_work_share": 0.2}}, "flavors": {}}
        )


# -- freeing GPUs for the share: borrowed work past level 0 ------------------------------------
A_STALE = holder("a-run", "a", 8, ran_h=5, ckpt_ago_s=3600)  # its last checkpoint is old: no victim for service
B_OWN = holder("b-own", "b", 12, ran_h=5)
B_LOAN = holder("b-loan", "b", 2, ran_h=2)  # beyond b's nominal 12, past level 0 (4 GPU-hours)


def test_a_short_job_frees_its_gpus_from_work_another_desk_runs_beyond_its_quota():
    decision = decide(desks(), [job("s", "a", 2)], [A_STALE, B_OWN, B_LOAN], capacity=22)  # nothing idle
    assert decision.admit == []
    assert [p.job_id for p in decision.preempt] == ["b-loan"]
    assert decision.preempt[0].reason.startswith(
        "preempted for short job s of queue a (under 1 GPU-hours received), on the short-work share of its cohort: "
        "b was borrowing these gpu GPUs beyond its nominal quota"
    )
    assert decision.pending["s"].code.value == "Preempting"


@pytest.mark.parametrize(
    "case, holders, capacity",
    [
        ("the borrowed job is itself at level 0", [A_STALE, B_OWN, holder("b-loan", "b", 2, ran_h=0.2)], 22),
        ("the other desk is within its quota", [A_STALE, B_OWN], 20),
        (
            "the borrowed job has a higher priority",
            [A_STALE, B_OWN, Holder("b-loan", "b", "gpu", 2, 100, NOW - 2 * HOUR, NOW - 60, tenant="b")],
            22,
        ),
    ],
)
def test_what_the_share_does_not_take(case, holders, capacity):
    decision = decide(desks(), [job("s", "a", 2)], holders, capacity)
    assert decision.preempt == [] and decision.admit == [], case


def test_the_share_room_is_held_within_a_cycle_for_the_job_it_frees_gpus_for():
    holders = [A_STALE, B_OWN, B_LOAN, holder("b-loan2", "b", 2, ran_h=3)]
    decision = decide(desks(), [job("s1", "a", 2), job("s2", "a", 2)], holders, capacity=24)
    assert [p.for_job for p in decision.preempt] == ["s1"]  # the share's 2 GPUs are s1's: s2 takes none
    assert decision.pending["s2"].code.value != "Preempting"


def test_a_job_already_leaving_is_promised_rather_than_a_new_victim():
    leaving = Holder("b-loan", "b", "gpu", 2, 0, NOW - 2 * HOUR, NOW - 60, preempting=True, tenant="b")
    decision = decide(desks(), [job("s", "a", 2)], [A_STALE, B_OWN, leaving], capacity=22)
    assert decision.preempt == []
    assert decision.pending["s"].code.value == "Preempting"


def test_the_share_lends_gpus_only_a_short_jobs_cores_stay_within_its_desks_quota():
    t = desks().model_copy(deep=True)
    t.cluster_queues["a"].quotas["gpu"].cpu = ResourceQuota(nominal=8, borrowing_limit=0)
    cores = [
        Workload("s1", "a", 1, submitted=NOW - 60, tenant="a", cpus=6),
        Workload("s2", "a", 1, submitted=NOW - 50, tenant="a", cpus=6),  # 12 cores: over desk a's 8
    ]
    decision = schedule(Snapshot(t, {"gpu": Amounts(20, 64, 0)}, tuple(A_FULL), tuple(cores), {}, NOW))
    assert [(a.job_id, a.short_share) for a in decision.admit] == [("s1", True)]
    assert "s2" in decision.pending


@pytest.mark.parametrize(
    "case, waited_min, head_gpus, expect",
    [
        ("a young head", 5, 4, ["s"]),
        ("a head that reserved but fits beside a full share", 60, 4, ["s"]),
        ("a head that reserved and needs all but the share", 60, 15, []),
    ],
)
def test_the_share_leaves_idle_gpus_to_a_head_that_reserved_and_needs_them(case, waited_min, head_gpus, expect):
    """Desk b's head (within its quota, 2 GPUs idle of 16) claims the flavor: a short job of desk
    a may take an idle GPU unless the head reserved (30 min) and could not start while the
    share (2 GPUs) lends all it may."""
    head = Workload(
        "head", "b", head_gpus, submitted=NOW - waited_min * 60, tenant="b", queued_at=NOW - waited_min * 60
    )
    holders = [A_STALE, holder("b-run", "b", 6, ran_h=5, ckpt_ago_s=3600)]
    decision = decide(desks(), [head, job("s", "a", 1)], holders, capacity=16)
    assert [a.job_id for a in decision.admit] == expect, case
