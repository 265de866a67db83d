"""What a user asks for (`JobSpec`) and how it is submitted: the request, its bounds, the
workflow run behind it (`Origin`), and the inputs bundle it names."""

from __future__ import annotations

import hashlib
import json
import keyword
import re
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints, field_validator, model_validator

from cellscale.spec.data import DatasetRef
from cellscale.spec.environment import MAX_ENV_BYTES, MAX_ENV_VARS, check_env
from cellscale.spec.fields import MAX_NAME_CHARS, Name, QueueName, Sha256, Strict
from cellscale.spec.resources import Resources, Retries
from cellscale.spec.sweeps import Sweep
from cellscale.vocabulary import BurstPolicy, DataMode, Launcher

MAX_INPUTS_BYTES = 64 * 1024 * 1024
"""Largest pickled input bundle a job may carry (64 MiB). Ship bigger data by URL."""

MAX_SOURCE_BYTES = 1024 * 1024
"""Largest cell source (1 MiB)."""

MAX_NAMES = 256
"""Most variables a job may ship in (--inputs) or bring back (--outputs)."""

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

PER_GPU_LAUNCHERS = (Launcher.torchrun, Launcher.jax)
"""Launchers that start several processes per node: one per GPU unless --tasks-per-node says."""

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
    # the enums' members as Literals: typed by the vocabulary, spelled inline in the OpenAPI schema
    # (and the panel's generated types) as before
    burst: Literal[BurstPolicy.never, BurstPolicy.allow] | None = Field(
        None, description="Whether it may go to a cloud site; absent: the desk's default."
    )
    datasets: list[DatasetRef] = Field(
        default_factory=list,
        max_length=MAX_NAMES,
        description="Datasets it reads: staged into its nodes' caches while it waits (or read from the source with "
        "data_mode stream); placement keeps it near their home sites or counts moving them.",
    )
    data_mode: Literal[DataMode.stage, DataMode.stream] = Field(
        DataMode.stage,
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
        return check_env(env)

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


class BundleRef(BaseModel):
    sha256: Sha256
    size: int


class BundleShare(Strict):
    """Whom to share one of your input bundles with."""

    user: Annotated[str, StringConstraints(pattern=r"^[^/\x00-\x1f]{1,255}$")] = Field(
        description="The JupyterHub user name whose jobs may then use the bundle."
    )
