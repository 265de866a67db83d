"""Metering: the ledger's rows, written as attempts run and once more when they end.

An attempt's rows tile its allocation, from the backend's own start of it (Slurm's Start) to
its own end (Slurm's End): each row is the GPUs held over one interval, what the job used of
them in that interval (its nodes' usage records, cumulative, so a row takes the difference;
None when no node could sample its GPUs), its CPU seconds, and the flavor's price then. An
on-prem flavor's capacity is metered the same way, so the fleet's cost over any window is
known and the ledger can be reconciled against it (cost.ledger).

`Metering` is the controller's reconciler for it: it writes the ledger's next rows for each
backend's attempts, bills cloud pools to the attempts that held their nodes (`cloudbill`),
and extends the on-prem flavors' capacity spans.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session, joinedload

from cellscale.runtime.records import NodeUsage
from cellscale_hub.cost.cloudbill import attribute
from cellscale_hub.drivers import Driver
from cellscale_hub.drivers.capabilities import CloudPool
from cellscale_hub.metrics import Metrics
from cellscale_hub.refs import attempt_ref
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.settings import Settings
from cellscale_hub.store import Store
from cellscale_hub.store import jobs as q
from cellscale_hub.store.models import Attempt, CapacityRow, Job, LedgerHour, LedgerRow, utcnow
from cellscale_hub.store.tenancy_book import TenancyBook
from cellscale_hub.tenancy import Tenancy

METER_LAG_S = 2.0
"""A running attempt is metered up to this long before the last poll that saw it running: Slurm
records whole seconds and its queue may show a job running a moment after it ended, and rows
past the end are trimmed (`metering.trim`) while Prometheus' counters cannot go back."""

BILL_WINDOW_S = 7 * 86400.0
"""Instances stopped longer ago than this are billed already: not attributed again."""


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


Hours = dict[tuple[str, datetime, str, str, str], LedgerHour]  # the hours touched in one metering pass


def meter_attempt(
    session: Session,
    tenancy: Tenancy,
    job: Job,
    attempt: Attempt,
    used: Used | None,
    alive_at: datetime | None,
    hours: Hours | None = None,
) -> list[LedgerRow]:
    """The attempt's next rows: from where its rows stop to its end (an ended attempt: the
    backend's end) or to `alive_at` (a running one: the last time its backend said it was
    running; its end, still unknown, is no earlier, so a row never has to be taken back). Rows
    are cut at clock hours, so an hour's sum and a period's first partial hour are exact."""
    start = attempt.metered_until or attempt.held_from
    if start is None:
        return []
    end = (attempt.held_until or attempt.ended_at) if attempt.state.ended else alive_at
    if end is None:
        return []
    hours = {} if hours is None else hours
    if end < start:
        if not attempt.state.ended:
            return []  # it started after the last poll's time, less the lag: nothing to meter yet
        trim(session, attempt, end, hours)  # its end is a little before the last poll that saw it running
        start = end
    held_s = (end - attempt.held_from).total_seconds()
    gpu_used = None
    if used is not None and used.gpu_used_s is not None:
        total = min(used.gpu_used_s, job.gpus * held_s)  # never more than was held (clocks differ a little)
        gpu_used = max(0.0, total - (attempt.gpu_used_s or 0.0))
        attempt.gpu_used_s = (attempt.gpu_used_s or 0.0) + gpu_used
    if end == start:
        if gpu_used:  # what the nodes used up to the end, after its last row: on that row
            last = _last_row(session, attempt)
            if last is not None:
                last.gpu_used_s = (last.gpu_used_s or 0.0) + gpu_used
                _bucket(session, last, hours).gpu_used_s += gpu_used
                return [_used_only(last, gpu_used)]
        return []
    cpu = 0.0
    if used is not None:
        cpu = max(0.0, used.cpu_s - (attempt.cpu_s or 0.0))
        attempt.cpu_s = (attempt.cpu_s or 0.0) + cpu
        attempt.memory_peak_bytes = max(attempt.memory_peak_bytes or 0, used.memory_peak_bytes)
    flavor = attempt.flavor or job.flavor or attempt.backend
    price = tenancy.price_of(flavor) if flavor in tenancy.flavors else 0.0
    span = (end - start).total_seconds()
    rows = []
    for piece_start, piece_end in clock_hours(start, end):
        share = (piece_end - piece_start).total_seconds() / span
        gpu_s = job.gpus * (piece_end - piece_start).total_seconds()
        row = LedgerRow(
            attempt_id=attempt.id,
            job_id=job.id,
            attempt=attempt.number,
            tenant=job.tenant,
            owner=job.owner,
            backend=attempt.backend,
            flavor=flavor,
            start=piece_start,
            end=piece_end,
            gpus=job.gpus,
            gpu_s=gpu_s,
            gpu_used_s=None if gpu_used is None else gpu_used * share,
            cpu_s=cpu * share,
            usd_per_gpu_hour=price,
            usd=gpu_s / 3600 * price,
        )
        session.add(row)
        add_to_hour(session, row, hours)
        attempt.usd = (attempt.usd or 0.0) + row.usd
        rows.append(row)
    attempt.metered_until = end
    return rows


