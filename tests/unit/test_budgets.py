"""Budgets: what a budget may say, how spend reads against it, and the hard stop that holds a
desk's new work (with its reason) while other desks go on."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cellscale.vocabulary import PendingCode
from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.placement import Spend
from cellscale_hub.scheduling.types import Snapshot, Workload
from cellscale_hub.tenancy import Budget
from tests.unit.test_admission import TWO_DESKS


@pytest.mark.parametrize(
    "budget, spent_usd, spent_gpu_hours, fraction, exhausted",
    [
        (Budget(usd=100), 50, 0, 0.5, False),
        (Budget(gpu_hours=10), 999, 12, 1.2, True),  # dollars are not limited: GPU-hours decide
        (Budget(usd=100, gpu_hours=10), 20, 9, 0.9, False),  # the larger of the two
        (Budget(usd=100, gpu_hours=10), 100, 1, 1.0, True),
        (Budget(usd=0), 0.01, 0, float("inf"), True),
    ],
)
def test_spend_against_a_budget(budget, spent_usd, spent_gpu_hours, fraction, exhausted):
    spend = Spend(budget, spent_usd, spent_gpu_hours)
    assert spend.fraction == pytest.approx(fraction)
    assert spend.exhausted is exhausted


def test_a_budget_needs_a_limit_and_sane_warnings():
    with pytest.raises(ValidationError, match="usd, gpu_hours or both"):
        Budget(period="week")
    with pytest.raises(ValidationError, match="warn_at"):
        Budget(usd=10, warn_at=(0.5, 0))
    assert Budget(usd=10).model_dump(exclude_none=True) == {"usd": 10.0, "period": "week"}  # defaults stay out


def test_spend_in_words():
    words = Spend(Budget(usd=500, gpu_hours=200, period="week"), 512.0, 30.0).words("desk-a")
    assert words == "$512 of desk-a's weekly $500 and 30.0 of 200 GPU-hours budget (102%)"


def held(spend: dict[str, Spend]):
    pending = (Workload("a1", "a", 1, tenant="a"), Workload("b1", "b", 1, tenant="b", submitted=1.0))
    return schedule(Snapshot(TWO_DESKS, {"gpu": 8}, (), pending, {}, 100.0, spend=spend))


def test_a_spent_budget_with_a_hard_stop_holds_the_desks_new_work_and_says_why():
    decision = held({"a": Spend(Budget(usd=100, hard_stop=True), 100.5)})
    assert [a.job_id for a in decision.admit] == ["b1"]  # the other desk goes on
    reason = decision.pending["a1"]
    assert reason.code is PendingCode.BudgetSpent
    assert reason.message.startswith("held: a has spent its budget ($100 of a's weekly $100 budget (100%))")


@pytest.mark.parametrize(
    "spend",
    [
        {"a": Spend(Budget(usd=100), 500)},  # spent, but no hard stop: warned, not held
        {"a": Spend(Budget(usd=100, hard_stop=True), 99)},  # not spent yet
        {},  # no budget
    ],
)
def test_work_is_held_only_by_a_spent_budget_with_a_hard_stop(spend):
    assert sorted(a.job_id for a in held(spend).admit) == ["a1", "b1"]
