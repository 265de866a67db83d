"""The words cellscale uses between its parts: phases, states, fault classes, exit reasons,
pending codes, event kinds and event reasons, burst policies and data modes.

Every module that stores, sends, shows or decides on one of these imports it from here, so
a new backend or a new client reads one list instead of copying strings. The values are the
strings stored in the database and sent on the wire; renaming a value is a data migration.
Modelled on Kueue's conditions and reasons: a short CamelCase reason says why, a free-text
message says it in words.
"""

from __future__ import annotations

from enum import StrEnum


class Launcher(StrEnum):
    """How ranks start on the nodes."""

    torchrun = "torchrun"  # one process per GPU, torch.distributed's static rendezvous across nodes
    ray = "ray"  # a private Ray cluster over the gang's nodes; the cell is its driver
    plain = "plain"  # one process per node, no launcher
    jax = "jax"  # one process per GPU (or --tasks-per-node), started by the supervisor; cellscale.jax.initialize()


class Resource(StrEnum):
    """What a job asks for and a quota divides (Kueue's covered resources)."""

    gpu = "gpu"  # accelerators (nvidia.com/gpu)
    cpu = "cpu"  # cores
    memory = "memory"  # MiB


class Phase(StrEnum):
    """Where a job is in its life. Terminal phases never change again."""

    PENDING = "PENDING"  # waiting for admission (why: the job's PendingView)
    ADMITTED = "ADMITTED"  # quota reserved, all or nothing; the attempt is being submitted
    STARTING = "STARTING"  # the backend has the attempt; not every rank runs yet
    RUNNING = "RUNNING"  # every rank started the cell
    RECOVERING = "RECOVERING"  # an attempt ended in a fault or a preemption; about to be requeued
    SUCCEEDED = "SUCCEEDED"  # every rank exited 0 (terminal)
    FAILED = "FAILED"  # ended in a fault with no retry left (terminal)
    CANCELLED = "CANCELLED"  # stopped by its owner or an admin (terminal)

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_PHASES

    @property
    def holds_quota(self) -> bool:
        """Admitted and not yet ended: its GPUs count against its queue."""
        return self in QUOTA_HOLDING_PHASES


# tuples, in declaration order: they are also the IN lists of queries
TERMINAL_PHASES = (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)
QUOTA_HOLDING_PHASES = (Phase.ADMITTED, Phase.STARTING, Phase.RUNNING)
ACTIVE_PHASES = tuple(p for p in Phase if p not in TERMINAL_PHASES and p is not Phase.PENDING)
"""Phases in which the job has an attempt the backend may be running."""


class AttemptState(StrEnum):
    """What the backend says about one submission of a job."""

    SUBMITTING = "SUBMITTING"  # admitted; not yet handed to the backend
    STARTING = "STARTING"  # the backend has it (queued there, or ranks still starting)
    RUNNING = "RUNNING"  # every rank started
    SUCCEEDED = "SUCCEEDED"  # every rank exited 0
    FAILED = "FAILED"  # a rank failed, or the backend ended it (node failure, time limit)
    CANCELLED = "CANCELLED"  # stopped on request
    LOST = "LOST"  # its processes vanished without an exit record, or it hung
    UNKNOWN = "UNKNOWN"  # the backend did not answer about it: kept, never taken as gone

    @property
    def ended(self) -> bool:
        return self in ENDED_ATTEMPT_STATES

    @property
    def active(self) -> bool:
        """The backend may still be running it: polled each cycle."""
        return self not in ENDED_ATTEMPT_STATES


ENDED_ATTEMPT_STATES = (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED, AttemptState.LOST)
ACTIVE_ATTEMPT_STATES = tuple(s for s in AttemptState if s not in ENDED_ATTEMPT_STATES)


