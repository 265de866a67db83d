"""The wire contract between kernels, the control plane and the panel.

Every object that crosses a process boundary is a pydantic model defined here. The
control plane's OpenAPI schema is generated from these models, and so are the panel's
TypeScript types: nothing is written twice.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    computed_field,
    field_validator,
    model_validator,
)

from cellscale.vocabulary import (
    AttemptState,
    EventKind,
    EventReason,
    Fault,
    Launcher,
    PendingCode,
    Phase,
    PointStatus,
    Resource,
)

MAX_INPUTS_BYTES = 64 * 1024 * 1024
"""Largest pickled input bundle a job may carry (64 MiB). Ship bigger data by URL."""

MAX_SOURCE_BYTES = 1024 * 1024
"""Largest cell source (1 MiB)."""

MAX_ENV_VARS = 256
"""Most environment variables a job may set (--env)."""

MAX_ENV_BYTES = 64 * 1024
"""Most bytes of --env, every `KEY=VALUE` counted with its terminating NUL, as the OS counts it
(64 KiB: well inside one exec's limits, MAX_ARG_STRLEN and ARG_MAX, on every Linux)."""

MAX_NAMES = 256
"""Most variables a job may ship in (--inputs) or bring back (--outputs)."""

MAX_NAME_CHARS = 128
"""Longest variable or environment variable name."""

MAX_SAFE_INT = 2**53 - 1
"""Largest integer every client reads exactly from JSON (JavaScript's Number.MAX_SAFE_INTEGER):
the bound of the offsets and ids a client sends back (log offsets, event ids)."""

MAX_ARG_STRLEN = 131072
"""Linux: the longest one argument or `KEY=VALUE` environment string of an exec may be, NUL
included; a longer one fails with E2BIG ("Argument list too long")."""

EXEC_RESERVE_BYTES = 64 * 1024
"""What an attempt adds to the job's --env when it starts its processes: cellscale's and the
scheduler's variables, the inherited environment, the launcher's arguments."""

RESULT_TAG_HEADER = "X-Cellscale-Result-Tag"
"""The response header of GET /api/jobs/ID/result carrying the job's HMAC of its outputs."""

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_ENV_PREFIXES = (
    "CELLSCALE_",
    "SLURM_",
    "CUDA_VISIBLE_DEVICES",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_",
    "JAX_COORDINATOR_ADDRESS",  # this and the next two: a jax job's coordinates
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
)
PER_GPU_LAUNCHERS = (Launcher.torchrun, Launcher.jax)
"""Launchers that start several processes per node: one per GPU unless --tasks-per-node says."""
USER_SETTABLE_ENV = frozenset({"CELLSCALE_SIMULATED_GPU_DUTY", "CELLSCALE_SIMULATED_GPU_PERIOD_S"})
"""cellscale's own variables a job may set: the GPU simulation of nodes without GPUs
(cellscale.runtime.usage; ignored where NVML sees real GPUs)."""

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
QueueName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
ResultKey = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
OriginText = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^[^\x00-\x1f\x7f]*$")]
"""A run id, step, asset, partition or link a workflow engine names a job by: printable, one line."""
MAX_TITLE_CHARS = 120
"""Longest job title (what the notebook, panel and command line show a job as)."""
Title = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=MAX_TITLE_CHARS,
        pattern=r"^[^\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]+$",
    ),
]
"""A job's title: one line of printable text (no control, line-break or bidi characters)."""
MAX_ORIGIN_PARTITIONS = 20
"""Partitions an Origin lists by name (a backfill's job lists the first ones and counts all)."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ErrorBody(BaseModel):
    """Every refusal of the control plane (4xx), validation errors included."""

    detail: str = Field(description="One sentence: what was refused and what to change.")


MAX_MEMORY_MB = 64 * 2**20
"""The most memory per node a job may ask for (64 TiB), far beyond any node."""

_MEMORY = re.compile(r"^\s*(\d+)\s*([kmgtKMGT]?)(i?[bB]?)\s*$")
_MEMORY_UNITS = {"": 1, "m": 1, "g": 1024, "t": 1024 * 1024}


def parse_memory_mb(text: str | int) -> int:
    """A memory size in MiB: a number of MiB, or with a unit K, M, G or T (binary, as Slurm's
    --mem reads them; "Gi" and "GB" mean the same)."""
    if isinstance(text, int):
        return text
    match = _MEMORY.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a memory size: use a number with M, G or T (e.g. 4G, 512M, 1T)")
    amount, unit = int(match.group(1)), match.group(2).lower()
    if unit == "k":
        return -(-amount // 1024)  # whole MiB, rounded up
    return amount * _MEMORY_UNITS[unit]


class Resources(Strict):
    """The gang: every rank's resources, granted all at once or not at all."""

    nodes: int = Field(1, ge=1, le=1024, description="Number of nodes.")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs on each node (0: CPU-only job).")
    tasks_per_node: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Processes (ranks) on each node; absent: one per GPU for torchrun and jax, else one.",
    )
    cpus_per_task: int = Field(1, ge=1, le=1024, description="CPU cores for each process (Slurm's --cpus-per-task).")
    memory_mb_per_node: int | None = Field(
        None,
        ge=1,
        le=MAX_MEMORY_MB,
        description="Memory per node in MiB (--mem); absent: the backend's default per core, not counted in quotas.",
    )
    timeout_min: int = Field(60, ge=1, le=60 * 24 * 14, description="Wall-clock limit in minutes.")
    switches: int | None = Field(None, ge=1, le=64, description="Most leaf switches the nodes may span (topology).")

    @field_validator("memory_mb_per_node", mode="before")
    @classmethod
    def _memory_with_units(cls, value):
        return parse_memory_mb(value) if isinstance(value, str) else value

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def cpus_per_node(self) -> int:
        return (self.tasks_per_node or 1) * self.cpus_per_task

    @property
    def cpus(self) -> int:
        return self.nodes * self.cpus_per_node

    @property
    def memory_mb(self) -> int:
        """Memory asked for in all (0: none asked; the backend's default applies)."""
        return self.nodes * (self.memory_mb_per_node or 0)


