"""What reports read from the ledger: a cloud bill within a window, and an estimate in words."""

from __future__ import annotations

import pytest

from cellscale_hub.cost.costs import bill_within, estimate_words
from cellscale_hub.drivers.capabilities import Instance
from cellscale_hub.scheduling.placement import Spend
from cellscale_hub.tenancy import Budget


@pytest.mark.parametrize(
    "instances, window, usd",
    [
        ([Instance("c1", 0, 100, 10.0)], (0, 100), 10.0),
        ([Instance("c1", 0, 100, 10.0)], (50, 200), 5.0),  # half of its billed seconds inside
        ([Instance("c1", 0, None, 4.0)], (0, 40), 4.0),  # still running: billed so far, up to the window's end
        ([Instance("c1", 0, 100, 10.0), Instance("c2", 100, 200, 6.0)], (90, 110), 1.0 + 0.6),
        ([Instance("c1", 0, 100, 10.0)], (100, 200), 0.0),
    ],
)
def test_a_cloud_bill_within_a_window(instances, window, usd):
    assert bill_within(instances, window) == pytest.approx(usd)


def test_an_estimate_in_words():
    spend = Spend(Budget(usd=1400, period="week"), 0)
    assert (
        estimate_words(16, 7200, "time_limit", 0, 84.0, 0.06, "desk-a", spend)
        == "≈16 GPU × 2.0 h ≈ $84, 6% of desk-a's weekly budget (at most: its --time)"
    )
    assert estimate_words(8, 95, "history", 3, 0.42, None, "desk-a", None) == (
        "≈8 GPU × 2 min ≈ $0.42 (from 3 earlier runs of this cell)"
    )


def test_an_estimate_warns_a_desk_past_a_threshold_of_its_budget():
    spend = Spend(Budget(usd=100, period="week", hard_stop=True), 100.0)
    words = estimate_words(1, 3600, "time_limit", 0, 2.0, 0.02, "desk-a", spend)
    assert words.endswith(
        "; desk-a is past 100% of its budget: $100 of desk-a's weekly $100 budget (100%); new work is held"
    )
