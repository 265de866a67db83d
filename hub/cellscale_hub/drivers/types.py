"""What drivers and the control plane hand each other (types apart from logic, as Kueue keeps
them): the attempt a driver works on, what its poll found, and the two refusals a driver
raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from cellscale.runtime.jobdir import JobDir
from cellscale.runtime.records import Checkpoint, ResumeReport
from cellscale.spec import IoProfileView, JobSpec
from cellscale.vocabulary import AttemptState, Fault


class SpecRejected(ValueError):
    """The job can never run on this backend; the message says what to change."""


class BackendUnreachable(RuntimeError):
    """The backend's scheduler does not answer (its controller is down or cut off): what it
    runs is unknown, not gone. Raised by `poll` (and any query) instead of a generic error."""


@dataclass(frozen=True)
class AttemptRef:
    """One attempt of a job, as a driver sees it: everything it needs, from the store."""

    job_id: str
    number: int
    job_dir: Path
    spec: JobSpec
    gpu_ids: tuple[int, ...] = ()
    backend_ref: str | None = None
    submitted_at: datetime | None = None
    owner: str = ""
    tenant: str = ""
    queue: str = ""  # the desk's LocalQueue it was admitted through (a Kueue backend submits to the same)
    resubmit: bool = False  # submitted again after a restart: the backend may already have it
    excluded_nodes: tuple[str, ...] = ()  # nodes that failed this job before: its next attempts avoid them
    nodelist: tuple[str, ...] = ()  # the nodes it must run on (where its datasets were staged), when set
    result_key: str | None = field(default=None, repr=False)  # the job signs its outputs with it

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.number)

    @property
    def dir(self) -> JobDir:
        return JobDir(self.job_dir)


@dataclass(frozen=True)
class Observation:
    """What a driver's poll found about one attempt, plus what its job directory says."""

    state: AttemptState
    exit_code: int | None = None
    reason: str | None = None
    heartbeat: datetime | None = None  # the oldest of the nodes' latest heartbeats
    step: int | None = None  # the training step rank 0 last reported
    fault: Fault | None = None  # why an ended attempt did not succeed (None: it did, or was cancelled)
    failed_nodes: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()  # the nodes the attempt holds (known once the backend placed it)
    checkpoint: Checkpoint | None = None  # the newest this attempt committed (filled in by JobFiles.annotate)
    resume: ResumeReport | None = None  # what this attempt resumed from (filled in by JobFiles.annotate)
    result: bool = False  # rank 0 wrote its outputs (filled in by JobFiles.annotate once the attempt SUCCEEDED)
    io: IoProfileView | None = None  # what its ranks read (filled in by JobFiles.annotate once the attempt ended)
    # the allocation's start and end (None: still held) as the backend's own scheduler has them: the ledger's clock
    held: tuple[float, float | None] | None = None
