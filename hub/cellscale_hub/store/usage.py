"""The store as admission and reports see it: the snapshot one scheduling cycle decides on
(columns only, so a queue of 100k jobs stays cheap to read), the quota usage desks and
admins see."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from functools import lru_cache

from sqlalchemy import ColumnElement, Select, Text, cast, func, or_, select
from sqlalchemy.orm import Session

from cellscale.spec import FlavorUsage, QueueUsage
from cellscale.vocabulary import ACTIVE_ATTEMPT_STATES, QUOTA_HOLDING_PHASES, Fault, Phase
from cellscale_hub.scheduling.fairshare import average_gpus, decayed_gpu_seconds
from cellscale_hub.scheduling.placement import SiteState, Spend
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.scheduling.usage import on_short_share
from cellscale_hub.store import totals
from cellscale_hub.store.models import Attempt, Event, Job, LedgerHour, LedgerRow, QueueTotal, epoch_seconds
from cellscale_hub.tenancy import ResourceWeights, Tenancy

HISTORY_HALF_LIVES = 8  # older use weighs under 0.4%: not worth reading
DEFAULT_TIMEOUT_MIN = 60  # a stored spec without resources.timeout_min (Resources' default)


def snapshot(
    session: Session,
    tenancy: Tenancy,
    pending: list[Workload],
    capacity: dict[str, int],
    now: datetime,
    half_life_s: float,
    sites: Mapping[str, SiteState] | None = None,
) -> Snapshot:
    return Snapshot(
        tenancy=tenancy,
        capacity=capacity,
        holders=tuple(holders(session)),
        pending=tuple(pending),
        history=history(session, now, half_life_s, tenancy.resource_weights),
        now=now.timestamp(),
        sites=sites or {},
        spend=budget_spend(session, tenancy, now),
    )


def budget_spend(session: Session, tenancy: Tenancy, now: datetime, only: set[str] | None = None) -> dict[str, Spend]:
    """Each budgeted tenant's spend (`only`: of these tenants) over its budget's period (a
    rolling window), in dollars and GPU-hours: on the cloud (`_cloud_spend`) and, when the
    budget covers all spend, elsewhere (the ledger, plus the part of running attempts it has not
    metered yet)."""
    budgets = {
        name: t.budget for name, t in tenancy.tenants.items() if t.budget is not None and (only is None or name in only)
    }
    if not budgets:
        return {}
    clouds = {
        f.backend: tenancy.sites[f.site] for f in tenancy.flavors.values() if f.site and tenancy.is_cloud_site(f.site)
    }
    cloud = _cloud_spend(session, budgets, clouds, now)
    everything = {t for t, b in budgets.items() if b.covers == "all"}
    rest = _ledger_spend(session, tenancy, {t: budgets[t] for t in everything}, set(clouds), now) if everything else {}
    spend = {}
    for tenant, budget in budgets.items():
        usd, gpu_s = cloud.get(tenant, (0.0, 0.0))
        more_usd, more_gpu_s = rest.get(tenant, (0.0, 0.0))
        spend[tenant] = Spend(budget, usd + more_usd, (gpu_s + more_gpu_s) / 3600)
    return spend


def _cloud_spend(session: Session, budgets: dict, clouds: dict, now: datetime) -> dict[str, tuple[float, float]]:
    """(dollars, GPU-seconds) on cloud sites per tenant: every attempt on a cloud site's
    backend, at its share of the cloud's own bill once attributed (`cloudbill`), else as the
    cloud bills it: from the request for its nodes (submit) to its end plus the site's idle
    tail, at the site's price."""
    if not clouds:
        return {}
    since = now - timedelta(seconds=max(b.seconds for b in budgets.values()))
    query = (
        select(Job.tenant, Job.gpus, Attempt.backend, Attempt.submitted_at, Attempt.ended_at, Attempt.cloud_usd)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(
            Attempt.backend.in_(clouds),
            Attempt.submitted_at.is_not(None),
            Job.tenant.in_(budgets),
            or_(Attempt.ended_at.is_(None), Attempt.ended_at > since),
        )
    )
    spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    t = now.timestamp()
    for tenant, gpus, backend, submitted, ended, billed in session.execute(query):
        site = clouds[backend]
        start = max(submitted.timestamp(), t - budgets[tenant].seconds)
        end = ended.timestamp() + site.idle_tail_s if ended else t
        gpu_s = gpus * max(0.0, min(end, t) - start)
        spent[tenant][1] += gpu_s
        # its share of the cloud's own bill once attributed (cloudbill), else the price
        spent[tenant][0] += billed if billed is not None and ended is not None else gpu_s / 3600 * site.gpu_hour_usd
    return {tenant: (usd, gpu_s) for tenant, (usd, gpu_s) in spent.items()}


