"""A job as the control plane answers for it: the job and its attempts, what it costs, its
checkpoints, events and log, and a dry run's script."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from cellscale.spec.data import IoProfileView
from cellscale.spec.job import JobSpec
from cellscale.spec.queues import PendingView
from cellscale.spec.sweeps import SweepProgress
from cellscale.vocabulary import AttemptState, EventKind, EventReason, Fault, Phase


class AttemptView(BaseModel):
    number: int
    backend: str
    backend_ref: str | None
    state: AttemptState
    gpu_ids: list[int]
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    end_reason: str | None
    last_heartbeat: datetime | None
    last_checkpoint_at: datetime | None = None
    fault: Fault | None = Field(None, description="Why it did not succeed, as a class with its own retry budget.")
    failed_nodes: list[str] = Field(default_factory=list, description="Nodes blamed for this attempt's end.")
    last_step: int | None = Field(None, description="The training step rank 0 last reported.")
    nodes: list[str] = Field(default_factory=list, description="The nodes it held, once placed.")
    held_from: datetime | None = Field(None, description="Its allocation's start, as the backend's scheduler has it.")
    held_until: datetime | None = Field(None, description="Its allocation's end, as the backend's scheduler has it.")
    cloud_usd: float | None = Field(
        None, description="Its share of a cloud pool's bill (boot, run, idle tail), once billed; null: not on a cloud."
    )


class CostEstimate(BaseModel):
    """What a job will cost, before it runs."""

    gpus: int
    seconds: float = Field(description="How long it is expected to hold its GPUs.")
    basis: Literal["history", "time_limit"] = Field(
        description="history: the median of this user's earlier runs of the same cell; time_limit: its --time "
        "(an upper bound)."
    )
    runs: int = Field(0, description="Earlier runs the estimate is from.")
    usd_per_gpu_hour: float
    usd: float
    budget_fraction: float | None = Field(None, description="Of its desk's budget for the period (None: no budget).")
    words: str = Field(description='e.g. "≈16 GPU × 2.0 h ≈ $84, 6% of desk-a\'s weekly budget (at most: its --time)".')


class JobCost(BaseModel):
    """What a job's attempts held, used and cost so far (the ledger)."""

    gpu_hours: float = Field(description="GPUs × the hours its allocations lasted (the backend's own start and end).")
    used_fraction: float | None = Field(None, description="Of that, the time its GPUs were busy (None: not sampled).")
    usd: float = Field(description="Allocation dollars (a cloud pool's billed share where one is billed).")
    idle_usd: float | None = Field(None, description="Dollars of GPUs held but idle (None: not sampled).")
    cpu_hours: float = 0.0
    memory_peak_bytes: int | None = None
    words: str = Field(description='e.g. "16 GPU × 2.1 h = 33.6 GPU-h, 41% used, $84 ($50 idle)".')


class CheckpointView(BaseModel):
    """A checkpoint a job committed (cellscale.checkpoint), as the notebook and panel list it."""

    attempt: int
    step: int
    url: str
    size_bytes: int
    committed_at: datetime
    write_s: float = Field(description="Seconds from save() to commit.")


class JobView(BaseModel):
    """A job as its owner and tenant see it."""

    id: str
    name: str
    owner: str
    tenant: str
    queue: str
    backend: str
    cluster_queue: str | None = None
    flavor: str | None = Field(None, description="ResourceFlavor it was admitted on.")
    priority: int = 0
    borrowed: int = Field(0, description="GPUs beyond its queue's nominal quota when admitted.")
    short_share: bool = Field(
        False,
        description="Admitted beyond its desk's quota on its cohort's short-work share: not reclaimed until it has "
        "received the first service level's GPU-hours.",
    )
    phase: Phase
    reason: str | None = Field(None, description="Why the job is in its phase, in plain words.")
    pending: PendingView | None = Field(None, description="Why it waits (PENDING jobs).")
    excluded_nodes: list[str] = Field(default_factory=list, description="Nodes its next attempts avoid.")
    preempting: bool = Field(False, description="Warned of preemption; requeued when its attempt ends.")
    spec: JobSpec
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool
    result_available: bool
    attempts: list[AttemptView]
    estimate: CostEstimate | None = Field(None, description="What it was expected to cost when submitted.")
    cost: JobCost | None = Field(None, description="What it held, used and cost so far (None: never held GPUs).")
    sweep: SweepProgress | None = Field(None, description="A sweep's points by status (sweeps only).")
    io: IoProfileView | None = Field(None, description="Its newest ended attempt's I/O profile (null: none measured).")

    @computed_field(description="What it is shown as: its spec's title, else its name.")
    @property
    def title(self) -> str:
        return self.spec.title or self.name

    service_gpu_hours: float = Field(
        0.0,
        description="Service received so far, in GPU-equivalent hours (held hours × its GPUs, CPUs and memory under "
        "the tenancy's resource weights), every attempt's, the running one up to now: within its desk, jobs that "
        "received less go first.",
    )


class JobPage(BaseModel):
    items: list[JobView]
    next_cursor: str | None = Field(None, description="Pass as cursor= to get the next page.")


class EventView(BaseModel):
    id: int
    job_id: str
    at: datetime
    kind: EventKind
    attempt: int | None
    from_phase: Phase | None
    to_phase: Phase | None
    reason: EventReason | None
    message: str | None
    actor: str | None


class LogChunk(BaseModel):
    """A slice of a job's combined, rank-prefixed log. Offsets are bytes."""

    offset: int
    next_offset: int
    text: str
    complete: bool = Field(description="The job has ended and nothing more will be written.")


class RenderView(BaseModel):
    backend: str
    script: str
    estimate: CostEstimate | None = Field(None, description="What it would cost, were it submitted now.")
