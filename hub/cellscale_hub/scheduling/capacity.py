"""All-or-nothing choice of GPU ids for a job on a backend with a declared capacity (the local
backend: the control plane assigns the ids; admission has already granted the quota)."""

from __future__ import annotations

from collections.abc import Iterable


def free_gpu_ids(capacity: int, in_use: Iterable[int]) -> list[int]:
    used = set(in_use)
    return [gpu for gpu in range(capacity) if gpu not in used]


def allocate(capacity: int, in_use: Iterable[int], gpus: int) -> list[int] | None:
    """The lowest free GPU ids for the whole gang, or None when not all are free."""
    free = free_gpu_ids(capacity, in_use)
    return free[:gpus] if len(free) >= gpus else None
