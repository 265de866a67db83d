"""Where a submitted job goes: user → tenant → LocalQueue → ClusterQueue → backend, and the
spec shaped for that backend. Decided once, at submit, before anything is stored; what can
never run is refused here with the numbers (a typed `Refused`, which the API maps to a
status code), using the same never-fits rule as admission (`scheduling.ceiling`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cellscale.spec import JobSpec, Resources
from cellscale.vocabulary import Resource
from cellscale_hub.auth import Principal
from cellscale_hub.drivers import Driver, SpecRejected
from cellscale_hub.scheduling.ceiling import Ceiling, never_fits
from cellscale_hub.scheduling.resources import Amounts, amount_words
from cellscale_hub.tenancy import Tenancy


class Refused(ValueError):
    """The job can never run as asked; the message says what to change."""


class NoTenant(Refused):
    """The user is in no tenant group (desk)."""


class UnknownName(Refused):
    """An unknown queue, priority class or backend."""


class NoQuota(Refused):
    """The queue has no quota on any backend the job may use."""


class NeverFits(Refused):
    """More than the queue or the backend could ever give."""


@dataclass(frozen=True)
class Placement:
    tenant: str
    queue: str  # LocalQueue
    cluster_queue: str
    priority: int
    backend: str
    spec: JobSpec  # shaped for the backend


def place(tenancy: Tenancy, drivers: Mapping[str, Driver], who: Principal, spec: JobSpec) -> Placement:
    """Resolve and check a submit; raises a `Refused` subclass."""
    if who.tenant is None:
        raise NoTenant(
            f"user {who.user} is in no tenant group; ask an admin to add you to a desk "
            f"(tenants: {', '.join(sorted(tenancy.tenants))})"
        )
    try:
        queue, cluster_queue = tenancy.resolve_queue(who.tenant, spec.queue)
        priority = tenancy.priority_of(spec.priority)
    except ValueError as exc:
        raise UnknownName(str(exc)) from exc
    backend, flavors = _backend(tenancy, drivers, queue, cluster_queue, spec.backend)
    driver = drivers[backend]
    try:
        spec = driver.shape(spec)
        driver.validate(spec)
    except SpecRejected as exc:
        raise NeverFits(str(exc)) from exc
    res = spec.resources
    best = never_fits(tenancy, cluster_queue, flavors, Amounts(res.gpus, res.cpus, res.memory_mb))
    if best is not None:
        raise NeverFits(_never_words(best, res, cluster_queue))
    return Placement(who.tenant, queue, cluster_queue, priority, backend, spec)


def _never_words(best: Ceiling, res: Resources, cluster_queue: str) -> str:
    if best.resource is Resource.gpu:
        return (
            f"{res.gpus} GPUs can never be admitted: queue {cluster_queue} can get at most "
            f"{best.most} {best.flavor} GPUs (nominal {best.nominal} + {best.borrowable} borrowable "
            f"from its cohort); ask for at most --gpus {best.most}, or ask an admin to raise the quota"
        )
    if best.resource is Resource.cpu:
        asked, change = f"{res.cpus} CPUs", "--cpus or --nodes"
    else:
        asked, change = f"--mem {res.memory_mb_per_node}M on {res.nodes} node(s)", "--mem"
    return (
        f"{asked} can never be admitted: queue {cluster_queue} can get at most "
        f"{amount_words(best.resource, best.most, best.flavor)} (nominal {best.nominal} + {best.borrowable} "
        f"borrowable from its cohort); lower {change}, or ask an admin to raise the quota"
    )


def _backend(
    tenancy: Tenancy, drivers: Mapping[str, Driver], queue: str, cluster_queue: str, asked: str | None
) -> tuple[str, list[str]]:
    """The backend the job runs on (the one asked for, else the queue's first flavor's) and
    the queue's flavors there."""
    if asked is not None and asked not in drivers:
        raise UnknownName(f"unknown backend {asked!r}; backends: {', '.join(sorted(drivers))}")
    usable = [f for f in tenancy.flavors_for(cluster_queue) if tenancy.flavors[f].backend in drivers]
    backend = asked or (tenancy.flavors[usable[0]].backend if usable else None)
    flavors = [f for f in usable if tenancy.flavors[f].backend == backend]
    if not flavors:
        on = f" on backend {asked!r}" if asked else ""
        raise NoQuota(
            f"queue {queue} ({cluster_queue}) has no quota{on}; its flavors: "
            f"{', '.join(f'{f} ({tenancy.flavors[f].backend})' for f in usable) or 'none'}"
        )
    return backend, flavors
