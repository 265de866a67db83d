"""Queries and changes on jobs, attempts and events, shared by the API and the controller.
Every phase change goes through `transition`, which writes its event row in the same
transaction."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from datetime import UTC, datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from cellscale.spec import (
    AttemptView,
    CostEstimate,
    EventView,
    IoProfileView,
    JobCost,
    JobView,
    PendingView,
)
from cellscale.vocabulary import ACTIVE_ATTEMPT_STATES, ACTIVE_PHASES, TERMINAL_PHASES, EventKind, EventReason, Phase
from cellscale_hub.lifecycle import check_transition
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.store import totals
from cellscale_hub.store.db import ENDED
from cellscale_hub.store.models import Attempt, Event, Job, utcnow
from cellscale_hub.store.points import sweep_progress
from cellscale_hub.tenancy import ResourceWeights

MAX_ID = 2**31 - 1
"""The largest integer id (an Integer column: 32 bits on PostgreSQL)."""


class IdempotencyConflict(ValueError):
    pass


def insert_job(session: Session, job: Job) -> tuple[Job, bool]:
    """Store a new job, or return the one this owner already made with the same key. The insert
    is tried first and the key looked up only when the unique (owner, key) refuses it: a retried
    submit is rare, and a look-up before every insert was one more statement on every submit."""
    try:
        with session.begin_nested():
            session.add(job)
            session.flush()  # the job's row before its event's (no relationship orders them)
            add_event(
                session,
                job,
                kind=EventKind.PHASE,
                to_phase=job.phase,
                reason=EventReason.Submitted,
                actor=job.owner,
                message=f"submitted to queue {job.queue} on backend {job.backend}",
            )
        if job.phase is Phase.PENDING:
            totals.note_pending(session, job.cluster_queue, 1, job.gpus, job.cpus or 0)
        return job, True
    except IntegrityError:  # the key was used before (or by a concurrent retry of this submit)
        existing = find_by_key(session, job.owner, job.idempotency_key)
        if existing is None:
            raise
    if existing.spec_json != job.spec_json:
        raise IdempotencyConflict(
            f"idempotency key {job.idempotency_key!r} was already used for a different job ({existing.id}); "
            "use a new key for a new job"
        )
    return existing, False


def find_by_key(session: Session, owner: str, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.owner == owner, Job.idempotency_key == key))


def add_event(
    session: Session,
    job: Job,
    *,
    kind: EventKind,
    attempt: int | None = None,
    from_phase: Phase | None = None,
    to_phase: Phase | None = None,
    reason: EventReason | None = None,
    message: str | None = None,
    actor: str | None = None,
) -> None:
    session.add(
        Event(
            job_id=job.id,
            kind=kind,
            attempt=attempt,
            from_phase=from_phase,
            to_phase=to_phase,
            reason=reason,
            message=message,
            actor=actor,
            at=utcnow(),
        )
    )


def transition(
    session: Session,
    job: Job,
    target: Phase,
    reason: EventReason,
    *,
    actor: str = "controller",
    attempt: int | None = None,
    message: str | None = None,
) -> None:
    current = job.phase
    if current is target:
        return
    check_transition(current, target)
    if Phase.PENDING in (current, target):
        sign = 1 if target is Phase.PENDING else -1
        totals.note_pending(session, job.cluster_queue, sign, sign * job.gpus, sign * (job.cpus or 0))
    job.phase, job.reason, job.updated_at = target, message or reason, utcnow()
    if target is Phase.RUNNING and job.started_at is None:
        job.started_at = job.updated_at
    if target.terminal:
        job.finished_at = job.updated_at
        session.info.setdefault(ENDED, set()).add(job.id)  # announced once committed (Store.on_job_end)
    add_event(
        session,
        job,
        kind=EventKind.PHASE,
        attempt=attempt,
        from_phase=current,
        to_phase=target,
        reason=reason,
        message=message,
        actor=actor,
    )


def active_attempts(session: Session, backend: str) -> list[Attempt]:
    query = select(Attempt).where(Attempt.backend == backend, Attempt.state.in_(ACTIVE_ATTEMPT_STATES))
    return list(session.scalars(query.options(selectinload(Attempt.job)).order_by(Attempt.id)))


def attempts_since(session: Session, backend: str, since: datetime) -> list[Attempt]:
    """The backend's attempts that ran or were submitted since `since` (ended ones through the
    ended_at index)."""
    query = select(Attempt).where(
        Attempt.backend == backend,
        Attempt.submitted_at.is_not(None),
        or_(Attempt.ended_at.is_(None), Attempt.ended_at > since),
    )
    return list(session.scalars(query.options(selectinload(Attempt.job)).order_by(Attempt.id)))


def bundles_in_use(session: Session, succeeded_since: datetime | None = None) -> dict[str, set[str]]:
    """owner → the input bundles their waiting or running jobs were submitted with, and those
    of jobs that succeeded after `succeeded_since` (kept so `%cluster promote` can save them)
    (the few jobs with inputs, from their index: not every job's spec)."""
    used: dict[str, set[str]] = {}
    wanted = Job.phase.not_in(TERMINAL_PHASES)
    if succeeded_since is not None:
        wanted = or_(wanted, and_(Job.phase == Phase.SUCCEEDED, Job.finished_at >= succeeded_since))
    query = select(Job.owner, Job.inputs_sha256).where(Job.inputs_sha256.is_not(None), wanted)
    for owner, sha256 in session.execute(query):
        used.setdefault(owner, set()).add(sha256)
    return used


def preemption_due(session: Session, now: datetime) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.preempt_deadline.is_not(None), Job.preempt_deadline <= now)))


