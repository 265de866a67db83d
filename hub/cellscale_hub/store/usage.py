"""The store as admission and reports see it: the snapshot one scheduling cycle decides on
(columns only, so a queue of 100k jobs stays cheap to read), the quota usage desks and
admins see, and a pending reason as the wire shows it."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from cellscale.spec import AheadView, FlavorUsage, PendingView, QueueUsage
from cellscale.vocabulary import QUOTA_HOLDING_PHASES, Fault, Phase
from cellscale_hub.scheduling.admission import Holder, PendingReason, Snapshot, Workload
from cellscale_hub.scheduling.fairshare import average_gpus, decayed_gpu_seconds
from cellscale_hub.store.models import Attempt, Job
from cellscale_hub.tenancy import Tenancy

HISTORY_HALF_LIVES = 8  # older use weighs under 0.4%: not worth reading


def snapshot(
    session: Session, tenancy: Tenancy, capacity: dict[str, int], now: datetime, half_life_s: float
) -> Snapshot:
    return Snapshot(
        tenancy=tenancy,
        capacity=capacity,
        holders=tuple(holders(session)),
        pending=tuple(pending_workloads(session, tenancy)),
        history=history(session, now, half_life_s),
        now=now.timestamp(),
    )


def pending_workloads(session: Session, tenancy: Tenancy) -> list[Workload]:
    """Columns only (no ORM objects, no spec): a queue of 100k jobs stays cheap to read. A
    job may use its queue's flavors on the backend its spec was shaped for."""
    query = select(Job.id, Job.cluster_queue, Job.gpus, Job.priority, Job.created_at, Job.backend, Job.tenant).where(
        Job.phase == Phase.PENDING, Job.cancel_requested.is_(False)
    )
    out = []
    for row in session.execute(query):
        if row.cluster_queue not in tenancy.cluster_queues:
            continue  # its queue was removed: it waits until an admin restores it (reason set at submit)
        flavors = tuple(tenancy.flavors_for(row.cluster_queue, row.backend))  # shaped for this backend
        out.append(
            Workload(row.id, row.cluster_queue, row.gpus, row.priority, row.created_at.timestamp(), flavors, row.tenant)
        )
    return out


def holders(session: Session) -> list[Holder]:
    query = select(Job).where(Job.phase.in_(QUOTA_HOLDING_PHASES), Job.flavor.is_not(None))
    return [holder_of(job) for job in session.scalars(query)]


def holder_of(job: Job) -> Holder:
    attempt = job.attempts[-1] if job.attempts else None
    started = attempt.started_at if attempt and attempt.started_at else None
    timeout_s = job.spec.get("resources", {}).get("timeout_min", 60) * 60
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
    )


def history(session: Session, now: datetime, half_life_s: float) -> dict[str, float]:
    """Recent average GPUs per cluster queue, decayed with the half-life."""
    if half_life_s <= 0:
        return {}
    since = now - timedelta(seconds=HISTORY_HALF_LIVES * half_life_s)
    query = (
        select(Job.cluster_queue, Job.gpus, Attempt.started_at, Attempt.ended_at)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Attempt.started_at.is_not(None), or_(Attempt.ended_at.is_(None), Attempt.ended_at > since))
    )
    decayed: dict[str, float] = defaultdict(float)
    t = now.timestamp()
    for cq, gpus, started, ended in session.execute(query):
        end = ended.timestamp() if ended else t
        decayed[cq] += decayed_gpu_seconds(gpus, started.timestamp(), end, t, half_life_s)
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


def gpu_hours(session: Session, now: datetime) -> dict[str, float]:
    """GPU-hours per cluster queue: ended attempts summed by the database (one row per queue,
    however many jobs are stored), running ones here."""
    seconds = _seconds_between(session, Attempt.started_at, Attempt.ended_at)
    ended = (
        select(Job.cluster_queue, func.sum(Job.gpus * seconds))
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Attempt.started_at.is_not(None), Attempt.ended_at.is_not(None))
        .group_by(Job.cluster_queue)
    )
    hours: dict[str, float] = defaultdict(float)
    for cq, total in session.execute(ended):
        hours[cq] += float(total or 0) / 3600
    running = (
        select(Job.cluster_queue, Job.gpus, Attempt.started_at)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Attempt.started_at.is_not(None), Attempt.ended_at.is_(None))
    )
    for cq, gpus, started in session.execute(running):
        hours[cq] += gpus * (now - started).total_seconds() / 3600
    return hours


def _seconds_between(session: Session, start, end):
    """SQL for `end - start` in seconds, on the store's dialect."""
    if session.get_bind().dialect.name == "postgresql":
        return func.extract("epoch", end - start)
    return (func.julianday(end) - func.julianday(start)) * 86400.0


def queue_usage(
    session: Session, tenancy: Tenancy, now: datetime, half_life_s: float, only: set[str] | None = None
) -> list[QueueUsage]:
    """Quota, use and pressure per cluster queue (`only`: these queues)."""
    held: dict[tuple[str, str], int] = defaultdict(int)
    for h in holders(session):
        held[h.cluster_queue, h.flavor] += h.gpus
    waiting = {
        cq: (count, gpus)
        for cq, count, gpus in session.execute(
            select(Job.cluster_queue, func.count(), func.sum(Job.gpus))
            .where(Job.phase == Phase.PENDING)
            .group_by(Job.cluster_queue)
        )
    }
    recent, hours = history(session, now, half_life_s), gpu_hours(session, now)
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
                used=held[name, f],
                borrowed=max(0, held[name, f] - q.nominal),
            )
            for f, q in cq.quotas.items()
        ]
        out.append(
            QueueUsage(
                cluster_queue=name,
                cohort=cq.cohort,
                weight=cq.weight,
                flavors=flavors,
                pending_jobs=waiting.get(name, (0, 0))[0],
                pending_gpus=int(waiting.get(name, (0, 0))[1] or 0),
                recent_gpus=round(recent.get(name, 0.0), 3),
                gpu_hours=round(hours.get(name, 0.0), 4),
            )
        )
    return out


def pending_view(reason: PendingReason) -> PendingView:
    return PendingView(
        code=reason.code,
        message=reason.message,
        position=reason.position,
        flavor=reason.flavor,
        needs=reason.needs,
        available=reason.available,
        ahead=[
            AheadView(job_id=a.job_id, cluster_queue=a.cluster_queue, gpus=a.gpus, why=a.why) for a in reason.ahead[:10]
        ],
        estimated_start=datetime.fromtimestamp(reason.estimated_start).astimezone() if reason.estimated_start else None,
    )
