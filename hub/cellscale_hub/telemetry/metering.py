"""Metering: the ledger's rows, written as attempts run and once more when they end.

An attempt's rows tile its allocation, from the backend's own start of it (Slurm's Start) to
its own end (Slurm's End): each row is the GPUs held over one interval, what the job used of
them in that interval (its nodes' usage records, cumulative, so a row takes the difference;
None when no node could sample its GPUs), its CPU seconds, and the flavor's price then. An
on-prem flavor's capacity is metered the same way, so the fleet's cost over any window is
known and the ledger can be reconciled against it (telemetry.ledger).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session, joinedload

from cellscale.runtime.records import NodeUsage
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.store.models import Attempt, CapacityRow, Job, LedgerRow
from cellscale_hub.tenancy import Tenancy


@dataclass(frozen=True)
class Used:
    """What an attempt's nodes used so far, summed over the nodes."""

    gpu_used_s: float | None  # None: some node could not sample its GPUs
    cpu_s: float
    memory_peak_bytes: int


def used_of(records: Sequence[NodeUsage | None], nodes: int) -> Used | None:
    """The attempt's use from its nodes' records; None before any node wrote one."""
    known = [r for r in records if r is not None]
    if not known:
        return None
    gpus_known = len(known) == nodes and all(r.gpu_used_s is not None for r in known)
    return Used(
        gpu_used_s=sum(r.gpu_used_s or 0.0 for r in known) if gpus_known else None,
        cpu_s=sum(r.cpu_s for r in known),
        memory_peak_bytes=sum(r.memory_peak_bytes for r in known),
    )


def meter_attempt(
    session: Session, tenancy: Tenancy, job: Job, attempt: Attempt, used: Used | None, alive_at: datetime | None
) -> LedgerRow | None:
    """The next row of the attempt, or None when there is nothing to add. An ended attempt's
    last row ends at its end; a running one's at `alive_at`, the last time its backend said it
    was running (its end, still unknown, is no earlier: a row never has to be taken back)."""
    start = attempt.metered_until or attempt.held_from
    if start is None:
        return None
    end = (attempt.held_until or attempt.ended_at) if attempt.state.ended else alive_at
    if end is None or end <= start:
        return None
    held_s = (end - attempt.held_from).total_seconds()
    gpu_used = None
    if used is not None and used.gpu_used_s is not None:
        total = min(used.gpu_used_s, job.gpus * held_s)  # never more than was held (clocks differ a little)
        gpu_used = max(0.0, total - (attempt.gpu_used_s or 0.0))
        attempt.gpu_used_s = (attempt.gpu_used_s or 0.0) + gpu_used
    cpu = 0.0
    if used is not None:
        cpu = max(0.0, used.cpu_s - (attempt.cpu_s or 0.0))
        attempt.cpu_s = (attempt.cpu_s or 0.0) + cpu
        attempt.memory_peak_bytes = max(attempt.memory_peak_bytes or 0, used.memory_peak_bytes)
    flavor = attempt.flavor or job.flavor or attempt.backend
    price = tenancy.price_of(flavor) if flavor in tenancy.flavors else 0.0
    gpu_s = job.gpus * (end - start).total_seconds()
    row = LedgerRow(
        attempt_id=attempt.id,
        job_id=job.id,
        attempt=attempt.number,
        tenant=job.tenant,
        owner=job.owner,
        backend=attempt.backend,
        flavor=flavor,
        start=start,
        end=end,
        gpus=job.gpus,
        gpu_s=gpu_s,
        gpu_used_s=gpu_used,
        cpu_s=cpu,
        usd_per_gpu_hour=price,
        usd=gpu_s / 3600 * price,
    )
    session.add(row)
    attempt.metered_until = end
    attempt.usd = (attempt.usd or 0.0) + row.usd
    return row


def unmetered(session: Session, backend: str, since: datetime) -> list[Attempt]:
    """The backend's attempts whose allocation the ledger does not cover up to now: running
    ones, and ended ones (since `since`) whose last row is missing."""
    final_end = func.coalesce(Attempt.held_until, Attempt.ended_at)
    query = (
        select(Attempt)
        .where(
            Attempt.backend == backend,
            Attempt.held_from.is_not(None),
            or_(
                Attempt.ended_at.is_(None),
                and_(Attempt.ended_at > since, or_(Attempt.metered_until.is_(None), Attempt.metered_until < final_end)),
            ),
        )
        .options(joinedload(Attempt.job))  # the caller reads each attempt's job: not one query per attempt
    )
    return list(session.scalars(query).unique())


def attempts(session: Session, ids: list[int], batch: int = 500) -> list[Attempt]:
    """These attempts with their jobs, a query per `batch` of them."""
    out: list[Attempt] = []
    for start in range(0, len(ids), batch):
        query = select(Attempt).where(Attempt.id.in_(ids[start : start + batch])).options(joinedload(Attempt.job))
        out.extend(session.scalars(query).unique())
    return out


def meter_capacity(session: Session, tenancy: Tenancy, capacities: Mapping[str, Amounts], now: datetime) -> None:
    """Extend each on-prem flavor's capacity span to now (a new span from the last one's end when
    its GPUs or price changed; a flavor's first span starts now). Cloud flavors are billed by the
    cloud instead; CPU pools have no GPUs to price."""
    for flavor, amounts in capacities.items():
        gpus = amounts.gpu
        if flavor not in tenancy.flavors or tenancy.is_cloud(flavor) or tenancy.flavors[flavor].cpu_only:
            continue
        price = tenancy.price_of(flavor)
        last = session.scalars(
            select(CapacityRow).where(CapacityRow.flavor == flavor).order_by(CapacityRow.end.desc()).limit(1)
        ).first()
        if last is not None and last.gpus == gpus and last.usd_per_gpu_hour == price:
            last.end = max(last.end, now)
            continue
        start = min(last.end, now) if last is not None else now
        backend = tenancy.flavors[flavor].backend
        session.add(
            CapacityRow(flavor=flavor, backend=backend, start=start, end=now, gpus=gpus, usd_per_gpu_hour=price)
        )
