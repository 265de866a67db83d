"""The files of a job directory, as typed records: what the control plane writes for a job's
runtime and what the runtime writes back. `JobDir` reads and writes each of them; nothing
else parses these files. Light imports only (no torch): the control plane reads them too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from cellscale.spec import DatasetRef
from cellscale.vocabulary import DataMode, ExitReason, Fault, Launcher, PointStatus


class DataCacheSettings(BaseModel):
    """Where and how big each node's dataset cache is (`cellscale.runtime.datacache`)."""

    root: str = Field(description="Its directory on a node; `{node}` is replaced by the node's name.")
    max_bytes: int | None = Field(None, description="Most bytes it keeps; None: bounded by free space only.")
    min_free_ratio: float = Field(0.1, description="Free space of its filesystem it never fills.")


class LaunchPlan(BaseModel):
    """plan.json: what the runtime needs to start one attempt on its nodes."""

    job_id: str
    attempt: int
    launcher: Launcher
    nodes: int
    gpus_per_node: int
    procs_per_node: int
    cpus_per_task: int = 1  # cores each process asked for (--cpus): its default thread count
    gpu_ids: list[int] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    input_names: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = 3600.0
    master_addr: str | None = Field(None, description="Address of node 0; None: the first host Slurm allocated.")
    master_port: int | None = None
    ray_cluster: Literal["own", "backend"] = Field(
        "own",
        description="A ray job's cluster. own: node 0's supervisor starts a private Ray head and the other nodes' "
        "supervisors join it; backend: the backend started it (KubeRay's RayJob) and RAY_ADDRESS names it, so one "
        "supervisor runs, the driver's.",
    )
    datasets: list[DatasetRef] = Field(default_factory=list, description="What each node stages before its ranks.")
    data_mode: DataMode = DataMode.stage
    data_cache: DataCacheSettings | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def expected_ranks(self) -> int:
        """How many rank processes run the cell: one per GPU for torchrun and jax (or
        --tasks-per-node), one per node for plain, one driver for Ray."""
        if self.launcher is Launcher.ray:
            return 1
        return self.nodes * self.procs_per_node


class Started(BaseModel):
    """node<k>/started: written once by the node's supervisor when it takes the attempt."""

    pid: int
    host: str
    at: float | None = Field(None, description="Unix seconds it took the attempt (a local allocation's start).")


class Heartbeat(BaseModel):
    """node<k>/heartbeat.json: rewritten every few seconds while the supervisor lives."""

    at: float = Field(description="Unix seconds.")
    pid: int
    step: int | None = Field(None, description="Rank 0's last reported training step.")


class NodeUsage(BaseModel):
    """node<k>/usage.json: what the node used in this attempt, cumulative since it started
    (cellscale.runtime.usage); rewritten with each heartbeat and once more before exit.json."""

    since: float = Field(description="Unix seconds: when the node started the attempt.")
    at: float = Field(description="Unix seconds of the last sample.")
    gpus: int
    source: str = Field(description="Where GPU busy time came from: nvml | simulated | none.")
    gpu_used_s: float | None = Field(description="Σ over GPUs of busy share × seconds; None: unknown.")
    gpu_sampled_s: float = Field(description="GPUs × seconds the GPU samples cover.")
    cpu_s: float = Field(description="User + system CPU seconds of the node's processes.")
    memory_peak_bytes: int = Field(description="Peak of the summed RSS of the node's processes.")


class Progress(BaseModel):
    """progress.json: rank 0's last reported training step (JobEnvironment.report_step)."""

    step: int
    at: float


class PreemptNotice(BaseModel):
    """preempt-notice: the attempt was warned that it will be stopped (its existence is the signal)."""

    at: float


class ExitRecord(BaseModel):
    """node<k>/exit.json: how the node's part of the attempt ended."""

    code: int
    reason: ExitReason
    message: str | None = None
    at: float | None = Field(None, description="Unix seconds the node's part ended (a local allocation's end).")


class RankError(BaseModel):
    """error.json: the first failing rank's exception (a cell error replaces a lost peer's)."""

    rank: int
    summary: str
    kind: str = Field(description="exception | peer_lost (a collective saw another rank die).")

    @property
    def peer_lost(self) -> bool:
        return self.kind == "peer_lost"


class SourceReads(BaseModel):
    """What one process read from one source: "cache" (a node's staged copies) or the source
    itself ("s3://md")."""

    bytes: int = Field(description="Bytes its read calls returned.")
    reads: int = Field(description="Read calls.")
    read_s: float = Field(description="Seconds with at least one of its reads in flight.")


