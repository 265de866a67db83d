"""The driver interface: what the control plane needs from a scheduler.

Subclass `Driver` and override:

- `capacity()`: the largest gang this backend can ever run, for refusing impossible jobs.
- `render(ref)`: the exact script or command `submit` would run (a public dry run).
- `submit(ref)`: start the attempt; return the backend's id for it. Must be idempotent for
  one attempt: submitting the same attempt twice never runs it twice (`ref.resubmit` says
  the control plane may have submitted it before it restarted).
- `poll(refs)`: one batched query for all active attempts of this backend. An attempt the
  backend did not answer for is UNKNOWN, never "gone".
- `cancel(ref)`: ask the backend to stop the attempt (the job dir's exit record follows).
- `warn(ref)`: deliver the preemption warning (SIGUSR1 to each node's supervisor, which
  tells the ranks); the controller cancels the attempt when the grace period ends.

Override `apply_tenancy(tenancy)` when the backend has a scheduler of its own that must agree
with cellscale's quotas and fair share (Slurm: account limits and shares). And, when the
backend places jobs itself rather than against a declared capacity,
`place(...)`. Drivers hold no durable state: everything they need after a restart of the
control plane is in the `AttemptRef` (from the store) and the job directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from traitlets import Unicode
from traitlets.config import LoggingConfigurable

from cellscale.runtime.jobdir import JobDir, LaunchPlan
from cellscale.spec import AttemptState, BackendView, JobSpec
from cellscale_hub import plans
from cellscale_hub.faults import Fault, from_exit_records
from cellscale_hub.tenancy import Tenancy


class SpecRejected(ValueError):
    """The job can never run on this backend; the message says what to change."""


@dataclass(frozen=True)
class AttemptRef:
    job_id: str
    number: int
    job_dir: Path
    spec: JobSpec
    gpu_ids: tuple[int, ...] = ()
    backend_ref: str | None = None
    submitted_at: datetime | None = None
    owner: str = ""
    tenant: str = ""
    resubmit: bool = False  # submitted again after a restart: the backend may already have it
    excluded_nodes: tuple[str, ...] = ()  # nodes that failed this job before: its next attempts avoid them

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.number)

    @property
    def dir(self) -> JobDir:
        return JobDir(self.job_dir)


@dataclass(frozen=True)
class Observation:
    state: AttemptState
    exit_code: int | None = None
    reason: str | None = None
    heartbeat: datetime | None = None  # the oldest of the nodes' latest heartbeats
    step: int | None = None  # the training step rank 0 last reported
    fault: Fault | None = None  # why an ended attempt did not succeed (None: it did, or was cancelled)
    failed_nodes: tuple[str, ...] = ()


def heartbeat_of(ref: AttemptRef, nodes: int) -> tuple[datetime | None, int | None]:
    """(oldest heartbeat across the nodes, step) from the job directory; None until every
    node has beaten once, so one silent node shows as silence."""
    beats = [ref.dir.read_heartbeat(ref.number, node) for node in range(nodes)]
    if not beats or any(beat is None for beat in beats):
        return None, None
    oldest = min(beat["at"] for beat in beats)
    return datetime.fromtimestamp(oldest, timezone.utc), beats[0].get("step")


def fault_from_job_dir(ref: AttemptRef, nodes: int) -> Fault:
    """The class of a failed gang from its nodes' exit records; a gang with no record at all
    lost its supervisors: an infrastructure fault."""
    records = [ref.dir.read_exit(ref.number, node) for node in range(nodes)]
    return from_exit_records(r.reason for r in records if r is not None) or Fault.INFRASTRUCTURE


class Driver(LoggingConfigurable):
    kind: str = "base"

    name = Unicode(help="The backend's name as users see it (--backend NAME).").tag(config=True)

    assigns_gpu_ids = False  # True: the control plane picks GPU ids (the backend does not)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        missing = [m for m in ("capacity", "render", "submit", "poll", "cancel", "warn") if getattr(cls, m) is getattr(Driver, m)]
        if missing:
            raise TypeError(f"{cls.__name__} must override {', '.join(missing)}")

    def capacity(self) -> BackendView:
        raise NotImplementedError("Override in subclass.")

    def launch_plan(self, ref: AttemptRef) -> LaunchPlan:
        """What the attempt's runtime reads; backends add what only they know."""
        return plans.launch_plan(ref)

    def shape(self, spec: JobSpec) -> JobSpec:
        """The spec as this backend will run it (e.g. whole nodes); identity by default."""
        return spec

    def validate(self, spec: JobSpec) -> None:
        """Refuse a spec this backend can never run, saying what to change."""
        cap = self.capacity()
        res = spec.resources
        if spec.launcher not in cap.launchers:
            raise SpecRejected(f"backend {self.name!r} has no {spec.launcher.value} launcher")
        if res.nodes > cap.max_nodes:
            raise SpecRejected(
                f"--nodes {res.nodes} is more than backend {self.name!r} has ({cap.max_nodes}); "
                f"use at most --nodes {cap.max_nodes}"
            )
        if res.gpus_per_node > cap.gpus_per_node:
            raise SpecRejected(
                f"{res.gpus_per_node} GPUs per node is more than backend {self.name!r} has "
                f"({cap.gpus_per_node} per node, {cap.capacity_gpus} in all); ask for at most "
                f"--gpus {cap.capacity_gpus}"
            )

    def render(self, ref: AttemptRef) -> str:
        raise NotImplementedError("Override in subclass.")

    def submit(self, ref: AttemptRef) -> str:
        raise NotImplementedError("Override in subclass.")

    def poll(self, refs: list[AttemptRef]) -> dict[tuple[str, int], Observation]:
        raise NotImplementedError("Override in subclass.")

    def cancel(self, ref: AttemptRef) -> None:
        raise NotImplementedError("Override in subclass.")

    def warn(self, ref: AttemptRef) -> None:
        raise NotImplementedError("Override in subclass.")

    def apply_tenancy(self, tenancy: Tenancy) -> None:
        """Mirror quotas and fair share into the backend's own scheduler; nothing to do for a
        backend that only runs what cellscale admits."""
