"""What a job holds: its gang of nodes, GPUs, cores and memory (`Resources`), and how many
times each class of fault is retried (`Retries`)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from cellscale.spec.fields import Strict

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
