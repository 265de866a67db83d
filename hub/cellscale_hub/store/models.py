"""The control plane's tables. Changes go through an Alembic migration (store/migrations)."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator

from cellscale.spec import JobSpec
from cellscale.vocabulary import AttemptState, EventKind, EventReason, Fault, Phase, PointStatus
from cellscale_hub.store.specs import typed_spec


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC on every database (SQLite forgets the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class epoch_seconds(FunctionElement):  # noqa: N801 (a SQL function, named as one)
    """A UTCDateTime as seconds since the epoch, computed by the database: admission reads 100k
    submit times on a restart without parsing 100k datetimes in Python. SQLite stores them as
    text ('YYYY-MM-DD HH:MM:SS.ffffff', UTC); PostgreSQL as timestamptz."""

    type = Double()
    inherit_cache = True


@compiles(epoch_seconds, "sqlite")
def _epoch_sqlite(element, compiler, **kw) -> str:
    at = compiler.process(element.clauses, **kw)
    return f"(CAST(strftime('%s', {at}) AS REAL) + COALESCE(CAST(substr({at}, 20) AS REAL), 0.0))"


@compiles(epoch_seconds, "postgresql")
def _epoch_postgresql(element, compiler, **kw) -> str:
    return f"CAST(EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)}) AS DOUBLE PRECISION)"


class Vocabulary(TypeDecorator):
    """A column of one of cellscale's vocabularies (cellscale.vocabulary): stored as the
    value's string, as before the enums existed (no migration), read back as the enum. A
    value outside the vocabulary is refused on write."""

    impl = String
    cache_ok = True

    def __init__(self, enum: type[StrEnum], length: int):
        super().__init__(length)
        self.enum = enum

    def process_bind_param(self, value, dialect):
        return self.enum(value).value if value is not None else None

    def process_result_value(self, value, dialect):
        return self.enum(value) if value is not None else None


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        # the job lists (newest first, keyset-paged) of one user and of one desk: no sort of all their jobs
        Index("ix_jobs_owner_created", "owner", "created_at", "id"),
        Index("ix_jobs_tenant_created", "tenant", "created_at", "id"),
        Index("ix_jobs_owner_phase_created", "owner", "phase", "created_at", "id"),  # "my failed jobs"
        # each cycle asks for warned jobs whose grace is over: almost none, among every job stored
        Index("ix_jobs_preempt_deadline", "preempt_deadline"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(255), index=True)
    tenant: Mapped[str] = mapped_column(String(255), index=True)
    queue: Mapped[str] = mapped_column(String(63))
    backend: Mapped[str] = mapped_column(String(63), index=True)
    cluster_queue: Mapped[str | None] = mapped_column(String(63), index=True)
    flavor: Mapped[str | None] = mapped_column(String(63))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    borrowed: Mapped[int] = mapped_column(Integer, default=0)
    short_share: Mapped[bool] = mapped_column(Boolean, default=False)  # admitted on its cohort's short-work share
    name: Mapped[str] = mapped_column(String(63))
    # the JobSpec as submitted, as JSON (written once, at submit): read it typed, as `spec`
    spec_json: Mapped[dict] = mapped_column("spec", JSON)
    # a choice of sites: {"backends": [...], "data": [[site, GB], ...]} (routing.Route.stored)
    placement: Mapped[dict | None] = mapped_column(JSON)
    inputs_sha256: Mapped[str | None] = mapped_column(String(64), index=True)  # its inputs bundle, if any
    estimate: Mapped[dict | None] = mapped_column(JSON)  # what it was expected to cost at submit (CostEstimate)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    cpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    memory_mb: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # as asked with --mem (0: not)
    # the service its ended attempts received, GPU-equivalent seconds (held seconds × its weight
    # under the tenancy's resource_weights): least-attained-service ordering within a desk reads it
    attained_gpu_s: Mapped[float] = mapped_column(Double, default=0.0, server_default="0")
    phase: Mapped[Phase] = mapped_column(Vocabulary(Phase, 16), index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    preempt_deadline: Mapped[datetime | None] = mapped_column(UTCDateTime)  # warned: cancel at this time
    preempt_reason: Mapped[str | None] = mapped_column(Text)
    excluded_nodes: Mapped[list] = mapped_column(JSON, default=list)  # nodes that failed it: avoided
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    result_available: Mapped[bool] = mapped_column(Boolean, default=False)
    # the secret the job signs its outputs with (HMAC-SHA256), chosen by the submitting kernel,
    # which checks the tag before it unpickles them; never shown in any view
    result_key: Mapped[str | None] = mapped_column(String(64))
    # a sweep's points by status (SweepProgress's counts), kept by the controller as they change
    sweep: Mapped[dict | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="job", order_by="Attempt.number", cascade="all, delete-orphan", lazy="selectin"
    )

    @property
    def spec(self) -> JobSpec:
        """The stored spec, typed (validated once per process, not at every read: store/specs.py)."""
        return typed_spec(self.id, self.spec_json)

    @spec.setter
    def spec(self, spec: JobSpec) -> None:
        self.spec_json = spec.model_dump(mode="json")


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),
        # fair-share history and node faults read the attempts that ended recently, not all of them
        Index("ix_attempts_ended_at", "ended_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(63))
    backend_ref: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[AttemptState] = mapped_column(Vocabulary(AttemptState, 16), index=True)
    gpu_ids: Mapped[list] = mapped_column(JSON, default=list)
    submitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    end_reason: Mapped[str | None] = mapped_column(Text)
    last_heartbeat: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_checkpoint_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    checkpoint_bytes: Mapped[int | None] = mapped_column(BigInteger)  # of that newest checkpoint
    nodes: Mapped[list | None] = mapped_column(JSON)  # the nodes it held, once the backend placed it
    cloud_usd: Mapped[float | None] = mapped_column(Double)  # its share of a cloud pool's bill (cloudbill)
    fault: Mapped[Fault | None] = mapped_column(Vocabulary(Fault, 16))  # when it did not succeed
    failed_nodes: Mapped[list] = mapped_column(JSON, default=list)
    last_step: Mapped[int | None] = mapped_column(Integer)
    last_step_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # when last_step last changed
    resumed_step: Mapped[int | None] = mapped_column(Integer)  # reported by the job once it loaded a checkpoint
    # the cost ledger: the backend's own start and end of the allocation (Slurm's Start/End),
    # how far the ledger rows cover it, and what it used so far (its nodes' usage records, summed)
    flavor: Mapped[str | None] = mapped_column(String(63))  # the flavor it was admitted to (its price)
    held_from: Mapped[datetime | None] = mapped_column(UTCDateTime)
    held_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    metered_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    gpu_used_s: Mapped[float | None] = mapped_column(Double)  # None: unknown (no GPU sampler on its nodes)
    cpu_s: Mapped[float | None] = mapped_column(Double)
    memory_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    usd: Mapped[float | None] = mapped_column(Double)  # its allocation's cost so far (the ledger's sum)
    io: Mapped[dict | None] = mapped_column(JSON)  # its I/O profile once it ended (IoProfileView), if it read any

    job: Mapped[Job] = relationship(back_populates="attempts")


class QueueTotal(Base):
    """Per cluster queue, what the quota and admin reports add up, kept by the transactions
    that change it (store.totals): jobs and GPUs waiting, GPU-seconds of ended attempts."""

    __tablename__ = "queue_totals"

    cluster_queue: Mapped[str] = mapped_column(String(63), primary_key=True)
    pending_jobs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    pending_gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    pending_cpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    ended_gpu_seconds: Mapped[float] = mapped_column(Double, default=0.0, server_default="0")


class LedgerRow(Base):
    """One metering interval of one attempt: the GPUs it held from start to end, what it used
    of them (None: unknown) and the price then. Rows of an attempt tile its allocation."""

    __tablename__ = "ledger"
    __table_args__ = (Index("ix_ledger_tenant_end", "tenant", "end"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    tenant: Mapped[str] = mapped_column(String(255))
    owner: Mapped[str] = mapped_column(String(255))
    backend: Mapped[str] = mapped_column(String(63))
    flavor: Mapped[str] = mapped_column(String(63))
    start: Mapped[datetime] = mapped_column(UTCDateTime)
    end: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_s: Mapped[float] = mapped_column(Double)  # gpus × (end − start): sums need no date arithmetic
    gpu_used_s: Mapped[float | None] = mapped_column(Double)
    cpu_s: Mapped[float] = mapped_column(Double)
    usd_per_gpu_hour: Mapped[float] = mapped_column(Double)
    usd: Mapped[float] = mapped_column(Double)  # gpu_s at that price


class LedgerHour(Base):
    """The ledger summed per desk, user, backend, flavor and clock hour (kept by metering as it
    writes rows): budgets and the metrics' starting totals read hours, not every row."""

    __tablename__ = "ledger_hours"

    tenant: Mapped[str] = mapped_column(String(255), primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), primary_key=True)
    backend: Mapped[str] = mapped_column(String(63), primary_key=True)
    flavor: Mapped[str] = mapped_column(String(63), primary_key=True)
    gpu_s: Mapped[float] = mapped_column(Double, default=0.0)
    gpu_used_s: Mapped[float] = mapped_column(Double, default=0.0)
    usd: Mapped[float] = mapped_column(Double, default=0.0)