def clock_hours(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at each clock hour."""
    pieces, t = [], start
    while t < end:
        upto = min(end, t.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1))
        pieces.append((t, upto))
        t = upto
    return pieces


def trim(session: Session, attempt: Attempt, end: datetime, hours: Hours) -> None:
    """Cut the attempt's rows back to its end: Slurm records whole seconds, and squeue may show a
    job running a moment after it ended, so the last poll that saw it running can be later than
    its end. The ledger then matches the backend's accounting; Prometheus' counters, which never
    go down, stay ahead by what was cut (under a second or two per attempt)."""
    rows = session.scalars(select(LedgerRow).where(LedgerRow.attempt_id == attempt.id, LedgerRow.end > end))
    for row in rows:
        span = (row.end - row.start).total_seconds()
        cut = 1.0 if row.start >= end else (row.end - end).total_seconds() / span
        bucket = _bucket(session, row, hours)
        gpu_s, used, usd = row.gpu_s * cut, (row.gpu_used_s or 0.0) * cut, row.usd * cut
        bucket.gpu_s -= gpu_s
        bucket.gpu_used_s -= used
        bucket.usd -= usd
        attempt.usd = (attempt.usd or 0.0) - usd
        if row.gpu_used_s is not None:
            attempt.gpu_used_s = (attempt.gpu_used_s or 0.0) - used
        if cut == 1.0:
            session.delete(row)
            continue
        row.end, row.gpu_s, row.usd, row.cpu_s = end, row.gpu_s - gpu_s, row.usd - usd, row.cpu_s * (1 - cut)
        if row.gpu_used_s is not None:
            row.gpu_used_s -= used
    attempt.metered_until = end


def _last_row(session: Session, attempt: Attempt) -> LedgerRow | None:
    query = select(LedgerRow).where(LedgerRow.attempt_id == attempt.id).order_by(LedgerRow.end.desc()).limit(1)
    return session.scalars(query).first()


def _used_only(row: LedgerRow, gpu_used: float) -> LedgerRow:
    """What the counters add for use found after a row was counted: the use, nothing held."""
    return LedgerRow(
        tenant=row.tenant,
        owner=row.owner,
        backend=row.backend,
        flavor=row.flavor,
        gpu_s=0.0,
        gpu_used_s=gpu_used,
        usd=0.0,
    )


def add_to_hour(session: Session, row: LedgerRow, hours: Hours) -> None:
    """Add a row (within one clock hour) to that hour's sum."""
    bucket = _bucket(session, row, hours)
    bucket.gpu_s += row.gpu_s
    bucket.gpu_used_s += row.gpu_used_s or 0.0
    bucket.usd += row.usd


def _bucket(session: Session, row: LedgerRow, hours: Hours) -> LedgerHour:
    """The hourly sum a row (within one clock hour) belongs to."""
    hour = row.start.replace(minute=0, second=0, microsecond=0)
    key = (row.tenant, hour, row.owner, row.backend, row.flavor)
    bucket = hours.get(key) or session.get(LedgerHour, key)
    if bucket is None:
        bucket = LedgerHour(
            tenant=row.tenant,
            hour=hour,
            owner=row.owner,
            backend=row.backend,
            flavor=row.flavor,
            gpu_s=0.0,
            gpu_used_s=0.0,
            usd=0.0,
        )
        session.add(bucket)
    hours[key] = bucket
    return bucket


def unmetered(session: Session, backend: str, since: datetime) -> list[Attempt]:
    """The backend's attempts whose allocation the ledger does not cover up to now: running
    ones, and ended ones (since `since`) whose rows do not end at their end yet (the last one
    missing, or to be trimmed back to it)."""
    final_end = func.coalesce(Attempt.held_until, Attempt.ended_at)
    query = (
        select(Attempt)
        .where(
            Attempt.backend == backend,
            Attempt.held_from.is_not(None),
            or_(
                Attempt.ended_at.is_(None),
                and_(
                    Attempt.ended_at > since, or_(Attempt.metered_until.is_(None), Attempt.metered_until != final_end)
                ),
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


class Metering:
    def __init__(self, store: Store, jobs_root: Path, tenancy: TenancyBook, metrics: Metrics, settings: Settings):
        self.store = store
        self.jobs_root = jobs_root
        self.tenancy = tenancy
        self.metrics = metrics
        self.settings = settings
        self._metered_at: dict[str, float] = {}
        self._billed_at: dict[str, float] = {}
        self._alive_at: dict[str, dict[int, datetime]] = {}  # backend -> attempt -> when it last polled running
        self._capacity_metered_at = 0.0

    def alive(self, backend: str, active: Collection[int]) -> dict[int, datetime]:
        """When each of the backend's active attempts last polled running, less METER_LAG_S: the
        poll writes it (attempts no longer active are dropped here), `meter` reads it."""
        alive = self._alive_at.setdefault(backend, {})
        for gone in alive.keys() - set(active):
            del alive[gone]
        return alive

    def due_now(self, backend: str) -> None:
        """An attempt of the backend ended: its last row now, not at the next interval."""
        self._metered_at.pop(backend, None)

    def bill_cloud(self, backend: str, driver: Driver) -> None:
        """Attribute a cloud pool's bill to the attempts that held its nodes (`cloudbill`), every
        `cloud_bill_interval_s`: each attempt's share (boot, run, idle tail) in `cloud_usd`."""
        if not isinstance(driver, CloudPool):
            return
        if time.monotonic() - self._billed_at.get(backend, 0.0) < self.settings.cloud_bill_interval_s:
            return
        self._billed_at[backend] = time.monotonic()
        now = time.time()
        recent = [i for i in driver.cloud_instances() if i.stopped is None or i.stopped > now - BILL_WINDOW_S]
        if not recent:
            return
        since = datetime.fromtimestamp(min(i.requested for i in recent), UTC) - timedelta(hours=1)
        with self.store.session() as session:
            attempts = q.attempts_since(session, backend, since)
            refs = [attempt_ref(self.jobs_root, a.job, a) for a in attempts]
        bill = attribute(recent, driver.node_runs(refs), now)
        with self.store.session() as session:
            for attempt in attempts:
                usd = bill.usd.get((attempt.job_id, attempt.number))
                if usd is not None and (attempt.cloud_usd is None or abs(attempt.cloud_usd - usd) > 1e-6):
                    session.get(Attempt, attempt.id).cloud_usd = round(usd, 6)

    def meter(self, backend: str, driver: Driver) -> None:
        """The ledger's next rows for the backend's attempts (`cost.metering`): every
        `meter_interval_s` while they run, and right after one ends."""
        if time.monotonic() - self._metered_at.get(backend, 0.0) < self.settings.meter_interval_s:
            return
        self._metered_at[backend] = time.monotonic()
        now = utcnow()
        with self.store.session() as session:
            unmet = unmetered(session, backend, now - timedelta(days=1))
            refs = {a.id: attempt_ref(self.jobs_root, a.job, a) for a in unmet}
        if not unmet:
            return
        usage = driver.files.usage
        used = {a.id: used_of(usage(refs[a.id]), refs[a.id].spec.resources.nodes) for a in unmet}
        tenancy = self.tenancy.current
        alive = self._alive_at.get(backend, {})
        rows, hours = [], {}
        with self.store.session() as session, session.no_autoflush:  # one flush for all the rows
            for attempt in attempts(session, list(used)):
                use, alive_at = used[attempt.id], alive.get(attempt.id)
                rows += meter_attempt(session, tenancy, attempt.job, attempt, use, alive_at, hours)
        for row in rows:  # counted once stored
            self.metrics.metered(row)

    def meter_capacity(self, capacities: dict[str, Amounts]) -> None:
        """Extend the on-prem flavors' capacity spans (what the fleet costs) every `meter_interval_s`."""
        if time.monotonic() - self._capacity_metered_at < self.settings.meter_interval_s:
            return
        self._capacity_metered_at = time.monotonic()
        with self.store.session() as session:
            meter_capacity(session, self.tenancy.current, capacities, utcnow())
