"""Admission rules, table by table: quota, borrowing and lending, order, strictness,
preemption and the reasons a job waits."""

from __future__ import annotations

import pytest

from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.tenancy import Ordering, Tenancy


def tenancy(queues: dict[str, dict], cohorts: dict | None = None, flavors=("gpu",)) -> Tenancy:
    """queues: name -> {"cohort": ..., "weight": ..., "gpu": nominal or {quota fields}}"""
    cqs = {}
    for name, q in queues.items():
        quotas = {f: (q[f] if isinstance(q[f], dict) else {"nominal": q[f]}) for f in flavors if f in q}
        cqs[name] = {"cohort": q.get("cohort"), "weight": q.get("weight", 1.0), "quotas": quotas}
    return Tenancy.model_validate(
        {
            "flavors": {f: {"backend": "local"} for f in flavors},
            "cohorts": cohorts or {},
            "cluster_queues": cqs,
            "tenants": {name: {"queues": {"default": {"cluster_queue": name}}} for name in queues},
        }
    )


def pend(job_id, cq, gpus, priority=0, at=0.0, flavors=None):
    return Workload(job_id, cq, gpus, priority, at, flavors)


def hold(job_id, cq, gpus, flavor="gpu", priority=0, started=0.0, ckpt=None, ends_by=None, preempting=False):
    return Holder(job_id, cq, flavor, gpus, priority, started, ckpt, ends_by, preempting)


TWO_DESKS = tenancy({"a": {"cohort": "firm", "gpu": 4}, "b": {"cohort": "firm", "gpu": 4}}, {"firm": {}})


def run(t, pending=(), holders=(), capacity=None, history=None, now=100.0):
    cap = capacity or {
        f: sum(q.quotas[f].nominal for q in t.cluster_queues.values() if f in q.quotas) for f in t.flavors
    }
    return schedule(Snapshot(t, cap, tuple(holders), tuple(pending), history or {}, now))


def admitted(decision):
    return [a.job_id for a in decision.admit]


# -- quota, borrowing, lending --------------------------------------------------------------
@pytest.mark.parametrize(
    "case, t, pending, holders, expect",
    [
        ("fits in nominal", TWO_DESKS, [pend("j", "a", 4)], [], ["j"]),
        ("all or nothing: 3 needed, 2 free", TWO_DESKS, [pend("j", "a", 3)], [hold("x", "b", 6)], []),
        ("borrows idle GPUs of the cohort", TWO_DESKS, [pend("j", "a", 7)], [], ["j"]),
        (
            "no cohort, no borrowing",
            tenancy({"a": {"gpu": 4}, "b": {"gpu": 4}}),
            [pend("j", "a", 4), pend("k", "a", 1, at=1)],
            [],
            ["j"],
        ),
        (
            "borrowing limit caps borrowing",
            tenancy(
                {"a": {"cohort": "f", "gpu": {"nominal": 4, "borrowing_limit": 1}}, "b": {"cohort": "f", "gpu": 4}},
                {"f": {}},
            ),
            [pend("j", "a", 4), pend("k", "a", 2, at=1)],
            [],
            ["j"],
        ),
        (
            "lending limit keeps part private",
            tenancy(
                {"a": {"cohort": "f", "gpu": 4}, "b": {"cohort": "f", "gpu": {"nominal": 4, "lending_limit": 1}}},
                {"f": {}},
            ),
            [pend("j", "a", 4), pend("k", "a", 2, at=1)],
            [],
            ["j"],
        ),
        (
            "the lender still uses its private part",
            tenancy(
                {"a": {"cohort": "f", "gpu": 4}, "b": {"cohort": "f", "gpu": {"nominal": 4, "lending_limit": 1}}},
                {"f": {}},
            ),
            [pend("k", "b", 3)],
            [hold("x", "a", 5)],
            ["k"],
        ),
        ("physical capacity caps quota", TWO_DESKS, [pend("j", "a", 4)], [hold("x", "b", 2)], []),
    ],
)
def test_quota(case, t, pending, holders, expect):
    capacity = {"gpu": 5} if case == "physical capacity caps quota" else None
    assert admitted(run(t, pending, holders, capacity)) == expect, case


def test_borrowed_amount_is_reported():
    assert [(a.job_id, a.borrowed) for a in run(TWO_DESKS, [pend("j", "a", 6)]).admit] == [("j", 2)]


