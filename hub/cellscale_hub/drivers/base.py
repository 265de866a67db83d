"""The driver interface: what the control plane needs from a scheduler (the contract is on
`Driver` itself), and what drivers hand back (`Observation`)."""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from traitlets import Float, Unicode
from traitlets.config import LoggingConfigurable

from cellscale.runtime.jobdir import JobDir, write_atomic
from cellscale.runtime.records import (
    ArrayPlan,
    Checkpoint,
    DataCacheSettings,
    LaunchPlan,
    NodeUsage,
    ResumeReport,
    StagePlan,
    StageProgress,
)
from cellscale.runtime.sweepdir import SweepDir
from cellscale.spec import BackendView, CheckpointView, IoProfileView, JobSpec
from cellscale.vocabulary import AttemptState, Fault
from cellscale_hub.cost.cloudbill import Instance, Run
from cellscale_hub.faults import from_exit_records
from cellscale_hub.drivers.ioprofile import io_profile
from cellscale_hub.tenancy import Tenancy

UNIX_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


class SpecRejected(ValueError):
    """The job can never run on this backend; the message says what to change."""


class BackendUnreachable(RuntimeError):
    """The backend's scheduler does not answer (its controller is down or cut off): what it
    runs is unknown, not gone. Raised by `poll` (and any query) instead of a generic error."""


def as_user(prefix: list[str], user: str) -> list[str]:
    """The privilege step that runs a command as the job's owner (`runuser -u {user} --` as
    root, `sudo -n -u {user} --` in production), with the validated user name filled in."""
    if not UNIX_USER.match(user):
        raise SpecRejected(f"user name {user!r} is not a valid Unix user name; jobs run as their owner")
    return [part.replace("{user}", user) for part in prefix]


def hand_to_owner(user: str, job_dir: Path) -> None:
    """As root, give the job directory to the user who runs the job, readable by them alone
    (desk-mates read it through the API, which checks). Not root: nothing to do (the control
    plane and its jobs share one Unix user)."""
    if os.geteuid() != 0:
        return
    hand_files_to_owner(user, [job_dir, *job_dir.rglob("*")])
    job_dir.chmod(0o700)


def owner_of(path: Path) -> str | None:
    """The user name owning `path` (None: gone, or a uid with no name)."""
    try:
        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (KeyError, OSError):
        return None


def hand_files_to_owner(user: str, paths: list[Path]) -> None:
    """As root, give these files (written since the job directory was handed over) to the job's
    user; not root: nothing to do."""
    if os.geteuid() != 0:
        return
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise RuntimeError(f"there is no Unix user {user!r} on this machine; jobs run as their owner") from None
    for path in paths:
        os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)


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
    checkpoint: Checkpoint | None = None  # the newest this attempt committed (filled in by Driver.observe_attempts)
    resume: ResumeReport | None = None  # what this attempt resumed from (filled in by Driver.observe_attempts)
    result: bool = False  # rank 0 wrote its outputs (filled in by Driver.observe_attempts once the attempt SUCCEEDED)
    io: IoProfileView | None = None  # what its ranks read (filled in by Driver.observe_attempts once the attempt ended)
    # the allocation's start and end (None: still held) as the backend's own scheduler has them: the ledger's clock
    held: tuple[float, float | None] | None = None


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


def heartbeat_of(ref: AttemptRef, nodes: int) -> tuple[datetime | None, int | None]:
    """(oldest heartbeat across the nodes, step) from the job directory; None until every
    node has beaten once, so one silent node shows as silence."""
    beats = [ref.dir.read_heartbeat(ref.number, node) for node in range(nodes)]
    if not beats or any(beat is None for beat in beats):
        return None, None
    oldest = min(beat.at for beat in beats)
    return datetime.fromtimestamp(oldest, UTC), beats[0].step


def fault_from_job_dir(ref: AttemptRef, nodes: int) -> Fault:
    """The class of a failed gang from its nodes' exit records; a gang with no record at all
    lost its supervisors: an infrastructure fault."""
    records = [ref.dir.read_exit(ref.number, node) for node in range(nodes)]
    return from_exit_records(r.reason for r in records if r is not None) or Fault.INFRASTRUCTURE