class Retries(Strict):
    """How many times each class of fault is retried (a new attempt that resumes from the
    newest verified checkpoint). Preemption is always requeued and never counted."""

    infrastructure: int = Field(3, ge=0, le=100, description="Node failures, killed ranks, lost or hung attempts.")
    timeout: int = Field(0, ge=0, le=100, description="Attempts that ran past --time.")
    user_error: int = Field(0, ge=0, le=100, description="Exceptions in the cell.")


MAX_SWEEP_POINTS = 100_000
"""Most points one sweep may have (split a larger grid into several sweeps)."""


class Sweep(Strict):
    """The cell runs once per point of a grid (`%%cluster map`): every point is its own task with
    its own result, log and retries, and the whole sweep is ONE job for admission, holding
    `max_parallel` times `resources` (each task's) while it runs."""

    points: int = Field(ge=1, le=MAX_SWEEP_POINTS, description="How many points the grid has.")
    points_sha256: Sha256 = Field(
        description="The uploaded points manifest (POST /api/bundles): JSON, "
        '{"points": [{"name": value, ...}, ...]} (cellscale.points); read by the control plane, never unpickled.'
    )
    max_parallel: int = Field(64, ge=1, le=10_000, description="Most tasks running at once (--max-parallel).")
    per_task: int = Field(
        1, ge=1, le=10_000, description="Points one task runs one after another (--per-task): for tiny points."
    )

    @property
    def tasks(self) -> int:
        return -(-self.points // self.per_task)

    @property
    def slots(self) -> int:
        """Tasks it may run at once: what admission reserves, each of the spec's resources."""
        return min(self.max_parallel, self.tasks)


class Origin(Strict):
    """Who asked for a job when a workflow engine submitted it on a user's behalf: shown with the
    job (panel, `%cluster status`) so a researcher can find the run and asset it belongs to."""

    tool: Literal["dagster"] = Field(description="The engine that submitted it.")
    run_id: OriginText = Field(description="The engine's run (Dagster's run id).")
    step: OriginText | None = Field(None, description="The step of that run (Dagster's step key).")
    asset: OriginText | None = Field(None, description="The asset it materializes (Dagster's asset key, '/'-joined).")
    partitions: list[OriginText] = Field(
        default_factory=list, max_length=MAX_ORIGIN_PARTITIONS, description="The partitions it materializes."
    )
    partition_count: int = Field(
        0, ge=0, description="How many partitions it materializes (more than `partitions` lists when many)."
    )
    url: OriginText | None = Field(None, description="A link to the run in the engine's UI, when it has one.")


DataUrl = Annotated[str, StringConstraints(max_length=1024, pattern=r"^([a-z][a-z0-9+.-]*://|/)[^\s\x00-\x1f\x7f]*$")]
"""An fsspec URL (`s3://bucket/prefix`, `gs://...`, `file:///path`) or an absolute path: one line."""
DataVersion = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")]
"""An etag, manifest hash or snapshot id (`v42`, `sha256:ab12...`, `2026-12-01`)."""


class DatasetRef(Strict):
    """A dataset a job reads: a name registered in the tenancy (which gives its URL, version and
    home site), or a name with its own URL (`bars=s3://md/bars/2024@v42`). The control plane
    stores it resolved, so a job records the exact version it read."""

    name: Name
    url: DataUrl | None = Field(None, description="fsspec URL of its directory or file; absent: the tenancy's.")
    version: DataVersion | None = Field(
        None,
        description="Its version (etag, manifest hash or snapshot id): a node's cached copy of it is used without "
        "asking the source again. Absent: what is there when it is staged (listed each time).",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        description="fsspec options that are not secrets (an endpoint_url); the tenancy's for a registered name.",
    )

    @classmethod
    def parse(cls, text: str) -> DatasetRef:
        """`name`, or `name=URL` with an optional `@version` after the URL's last slash."""
        name, _, location = text.partition("=")
        if not location:
            return cls(name=name)
        url, at, version = location.rpartition("@")
        if not at or "/" in version:
            return cls(name=name, url=location)
        return cls(name=name, url=url, version=version)

    def words(self) -> str:
        """How the magic spells it."""
        if self.url is None:
            return self.name
        return f"{self.name}={self.url}" + (f"@{self.version}" if self.version else "")


class JobSpec(Strict):
    """What a user asks for. Validated completely before anything is stored."""

    name: Name = Field("cell", description="A slug: what --name sets and GET /api/jobs?name= matches.")
    title: Title | None = Field(
        None,
        description="How it is shown: where it came from (`train.ipynb [12]`, a cell's first line, a file, an asset "
        "and partition), at most 120 printable characters on one line; absent: its name. Never in a backend's script.",
    )
    launcher: Launcher = Launcher.torchrun
    resources: Resources = Field(default_factory=Resources)
    queue: QueueName | None = Field(None, description="LocalQueue of the user's tenant; its default when absent.")
    backend: Name | None = Field(None, description="Backend to run on; chosen by the queue when absent.")
    site: Name | None = Field(
        None,
        description="Site (datacenter or cloud pool) to run at; absent or 'auto': placement weighs every site of the "
        "queue (start time, dollars, data, budget).",
    )
    burst: Literal["never", "allow"] | None = Field(
        None, description="Whether it may go to a cloud site; absent: the desk's default."
    )
    datasets: list[DatasetRef] = Field(
        default_factory=list,
        max_length=MAX_NAMES,
        description="Datasets it reads: staged into its nodes' caches while it waits (or read from the source with "
        "data_mode stream); placement keeps it near their home sites or counts moving them.",
    )
    data_mode: Literal["stage", "stream"] = Field(
        "stage",
        description="stage: copy each dataset to its nodes' cache before the ranks start (while it waits when "
        "the nodes are known); stream: the ranks read the source directly.",
    )
    priority: Name | None = Field(None, description="Priority class (e.g. low, normal, high); normal when absent.")
    retries: Retries = Field(default_factory=Retries)
    stall_timeout_s: float | None = Field(
        None,
        ge=10,
        le=7 * 24 * 3600,
        description=(
            "Once the job reports training steps (JobEnvironment.report_step, Checkpointer.maybe_save), an attempt "
            "whose step does not advance for this long counts as hung (deadlocked in a collective): stopped, retried."
        ),
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ENV_VARS,
        description=(
            f"Extra environment variables for every rank: at most {MAX_ENV_VARS}, names of at most "
            f"{MAX_NAME_CHARS} characters, {MAX_ENV_BYTES // 1024} KiB in all (each KEY=VALUE and its NUL)."
        ),
    )
    source: str = Field(..., description=f"The cell's Python source ({MAX_SOURCE_BYTES // 2**20} MiB at most).")
    input_names: list[str] = Field(
        default_factory=list,
        max_length=MAX_NAMES,
        description=f"Names bound from the inputs bundle (at most {MAX_NAMES}, {MAX_NAME_CHARS} characters each).",
    )
    inputs_sha256: Sha256 | None = Field(None, description="Content address of the uploaded inputs bundle.")
    outputs: list[str] = Field(
        default_factory=list,
        max_length=MAX_NAMES,
        description=f"Variables returned from rank 0 (at most {MAX_NAMES}, {MAX_NAME_CHARS} characters each).",
    )
    sweep: Sweep | None = Field(
        None, description="Run the cell once per point of a grid (each point's values bound as variables)."
    )
    origin: Origin | None = Field(
        None, description="The workflow run that submitted it (Dagster's run, step, asset and partitions)."
    )

    def code_key(self) -> str:
        """What a sweep point's result depends on besides the point (the result cache's key, with
        `cellscale.points.point_key`): the cell, its inputs bundle, outputs, launcher, environment
        and datasets. Not its resources, retries or name: they do not change a result."""
        material = {
            "source": self.source,
            "inputs": self.inputs_sha256,
            "input_names": self.input_names,
            "outputs": self.outputs,
            "launcher": self.launcher.value,
            "env": self.env,
            "datasets": [d.words() for d in self.datasets],
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    @property
    def slots(self) -> int:
        """Gangs of `resources` it holds at once: 1, or a sweep's tasks in flight."""
        return self.sweep.slots if self.sweep else 1

    @property
    def demand(self) -> Resources:
        """What admission reserves for it: `resources`, or a sweep's slots of them side by side."""
        if self.sweep is None:
            return self.resources
        return self.resources.model_copy(update={"nodes": self.resources.nodes * self.slots})

    @field_validator("source")
    @classmethod
    def _source_fits(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the cell is empty: put the code to run below the %%cluster line")
        if len(value.encode()) > MAX_SOURCE_BYTES:
            raise ValueError(f"the cell is larger than {MAX_SOURCE_BYTES} bytes")
        return value

    @field_validator("datasets", mode="before")
    @classmethod
    def _dataset_words(cls, value: object) -> object:
        """Each one as the magic spells it (`bars`, `bars=s3://md/bars@v42`) or as an object."""
        if not isinstance(value, list):
            return value
        return [DatasetRef.parse(item) if isinstance(item, str) else item for item in value]

    @field_validator("datasets")
    @classmethod
    def _datasets_once(cls, value: list[DatasetRef]) -> list[DatasetRef]:
        names = [d.name for d in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"dataset {', '.join(map(repr, twice))} is named twice")
        return value

    @field_validator("input_names", "outputs")
    @classmethod
    def _identifiers(cls, names: list[str]) -> list[str]:
        for name in names:
            if len(name) > MAX_NAME_CHARS:
                raise ValueError(f"{name[:20]!r}... is longer than {MAX_NAME_CHARS} characters")
            if not _IDENT.match(name) or keyword.iskeyword(name):
                raise ValueError(f"{name!r} is not a Python variable name")
        if len(set(names)) != len(names):
            raise ValueError("a variable is named twice")
        return names

    @field_validator("env")
    @classmethod
    def _env_keys(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if len(key) > MAX_NAME_CHARS:
                raise ValueError(
                    f"environment variable name {key[:20]!r}... is longer than {MAX_NAME_CHARS} characters"
                )
            if not _ENV_KEY.match(key):
                raise ValueError(f"environment variable name {key!r} is invalid (letters, digits, _)")
            if key.startswith(_RESERVED_ENV_PREFIXES) and key not in USER_SETTABLE_ENV:
                raise ValueError(f"environment variable {key!r} is set by cellscale itself; pick another name")
            if "\0" in value or "\n" in value:
                raise ValueError(f"environment variable {key!r} contains a newline or NUL")
        size = env_bytes(env)
        if size > MAX_ENV_BYTES:
            raise ValueError(
                f"{size / 1024:.1f} KiB of environment ({size} bytes, each KEY=VALUE with its NUL); a job's "
                f"environment may be at most {MAX_ENV_BYTES // 1024} KiB: ship large values as a file or with --inputs"
            )
        return env

    @model_validator(mode="after")
    def _inputs_match(self) -> JobSpec:
        if bool(self.input_names) != bool(self.inputs_sha256):
            raise ValueError("input_names and inputs_sha256 go together")
        if self.launcher is Launcher.ray and self.resources.nodes > 1 and self.resources.gpus_per_node == 0:
            raise ValueError("a multi-node Ray job needs --gpus-per-node")
        return self

    @model_validator(mode="after")
    def _sweep_tasks_are_one_process(self) -> JobSpec:
        if self.sweep is None:
            return self
        if self.launcher is not Launcher.plain:
            raise ValueError(
                f"a sweep runs each point in one process: use --launcher plain (not {self.launcher.value}), "
                "or run the distributed cell once per point with its own %%cluster"
            )
        if self.resources.nodes > 1:
            raise ValueError("a sweep task runs on one node: leave out --nodes (each point gets --gpus on one node)")
        return self

    @model_validator(mode="after")
    def _tasks_said(self) -> JobSpec:
        """Stored with its processes per node spelled out: one per GPU for torchrun and jax, else one."""
        per_gpu = self.launcher in PER_GPU_LAUNCHERS
        if (self.resources.tasks_per_node or 1) > 1 and not per_gpu:
            raise ValueError(f"--tasks-per-node starts several processes per node: a {self.launcher.value} job has one")
        if self.resources.tasks_per_node is None:
            tasks = max(1, self.resources.gpus_per_node) if per_gpu else 1
            self.resources = self.resources.model_copy(update={"tasks_per_node": tasks})
        return self


class SubmitRequest(Strict):
    spec: JobSpec
    result_key: ResultKey | None = Field(
        None,
        description="A secret the job signs its outputs with (HMAC-SHA256, 64 hex digits), chosen by the client, "
        "which checks the signature before it unpickles them. Kept by the control plane, never shown in a view.",
    )


def env_bytes(env: Mapping[str, str]) -> int:
    """What `env` weighs in an exec: every `KEY=VALUE` in UTF-8 with its terminating NUL."""
    return sum(
        len(key.encode(errors="surrogatepass")) + len(value.encode(errors="surrogatepass")) + 2
        for key, value in env.items()
    )


def exec_limit() -> int:
    """ARG_MAX of this OS: the most bytes of arguments and environment one exec may carry."""
    try:
        limit = os.sysconf("SC_ARG_MAX")
    except (AttributeError, ValueError, OSError):
        limit = -1
    return limit if limit > 0 else 2 * 2**20


def exec_refusal(
    env: Mapping[str, str], argv: Sequence[str] = (), arg_max: int | None = None, reserve: int = EXEC_RESERVE_BYTES
) -> str | None:
    """Why the OS would refuse (E2BIG) to start a job's processes with this --env and these
    arguments, in one sentence that names --env; None if they fit. Each string must stay within
    MAX_ARG_STRLEN, and all of them (a pointer each, plus `reserve` for what the attempt adds)
    within ARG_MAX."""
    for key, value in env.items():
        size = len(key.encode(errors="surrogatepass")) + len(value.encode(errors="surrogatepass")) + 2
        if size > MAX_ARG_STRLEN:
            return (
                f"--env {key}: {size} bytes, more than the {MAX_ARG_STRLEN} bytes the OS allows one variable "
                "(Argument list too long); ship large values as a file or with --inputs"
            )
    for arg in argv:
        if len(arg.encode(errors="surrogatepass")) + 1 > MAX_ARG_STRLEN:
            return f"an argument is longer than the {MAX_ARG_STRLEN} bytes the OS allows one (Argument list too long)"
    limit = exec_limit() if arg_max is None else arg_max
    pointer = 8
    total = env_bytes(env) + pointer * len(env) + sum(len(a.encode(errors="surrogatepass")) + 1 + pointer for a in argv)
    if total + reserve > limit:
        return (
            f"--env and the job's arguments take {total} bytes; with the {reserve // 1024} KiB an attempt adds that "
            f"is more than the {limit} bytes this OS lets one process start with (ARG_MAX, Argument list too long): "
            "set fewer or smaller --env variables"
        )
    return None


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


class IoSourceView(BaseModel):
    """What a job's ranks read from one source."""

    source: str = Field(
        description='"cache": the nodes\' staged copies; else the source\'s scheme and bucket ("s3://md").'
    )
    bytes: int
    reads: int = Field(description="Read calls.")
    read_s: float = Field(description="Seconds the ranks were blocked reading it, summed over the ranks.")
    mb_per_s: float | None = Field(description="bytes / read_s in MB/s (10^6): one rank's read rate (null: no time).")


class IoRankView(BaseModel):
    """One rank's reads over its cell's run."""

    rank: int
    host: str
    wall_s: float = Field(description="Seconds the cell ran.")
    blocked_s: float = Field(description="Seconds with a dataset read in flight.")
    blocked_fraction: float = Field(description="blocked_s / wall_s.")
    bytes: int = Field(description="Bytes it read through cellscale.datasets.")
    proc_rchar: int | None = Field(None, description="Bytes every read of the process returned (/proc/self/io).")
    proc_read_bytes: int | None = Field(None, description="Bytes the process fetched from storage (/proc/self/io).")


class StageView(BaseModel):
    """How one dataset was staged on the job's nodes before the ranks started."""

    name: str
    url: str
    nodes: int = Field(description="Nodes that staged it.")
    hits: int = Field(description="Of those, the nodes whose cache had it already (nothing fetched).")
    bytes: int = Field(description="The staged copy's size.")
    fetched_bytes: int = Field(description="Bytes fetched from the source, all nodes together.")
    seconds: float = Field(description="The slowest node's staging time.")


class IoProfileView(BaseModel):
    """Where a job's reads came from and what they cost it: its newest attempt's profile (each
    rank's reads through cellscale.datasets), with a verdict in words."""

    attempt: int
    verdict: str = Field(
        description='e.g. "I/O-bound: 38% of step time waiting on s3://md; staging would cut it to <2%", '
        '"not I/O-bound: 1% of step time in reads (92% from the node cache)".'
    )
    io_bound: bool = Field(description="Its ranks spent at least 20% of their time blocked in reads.")
    blocked_fraction: float = Field(description="Seconds blocked in reads / seconds the cells ran, over all ranks.")
    bytes: int = Field(description="Bytes its ranks read through cellscale.datasets.")
    cache_hit_ratio: float | None = Field(description="Of those bytes, the share served by staged copies (null: none).")
    sources: list[IoSourceView] = Field(default_factory=list, description="By bytes read, most first.")
    rank_count: int = Field(0, description="Ranks that wrote a profile.")
    ranks: list[IoRankView] = Field(
        default_factory=list, description="The most blocked ranks first, at most 16 (a big job's list stays short)."
    )
    staging: list[StageView] = Field(default_factory=list, description="Each dataset's staging, over the nodes.")


class AheadView(BaseModel):
    """A job in the way of a waiting one."""

    job_id: str
    cluster_queue: str
    gpus: int = Field(description="Its GPUs (0: a CPU job).")
    why: str = Field(description="e.g. borrowing, within its quota, next in queue, being preempted.")
    holds: str = Field("", description='What it holds (or waits for) of the resource in the way: "4 GPUs", "8 CPUs".')
    name: str | None = Field(None, description="Its name (JobSpec.name), when known.")
    owner: str | None = Field(None, description="Who submitted it, when known.")


class SiteOfferView(BaseModel):
    """One site a waiting job could go to, as placement weighed it."""

    site: str
    flavor: str
    cloud: bool = False
    fits_now: bool = Field(description="Its quota and the site's capacity would take it now.")
    start_in_s: float = Field(description="Seconds until it could run there (boot and data transfer included).")
    start_known: bool = Field(True, description="False: nothing in the way has a known end (an assumed wait).")
    usd: float = Field(description="Estimated dollars there: its run at the site's price (cloud: boot and idle tail).")
    move_gb: float = Field(0.0, description="Data and checkpoint it would move there.")
    move_usd: float = Field(0.0, description="Egress for that.")
    excluded: str | None = Field(None, description="Why it may not go there (budget, a stockout, a lost site).")


class PendingView(BaseModel):
    """Why a job waits: structured, and in plain words."""

    code: PendingCode
    message: str = Field(
        description='In words: first what it waits for and who has it (the reader\'s own jobs as "your job"), '
        'then, after " Details: ", the quotas and cohorts behind it.'
    )
    position: int = Field(description="1 = next in its ClusterQueue.")
    flavor: str | None = None
    needs: int = Field(0, description="How much of `resource` the job needs.")
    available: int = Field(0, description="How much of `resource` it could get now.")
    ahead: list[AheadView] = Field(default_factory=list)
    estimated_start: datetime | None = Field(None, description="If every holder runs to its time limit; null: unknown.")
    resource: Resource = Field(Resource.gpu, description="What it waits for: GPUs, CPU cores or memory (MiB).")
    sites: list[SiteOfferView] = Field(default_factory=list, description="Every site it may use, when it has a choice.")
    staging: str | None = Field(
        None,
        description="Its datasets being copied to the nodes it will start on, in words (staging bars: 3.1 of 8 GB).",
    )


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


class SweepProgress(BaseModel):
    """A sweep's points by status, as the panel's progress bar and the notebook's line show it."""

    points: int
    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    cached: int = 0
    cancelled: int = 0
    retried: int = Field(0, description="Points that needed more than one try.")
    max_parallel: int = Field(description="Most tasks in flight at once.")
    arrays: int = Field(0, description="Backend submissions so far (Slurm job arrays; local task pools).")
    eta_s: float | None = Field(None, description="Seconds until every point is done, at the pace so far.")

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.cached + self.cancelled


class PointView(BaseModel):
    """One point of a sweep: its values, where it is, and how its tries went."""

    index: int
    params: dict = Field(description="The point's values, as the points manifest has them (cellscale.points).")
    status: PointStatus
    tries: int = Field(0, description="Times a task started it.")
    fault: Fault | None = Field(None, description="Why its last try did not succeed.")
    node: str | None = Field(None, description="Where its last try ran.")
    wall_s: float | None = Field(None, description="Seconds its last try took.")
    error: str | None = Field(None, description="One line: why it failed.")
    traceback: str | None = Field(None, description="The exception in the cell, from the cell's own frames.")
    result_job: str | None = Field(
        None, description="The job whose task wrote its outputs: this sweep, or (cached) an earlier one."
    )
    stamp: int = Field(description="Changes whenever the point does (microseconds).")


class PointPage(BaseModel):
    items: list[PointView]
    stamp: int = Field(description="Pass as since= to get only the points that changed after this page.")


MAX_RESULTS_PER_CALL = 200
"""Most points whose outputs one GET /api/jobs/ID/points/results returns."""


class PointResult(BaseModel):
    index: int
    result_job: str = Field(description="The job whose task wrote them (its key signed them).")
    data: str = Field(description="The pickled outputs, base64 (never unpickled by the control plane).")
    tag: str | None = Field(None, description="HMAC-SHA256 of the bytes under the key of result_job.")


class PointResults(BaseModel):
    """Several points' outputs at once (a notebook fills its DataFrame with a few calls)."""

    items: list[PointResult]
    missing: list[int] = Field(default_factory=list, description="Asked for; no outputs (yet).")
    later: list[int] = Field(default_factory=list, description="Left for the next call: the answer was big enough.")


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


class BundleRef(BaseModel):
    sha256: Sha256
    size: int


class BundleShare(Strict):
    """Whom to share one of your input bundles with."""

    user: Annotated[str, StringConstraints(pattern=r"^[^/\x00-\x1f]{1,255}$")] = Field(
        description="The JupyterHub user name whose jobs may then use the bundle."
    )


class BackendView(BaseModel):
    name: str
    kind: str
    capacity_gpus: int
    max_nodes: int
    gpus_per_node: int
    launchers: list[Launcher]
    capacity_cpus: int | None = Field(None, description="CPU cores in all (None: the backend does not say).")
    cpus_per_node: int | None = Field(None, description="Cores of its largest node.")
    capacity_memory_mb: int | None = Field(None, description="Memory in all, MiB.")
    memory_mb_per_node: int | None = Field(None, description="Memory of its largest node, MiB.")


class JobLimits(BaseModel):
    """The most one job of a queue can ever get: what its quota can reach (nominal plus what
    its tree may lend) on its best flavor, no more than that backend's largest gang. A
    `%%cluster` flag above it is refused with these numbers ("ask for at most --gpus 4")."""

    queue: str
    cluster_queue: str
    gpus: int | None = Field(None, description="GPUs in all (None: nothing bounds them here).")
    cpus: int | None = Field(None, description="CPU cores in all (None: nothing bounds them here).")
    memory_mb: int | None = Field(None, description="Memory in all, MiB (None: nothing bounds it here).")


class WhoAmI(BaseModel):
    user: str
    tenant: str | None
    tenants: list[str]
    queues: list[str]
    admin: bool


class FlavorUsage(BaseModel):
    flavor: str
    backend: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    used: int = Field(description="GPUs held by admitted and running jobs.")
    borrowed: int = Field(description="Of those, GPUs beyond nominal.")
    cpus_used: int = Field(0, description="CPU cores held by admitted and running jobs.")
    cpu_nominal: int | None = Field(None, description="The queue's CPU quota here (None: not quota'd).")
    memory_mb_used: int = Field(0, description="Memory (MiB) held, as jobs asked for it with --mem.")
    memory_mb_nominal: int | None = Field(None, description="The queue's memory quota here, MiB (None: not quota'd).")


class QueueUsage(BaseModel):
    """One ClusterQueue's quota and what it uses, as its desk and admins see it."""

    cluster_queue: str
    cohort: str | None
    weight: float
    flavors: list[FlavorUsage]
    pending_jobs: int
    pending_gpus: int = Field(description="GPUs wanted by its waiting jobs.")
    pending_cpus: int = Field(0, description="CPU cores wanted by its waiting jobs.")
    recent_gpus: float = Field(
        description="Average use over the fair-share half-life (decayed history), in GPU-equivalents: GPUs, "
        "plus CPUs and memory at the tenancy's resource_weights."
    )
    gpu_hours: float = Field(description="GPU-hours used by its jobs so far.")


class RenderView(BaseModel):
    backend: str
    script: str
    estimate: CostEstimate | None = Field(None, description="What it would cost, were it submitted now.")