def test_flavor_order_prefers_a_flavor_within_nominal_over_borrowing():
    t = tenancy(
        {"a": {"cohort": "f", "h100": 2, "a100": 4}, "b": {"cohort": "f", "h100": 4, "a100": 4}},
        {"f": {}},
        flavors=("h100", "a100"),
    )
    decision = run(t, [pend("j", "a", 3)])
    assert [(a.job_id, a.flavor, a.borrowed) for a in decision.admit] == [("j", "a100", 0)]


def test_job_restricted_to_one_flavor_uses_only_it():
    t = tenancy({"a": {"h100": 2, "a100": 4}}, flavors=("h100", "a100"))
    assert admitted(run(t, [pend("j", "a", 3, flavors=("h100",))])) == []
    assert run(t, [pend("j", "a", 3, flavors=("h100",))]).pending["j"].code == "NeverFits"


# -- order ------------------------------------------------------------------------------------
def test_priority_before_submit_time():
    decision = run(TWO_DESKS, [pend("early", "a", 8, at=1), pend("urgent", "a", 8, priority=100, at=2)])
    assert admitted(decision) == ["urgent"]


def test_fair_share_remembers_recent_use():
    pending = [pend("a1", "a", 8, at=1), pend("b1", "b", 8, at=2)]
    assert admitted(run(TWO_DESKS, pending)) == ["a1"]  # no history: submit time decides
    assert admitted(run(TWO_DESKS, pending, history={"a": 6.0, "b": 1.0})) == ["b1"]


def test_fair_share_counts_what_a_queue_holds_now():
    t = tenancy(
        {"a": {"cohort": "f", "gpu": 4}, "b": {"cohort": "f", "gpu": 4}, "c": {"cohort": "f", "gpu": 0}}, {"f": {}}
    )
    decision = run(t, [pend("a2", "a", 2, at=1), pend("c1", "c", 2, at=2)], [hold("a1", "a", 5)], capacity={"gpu": 8})
    assert admitted(decision) == ["c1"]


def test_fair_share_weights():
    t = tenancy({"a": {"cohort": "f", "gpu": 4, "weight": 3}, "b": {"cohort": "f", "gpu": 4, "weight": 1}}, {"f": {}})
    pending = [pend("b1", "b", 8, at=1), pend("a1", "a", 8, at=2)]
    assert admitted(run(t, pending, history={"a": 2.0, "b": 1.0})) == ["a1"]  # 2/0.75 < 1/0.25


def test_fair_share_is_hierarchical():
    """Division x has two desks that each used a little; division y's one desk used more
    than either, but less than x in total: y goes first."""
    t = tenancy(
        {"x1": {"cohort": "x", "gpu": 2}, "x2": {"cohort": "x", "gpu": 2}, "y1": {"cohort": "y", "gpu": 4}},
        {"firm": {}, "x": {"parent": "firm"}, "y": {"parent": "firm"}},
    )
    pending = [pend("x", "x1", 8, at=1), pend("y", "y1", 8, at=2)]
    assert admitted(run(t, pending, history={"x1": 2.0, "x2": 2.0, "y1": 3.0})) == ["y"]


def test_order_updates_as_jobs_are_admitted():
    pending = [pend(f"a{i}", "a", 2, at=i) for i in range(4)] + [pend(f"b{i}", "b", 2, at=10 + i) for i in range(4)]
    assert sorted(admitted(run(TWO_DESKS, pending, capacity={"gpu": 8}))) == ["a0", "a1", "b0", "b1"]


# -- strictness, backfill and reservation ------------------------------------------------------
STRICT = TWO_DESKS.model_copy(update={"ordering": Ordering.submit_order()})


def test_in_submit_order_a_blocked_head_blocks_its_queue_and_borrowing_by_others():
    decision = run(
        STRICT,
        [
            pend("big", "a", 6, at=1),
            pend("small", "a", 1, at=2),
            pend("b-own", "b", 2, at=3),
            pend("b-borrow", "b", 3, at=4),
        ],
        [hold("x", "b", 3)],
    )
    assert admitted(decision) == []  # b-own would not borrow, but b's head (b-own,2)+3 held = 5 > 4
    decision = run(
        STRICT,
        [
            pend("big", "a", 6, at=1),
            pend("small", "a", 1, at=2),
            pend("b-own", "b", 1, at=3),
            pend("b-borrow", "b", 2, at=4),
        ],
        [hold("x", "b", 3)],
    )
    assert admitted(decision) == ["b-own"]
    assert decision.pending["small"].code == "Queued" and decision.pending["small"].position == 2
    assert decision.pending["small"].ahead[0].job_id == "big"