def _ledger_spend(
    session: Session, tenancy: Tenancy, budgets: dict, clouds: set[str], now: datetime
) -> dict[str, tuple[float, float]]:
    """(dollars, GPU-seconds) per tenant off the cloud within each budget's period: whole clock
    hours from the ledger's hourly sums, the period's first partial hour from its rows, and
    running attempts from where the ledger stops to now. A week costs ~170 sums, not every row."""
    spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def add(tenant: str, gpus: int, start: datetime, end: datetime, price: float, since: datetime) -> None:
        seconds = max(0.0, (end - max(start, since)).total_seconds())
        spent[tenant][0] += gpus * seconds / 3600 * price
        spent[tenant][1] += gpus * seconds

    for tenant, budget in budgets.items():
        since = now - timedelta(seconds=budget.seconds)
        first_hour = since.replace(minute=0, second=0, microsecond=0)
        if first_hour < since:
            first_hour += timedelta(hours=1)
        whole = select(func.sum(LedgerHour.usd), func.sum(LedgerHour.gpu_s)).where(
            LedgerHour.tenant == tenant, LedgerHour.hour >= first_hour, LedgerHour.backend.not_in(clouds)
        )
        usd, gpu_s = session.execute(whole).one()
        spent[tenant][0] += usd or 0.0
        spent[tenant][1] += gpu_s or 0.0
        partial = select(LedgerRow.gpus, LedgerRow.start, LedgerRow.end, LedgerRow.usd_per_gpu_hour).where(
            LedgerRow.tenant == tenant,
            LedgerRow.end > since,
            LedgerRow.end <= first_hour,  # rows never cross a clock hour (metering cuts them)
            LedgerRow.backend.not_in(clouds),
        )
        for gpus, start, end, price in session.execute(partial):
            add(tenant, gpus, start, end, price, since)
    running = (
        select(Job.tenant, Job.gpus, Job.flavor, Attempt.held_from, Attempt.metered_until)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(
            Job.tenant.in_(budgets),
            Attempt.state.in_(ACTIVE_ATTEMPT_STATES),
            Attempt.held_from.is_not(None),
            Attempt.backend.not_in(clouds),
        )
    )
    for tenant, gpus, flavor, held_from, metered_until in session.execute(running):
        price = tenancy.price_of(flavor) if flavor in tenancy.flavors else 0.0
        since = now - timedelta(seconds=budgets[tenant].seconds)
        add(tenant, gpus, metered_until or held_from, now, price, since)
    return {tenant: (usd, gpu_s) for tenant, (usd, gpu_s) in spent.items()}


class PendingFeed:
    """What changed among the waiting jobs since the last read, for the admission engine, which
    keeps them (`scheduling.engine`). A full read (on start, after a tenancy change, and every
    resync as a safety net) takes the ids of all waiting jobs from the phase index in one query
    and loads the columns of the new ones in one more; between them, a read looks only at the
    jobs with an event since the last one it saw (a submit, a cancel, a phase change all write
    one), so its cost follows what changed, not what waits. Event ids may commit out of order
    on PostgreSQL (concurrent writers): each read looks `MARGIN` ids back, and the resync
    catches anything older. A job's workload does not change while it waits (its attained
    service and queued_at change only when an attempt ends, i.e. after it was admitted)."""

    MARGIN = 1000  # event ids re-read behind the newest seen

    def __init__(self) -> None:
        self._last_event: int | None = None
        self._seen: set[int] = set()  # event ids read within MARGIN of the newest

    def full(self, session: Session, tenancy: Tenancy, known: Collection[str]) -> tuple[list[Workload], set[str]]:
        """(new waiting jobs, ids no longer waiting), against `known`, from every waiting job."""
        self._last_event, self._seen = session.scalar(select(func.max(Event.id))) or 0, set()
        if not known:  # a start: every waiting job in one pass, one query per table
            return _workloads(session, tenancy, _WAITING), set()
        waiting = set(session.scalars(select(Job.id).where(_WAITING)))
        return _by_ids(session, tenancy, waiting - set(known)), set(known) - waiting

    def since(self, session: Session, tenancy: Tenancy, known: Collection[str]) -> tuple[list[Workload], set[str]]:
        """The same, from the jobs with an event not read before only (the margin's events are
        read again, but a job counts as touched once per event)."""
        if self._last_event is None:
            return self.full(session, tenancy, known)
        floor = self._last_event - self.MARGIN
        rows = session.execute(select(Event.id, Event.job_id).where(Event.id > floor)).all()
        touched = {job_id for event_id, job_id in rows if event_id not in self._seen}
        self._last_event = max([self._last_event, *(event_id for event_id, _ in rows)])
        floor = self._last_event - self.MARGIN
        self._seen = {event_id for event_id, _ in rows if event_id > floor}
        if not touched:
            return [], set()
        waiting = _still_waiting(session, sorted(touched))
        new = {job_id for job_id in waiting if job_id not in known}
        gone = {job_id for job_id in touched - waiting if job_id in known}
        return _by_ids(session, tenancy, new), gone


