"""What reports read from the ledger: a cloud bill within a window, and an estimate in words."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cellscale.spec import JobSpec, Phase
from cellscale_hub.cost import costs
from cellscale_hub.cost.costs import bill_within, earlier_runs, estimate_words
from cellscale_hub.drivers.capabilities import Instance
from cellscale_hub.scheduling.placement import Spend
from cellscale_hub.store.models import Attempt, Job, utcnow
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


def test_earlier_runs_are_the_owners_successful_runs_of_the_same_cell_and_gang(store, monkeypatch):
    now = utcnow()
    runs = [  # (owner, source, inputs, nodes x GPUs, phase, held seconds), oldest first
        ("alice", "x = 1", None, (1, 2), Phase.SUCCEEDED, 100),
        ("alice", "x = 1", None, (1, 2), Phase.SUCCEEDED, 300),
        ("alice", "x = 1", None, (2, 1), Phase.SUCCEEDED, 7),  # the same GPUs in another shape
        ("alice", "x = 1", None, (1, 4), Phase.SUCCEEDED, 8),  # more GPUs
        ("alice", "x = 1", "ab" * 32, (1, 2), Phase.SUCCEEDED, 9),  # other inputs
        ("alice", "x = 2", None, (1, 2), Phase.SUCCEEDED, 10),  # other code
        ("alice", "x = 1", None, (1, 2), Phase.FAILED, 11),
        ("bob", "x = 1", None, (1, 2), Phase.SUCCEEDED, 12),
    ]
    with store.session() as s:
        for i, (owner, source, inputs, (nodes, gpus), phase, held) in enumerate(runs):
            resources = {"nodes": nodes, "gpus_per_node": gpus}
            spec = JobSpec(
                source=source, resources=resources, inputs_sha256=inputs, input_names=["v"] if inputs else []
            )
            created = now - timedelta(hours=len(runs) - i)
            s.add(
                Job(
                    id=f"cs-{i}",
                    idempotency_key=f"k{i}",
                    owner=owner,
                    tenant="desk-a",
                    queue="default",
                    backend="local",
                    name="cell",
                    spec=spec,
                    gpus=nodes * gpus,
                    phase=phase,
                    created_at=created,
                )
            )
            s.flush()
            until = created + timedelta(seconds=60 + held)
            s.add(
                Attempt(
                    job_id=f"cs-{i}",
                    number=1,
                    backend="local",
                    state="SUCCEEDED",
                    held_from=created + timedelta(seconds=60),
                    held_until=until,
                )
            )
    wanted = JobSpec(source="x = 1", resources={"nodes": 1, "gpus_per_node": 2})
    with store.session() as s:
        assert earlier_runs(s, "alice", wanted) == [7.0, 300.0, 100.0]  # newest first
        assert earlier_runs(s, "carol", wanted) == []
    monkeypatch.setattr(costs, "HISTORY_JOBS", 4)  # only the newest 4 of alice's successful runs are searched
    monkeypatch.setattr(costs, "_EARLIER_RUNS", costs._earlier_runs_query())
    with store.session() as s:
        assert earlier_runs(s, "alice", wanted) == [7.0]
