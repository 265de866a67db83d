"""What only some backends do, each an opt-in ABC a driver inherits when it does it (Kueue's
minimal interface plus `JobWith*`): the control plane asks `isinstance(driver, RunsSweeps)`
before it uses one, and a backend without it never sees the call. A driver that inherits one
must implement its abstract methods (else it cannot be instantiated)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime

from cellscale.runtime.records import ArrayPlan, StagePlan, StageProgress
from cellscale.spec import JobSpec
from cellscale.vocabulary import Fault, TaskLiveness
from cellscale_hub.drivers.owners import hand_files_to_owner
from cellscale_hub.drivers.types import AttemptRef
from cellscale_hub.tenancy import Tenancy


@dataclass(frozen=True)
class ArrayRef:
    """One array of a sweep's attempt (a Slurm job array, a local task pool), as a driver sees it."""

    ref: AttemptRef
    plan: ArrayPlan
    backend_ref: str | None = None
    submitted_at: datetime | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.ref.job_id, self.plan.number)


@dataclass(frozen=True)
class TaskEnd:
    """How a sweep task that left no outcome for some of its points ended, as the backend says."""

    fault: Fault | None  # None: cancelled on request (no budget is spent)
    words: str
    node: str | None = None  # the node to blame (an infrastructure fault)


class RunsSweeps(ABC):
    """Sweeps (`JobSpec.sweep`): the control plane (`cellscale_hub.control.sweeps`) submits a
    sweep's tasks as arrays and rebalances them; the driver runs them. `live_tasks` answers for
    all arrays in ONE query (an index absent has ended); `submit_array` is idempotent
    (`array.ref.resubmit` may find it already there)."""

    @abstractmethod
    def max_array_size(self) -> int:
        """The most indexes one array may have (Slurm's MaxArraySize caps the index: 0..size-1)."""

    @abstractmethod
    def submit_array(self, array: ArrayRef) -> str:
        """Start the array; return the backend's id for it."""

    @abstractmethod
    def live_tasks(self, arrays: list[ArrayRef]) -> dict[tuple[str, int], dict[int, TaskLiveness]]:
        """{array.key: {index: TaskLiveness}} for every array, in ONE query."""

    @abstractmethod
    def task_end(self, array: ArrayRef, index: int) -> TaskEnd | None:
        """How a task that left points without an outcome ended (None while the backend has
        not settled it)."""

    @abstractmethod
    def cancel_array(self, array: ArrayRef) -> None: ...

    @abstractmethod
    def throttle_array(self, array: ArrayRef, throttle: int) -> None: ...

    def write_array(self, array: ArrayRef) -> None:
        """Write what an array's tasks read (its plan and throttle), theirs to read: the control
        plane may write them as root with a private umask, after the directory was handed over."""
        sweep = self.files.sweep_dir(array.ref.job_dir)
        sweep.write_array(array.plan)
        hand_files_to_owner(
            array.ref.owner, [sweep.array_file(array.plan.number), sweep.throttle_file(array.plan.number)]
        )


class StagesAhead(ABC):
    """Staging a waiting job's datasets ahead: `stage_targets(ref)` -> the nodes it would start
    on (Slurm: `sbatch --test-only`); `start_staging(ref, nodes)` starts `cellscale.runtime.stage`
    on each of them (after `stage_plan`), so its datasets are in the nodes' caches before it
    starts. Without it, each node stages when the job starts."""

    @abstractmethod
    def stage_targets(self, ref: AttemptRef) -> list[str] | None:
        """The nodes the waiting job (its next attempt `ref`) would start on, as the backend's
        scheduler plans it now; None: it cannot say (then its nodes stage at start)."""

    @abstractmethod
    def start_staging(self, ref: AttemptRef, nodes: list[str]) -> None:
        """Start copying the job's datasets into these nodes' caches (`cellscale.runtime.stage`),
        without waiting; progress is read back with `staging_progress`."""

    def stage_plan(self, ref: AttemptRef, nodes: list[str]) -> None:
        """Write the staging plan the nodes' stagers read (`start_staging` hands it to the owner)."""
        ref.dir.write_stage_plan(
            StagePlan(
                datasets=ref.spec.datasets, cache=self.data_cache(), nodes=nodes, env=ref.spec.env, at=time.time()
            )
        )

    def staging_progress(self, ref: AttemptRef, nodes: list[str]) -> dict[str, StageProgress]:
        """Each node's staging progress so far (nodes that have not begun are absent)."""
        return ref.dir.read_stage_progress(nodes)


class MirrorsTenancy(ABC):
    """A backend with a scheduler of its own (Slurm: account limits and shares; Kubernetes:
    the desks' namespaces it watches) is told about quotas and fair share."""

    @abstractmethod
    def apply_tenancy(self, tenancy: Tenancy) -> None:
        """Mirror quotas and fair share into the backend's own scheduler."""


class EstimatesStart(ABC):
    """A backend whose scheduler can say when it would start a job (Slurm: `sbatch --test-only`)."""

    @abstractmethod
    def start_estimate(self, spec: JobSpec, account: str) -> float | None:
        """When the backend's scheduler would start `spec` if submitted now (epoch seconds);
        None: it cannot say."""


class WatchesNodes(ABC):
    """A backend whose nodes announce they go away soon (a cloud's spot reclaim notice): the
    controller preempts what runs there, with its checkpoint warning."""

    @abstractmethod
    def node_notices(self) -> dict[str, str]:
        """Nodes announced to go away soon (node -> the notice in words)."""


@dataclass(frozen=True)
class Instance:
    """One billed instance, as the cloud's ledger has it."""

    node: str
    requested: float  # epoch seconds
    stopped: float | None  # None: still running (billed up to now)
    usd: float  # billed so far


@dataclass(frozen=True)
class Run:
    """An attempt holding a node, as the backend's accounting has it."""

    key: Hashable
    node: str
    start: float
    end: float | None  # None: still running


class CloudPool(ABC):
    """A backend on rented nodes reports its cloud bill per instance and which attempt held
    which node when; the controller attributes the bill to attempts (`cloudbill`)."""

    @abstractmethod
    def cloud_instances(self) -> list[Instance]:
        """The cloud bill of this backend's nodes, per instance (empty: no bill to attribute)."""

    @abstractmethod
    def node_runs(self, refs: list[AttemptRef]) -> list[Run]:
        """Which of these attempts held which node when, from the backend's own accounting
        (to attribute `cloud_instances()`)."""


class ChecksQueue(ABC):
    """A backend with queues of its own that may never admit a desk's job (Kubernetes: Kueue's
    LocalQueue missing or stopped)."""

    @abstractmethod
    def validate_for(self, spec: JobSpec, tenant: str, queue: str) -> None:
        """Refuse a spec the backend's own queues would never admit for this desk's queue."""


class AssignsGpuIds(ABC):  # noqa: B024 (a marker: nothing to implement)
    """The control plane picks the GPU ids an attempt gets (the backend does not)."""