def cancel_requested_active(session: Session) -> list[Job]:
    query = select(Job).where(Job.cancel_requested.is_(True), Job.phase.in_(ACTIVE_PHASES))
    return list(session.scalars(query))


def list_jobs(
    session: Session,
    *,
    owners: Iterable[str] | None,
    tenants: Iterable[str] | None,
    phase: Phase | None,
    name: str | None,
    limit: int,
    cursor: str | None,
    key: str | None = None,
) -> tuple[list[Job], str | None]:
    """Newest first, keyset-paginated. `owners`/`tenants` of None mean no restriction; `key`:
    only the job submitted with that idempotency key."""
    query = select(Job)
    if key is not None:
        query = query.where(Job.idempotency_key == key)
    if owners is not None:
        query = query.where(Job.owner.in_(list(owners)))
    if tenants is not None:
        query = query.where(Job.tenant.in_(list(tenants)))
    if phase:
        query = query.where(Job.phase == phase)
    if name:
        query = query.where(Job.name.contains(name, autoescape=True))
    if cursor:
        at, job_id = decode_cursor(cursor)
        query = query.where(or_(Job.created_at < at, and_(Job.created_at == at, Job.id < job_id)))
    rows = list(session.scalars(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1]) if more and rows else None


def encode_cursor(job: Job) -> str:
    return base64.urlsafe_b64encode(f"{job.created_at.isoformat()}|{job.id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """A cursor's position; ValueError for one this server did not return (its date must be
    an aware one that UTC can express, its job id one a job can have)."""
    try:
        at, job_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        when = datetime.fromisoformat(at)
        if when.tzinfo is None or not _CURSOR_JOB_ID.match(job_id):
            raise ValueError(cursor)
        return when.astimezone(UTC), job_id
    except (ValueError, OverflowError) as exc:
        raise ValueError("cursor is not one this server returned") from exc


_CURSOR_JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def events_of(session: Session, job_id: str, after: int = 0) -> list[Event]:
    after = min(after, MAX_ID)  # no id is larger; PostgreSQL refuses a larger bound for its column
    query = select(Event).where(Event.job_id == job_id, Event.id > after).order_by(Event.id)
    return list(session.scalars(query))


def attempt_service_s(job: Job, attempt: Attempt, weights: ResourceWeights, now: datetime | None = None) -> float:
    """The service one attempt received, in GPU-equivalent seconds (what least-attained-service
    ordering counts, `jobs.attained_gpu_s` sums over ended attempts): the seconds it held its
    allocation, the backend's own held_from→held_until when known, else started_at→ended_at,
    times the job's weight under `weights` (as fair share's history weighs it). An attempt that
    never started received none; one still running counts up to `now` (None: none of it)."""
    start = attempt.held_from or attempt.started_at
    end = attempt.held_until if attempt.held_from is not None and attempt.held_until else attempt.ended_at
    end = end or now
    if start is None or end is None:
        return 0.0
    held_s = max(0.0, (end - start).total_seconds())
    return held_s * Amounts(job.gpus, job.cpus or 0, job.memory_mb or 0).weight(weights)


def job_view(job: Job, waiting: PendingView | None = None, weights: ResourceWeights | None = None) -> JobView:
    """The job as the API shows it; `waiting`: why it waits, when it is pending (the
    newest admission cycle's reason, from the WaitingBoard); `weights`: the tenancy's resource
    weights (its running attempt's service so far; None: the default weights)."""
    waiting = waiting if job.phase is Phase.PENDING else None
    running = next((a for a in reversed(job.attempts) if a.ended_at is None), None)
    service_s = (job.attained_gpu_s or 0.0) + (
        attempt_service_s(job, running, weights or ResourceWeights(), utcnow()) if running else 0.0
    )
    return JobView(
        id=job.id,
        name=job.name,
        owner=job.owner,
        tenant=job.tenant,
        queue=job.queue,
        backend=job.backend,
        cluster_queue=job.cluster_queue,
        flavor=job.flavor,
        priority=job.priority,
        borrowed=job.borrowed,
        short_share=job.short_share,
        phase=job.phase,
        reason=waiting.message if waiting else job.reason,
        spec=job.spec,
        pending=waiting,
        preempting=job.preempt_deadline is not None,
        excluded_nodes=list(job.excluded_nodes or []),
        created_at=job.created_at,
        updated_at=job.updated_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        cancel_requested=job.cancel_requested,
        result_available=job.result_available,
        attempts=[attempt_view(a) for a in job.attempts],
        estimate=CostEstimate.model_validate(job.estimate) if job.estimate else None,
        cost=job_cost(job),
        io=io_view(job),
        service_gpu_hours=service_s / 3600,
        sweep=sweep_progress(job),
    )


def io_view(job: Job) -> IoProfileView | None:
    """The I/O profile of its newest attempt that has one (None: none read through cellscale.datasets)."""
    profiled = next((a for a in reversed(job.attempts) if a.io is not None), None)
    return IoProfileView.model_validate(profiled.io) if profiled else None


def job_cost(job: Job) -> JobCost | None:
    """What the ledger has for the job so far: its attempts' allocations, use and dollars."""
    held = [a for a in job.attempts if a.held_from is not None and a.metered_until is not None]
    if not held:
        return None
    held_s = sum((a.metered_until - a.held_from).total_seconds() for a in held)
    gpu_s = job.gpus * held_s
    usd = sum(a.cloud_usd if a.cloud_usd is not None else (a.usd or 0.0) for a in held)
    known = all(a.gpu_used_s is not None for a in held)
    used = sum(a.gpu_used_s or 0.0 for a in held) / gpu_s if known and gpu_s > 0 else None
    idle = usd * (1 - used) if used is not None else None
    words = f"{job.gpus} GPU × {span_words(held_s)} = {gpu_s / 3600:.2f} GPU-h"
    if used is not None:
        words += f", {used:.0%} used"
    words += f", ${usd:,.2f}" + (f" (${idle:,.2f} idle)" if idle is not None else "")
    return JobCost(
        gpu_hours=gpu_s / 3600,
        used_fraction=used,
        usd=usd,
        idle_usd=idle,
        cpu_hours=sum(a.cpu_s or 0.0 for a in held) / 3600,
        memory_peak_bytes=max((a.memory_peak_bytes or 0 for a in held), default=None) or None,
        words=words,
    )


def attempt_view(a: Attempt) -> AttemptView:
    return AttemptView(
        number=a.number,
        backend=a.backend,
        backend_ref=a.backend_ref,
        state=a.state,
        gpu_ids=list(a.gpu_ids or []),
        submitted_at=a.submitted_at,
        started_at=a.started_at,
        ended_at=a.ended_at,
        exit_code=a.exit_code,
        end_reason=a.end_reason,
        last_heartbeat=a.last_heartbeat,
        last_checkpoint_at=a.last_checkpoint_at,
        fault=a.fault,
        failed_nodes=list(a.failed_nodes or []),
        last_step=a.last_step,
        nodes=list(a.nodes or []),
        cloud_usd=a.cloud_usd,
        held_from=a.held_from,
        held_until=a.held_until,
    )


def event_view(e: Event) -> EventView:
    return EventView(
        id=e.id,
        job_id=e.job_id,
        at=e.at,
        kind=e.kind,
        attempt=e.attempt,
        from_phase=e.from_phase,
        to_phase=e.to_phase,
        reason=e.reason,
        message=e.message,
        actor=e.actor,
    )


def span_words(seconds: float) -> str:
    """ "45 s", "12 min", "2.1 h"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"