BATCH = 500  # ids per IN list (SQLite binds at most 32766 parameters a statement)
_WAITING = (Job.phase == Phase.PENDING) & Job.cancel_requested.is_(False)


def _still_waiting(session: Session, ids: list[str]) -> set[str]:
    """Which of `ids` wait, found by primary key (a condition on the phase too would let the
    database scan the phase index: every waiting job)."""
    found = set()
    for start in range(0, len(ids), BATCH):
        batch = select(Job.id, Job.phase, Job.cancel_requested).where(Job.id.in_(ids[start : start + BATCH]))
        found |= {job_id for job_id, phase, cancel in session.execute(batch) if phase == Phase.PENDING and not cancel}
    return found


def _by_ids(session: Session, tenancy: Tenancy, ids: Collection[str]) -> list[Workload]:
    ids = sorted(ids)
    return [
        workload
        for start in range(0, len(ids), BATCH)
        for workload in _workloads(session, tenancy, Job.id.in_(ids[start : start + BATCH]))
    ]


def _workloads(session: Session, tenancy: Tenancy, which: ColumnElement[bool]) -> list[Workload]:
    """A job may use its queue's flavors on the backend its spec was shaped for, or, with a
    choice of sites (`jobs.placement`), on each of those backends; it reads its datasets and
    its newest checkpoint where they are. Its attained service (ended attempts) and when it
    last joined the queue (its newest attempt's end; none: when submitted) do not change while
    it waits, so the engine may keep them. `which`: the jobs, as a condition on Job (one query
    per table, however many jobs)."""
    query = _waiting_rows(which)
    flavors: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}
    checkpoints = _newest_checkpoints(session, tenancy, which)
    queues = tenancy.cluster_queues
    out = []
    # Core rows, not ORM ones, and times as epoch seconds from the database: a restart reads
    # every waiting job here, 100k of them in one pass
    for (
        job_id,
        cq,
        gpus,
        priority,
        created,
        backend,
        tenant,
        cpus,
        memory,
        placement,
        attained,
        timeout,
        queued,
    ) in session.connection().execute(query):
        if cq not in queues:
            continue  # its queue was removed: it waits until an admin restores it (reason set at submit)
        placement = _placement(placement)
        backends = tuple(placement.get("backends") or (backend,))
        key = (cq, backends)
        if key not in flavors:
            flavors[key] = tuple(f for f in tenancy.flavors_for(cq) if tenancy.flavors[f].backend in backends)
        data = tuple((site, float(gb)) for site, gb in placement.get("data", ()))
        if job_id in checkpoints:
            data += (checkpoints[job_id],)
        out.append(
            Workload(
                job_id,
                cq,
                gpus,
                priority,
                created,
                flavors[key],
                tenant,
                cpus,
                memory,
                data,
                float(placement.get("runtime_s", 3600.0)),
                attained,
                queued,
                (timeout or DEFAULT_TIMEOUT_MIN) * 60,
            )
        )
    return out


