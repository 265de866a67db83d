"""The ledger as reports read it: a window's cost report from the stored rows (plus each cloud
pool's bill from its own ledger), and the estimate of a job's cost before it runs."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.orm import Session

from cellscale.spec import CostEstimate, JobSpec, Resources
from cellscale.vocabulary import Phase
from cellscale_hub.cost.ledger import CloudBill, CostReport, Interval, Pool, report
from cellscale_hub.drivers import Driver
from cellscale_hub.drivers.capabilities import CloudPool, Instance
from cellscale_hub.scheduling.placement import Spend, usd_words
from cellscale_hub.store.jobs import span_words
from cellscale_hub.store.models import Attempt, CapacityRow, Job, LedgerRow
from cellscale_hub.tenancy import Tenancy

HISTORY_JOBS = 200  # the user's newest finished jobs searched for earlier runs of a cell


@dataclass(frozen=True)
class Inputs:
    """What the ledger holds for a window, read once: reports of any part of it are pure."""

    intervals: list[Interval]
    pools: list[Pool]
    instances: dict[str, list[Instance]]  # cloud flavor -> its pool's billed instances
    quotas: dict[str, dict[str, int]]


def cost_report(
    session: Session, tenancy: Tenancy, drivers: Mapping[str, Driver], since: datetime, until: datetime
) -> CostReport:
    return report_of(read_inputs(session, tenancy, drivers, since, until), tenancy, (since, until))


def cost_series(
    session: Session, tenancy: Tenancy, drivers: Mapping[str, Driver], since: datetime, until: datetime, step: timedelta
) -> list[tuple[datetime, CostReport]]:
    """One report per step of the window (cost and GPU-hours over time)."""
    inputs = read_inputs(session, tenancy, drivers, since, until)
    out, start = [], since
    while start < until:
        end = min(start + step, until)
        out.append((start, report_of(inputs, tenancy, (start, end))))
        start = end
    return out


def read_inputs(
    session: Session, tenancy: Tenancy, drivers: Mapping[str, Driver], since: datetime, until: datetime
) -> Inputs:
    rows = session.execute(select(LedgerRow).where(LedgerRow.end > since, LedgerRow.start < until)).scalars()
    intervals = [
        Interval(
            job_id=r.job_id,
            attempt=r.attempt,
            tenant=r.tenant,
            user=r.owner,
            backend=r.backend,
            flavor=r.flavor,
            start=r.start.timestamp(),
            end=r.end.timestamp(),
            gpus=r.gpus,
            gpu_used_s=r.gpu_used_s,
            cpu_s=r.cpu_s,
            usd_per_gpu_hour=r.usd_per_gpu_hour,
        )
        for r in rows
    ]
    spans = session.execute(select(CapacityRow).where(CapacityRow.end > since, CapacityRow.start < until)).scalars()
    pools = [
        Pool(s.flavor, s.backend, s.start.timestamp(), s.end.timestamp(), s.gpus, s.usd_per_gpu_hour) for s in spans
    ]
    instances = {
        flavor: drivers[config.backend].cloud_instances() if isinstance(drivers[config.backend], CloudPool) else []
        for flavor, config in tenancy.flavors.items()
        if tenancy.is_cloud(flavor) and config.backend in drivers
    }
    quotas = {
        tenant: {
            f: q.nominal
            for local in t.queues.values()
            for f, q in tenancy.cluster_queues[local.cluster_queue].quotas.items()
        }
        for tenant, t in tenancy.tenants.items()
    }
    return Inputs(intervals, pools, instances, quotas)


def report_of(inputs: Inputs, tenancy: Tenancy, window: tuple[datetime, datetime]) -> CostReport:
    span = (window[0].timestamp(), window[1].timestamp())
    bills = [CloudBill(flavor, bill_within(found, span)) for flavor, found in inputs.instances.items()]
    return report(inputs.intervals, inputs.pools, bills, inputs.quotas, tenancy.cost.idle, span)


def bill_within(instances: list[Instance], window: tuple[float, float]) -> float:
    """A cloud pool's dollars within the window: each instance's bill spread evenly over its
    billed seconds (it bills by the second at one price)."""
    w0, w1 = window
    usd = 0.0
    for i in instances:
        stop = i.stopped if i.stopped is not None else w1
        span = stop - i.requested
        if span > 0:
            usd += i.usd * max(0.0, min(stop, w1) - max(i.requested, w0)) / span
    return usd


def estimate(
    session: Session,
    tenancy: Tenancy,
    owner: str,
    spec: JobSpec,
    gpus: int,
    flavor: str | None,
    spend: Spend | None,
    tenant: str,
) -> CostEstimate:
    """What the job will cost: its GPUs × how long earlier runs of the same cell by this user
    held them (the median), else × its time limit (an upper bound), at the flavor's price."""
    price = tenancy.price_of(flavor) if flavor in tenancy.flavors else 0.0
    runs = earlier_runs(session, owner, spec)
    if runs:
        seconds, basis = statistics.median(runs), "history"
    else:
        seconds, basis = spec.resources.timeout_min * 60.0, "time_limit"
    usd = gpus * seconds / 3600 * price
    fraction = usd / spend.budget.usd if spend is not None and spend.budget.usd else None
    return CostEstimate(
        gpus=gpus,
        seconds=seconds,
        basis=basis,
        runs=len(runs),
        usd_per_gpu_hour=price,
        usd=usd,
        budget_fraction=fraction,
        words=estimate_words(gpus, seconds, basis, len(runs), usd, fraction, tenant, spend),
    )