class Fault(StrEnum):
    """Why an attempt that did not succeed ended, as a class with its own retry budget."""

    USER_ERROR = "user_error"  # an exception in the cell; the traceback is shown (--retries-user)
    INFRASTRUCTURE = "infrastructure"  # a node failed, a rank was killed, the attempt was lost or hung (--retries)
    TIMEOUT = "timeout"  # ran past --time (--retries-timeout)
    PREEMPTION = "preemption"  # stopped to make room for another job; always requeued, never counted
    CAPACITY = "capacity"  # the backend could not provide the nodes (a cloud stockout); re-placed, never counted

    @property
    def words(self) -> str:
        return self.value.replace("_", " ")


class ExitReason(StrEnum):
    """Why one node's supervisor ended its part of an attempt (its exit record)."""

    SUCCEEDED = "succeeded"  # every rank on the node exited 0
    CANCELLED = "cancelled"  # stopped by the control plane (SIGTERM)
    TIMEOUT = "timeout"  # ran past the plan's time limit
    PREEMPTED = "preempted"  # stopped after the preemption warning
    USER_ERROR = "user_error"  # a rank raised an exception in the cell (error.json has it)
    FAILED = "failed"  # a rank died without a Python exception: killed, OOM, segfault
    LAUNCH_FAILED = "launch_failed"  # the launcher could not be started
    INPUT_REFUSED = "input_refused"  # the OS refused the job's own input when starting it (E2BIG: --env too large)

    @property
    def fault(self) -> Fault | None:
        """The fault class this reason stands for (None: the node did its part)."""
        return _EXIT_FAULTS.get(self)


_EXIT_FAULTS = {
    ExitReason.USER_ERROR: Fault.USER_ERROR,
    ExitReason.TIMEOUT: Fault.TIMEOUT,
    ExitReason.PREEMPTED: Fault.PREEMPTION,
    ExitReason.FAILED: Fault.INFRASTRUCTURE,
    ExitReason.LAUNCH_FAILED: Fault.INFRASTRUCTURE,
    ExitReason.INPUT_REFUSED: Fault.USER_ERROR,  # retrying cannot help: the job's input must change
}


class PointStatus(StrEnum):
    """Where one point of a sweep is (`%%cluster map`): each point is its own task."""

    queued = "queued"  # waiting for a slot of the sweep (or for the sweep's admission)
    running = "running"  # a task is running it now
    done = "done"  # it ran and wrote its outputs
    failed = "failed"  # it raised (user error), or its faults used up their retries
    cached = "cached"  # an earlier run of the same code on the same point has its result: not run
    cancelled = "cancelled"  # the sweep was cancelled before it ran

    @property
    def terminal(self) -> bool:
        return self not in (PointStatus.queued, PointStatus.running)


class PendingCode(StrEnum):
    """Why a PENDING job was not admitted in the last scheduling cycle."""

    Queued = "Queued"  # it would fit, but jobs ahead of it in its ClusterQueue go first
    QuotaExhausted = "QuotaExhausted"  # its ClusterQueue is at nominal + borrowing limit for the flavor
    PoolLent = "PoolLent"  # the cohort tree's lendable quota is in use by other queues
    CapacityFull = "CapacityFull"  # the backend's GPUs are all in use (whatever the quotas say)
    HeldForAhead = "HeldForAhead"  # it fits, but the GPUs it would borrow are promised to a waiting head
    Preempting = "Preempting"  # victims were warned; it starts when their GPUs are free
    NeverFits = "NeverFits"  # larger than its queue or backend could ever give: change the request
    NoFlavor = "NoFlavor"  # its queue has no flavor on the backend the job was shaped for
    BudgetSpent = "BudgetSpent"  # its desk spent its budget and the budget has a hard stop


class EventKind(StrEnum):
    """What a row of a job's event log records."""

    PHASE = "phase"  # the job changed phase (from_phase → to_phase)
    ATTEMPT = "attempt"  # one attempt ended, or its backend stopped answering about it
    PREEMPTION = "preemption"  # the job was warned that it will be preempted
    CHECKPOINT = "checkpoint"  # an attempt resumed from a checkpoint
    CANCEL = "cancel"  # someone asked to cancel the job
    DATA = "data"  # its datasets were staged onto the nodes it will start on


