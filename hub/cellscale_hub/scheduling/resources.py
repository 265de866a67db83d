"""Amounts of the resources admission divides among queues: GPUs, CPU cores and memory (MiB).

A job's demand, a queue's use and a flavor's capacity are all `Amounts`; admission is all or
nothing across every resource, as Kueue admits a workload only when each covered resource
fits.
"""

from __future__ import annotations

from typing import NamedTuple

from cellscale.vocabulary import Resource

UNLIMITED = 2**62
"""A capacity nobody reported (a backend that counts only GPUs): it never binds."""

RESOURCES = tuple(Resource)  # the order of an Amounts tuple, and the order reasons look in


class Amounts(NamedTuple):
    gpu: int = 0
    cpu: int = 0
    memory: int = 0  # MiB

    def plus(self, other: Amounts) -> Amounts:
        return Amounts(self.gpu + other.gpu, self.cpu + other.cpu, self.memory + other.memory)

    def minus(self, other: Amounts) -> Amounts:
        return Amounts(self.gpu - other.gpu, self.cpu - other.cpu, self.memory - other.memory)

    def covers(self, other: Amounts) -> bool:
        """At least `other` of every resource."""
        return self.gpu >= other.gpu and self.cpu >= other.cpu and self.memory >= other.memory

    def weight(self, weights) -> float:
        """GPU-equivalents under `weights` (tenancy.ResourceWeights)."""
        return self.gpu * weights.gpu + self.cpu * weights.cpu + self.memory / 1024 * weights.memory_gib


def capacity_of(value: int | Amounts) -> Amounts:
    """A flavor's capacity; a bare number is GPUs, with CPUs and memory unbounded."""
    return value if isinstance(value, Amounts) else Amounts(value, UNLIMITED, UNLIMITED)


def amount_words(resource: Resource, amount: int, flavor: str | None = None) -> str:
    """`4 h100 GPU(s)`, `64 CPUs`, `8 GiB of memory`, as a reason says it."""
    if resource is Resource.gpu:
        return f"{amount} {flavor} GPU(s)" if flavor else f"{amount} GPU(s)"
    if resource is Resource.cpu:
        return f"{amount} CPU{'s' if amount != 1 else ''}" + (f" ({flavor})" if flavor else "")
    size = f"{amount / 1024:g} GiB" if amount >= 1024 else f"{amount} MiB"
    return f"{size} of memory" + (f" ({flavor})" if flavor else "")