class RankIoProfile(BaseModel):
    """io/rank<r>.json: what one rank read through cellscale.datasets over its cell's run
    (cellscale.runtime.ioprofile), with the process's own /proc/self/io counters as a check."""

    rank: int
    node: int
    host: str
    wall_s: float = Field(description="Seconds the cell ran.")
    blocked_s: float = Field(description="Seconds with at least one dataset read in flight.")
    sources: dict[str, SourceReads] = Field(default_factory=dict)
    proc_rchar: int | None = Field(None, description="/proc/self/io rchar over the run: bytes every read returned.")
    proc_read_bytes: int | None = Field(
        None, description="/proc/self/io read_bytes over the run: bytes fetched from storage (not the page cache)."
    )
    at: float = Field(description="Unix seconds it was written.")


class StageRecord(BaseModel):
    """One dataset a node's supervisor staged before the ranks started (an entry of node<k>/stage.json)."""

    node: int
    name: str
    url: str
    hit: bool = Field(description="The node's cache had this version already: nothing fetched.")
    bytes: int = Field(description="The staged copy's size.")
    fetched_bytes: int = Field(description="Bytes fetched from the source to stage it.")
    seconds: float = Field(description="Seconds staging it took.")


class Checkpoint(BaseModel):
    """One committed checkpoint: a line of checkpoints.jsonl, and what Checkpointer.list() shows."""

    step: int
    url: str
    size_bytes: int
    wall_time: float = Field(description="When it was committed, Unix seconds.")
    write_s: float = Field(description="From the save() call to the commit.")
    verified: bool | None = None  # None: not checked (never written to the job directory)


class Skipped(BaseModel):
    """A committed checkpoint that failed verification, and why."""

    step: int
    url: str
    reason: str


class ResumeReport(BaseModel):
    """resume.json: the checkpoint an attempt resumed from, and the newer ones it passed over."""

    step: int
    url: str
    at: float
    skipped: list[Skipped] = Field(default_factory=list)


class ArrayPlan(BaseModel):
    """arrays/<n>.json: one submission of some of a sweep's tasks (a Slurm job array, a local
    task pool). Its index i runs the points `tasks[i]`, one after another."""

    number: int
    attempt: int
    offset: int = Field(0, description="The sweep's task number of index 0 (arrays chunk a sweep by MaxArraySize).")
    tasks: list[list[int]]
    throttle: int = Field(description="Most of its tasks running at once (Slurm's %N).")
    timeout_s: float = Field(description="Each task's time limit: the points it runs x the job's --time.")
    excluded_nodes: list[str] = Field(default_factory=list)
    slot_gpus: list[list[int]] = Field(
        default_factory=list, description="Local pools: the GPU ids of each slot (a task takes a free slot)."
    )


class TaskStarted(BaseModel):
    """runs/<n>.<i>: written by a sweep task when it starts."""

    host: str
    pid: int
    at: float


class TaskEnded(BaseModel):
    """runs/<n>.<i>.end: how a sweep task ended (written by the task, or by the local pool when
    the task died without writing it)."""

    code: int
    reason: ExitReason
    at: float
    message: str | None = None


class PointOutcome(BaseModel):
    """outcomes/<point>.<n>.json: how one try of one point ended (n: the array that ran it)."""

    status: Literal[PointStatus.done, PointStatus.failed]
    fault: Fault | None = Field(None, description="A Fault value when it failed.")
    host: str
    wall_s: float
    at: float
    error: str | None = None
    traceback: str | None = None
    result: bool = Field(False, description="It wrote results/<point>.<n>.pkl.")


class StagePlan(BaseModel):
    """staging/plan.json: datasets to copy into the caches of the nodes a waiting job is
    expected to start on (`python -m cellscale.runtime.stage`, one process per node)."""

    datasets: list[DatasetRef]
    cache: DataCacheSettings
    nodes: list[str] = Field(description="The nodes it was planned for.")
    env: dict[str, str] = Field(default_factory=dict, description="The job's --env (the source's credentials).")
    at: float


class DatasetProgress(BaseModel):
    name: str
    done_bytes: int = 0
    total_bytes: int | None = None  # None: not listed yet
    hit: bool = False  # the node already had it
    finished: bool = False
    error: str | None = None


class StageProgress(BaseModel):
    """staging/<node>.json: one node's staging, rewritten as bytes land."""

    node: str
    pid: int
    started: float
    at: float
    datasets: list[DatasetProgress]

    @property
    def finished(self) -> bool:
        return all(d.finished or d.error for d in self.datasets)