class CapacityRow(Base):
    """An on-prem flavor's GPUs over a span, at its price: what the fleet costs."""

    __tablename__ = "ledger_capacity"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    flavor: Mapped[str] = mapped_column(String(63))
    backend: Mapped[str] = mapped_column(String(63))
    start: Mapped[datetime] = mapped_column(UTCDateTime)
    end: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    gpus: Mapped[int] = mapped_column(Integer)
    usd_per_gpu_hour: Mapped[float] = mapped_column(Double)


class SweepPoint(Base):
    """One point of a sweep: its values, status, tries and where its result is. The result
    cache is the (owner, key) index: a point with the same key, done in an earlier sweep of
    the same user, is not run again."""

    __tablename__ = "sweep_points"
    __table_args__ = (
        Index("ix_sweep_points_cache", "owner", "key", "status"),
        Index("ix_sweep_points_job_stamp", "job_id", "stamp"),
    )

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(64))  # cellscale.points.point_key
    params: Mapped[dict] = mapped_column(JSON)
    status: Mapped[PointStatus] = mapped_column(Vocabulary(PointStatus, 16))
    tries: Mapped[int] = mapped_column(Integer, default=0)
    faults: Mapped[list] = mapped_column(JSON, default=list)  # the Fault of each try that did not succeed
    array: Mapped[int | None] = mapped_column(Integer)  # the array (SweepArray.number) of its last try
    node: Mapped[str | None] = mapped_column(String(255))
    wall_s: Mapped[float | None] = mapped_column(Double)
    error: Mapped[str | None] = mapped_column(Text)
    traceback: Mapped[str | None] = mapped_column(Text)
    result_job: Mapped[str | None] = mapped_column(String(32))  # whose task wrote its outputs
    result_array: Mapped[int | None] = mapped_column(Integer)  # ... in which of that job's arrays
    result_point: Mapped[int | None] = mapped_column(Integer)  # ... as which of that job's points
    stamp: Mapped[int] = mapped_column(BigInteger)  # µs since the epoch of its last change


