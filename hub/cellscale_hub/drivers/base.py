"""The driver interface: what the control plane needs from a scheduler (the contract is on
`Driver` itself), and what drivers hand back (`Observation`, in `drivers.types`). What only some backends do is
opt-in (`drivers.capabilities`); what a job's directory says is read through `Driver.files`
(`drivers.jobfiles`)."""

from __future__ import annotations

from abc import ABCMeta
from collections.abc import Callable
from pathlib import Path

from traitlets import Float, MetaHasTraits, Unicode
from traitlets.config import LoggingConfigurable

from cellscale.runtime.records import DataCacheSettings, LaunchPlan
from cellscale.spec import BackendView, JobSpec
from cellscale_hub.drivers.jobfiles import JobFiles
from cellscale_hub.drivers.types import AttemptRef, Observation, SpecRejected


class DriverMeta(MetaHasTraits, ABCMeta):
    """Traitlets' metaclass and ABC's in one, so that a driver may inherit the capability ABCs
    of `drivers.capabilities`."""


class Driver(LoggingConfigurable, metaclass=DriverMeta):
    """A scheduler kind (Slurm, the local machine, ...); each configured backend is one instance.

    Admins name a driver by its entry point in the `cellscale.drivers` group ("local",
    "slurm") or by its import path, and configure it with traitlets (`c.SlurmDriver.partition`).
    A driver holds no durable state: everything it needs after a restart of the control plane
    is in the `AttemptRef` (from the store) and the job directory.

    Override, in a subclass (a missing one is a TypeError at class creation):

    - `capacity()` -> BackendView: the backend's GPUs and largest gang, for refusing impossible
      jobs and capping admission. Called every scheduling cycle: cache what is slow to ask.
    - `render(ref)` -> str: the exact script or command `submit` would run (the public dry
      run). A pure function of `ref` and the driver's configuration: no subprocess.
    - `submit(ref)` -> str: start the attempt; return the backend's id for it. Idempotent for
      one attempt: submitting it twice never runs it twice (`ref.resubmit` says the control
      plane may have submitted it before it restarted).
    - `poll(refs)` -> {ref.key: Observation}: ONE batched query for all active attempts of
      this backend. An attempt the backend did not answer for is UNKNOWN, never "gone"; an
      ended one carries its exit code, its reason in words, its `Fault` class and the nodes
      to blame. Heartbeats come from the job directory (`jobfiles.heartbeat_of`).
    - `cancel(ref)`: ask the backend to stop the attempt (the job dir's exit record follows).
    - `warn(ref)`: deliver the preemption warning (SIGUSR1 to each node's supervisor, which
      tells the ranks); the controller cancels the attempt when the grace period ends.

    Override when the default does not fit:

    - `shape(spec)`: the spec as this backend runs it (Slurm: whole nodes); identity.
    - `validate(spec)`: refuse a spec this backend can never run (SpecRejected, saying what
      to change); by default checked against `capacity()`.
    - `launch_plan(ref)`: what the attempt's runtime reads (Slurm adds its rendezvous).
    - `prepare(ref, bundle, points)`: write what the attempt's runtime reads before `submit`
      (through `files`).

    What only some backends do is opt-in: a driver also inherits the ABCs of
    `drivers.capabilities` it implements (`RunsSweeps`, `StagesAhead`, `MirrorsTenancy`,
    `EstimatesStart`, `WatchesNodes`, `CloudPool`, `ChecksQueue`, `AssignsGpuIds`), and the
    control plane asks `isinstance(driver, RunsSweeps)` before it uses one.

    `files` (a `JobFiles`) reads the job directory for the control plane: logs, checkpoints,
    outputs, usage, a sweep's files, and the facts `files.annotate` adds to `poll`'s
    observations. It assumes a directory every node and the control plane share
    (`ref.job_dir`); a backend whose jobs write elsewhere (object storage, a pod's volume) sets
    a `files` of its own; nothing else in the control plane opens a job's files.

    The controller sets `notify` to its `wake()`: a driver that learns by itself that an
    attempt ended (the local backend sees its supervisor exit) calls `notify()`, from any
    thread, so that the end is reconciled now rather than at the next tick. A driver without
    such news never calls it.
    """

    kind: str = "base"

    name = Unicode(help="The backend's name as users see it (--backend NAME).").tag(config=True)
    log_poll_interval = Float(
        0.25,
        min=0.01,
        help="""Seconds between two checks of a followed job's log for lines that other hosts wrote.
        The control plane is told at once (inotify) of what is written on its own host, but not of
        what a job on other nodes appends to a shared filesystem (NFS, Lustre): followers see those
        lines at this check. Costs one open of the log per followed job per interval.""",
    ).tag(config=True)

    data_cache_root = Unicode(
        "/tmp/cellscale-data/{node}",
        help="""Each node's dataset cache (`--data`): a directory on node-local disk, `{node}` replaced by
        the node's name (nodes sharing one host, as emulated ones do, need it). Every job of every user on
        the node shares it: each dataset is fetched once per node. Put a desk's name in it to keep desks'
        copies apart: a job on the node could delete or replace entries others use.""",
    ).tag(config=True)
    data_cache_max_gb = Float(
        None, allow_none=True, help="Most GB each node's dataset cache keeps (least recently used out first)."
    ).tag(config=True)
    data_cache_min_free = Float(
        0.1, min=0.0, max=0.9, help="Fraction of the cache's filesystem it always leaves free."
    ).tag(config=True)

    files: JobFiles = JobFiles()  # the job directory, as the control plane reads it
    notify: Callable[[], None] = staticmethod(lambda: None)  # the controller's wake(), once it is set

    REQUIRED = ("capacity", "render", "submit", "poll", "cancel", "warn")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        missing = [m for m in cls.REQUIRED if getattr(cls, m) is getattr(Driver, m)]
        if missing:
            raise TypeError(f"{cls.__name__} must override {', '.join(missing)}")

    # -- must override --------------------------------------------------------------------------
    def capacity(self) -> BackendView:
        raise NotImplementedError("Override in subclass.")

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

    # -- may override ---------------------------------------------------------------------------
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
        if cap.cpus_per_node is not None and res.cpus_per_node > cap.cpus_per_node:
            tasks = res.tasks_per_node or 1
            ask = (
                f"ask for at most --cpus {cap.cpus_per_node // tasks}"
                if cap.cpus_per_node >= tasks
                else f"ask for at most --tasks-per-node {cap.cpus_per_node}"
            )
            raise SpecRejected(
                f"{res.cpus_per_node} CPUs per node ({tasks} task(s) x --cpus {res.cpus_per_task}) is "
                f"more than any node of backend {self.name!r} has ({cap.cpus_per_node}); {ask}"
            )
        memory = res.memory_mb_per_node
        if cap.memory_mb_per_node is not None and memory is not None and memory > cap.memory_mb_per_node:
            raise SpecRejected(
                f"--mem {memory}M per node is more than any node of backend {self.name!r} has "
                f"({cap.memory_mb_per_node}M); ask for at most --mem {cap.memory_mb_per_node // 1024}G"
            )

    def launch_plan(self, ref: AttemptRef) -> LaunchPlan:
        """What the attempt's runtime reads; backends add what only they know."""
        spec, res = ref.spec, ref.spec.resources
        procs = res.tasks_per_node or 1
        return LaunchPlan(
            job_id=ref.job_id,
            attempt=ref.number,
            launcher=spec.launcher,
            nodes=res.nodes,
            gpus_per_node=res.gpus_per_node,
            procs_per_node=procs,
            cpus_per_task=res.cpus_per_task,
            gpu_ids=list(ref.gpu_ids),
            outputs=spec.outputs,
            input_names=spec.input_names,
            env=spec.env,
            timeout_s=res.timeout_min * 60.0,
            datasets=spec.datasets,
            data_mode=spec.data_mode,
            data_cache=self.data_cache(),
        )

    def data_cache(self) -> DataCacheSettings:
        """The nodes' dataset cache (the `data_cache_*` traits), as launch and staging plans carry it."""
        max_gb = self.data_cache_max_gb
        return DataCacheSettings(
            root=self.data_cache_root,
            max_bytes=None if max_gb is None else int(max_gb * 1e9),
            min_free_ratio=self.data_cache_min_free,
        )

    def prepare(self, ref: AttemptRef, bundle: Path | None, points: Path | None = None) -> None:
        """Write what the attempt's runtime reads (cell, inputs, plan; a sweep's points
        manifest and folders) before `submit`."""
        self.files.prepare(ref, self.launch_plan(ref), bundle, points)