def earlier_runs(session: Session, owner: str, spec: JobSpec) -> list[float]:
    """Seconds the user's earlier successful runs of this cell (same code, same GPUs) held their
    GPUs, newest first, among their newest HISTORY_JOBS. The database compares the stored specs'
    source, inputs and gang size: decoding and hashing each spec here cost ~1.5 ms per 100
    earlier jobs, on every submit."""
    wanted = {
        "owner": owner,
        "source": spec.source,
        "inputs": spec.inputs_sha256 or "",
        "gang": spec.resources.nodes * spec.resources.gpus_per_node,
    }
    return [(until - since).total_seconds() for since, until in session.execute(_EARLIER_RUNS, wanted)]


def _earlier_runs_query() -> Select:
    """The query of `earlier_runs`, built once (building it took as long as running it). The
    newest attempts are found by the index, then their specs compared, the source first: the
    other fields are read only from the few specs of the same cell."""
    newest = (
        select(Attempt.id, Job.created_at)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Job.owner == bindparam("owner"), Job.phase == Phase.SUCCEEDED, Attempt.held_until.is_not(None))
        .order_by(Job.created_at.desc())
        .limit(HISTORY_JOBS)
        .subquery()
    )
    document, fields = Job.spec_json, Resources.model_fields  # a spec without a field has its default
    nodes = func.coalesce(document[("resources", "nodes")].as_integer(), fields["nodes"].default)
    per_node = func.coalesce(document[("resources", "gpus_per_node")].as_integer(), fields["gpus_per_node"].default)
    return (
        select(Attempt.held_from, Attempt.held_until)
        .join(newest, newest.c.id == Attempt.id)
        .join(Job, Job.id == Attempt.job_id)
        .where(
            document["source"].as_string() == bindparam("source"),
            func.coalesce(document["inputs_sha256"].as_string(), "") == bindparam("inputs"),
            nodes * per_node == bindparam("gang"),
        )
        .order_by(newest.c.created_at.desc())
    )


_EARLIER_RUNS = _earlier_runs_query()


def estimate_words(
    gpus: int, seconds: float, basis: str, runs: int, usd: float, fraction: float | None, tenant: str, spend
) -> str:
    """ "≈16 GPU × 2 h ≈ $84, 6% of desk-a's weekly budget (from 3 earlier runs of this cell)",
    then the budget's warning when the desk is past one of its thresholds."""
    words = f"≈{gpus} GPU × {span_words(seconds)} ≈ {usd_words(usd)}"
    if fraction is not None:
        words += f", {fraction:.0%} of {tenant}'s {spend.budget.period_words} budget"
    plural = "s" if runs != 1 else ""
    origin = f"from {runs} earlier run{plural} of this cell" if basis == "history" else "at most: its --time"
    words = f"{words} ({origin})"
    crossed = [f for f in spend.budget.warn_at if spend.fraction >= f] if spend is not None else []
    if crossed:
        held = "; new work is held" if spend.budget.hard_stop and spend.exhausted else ""
        words += f"; {tenant} is past {max(crossed):.0%} of its budget: {spend.words(tenant)}{held}"
    return words