class SweepArray(Base):
    """One submission of some of a sweep's tasks to the backend (a Slurm job array, a local
    task pool): which points each of its tasks runs, and its throttle."""

    __tablename__ = "sweep_arrays"
    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_sweep_arrays_job_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    number: Mapped[int] = mapped_column(Integer)  # 1, 2, ... across the job's attempts
    offset: Mapped[int] = mapped_column(Integer)  # the sweep's task number of its index 0
    tasks: Mapped[list] = mapped_column(JSON)  # [[point, ...], ...]: the points of each of its indexes
    excluded_nodes: Mapped[list] = mapped_column(JSON, default=list)
    throttle: Mapped[int] = mapped_column(Integer)  # most of its tasks running at once (%N); 0: waits unsubmitted
    backend_ref: Mapped[str | None] = mapped_column(String(255))
    ended: Mapped[bool] = mapped_column(Boolean, default=False)  # none of its tasks is pending or running
    submitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Event(Base):
    """The audit trail: one row per state transition or notable fact."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    kind: Mapped[EventKind] = mapped_column(Vocabulary(EventKind, 32))
    attempt: Mapped[int | None] = mapped_column(Integer)
    from_phase: Mapped[Phase | None] = mapped_column(Vocabulary(Phase, 16))
    to_phase: Mapped[Phase | None] = mapped_column(Vocabulary(Phase, 16))
    reason: Mapped[EventReason | None] = mapped_column(Vocabulary(EventReason, 64))
    message: Mapped[str | None] = mapped_column(Text)
    actor: Mapped[str | None] = mapped_column(String(255))


class TenancyRevision(Base):
    """Every version of the tenancy document (flavors, cohorts, queues, tenants); the
    newest is in force."""

    __tablename__ = "tenancy_revisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(255))
    document: Mapped[dict] = mapped_column(JSON)


class AuditEvent(Base):
    """Who changed what in the tenancy, with the value before and after."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(255))
    before: Mapped[dict | None] = mapped_column(JSON)
    after: Mapped[dict | None] = mapped_column(JSON)
    revision: Mapped[int | None] = mapped_column(Integer)
