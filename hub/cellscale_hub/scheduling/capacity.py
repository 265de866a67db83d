"""All-or-nothing placement of a job's GPUs on a backend with a declared capacity."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    job_id: str
    gpus: int


def free_gpu_ids(capacity: int, in_use: Iterable[int]) -> list[int]:
    used = set(in_use)
    return [gpu for gpu in range(capacity) if gpu not in used]


def allocate(capacity: int, in_use: Iterable[int], gpus: int) -> list[int] | None:
    """The lowest free GPU ids for the whole gang, or None when not all are free."""
    free = free_gpu_ids(capacity, in_use)
    return free[:gpus] if len(free) >= gpus else None


def admit_in_order(capacity: int, in_use: Iterable[int], queue: Sequence[Pending]) -> dict[str, list[int]]:
    """Admit jobs strictly in queue order; the first that does not fit blocks the rest.

    Strict order means a large gang is never starved by a stream of small ones. Quotas,
    fair share and backfill come from the admission layer (cohorts, ClusterQueues).
    """
    used = list(in_use)
    granted: dict[str, list[int]] = {}
    for job in queue:
        ids = allocate(capacity, used, job.gpus)
        if ids is None:
            break
        granted[job.job_id] = ids
        used.extend(ids)
    return granted
