"""The one never-fits rule: the most of each resource one job of a ClusterQueue can ever get
on a flavor.

Routing (`routing.route`) refuses a submit above it (with these numbers, before anything is stored);
admission keeps a stored job that is above it waiting with the reason `NeverFits` (its
quota was lowered, or the backend has less now than the quota promises).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cellscale.vocabulary import Resource
from cellscale_hub.scheduling.resources import RESOURCES, UNLIMITED, Amounts, capacity_of
from cellscale_hub.tenancy import Tenancy


@dataclass(frozen=True)
class Ceiling:
    """The most of `resource` on `flavor` one job of `cluster_queue` could get."""

    cluster_queue: str
    flavor: str
    nominal: int | None  # guaranteed to the queue (None: no quota on this resource)
    quota: int | None  # nominal + what it may borrow from its tree (Tenancy.max_admissible); None: no quota
    capacity: int | None = None  # the flavor's amount now; None: not considered (at submit)
    resource: Resource = Resource.gpu

    @property
    def most(self) -> int:
        bounds = [b for b in (self.quota, self.capacity) if b is not None]
        return min(bounds) if bounds else UNLIMITED

    @property
    def borrowable(self) -> int:
        return (self.quota or 0) - (self.nominal or 0)

    @property
    def capacity_short(self) -> bool:
        """The backend has less now than the quota allows (nodes down, or no answer)."""
        return self.capacity is not None and (self.quota is None or self.capacity < self.quota)


def limits(
    tenancy: Tenancy, cluster_queue: str, flavor: str, capacity: Mapping[str, int | Amounts] | None = None
) -> tuple[Ceiling, ...]:
    """The flavor's ceiling on each resource, in RESOURCES order."""
    quota = tenancy.cluster_queues[cluster_queue].quotas[flavor]
    now = None if capacity is None else capacity_of(capacity.get(flavor, Amounts()))
    out = []
    for i, resource in enumerate(RESOURCES):
        own = quota.of(resource)
        has = None if now is None or now[i] >= UNLIMITED else now[i]
        out.append(
            Ceiling(
                cluster_queue,
                flavor,
                None if own is None else own.nominal,
                tenancy.max_admissible(cluster_queue, flavor, resource),
                has,
                resource,
            )
        )
    return tuple(out)


def over(ceilings: tuple[Ceiling, ...], demand: Amounts) -> Ceiling | None:
    """The first resource `demand` exceeds on this flavor, or None if it fits."""
    for i, ceiling in enumerate(ceilings):
        if demand[i] > ceiling.most:
            return ceiling
    return None


def never_fits(
    tenancy: Tenancy,
    cluster_queue: str,
    flavors: Iterable[str],
    demand: Amounts,
    capacity: Mapping[str, int | Amounts] | None = None,
) -> Ceiling | None:
    """None when the job fits on some flavor; otherwise the ceiling it exceeds on the flavor
    that comes closest: the most GPUs (as the refusal's numbers say), then the first."""
    blocked = []
    for flavor in flavors:
        ceilings = limits(tenancy, cluster_queue, flavor, capacity)
        ceiling = over(ceilings, demand)
        if ceiling is None:
            return None
        blocked.append((ceilings[0].most, ceiling))
    return max(blocked, key=lambda b: b[0])[1] if blocked else None
