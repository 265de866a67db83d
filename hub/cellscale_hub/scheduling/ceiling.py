"""The one never-fits rule: the most GPUs one job of a ClusterQueue can ever get on a flavor.

Placement refuses a submit above it (with these numbers, before anything is stored);
admission keeps a stored job that is above it waiting with the reason `NeverFits` (its
quota was lowered, or the backend has fewer GPUs now than the quota promises).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cellscale_hub.tenancy import Tenancy


@dataclass(frozen=True)
class Ceiling:
    """The most GPUs of `flavor` one job of `cluster_queue` could get."""

    cluster_queue: str
    flavor: str
    nominal: int  # guaranteed to the queue
    quota: int  # nominal + what it may borrow from its tree (Tenancy.max_admissible)
    capacity: int | None = None  # the flavor's GPUs now; None: not considered (at submit)

    @property
    def gpus(self) -> int:
        return self.quota if self.capacity is None else min(self.quota, self.capacity)

    @property
    def borrowable(self) -> int:
        return self.quota - self.nominal

    @property
    def capacity_short(self) -> bool:
        """The backend has fewer GPUs now than the quota allows (nodes down, or no answer)."""
        return self.capacity is not None and self.capacity < self.quota


def ceiling(tenancy: Tenancy, cluster_queue: str, flavor: str, capacity: Mapping[str, int] | None = None) -> Ceiling:
    return Ceiling(
        cluster_queue,
        flavor,
        tenancy.cluster_queues[cluster_queue].quotas[flavor].nominal,
        tenancy.max_admissible(cluster_queue, flavor),
        None if capacity is None else capacity.get(flavor, 0),
    )


def best_ceiling(
    tenancy: Tenancy, cluster_queue: str, flavors: Iterable[str], capacity: Mapping[str, int] | None = None
) -> Ceiling:
    """The highest ceiling among `flavors` (the first one on a tie: flavors are tried in order)."""
    ceilings = [ceiling(tenancy, cluster_queue, f, capacity) for f in flavors]
    return max(ceilings, key=lambda c: c.gpus)


def never_fits(
    tenancy: Tenancy, cluster_queue: str, flavors: Iterable[str], gpus: int, capacity: Mapping[str, int] | None = None
) -> Ceiling | None:
    """The best ceiling when `gpus` is above every flavor's; None when the job can fit."""
    best = best_ceiling(tenancy, cluster_queue, flavors, capacity)
    return best if gpus > best.gpus else None