def test_a_young_head_lets_smaller_jobs_of_its_queue_start_but_keeps_its_claim_on_borrowing():
    pending = [pend("big", "a", 6, at=90), pend("small", "a", 1, at=91), pend("b-borrow", "b", 2, at=92)]
    decision = run(TWO_DESKS, pending, [hold("x", "b", 3)], now=100.0)
    assert admitted(decision) == ["small"]  # within a's quota; b may not borrow what big waits for
    assert "smaller jobs behind it may start first until it has waited 30 min" in decision.pending["big"].message
    assert decision.pending["b-borrow"].code == "HeldForAhead"


def test_a_head_that_waited_reserves_and_only_jobs_ending_before_its_start_backfill():
    holders = [hold("x", "a", 4, ends_by=100.0 + 1200)]
    pending = [
        pend("big", "a", 6, at=0.0),
        Workload("short", "a", 1, 0, 10.0, time_limit_s=600),
        Workload("long", "a", 1, 0, 20.0, time_limit_s=7200),
        pend("blind", "a", 1, at=30.0),
    ]
    decision = run(TWO_DESKS, pending, holders, now=3600.0)
    assert admitted(decision) == []  # x ends at 1300 s: big's estimated start is now
    holders = [hold("x", "a", 4, ends_by=3600.0 + 1200)]
    decision = run(TWO_DESKS, pending, holders, now=3600.0)
    assert admitted(decision) == ["short"]  # ends within 10 min, before big starts (~20 min)
    big, long = decision.pending["big"], decision.pending["long"]
    assert "reserved (it waited 60 min)" in big.message and "~20 min" in big.message
    assert long.code == "Queued" and long.position == 2 and long.ahead[0].job_id == "big"
    assert "big (6 GPUs) waited 60 min and has reserved gpu" in long.message
    assert decision.pending["blind"].position == 3


# -- preemption -------------------------------------------------------------------------------
def test_reclaim_takes_back_lent_gpus_losing_least_work():
    holders = [
        hold("old-ckpt", "a", 2, started=0, ckpt=10),
        hold("new-ckpt", "a", 2, started=0, ckpt=95),
        hold("a-own", "a", 4, started=0),
    ]
    decision = run(TWO_DESKS, [pend("b1", "b", 2)], holders)
    assert admitted(decision) == []
    assert [p.job_id for p in decision.preempt] == ["new-ckpt"]
    assert decision.preempt[0].reason.startswith("reclaimed by b: a was borrowing 2 gpu GPU(s) (this job held 2)")
    assert decision.pending["b1"].code == "Preempting"


def test_reclaim_prefers_fewer_gpus_and_takes_the_fewest_victims():
    holders = [hold("a4", "a", 4, started=90), hold("a2", "a", 2, started=90), hold("a1", "a", 2, started=90)]
    decision = run(TWO_DESKS, [pend("b1", "b", 4)], holders)
    assert sorted(p.job_id for p in decision.preempt) == ["a1", "a2"]


def test_no_reclaim_for_a_job_that_would_itself_borrow():
    decision = run(TWO_DESKS, [pend("b1", "b", 6)], [hold("a1", "a", 6)])
    assert decision.preempt == [] and decision.pending["b1"].code == "PoolLent"


def test_lender_within_its_quota_is_never_a_victim():
    decision = run(TWO_DESKS, [pend("b1", "b", 4)], [hold("a1", "a", 4), hold("b0", "b", 2)])
    assert decision.preempt == []


def test_priority_preemption_within_a_queue():
    t = tenancy({"a": {"gpu": 4}})
    decision = run(
        t, [pend("urgent", "a", 2, priority=100)], [hold("low", "a", 2, priority=-100), hold("same", "a", 2)]
    )
    assert [p.job_id for p in decision.preempt] == ["low"]
    assert "higher-priority" in decision.preempt[0].reason


def test_preemptions_under_way_are_not_repeated():
    holders = [hold("a1", "a", 2, preempting=True), hold("a2", "a", 4), hold("a3", "a", 2)]
    decision = run(TWO_DESKS, [pend("b1", "b", 2)], holders)
    assert decision.preempt == [] and decision.pending["b1"].code == "Preempting"
    assert "a1" in decision.pending["b1"].message


def test_no_victims_when_preemption_cannot_make_room():
    decision = run(TWO_DESKS, [pend("b1", "b", 4)], [hold("a1", "a", 5), hold("b0", "b", 2)], capacity={"gpu": 8})
    assert decision.preempt == []  # b already holds 2: 2 + 4 > its nominal 4


