"""Metering: an attempt's ledger rows tile its allocation, from the backend's own start to its
own end; a running one is metered only up to the last poll that saw it running, so no row is
ever taken back; used GPU-seconds are differences of the nodes' cumulative records, unknown when
any node could not sample; capacity spans extend while nothing changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from cellscale.runtime.records import NodeUsage
from cellscale.vocabulary import AttemptState
from cellscale_hub.cost.metering import Metering, Used, meter_attempt, meter_capacity, unmetered, used_of
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.settings import Settings
from cellscale_hub.store.models import Attempt, CapacityRow, LedgerHour, LedgerRow
from cellscale_hub.store.usage import budget_spend
from cellscale_hub.tenancy import Budget, Tenancy
from tests.unit.test_store import make_job

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
TENANCY = Tenancy.model_validate(
    {
        "sites": {"dc": {"gpu_hour_usd": 1.5}},
        "flavors": {"a100": {"backend": "slurm", "gpu_hour_usd": 2.0}, "h100": {"backend": "slurm", "site": "dc"}},
        "cluster_queues": {"desk-a": {"quotas": {"a100": {"nominal": 8}, "h100": {"nominal": 8}}}},
        "tenants": {"desk-a": {"queues": {"default": {"cluster_queue": "desk-a"}}}},
    }
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def node(used: float | None, cpu: float = 1.0, memory: int = 100) -> NodeUsage:
    return NodeUsage(
        since=0, at=0, gpus=8, source="simulated", gpu_used_s=used, gpu_sampled_s=0, cpu_s=cpu, memory_peak_bytes=memory
    )


@pytest.mark.parametrize(
    "records, nodes, expect",
    [
        ([node(10.0), node(20.0)], 2, Used(30.0, 2.0, 200)),
        ([node(10.0), None], 2, Used(None, 1.0, 100)),  # a node without a record: GPU use unknown
        ([node(10.0), node(None)], 2, Used(None, 2.0, 200)),  # a node that cannot sample its GPUs
        ([None, None], 2, None),
    ],
)
def test_what_an_attempts_nodes_used(records, nodes, expect):
    assert used_of(records, nodes) == expect


@pytest.fixture
def attempt(store):
    with store.session() as session:
        job = make_job()
        job.gpus, job.flavor = 16, "a100"
        session.add(job)
        session.flush()
        a = Attempt(job_id=job.id, number=1, backend="slurm", flavor="a100", state=AttemptState.RUNNING)
        a.held_from = at(0)
        session.add(a)
    return store


def meter(store, alive_at=None, used=None, end=None):
    with store.session() as session:
        a = session.scalars(select(Attempt)).one()
        if end is not None:
            a.state, a.held_until, a.ended_at = AttemptState.SUCCEEDED, at(end), at(end + 2)
        rows = meter_attempt(session, TENANCY, a.job, a, used, alive_at)
        return [(row.start, row.end, row.gpu_used_s, row.usd_per_gpu_hour) for row in rows] or None


def test_rows_tile_the_allocation_to_the_backends_own_end(attempt):
    assert meter(attempt, alive_at=at(60), used=Used(400.0, 5.0, 1)) == [(at(0), at(60), 400.0, 2.0)]
    assert meter(attempt, alive_at=at(60)) is None  # nothing new since that poll
    # ended at 90 by Slurm's clock (the controller saw it at 92): the last row stops at 90
    assert meter(attempt, used=Used(1000.0, 9.0, 1), end=90) == [(at(60), at(90), 600.0, 2.0)]
    with attempt.session() as session:
        a = session.scalars(select(Attempt)).one()
        rows = session.scalars(select(LedgerRow)).all()
        assert sum(r.gpus * (r.end - r.start).total_seconds() for r in rows) == 16 * 90
        assert (a.gpu_used_s, a.cpu_s, a.usd) == (1000.0, 9.0, pytest.approx(16 * 90 / 3600 * 2.0))
        assert unmetered(session, "slurm", at(-3600)) == []  # fully metered


def test_a_running_attempt_is_metered_only_to_the_last_poll_that_saw_it(attempt):
    assert meter(attempt, alive_at=None) is None  # not polled since the control plane started
    assert meter(attempt, alive_at=at(-1)) is None  # the poll (less its lag) was before it started
    with attempt.session() as session:
        assert session.scalars(select(Attempt)).one().metered_until is None
    assert meter(attempt, alive_at=at(30))[0][1] == at(30)


def test_used_never_exceeds_what_was_held(attempt):
    meter(attempt, alive_at=at(10), used=Used(10_000.0, 0.0, 0))  # clocks differ: more than 16 × 10
    with attempt.session() as session:
        assert session.scalars(select(Attempt)).one().gpu_used_s == 160.0


def test_unknown_use_stays_unknown(attempt):
    assert meter(attempt, alive_at=at(10), used=Used(None, 1.0, 1))[0][2] is None


def test_capacity_spans_extend_until_something_changes(store):
    with store.session() as session:
        meter_capacity(session, TENANCY, {"a100": Amounts(32), "h100": Amounts(16)}, at(0))
        meter_capacity(session, TENANCY, {"a100": Amounts(32), "h100": Amounts(16)}, at(60))
        meter_capacity(session, TENANCY, {"a100": Amounts(24), "h100": Amounts(16)}, at(120))  # a node left
    with store.session() as session:
        spans = [(s.flavor, s.start, s.end, s.gpus, s.usd_per_gpu_hour) for s in session.scalars(select(CapacityRow))]
    assert sorted(spans) == [
        ("a100", at(0), at(60), 32, 2.0),
        ("a100", at(60), at(120), 24, 2.0),
        ("h100", at(0), at(120), 16, 1.5),  # its site's price
    ]


def test_rows_are_cut_at_clock_hours_and_summed_per_hour(attempt):
    # 30 min before and 30 min after 10:00, used 900 GPU-s spread over it
    assert meter(attempt, alive_at=at(1800)) is not None
    assert meter(attempt, alive_at=at(5400), used=Used(16 * 1800.0, 0.0, 0)) == [
        (at(1800), at(3600), 16 * 900.0, 2.0),
        (at(3600), at(5400), 16 * 900.0, 2.0),
    ]
    with attempt.session() as session:
        hours = {h.hour: (h.gpu_s, h.usd) for h in session.scalars(select(LedgerHour))}
    assert hours == {at(0): (16 * 3600.0, 32.0), at(3600): (16 * 1800.0, 16.0)}


def test_a_budget_period_counts_whole_hours_and_the_exact_part_of_its_first(attempt):
    meter(attempt, end=7200)  # held 9:00 to 11:00 (ended), 16 GPUs at $2
    with attempt.session() as session:
        tenancy = TENANCY.model_copy(
            update={
                "tenants": {
                    "desk-a": TENANCY.tenants["desk-a"].model_copy(update={"budget": Budget(usd=1000, period="day")})
                }
            }
        )
        spend = budget_spend(session, tenancy, at(86400 + 1800))  # the period starts at 9:30
    assert spend["desk-a"].spent_gpu_hours == pytest.approx(16 * 1.5)
    assert spend["desk-a"].spent_usd == pytest.approx(16 * 1.5 * 2.0)


def test_rows_past_the_backends_end_are_trimmed_back_to_it(attempt):
    meter(attempt, alive_at=at(60), used=Used(480.0, 1.0, 1))
    # Slurm says it ended at 59.0 (whole seconds; its queue still showed it running at 60)
    added = meter(attempt, used=Used(500.0, 1.0, 1), end=59)
    assert added == [(None, None, 500.0 - 480.0 * 59 / 60, None)]  # for the counters: the use found since
    with attempt.session() as session:
        a = session.scalars(select(Attempt)).one()
        (row,) = session.scalars(select(LedgerRow)).all()
        (hour,) = session.scalars(select(LedgerHour)).all()
        assert (row.end, row.gpu_s, a.metered_until) == (at(59), 16 * 59.0, at(59))
        assert row.gpu_used_s == pytest.approx(500.0)  # the nodes' last use lands on the trimmed row
        assert (hour.gpu_s, hour.usd) == (pytest.approx(16 * 59.0), pytest.approx(a.usd))
        assert a.usd == pytest.approx(16 * 59 / 3600 * 2.0) and a.gpu_used_s == pytest.approx(500.0)
        assert unmetered(session, "slurm", at(-3600)) == []


def test_the_metering_reconciler_keeps_when_active_attempts_last_polled_running():
    metering = Metering(None, None, None, None, Settings())
    alive = metering.alive("slurm", [1, 2])
    alive[1], alive[2] = at(10), at(20)
    assert metering.alive("slurm", [2]) == {2: at(20)}  # attempt 1 is no longer active: dropped
    assert metering.alive("local", []) == {}
    metering._metered_at["slurm"] = 1.0
    metering.due_now("slurm")  # an attempt ended: its last row at the next pass
    assert "slurm" not in metering._metered_at