def _waiting_rows(which: ColumnElement[bool]) -> Select:
    """One row per job of `which`: the columns a Workload needs, times as epoch seconds."""
    # per job, by the attempts' job_id index (a grouped join over the waiting jobs' attempts
    # cost SQLite a third more at 100k)
    requeued = select(epoch_seconds(func.max(Attempt.ended_at))).where(Attempt.job_id == Job.id).scalar_subquery()
    return select(
        Job.id,
        Job.cluster_queue,
        Job.gpus,
        Job.priority,
        epoch_seconds(Job.created_at),
        Job.backend,
        Job.tenant,
        Job.cpus,
        Job.memory_mb,
        cast(Job.placement, Text),  # decoded once per distinct text (`_placement`)
        Job.attained_gpu_s,
        Job.spec_json[("resources", "timeout_min")].as_float(),
        requeued,
    ).where(which)


@lru_cache(maxsize=4096)
def _placement(text: str | None) -> dict:
    """A job's stored placement (read-only): most jobs share a handful of texts, or have none."""
    return (json.loads(text) if text else None) or {}


def _newest_checkpoints(session: Session, tenancy: Tenancy, which: ColumnElement[bool]) -> dict[str, tuple[str, float]]:
    """(site, GB) of each job's newest checkpoint, for jobs that have one at a site."""
    site_of = {spec.backend: spec.site for spec in tenancy.flavors.values() if spec.site is not None}
    if not site_of:
        return {}
    query = (
        select(Attempt.job_id, Attempt.backend, Attempt.checkpoint_bytes)
        .join(Job, Job.id == Attempt.job_id)
        .where(which, Attempt.checkpoint_bytes.is_not(None))
        .order_by(Attempt.number)
    )
    found = {}
    for job_id, backend, size in session.execute(query):
        if backend in site_of:
            found[job_id] = (site_of[backend], size / 1e9)
    return found


def holders(session: Session) -> list[Holder]:
    query = select(Job).where(Job.phase.in_(QUOTA_HOLDING_PHASES), Job.flavor.is_not(None))
    return [holder_of(job) for job in session.scalars(query)]


def short_share_loans(
    session: Session, tenancy: Tenancy, now: datetime
) -> dict[tuple[str, str], list[tuple[str, int]]]:
    """(tree root, flavor) -> the (job, GPUs) its short-work share lends to now (still at level 0)."""
    service = Service(tenancy.ordering, tenancy.resource_weights, now.timestamp())
    query = select(Job).where(Job.phase.in_(QUOTA_HOLDING_PHASES), Job.flavor.is_not(None), Job.short_share)
    loans: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for h in on_short_share((holder_of(job) for job in session.scalars(query)), service):
        if h.cluster_queue in tenancy.cluster_queues:
            loans[tenancy.root_of(h.cluster_queue), h.flavor].append((h.job_id, h.gpus))
    return loans


def holder_of(job: Job) -> Holder:
    """A job that holds quota; its attained service is its ended attempts' (not the current one's)."""
    attempt = job.attempts[-1] if job.attempts else None
    started = attempt.started_at if attempt and attempt.started_at else None
    timeout_s = job.spec.resources.timeout_min * 60
    return Holder(
        job.id,
        job.cluster_queue,
        job.flavor,
        job.gpus,
        job.priority,
        started.timestamp() if started else None,
        attempt.last_checkpoint_at.timestamp() if attempt and attempt.last_checkpoint_at else None,
        started.timestamp() + timeout_s if started else None,
        job.preempt_deadline is not None,
        job.tenant,
        job.cpus,
        job.memory_mb,
        attained=job.attained_gpu_s or 0.0,
        preemptions=sum(a.fault is Fault.PREEMPTION for a in job.attempts),
        owner=job.owner,
        name=job.spec.title or job.name or "",  # as the job is shown (JobView.title)
        short_share=job.short_share,
    )


def history(session: Session, now: datetime, half_life_s: float, weights: ResourceWeights) -> dict[str, float]:
    """Recent average use per cluster queue in GPU-equivalents (`weights`), decayed with the
    half-life: the attempts that run and those that ended within HISTORY_HALF_LIVES (two
    indexed reads, not all attempts)."""
    if half_life_s <= 0:
        return {}
    since = now - timedelta(seconds=HISTORY_HALF_LIVES * half_life_s)
    columns = select(Job.cluster_queue, Job.gpus, Job.cpus, Job.memory_mb, Attempt.started_at, Attempt.ended_at).join(
        Attempt, Attempt.job_id == Job.id
    )
    running = columns.where(Attempt.state.in_(ACTIVE_ATTEMPT_STATES), Attempt.ended_at.is_(None))
    recent = columns.where(Attempt.ended_at > since)
    decayed: dict[str, float] = defaultdict(float)
    t = now.timestamp()
    for query in (running, recent):
        for cq, gpus, cpus, memory, started, ended in session.execute(query.where(Attempt.started_at.is_not(None))):
            end = ended.timestamp() if ended else t
            size = Amounts(gpus, cpus, memory).weight(weights)
            decayed[cq] += decayed_gpu_seconds(size, started.timestamp(), end, t, half_life_s)
    return {cq: average_gpus(value, half_life_s) for cq, value in decayed.items()}