class Driver(LoggingConfigurable):
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
      to blame. Heartbeats come from the job directory (`heartbeat_of`).
    - `cancel(ref)`: ask the backend to stop the attempt (the job dir's exit record follows).
    - `warn(ref)`: deliver the preemption warning (SIGUSR1 to each node's supervisor, which
      tells the ranks); the controller cancels the attempt when the grace period ends.

    Override when the default does not fit:

    - `shape(spec)`: the spec as this backend runs it (Slurm: whole nodes); identity.
    - `validate(spec)`: refuse a spec this backend can never run (SpecRejected, saying what
      to change); by default checked against `capacity()`.
    - `validate_for(spec, tenant, queue)`: refuse what this backend's own queueing would never
      admit for this desk and queue (Kubernetes: Kueue's LocalQueue missing or stopped); nothing
      by default.
    - `launch_plan(ref)`: what the attempt's runtime reads (Slurm adds its rendezvous).
    - `apply_tenancy(tenancy)`: mirror quotas and fair share into a backend that has a
      scheduler of its own (Slurm: account limits and shares); nothing by default.
    - `start_estimate(spec, account)` -> epoch seconds: when the backend's own scheduler would
      start this job if it were submitted now (Slurm: `sbatch --test-only`); None when it
      cannot say (the default).
    - `node_notices()` -> {node: words}: nodes the backend announces are going away soon (a
      cloud's spot reclaim notice); the controller preempts what runs there, with its
      checkpoint warning. Nothing by default.
    - `cloud_instances()` and `node_runs(refs)`: a backend on rented nodes reports its cloud
      bill per instance and which attempt held which node when; the controller attributes the
      bill to attempts (`cloudbill`). Nothing by default.
    - Staging ahead (`stages_ahead = True`): `stage_targets(ref)` -> the nodes a waiting job
      would start on (Slurm: `sbatch --test-only`); `start_staging(ref, nodes)` starts
      `cellscale.runtime.stage` on each of them (after `stage_plan`), so its datasets are in
      the nodes' caches before it starts. Without it, each node stages when the job starts.
    - `fence(ref)`: before an attempt that never started moves to another backend, make sure
      it never starts here (the job directory's gate by default).
    - Sweeps (`JobSpec.sweep`; `runs_sweeps = True`): the control plane (`cellscale_hub.control.sweeps`)
      submits a sweep's tasks as arrays and rebalances them; the driver runs them. Override
      `max_array_size()` (the most indexes one array may have), `submit_array(array)` -> the
      backend's id (idempotent: `array.ref.resubmit` may find it already there),
      `live_tasks(arrays)` -> {array.key: {index: "pending" | "running"}} in ONE query for all
      of them (an index absent has ended), `task_end(array, index)` -> TaskEnd (None while the
      backend has not settled it), `cancel_array(array)`, `throttle_array(array, n)`.
    - The job-directory methods (`prepare`, `read_log`, `log_path`, `log_size`, `checkpoints`,
      `result_file`, `io_profile`, and the facts `observe_attempts` adds to each observation) assume a directory
      every node and the control plane share (`ref.job_dir`). A backend whose jobs write elsewhere
      (object storage, a pod's volume) overrides them; nothing else in the control plane opens a
      job's files.

    The controller calls `observe_attempts(refs)`, never `poll` directly, and sets `notify` to
    its `wake()`: a driver that learns by itself that an attempt ended (the local backend sees
    its supervisor exit) calls `notify()`, from any thread, so that the end is reconciled now
    rather than at the next tick. A driver without such news never calls it.
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

    assigns_gpu_ids = False  # True: the control plane picks GPU ids (the backend does not)
    stages_ahead = False  # True: it implements stage_targets and start_staging
    runs_sweeps = False  # True: it implements the sweep methods (submit_array and the rest)

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

    def validate_for(self, spec: JobSpec, tenant: str, queue: str) -> None:
        """Refuse a spec the backend's own queues would never admit for this desk's queue."""

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
        max_gb = self.data_cache_max_gb
        return DataCacheSettings(
            root=self.data_cache_root,
            max_bytes=None if max_gb is None else int(max_gb * 1e9),
            min_free_ratio=self.data_cache_min_free,
        )

    # -- staging a waiting job's datasets ahead (stages_ahead) -------------------------------------
    def stage_targets(self, ref: AttemptRef) -> list[str] | None:
        """The nodes the waiting job (its next attempt `ref`) would start on, as the backend's
        scheduler plans it now; None: it cannot say (then its nodes stage at start)."""
        return None

    def start_staging(self, ref: AttemptRef, nodes: list[str]) -> None:
        """Start copying the job's datasets into these nodes' caches (`cellscale.runtime.stage`),
        without waiting; progress is read back with `staging_progress`."""
        raise NotImplementedError(f"backend {self.name!r} does not stage ahead")

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

    def apply_tenancy(self, tenancy: Tenancy) -> None:
        """Mirror quotas and fair share into the backend's own scheduler; nothing to do for a
        backend that only runs what cellscale admits."""

    def start_estimate(self, spec: JobSpec, account: str) -> float | None:
        """When the backend's scheduler would start `spec` if submitted now (epoch seconds);
        None: it cannot say."""
        return None

    def node_notices(self) -> dict[str, str]:
        """Nodes announced to go away soon (node -> the notice in words)."""
        return {}

    def cloud_instances(self) -> list[Instance]:
        """The cloud bill of this backend's nodes, per instance (a backend on rented nodes);
        none by default."""
        return []

    def node_runs(self, refs: list[AttemptRef]) -> list[Run]:
        """Which of these attempts held which node when, from the backend's own accounting
        (to attribute `cloud_instances()`); none by default."""
        return []

    def fence(self, ref: AttemptRef) -> bool:
        """Make sure an attempt that has not started never starts (before it is moved to another
        backend): True if fenced, False if it had started. The job directory's gate by default."""
        return ref.dir.pass_gate(ref.number, "fenced") == "fenced"

    # -- sweeps (runs_sweeps) ------------------------------------------------------------------------
    def max_array_size(self) -> int:
        """The most indexes one array may have (Slurm's MaxArraySize caps the index: 0..size-1)."""
        raise NotImplementedError(f"backend {self.name!r} does not run sweeps")

    def submit_array(self, array: ArrayRef) -> str:
        raise NotImplementedError(f"backend {self.name!r} does not run sweeps")

    def live_tasks(self, arrays: list[ArrayRef]) -> dict[tuple[str, int], dict[int, str]]:
        raise NotImplementedError(f"backend {self.name!r} does not run sweeps")

    def task_end(self, array: ArrayRef, index: int) -> TaskEnd | None:
        raise NotImplementedError(f"backend {self.name!r} does not run sweeps")

    def cancel_array(self, array: ArrayRef) -> None:
        raise NotImplementedError(f"backend {self.name!r} does not run sweeps")

    def throttle_array(self, array: ArrayRef, throttle: int) -> None:
        raise NotImplementedError(f"backend {self.name!r} does not run sweeps")

    # -- the job directory ----------------------------------------------------------------------
    def prepare(self, ref: AttemptRef, bundle: Path | None, points: Path | None = None) -> None:
        """Write what the attempt's runtime reads (cell, inputs, plan; a sweep's points
        manifest and folders) before `submit`."""
        ref.dir.prepare(ref.number, ref.spec.source, self.launch_plan(ref), bundle, ref.result_key)
        if points is not None:
            sweep = self.sweep_dir(ref.job_dir)
            sweep.make_dirs()
            if not sweep.points.exists():
                write_atomic(sweep.points, points.read_bytes(), mode=0o644)

    def write_array(self, array: ArrayRef) -> None:
        """Write what an array's tasks read (its plan and throttle), theirs to read: the control
        plane may write them as root with a private umask, after the directory was handed over."""
        sweep = self.sweep_dir(array.ref.job_dir)
        sweep.write_array(array.plan)
        hand_files_to_owner(
            array.ref.owner, [sweep.array_file(array.plan.number), sweep.throttle_file(array.plan.number)]
        )

    def sweep_dir(self, job_dir: Path) -> SweepDir:
        """A sweep's files in its job directory (what its tasks wrote), read by the sweep runner."""
        return SweepDir(job_dir)

    def observe_attempts(self, refs: list[AttemptRef]) -> dict[tuple[str, int], Observation]:
        """`poll`, with what the job directory adds: the attempt's newest checkpoint, the
        checkpoint it resumed from, whether a finished job left its outputs, and an ended
        attempt's I/O profile (its ranks write theirs as their cells end, before the node's exit record)."""
        observed = self.poll(refs)
        for ref in refs:
            if ref.key in observed:
                obs, jd = observed[ref.key], ref.dir
                observed[ref.key] = dataclasses.replace(
                    obs,
                    checkpoint=jd.latest_checkpoint(ref.number),
                    resume=jd.read_resume(ref.number),
                    result=obs.state is AttemptState.SUCCEEDED and jd.has_result(),
                    io=self.io_profile(ref) if obs.state.ended else None,
                )
        return observed

    def io_profile(self, ref: AttemptRef) -> IoProfileView | None:
        """What the attempt's ranks read through cellscale.datasets and what its nodes staged
        (None: neither wrote a record)."""
        jd, nodes = ref.dir, ref.spec.resources.nodes
        stages = [stage for node in range(nodes) for stage in jd.read_stage(ref.number, node)]
        return io_profile(ref.number, jd.read_io(ref.number), stages)

    def usage(self, ref: AttemptRef) -> list[NodeUsage | None]:
        """What each node of the attempt used so far (its runtime's usage record), for the ledger."""
        return [ref.dir.read_usage(ref.number, node) for node in range(ref.spec.resources.nodes)]

    def read_log(self, job_dir: Path, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole lines of the job's combined log from byte `offset`, and the log's size."""
        return JobDir(job_dir).read_log(offset, max_bytes)

    def log_path(self, job_dir: Path) -> Path | None:
        """The local file that holds the job's combined log, for the control plane to be told
        when it changes (it reads it through `read_log` only); None when the log is not a file
        on this host (then followers rely on `log_size` every `log_poll_interval`)."""
        return JobDir(job_dir).log

    def log_size(self, job_dir: Path) -> int:
        """The size of the job's combined log (0 before it exists). `read_log` opens the file,
        where a stat could answer from NFS's attribute cache for up to a minute: an open
        revalidates it (close-to-open consistency)."""
        return self.read_log(job_dir, 0, 0)[1]

    def checkpoints(self, job_dir: Path, attempts: list[int]) -> list[CheckpointView]:
        """The checkpoints the job's attempts committed, oldest first."""
        return [
            CheckpointView(
                attempt=n,
                step=c.step,
                url=c.url,
                size_bytes=c.size_bytes,
                write_s=c.write_s,
                committed_at=datetime.fromtimestamp(c.wall_time, UTC),
            )
            for n in attempts
            for c in JobDir(job_dir).read_checkpoints(n)
        ]

    def point_result_file(self, job_dir: Path, point: int, array: int) -> tuple[Path, str | None] | None:
        """One sweep point's pickled outputs as its try in `array` wrote them, and their tag."""
        sweep = self.sweep_dir(job_dir)
        path = sweep.result_file(point, array)
        return (path, sweep.point_result_tag(point, array)) if path.exists() else None

    def read_point_log(self, job_dir: Path, point: int, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Bytes of one sweep point's own log from `offset`, and its size."""
        try:
            with open(self.sweep_dir(job_dir).point_log(point), "rb") as handle:
                handle.seek(offset)
                data = handle.read(max_bytes)
                return data, handle.seek(0, os.SEEK_END)
        except FileNotFoundError:
            return b"", 0

    def result_file(self, job_dir: Path) -> tuple[Path, str | None] | None:
        """Rank 0's pickled outputs (opaque bytes to the control plane) and the job's tag of
        them (HMAC under the key its kernel chose; None for a job submitted without one), or
        None if there are none."""
        jd = JobDir(job_dir)
        return (jd.result, jd.read_result_tag()) if jd.has_result() else None