class EventReason(StrEnum):
    """Why an event happened: the condition reasons of a job's timeline."""

    Submitted = "Submitted"  # stored PENDING; or, later, handed to the backend (STARTING)
    QuotaReserved = "QuotaReserved"  # admitted: its GPUs reserved all or nothing
    Starting = "Starting"  # the backend is starting the ranks
    Running = "Running"  # every rank started
    Finished = "Finished"  # every rank exited 0: the job SUCCEEDED
    Succeeded = "Succeeded"  # an attempt ended with every rank at exit 0
    Failed = "Failed"  # an attempt, or the job, failed
    Cancelled = "Cancelled"  # an attempt or the job was stopped on request
    Lost = "Lost"  # an attempt's processes vanished, or it hung
    AttemptLost = "AttemptLost"  # the job FAILED because its last attempt was lost
    CancelRequested = "CancelRequested"  # its owner or an admin asked to cancel
    BackendUnknown = "BackendUnknown"  # the backend stopped answering about an attempt (kept, not ended)
    Preempting = "Preempting"  # warned: stops after the grace period unless it ends first
    Preempted = "Preempted"  # stopped to make room; requeued
    Retrying = "Retrying"  # a fault with budget left: requeued for a new attempt
    Requeued = "Requeued"  # back in its queue, keeping its place
    Resumed = "Resumed"  # the attempt loaded the newest verified checkpoint
    ResumedWithFallback = "ResumedWithFallback"  # newer checkpoints failed verification; an older one was loaded
    Staging = "Staging"  # its datasets are being copied to the nodes it is expected to start on
    Staged = "Staged"  # they are in those nodes' caches
    StagingFailed = "StagingFailed"  # a node could not stage one (its nodes try again when it starts)

    @classmethod
    def of_attempt_end(cls, state: AttemptState) -> EventReason:
        """The reason of the event that records an attempt's end."""
        return {
            AttemptState.SUCCEEDED: cls.Succeeded,
            AttemptState.CANCELLED: cls.Cancelled,
            AttemptState.LOST: cls.Lost,
        }.get(state, cls.Failed)

    @classmethod
    def of_job_end(cls, state: AttemptState) -> EventReason:
        """The reason of the job's last phase change, from its last attempt's end."""
        return {
            AttemptState.SUCCEEDED: cls.Finished,
            AttemptState.CANCELLED: cls.Cancelled,
            AttemptState.LOST: cls.AttemptLost,
        }.get(state, cls.Failed)

    @classmethod
    def of_phase(cls, phase: Phase) -> EventReason:
        """The reason of a phase change driven by what the backend reports."""
        return {
            Phase.STARTING: cls.Starting,
            Phase.RUNNING: cls.Running,
            Phase.SUCCEEDED: cls.Succeeded,
            Phase.CANCELLED: cls.Cancelled,
        }.get(phase, cls.Failed)


class BurstPolicy(StrEnum):
    """Whether a job may go to a cloud site (--burst; a desk's default when the job says none)."""

    never = "never"  # only the queue's own sites
    allow = "allow"  # a cloud pool too, when placement finds it better (start time, dollars, data, budget)


class DataMode(StrEnum):
    """How a job's ranks read its datasets (--data-mode)."""

    stage = "stage"  # copied into its nodes' cache before the ranks start (while it waits when the nodes are known)
    stream = "stream"  # read from the source directly


class TaskLiveness(StrEnum):
    """Where a live task of a sweep's array is at its backend (`Driver.live_tasks`); a task the
    backend no longer lists has ended."""

    pending = "pending"  # queued at the backend, not started yet
    running = "running"  # started on a node


class IdlePolicy(StrEnum):
    """Who pays for an on-prem flavor's GPU-seconds nobody held (OpenCost's shared idle); the
    tenancy's cost policy names one."""

    none = "none"  # nobody: all of it is shared
    even = "even"  # the desks with a nominal quota on the flavor, in equal parts
    proportional = "proportional"  # the desks that held the flavor, by their GPU-seconds on it
    owner = "owner"  # each desk its reserved-but-unused quota; the rest shared