# -- why pending ---------------------------------------------------------------------------------
def test_never_fits_says_the_numbers():
    reason = run(TWO_DESKS, [pend("huge", "a", 9)]).pending["huge"]
    assert reason.code == "NeverFits" and reason.available == 8
    assert "at most 8" in reason.message


def test_pending_reason_names_holders_and_estimates_start():
    t = tenancy(
        {"a": {"cohort": "f", "gpu": {"nominal": 4, "borrowing_limit": 0}}, "b": {"cohort": "f", "gpu": 4}}, {"f": {}}
    )
    reason = run(t, [pend("j", "a", 4)], [hold("h1", "a", 2, ends_by=400), hold("h2", "a", 2, ends_by=300)]).pending[
        "j"
    ]
    assert reason.code == "QuotaExhausted" and reason.needs == 4 and reason.available == 0
    assert {a.job_id for a in reason.ahead} == {"h1", "h2"}
    assert reason.estimated_start == 400
    assert "h1" in reason.message and "quota" in reason.message


def test_pool_lent_reason_lists_borrowers_first():
    reason = run(TWO_DESKS, [pend("j", "a", 5)], [hold("a0", "a", 1), hold("b-borrow", "b", 6)]).pending["j"]
    assert reason.code == "PoolLent" and reason.ahead[0].job_id == "b-borrow" and reason.ahead[0].why == "borrowing"
    assert reason.estimated_start is None  # b-borrow has no known end


# -- found by the trace replay and the admission benchmark ------------------------------------
def test_a_job_within_nominal_goes_before_a_borrower_so_nothing_is_lent_and_reclaimed_at_once():
    decision = run(
        TWO_DESKS,
        [pend("b-more", "b", 4, at=0), pend("a-job", "a", 4, at=1)],
        [hold("b-own", "b", 4)],
        history={"a": 20.0},
    )
    assert admitted(decision) == ["a-job"] and decision.preempt == []
    assert decision.pending["b-more"].code == "PoolLent"


def test_each_victim_frees_gpus_for_one_head_only():
    t = tenancy({q: {"cohort": "f", "gpu": 4} for q in "abc"}, {"f": {}})
    holders = [hold("a1", "a", 4, started=90), hold("a2", "a", 4, started=50), hold("a3", "a", 4, started=10)]
    decision = run(t, [pend("b1", "b", 4, at=1), pend("c1", "c", 4, at=2)], holders)
    assert sorted(p.job_id for p in decision.preempt) == ["a1", "a2"]  # the two that lose least
    promised = {job: decision.pending[job].ahead[0].job_id for job in ("b1", "c1")}
    assert sorted(promised.values()) == ["a1", "a2"]
    # a preemption already under way is promised to the first head; the second gets its own victim
    holders[0] = hold("a1", "a", 4, started=90, preempting=True)
    decision = run(t, [pend("b1", "b", 4, at=1), pend("c1", "c", 4, at=2)], holders)
    assert [p.job_id for p in decision.preempt] == ["a2"]
    assert decision.pending["b1"].ahead[0].job_id == "a1" and decision.pending["c1"].ahead[0].job_id == "a2"


def test_a_job_held_back_by_another_queues_claim_says_so():
    decision = run(TWO_DESKS, [pend("big", "a", 6, at=1), pend("b2", "b", 2, at=2)], [hold("x", "b", 3)])
    reason = decision.pending["b2"]
    assert reason.code == "HeldForAhead" and reason.ahead[0].job_id == "big" and "big" in reason.message


def test_estimate_counts_only_holders_whose_end_helps():
    t = tenancy(
        {"a": {"cohort": "f", "gpu": {"nominal": 4, "borrowing_limit": 0}}, "b": {"cohort": "f", "gpu": 4}}, {"f": {}}
    )
    reason = run(
        t, [pend("j", "a", 4)], [hold("mine", "a", 4, ends_by=1000), hold("theirs", "b", 2, ends_by=200)]
    ).pending["j"]
    assert reason.code == "QuotaExhausted" and reason.estimated_start == 1000


def test_a_job_larger_than_the_backend_never_blocks_its_tree():
    decision = run(TWO_DESKS, [pend("huge", "a", 6, at=1), pend("b5", "b", 5, at=2)], capacity={"gpu": 5})
    assert admitted(decision) == ["b5"]
    assert decision.pending["huge"].code == "NeverFits" and "backend has 5 GPUs now" in decision.pending["huge"].message