def node_faults(session: Session, since: datetime) -> dict[str, list[tuple[str, datetime]]]:
    """node -> (job, when) for each infrastructure fault that blamed it since `since`."""
    query = select(Attempt.job_id, Attempt.failed_nodes, Attempt.ended_at).where(
        Attempt.fault == Fault.INFRASTRUCTURE, Attempt.ended_at > since
    )
    found: dict[str, list[tuple[str, datetime]]] = defaultdict(list)
    for job_id, nodes, ended in session.execute(query):
        for node in nodes or []:
            found[node].append((job_id, ended))
    return found


def gpu_hours(session: Session, now: datetime, ended: dict[str, QueueTotal]) -> dict[str, float]:
    """GPU-hours per cluster queue: ended attempts from the queue totals, running ones here."""
    hours: dict[str, float] = defaultdict(float)
    for cq, total in ended.items():
        hours[cq] += total.ended_gpu_seconds / 3600
    running = (
        select(Job.cluster_queue, Job.gpus, Attempt.started_at)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Attempt.state.in_(ACTIVE_ATTEMPT_STATES), Attempt.started_at.is_not(None), Attempt.ended_at.is_(None))
    )
    for cq, gpus, started in session.execute(running):
        hours[cq] += gpus * (now - started).total_seconds() / 3600
    return hours


def flavor_gpu_hours(session: Session) -> dict[str, float]:
    """GPU-hours held on each flavor so far, every desk's: the cost ledger's hours (what metering
    has written: ended attempts, and running ones up to its last pass)."""
    rows = select(LedgerHour.flavor, func.sum(LedgerHour.gpu_s)).group_by(LedgerHour.flavor)
    return {flavor: (gpu_s or 0.0) / 3600 for flavor, gpu_s in session.execute(rows)}


def queue_usage(
    session: Session,
    tenancy: Tenancy,
    now: datetime,
    half_life_s: float,
    only: set[str] | None = None,
    backends: set[str] | None = None,
) -> list[QueueUsage]:
    """Quota, use and pressure per cluster queue (`only`: these queues; `backends`: only the
    flavors of these backends, the ones this deployment runs)."""
    held: dict[tuple[str, str], Amounts] = defaultdict(Amounts)
    for h in holders(session):
        held[h.cluster_queue, h.flavor] = held[h.cluster_queue, h.flavor].plus(h.demand)
    counted = totals.read(session)
    recent = history(session, now, half_life_s, tenancy.resource_weights)
    hours = gpu_hours(session, now, counted)
    out = []
    for name, cq in tenancy.cluster_queues.items():
        if only is not None and name not in only:
            continue
        flavors = [
            FlavorUsage(
                flavor=f,
                backend=tenancy.flavors[f].backend,
                nominal=q.nominal,
                borrowing_limit=q.borrowing_limit,
                lending_limit=q.lending_limit,
                used=held[name, f].gpu,
                borrowed=max(0, held[name, f].gpu - q.nominal),
                cpus_used=held[name, f].cpu,
                cpu_nominal=q.cpu.nominal if q.cpu else None,
                memory_mb_used=held[name, f].memory,
                memory_mb_nominal=q.memory.nominal if q.memory else None,
            )
            for f, q in cq.quotas.items()
            if backends is None or tenancy.flavors[f].backend in backends
        ]
        out.append(
            QueueUsage(
                cluster_queue=name,
                cohort=cq.cohort,
                weight=cq.weight,
                flavors=flavors,
                pending_jobs=counted[name].pending_jobs if name in counted else 0,
                pending_gpus=counted[name].pending_gpus if name in counted else 0,
                pending_cpus=counted[name].pending_cpus if name in counted else 0,
                recent_gpus=round(recent.get(name, 0.0), 3),
                gpu_hours=round(hours.get(name, 0.0), 4),
            )
        )
    return out
