"""Where a submitted job goes: user → tenant → LocalQueue → ClusterQueue → backend, and the
spec shaped for that backend. Decided once, at submit, before anything is stored; what can
never run is refused here with the numbers (a typed `Refused`, which the API maps to a
status code), using the same never-fits rule as admission (`scheduling.ceiling`).

A queue whose flavors are at several sites (datacenters, cloud pools) leaves the site to
admission: the job gets every backend of those sites it may use (`Route.backends`: the
site asked for, cloud sites only when the job or its desk allows bursting, and only backends
that shape the job the same way, so its gang is the same wherever it lands), and admission
weighs them each cycle (`scheduling.placement`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cellscale.spec import JobLimits, JobSpec, Resources
from cellscale.vocabulary import BurstPolicy, Resource
from cellscale_hub.auth import Principal
from cellscale_hub.drivers import BackendUnreachable, Driver, SpecRejected
from cellscale_hub.drivers.capabilities import ChecksQueue, RunsSweeps
from cellscale_hub.scheduling.ceiling import Ceiling, limits, never_fits
from cellscale_hub.scheduling.resources import UNLIMITED, Amounts, amount_words
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
class Route:
    tenant: str
    queue: str  # LocalQueue
    cluster_queue: str
    priority: int
    backend: str
    spec: JobSpec  # shaped for the backend
    backends: tuple[str, ...] = ()  # more than one: admission chooses among these sites' backends
    data: tuple[tuple[str, float], ...] = ()  # (home site, GB) of each dataset it reads
    note: str | None = None  # what routing changed, in words (a sweep's --max-parallel lowered to fit)

    def stored(self) -> dict | None:
        """What the store keeps of a choice of sites (jobs.placement); None: one backend, no data."""
        if len(self.backends) < 2 and not self.data:
            return None
        return {
            "backends": list(self.backends),
            "data": [list(d) for d in self.data],
            "runtime_s": self.spec.resources.timeout_min * 60,  # dollars are estimated on its time limit
        }


def route(tenancy: Tenancy, drivers: Mapping[str, Driver], who: Principal, spec: JobSpec) -> Route:
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
    spec = _resolved(tenancy, spec)
    data = _data(tenancy, spec)
    backends = _backends(tenancy, drivers, who.tenant, queue, cluster_queue, spec)
    shaped, refusals = _shaped(drivers, backends, spec, who.tenant, queue)
    if not shaped:
        raise NeverFits(refusals[0] if len(refusals) == 1 else "; ".join(refusals))
    backend, spec = next(iter(shaped.items()))
    note = None
    if spec.sweep is not None:
        spec, note = _backend_slots(spec, [drivers[b] for b in shaped])
    flavors = [f for f in tenancy.flavors_for(cluster_queue) if tenancy.flavors[f].backend in shaped]
    res = spec.demand  # a sweep holds its slots' resources at once
    best = never_fits(tenancy, cluster_queue, flavors, Amounts(res.gpus, res.cpus, res.memory_mb))
    while best is not None and spec.sweep is not None:  # each resource may lower it once
        spec, note = _fewer_slots(best, spec, cluster_queue)
        res = spec.demand
        best = never_fits(tenancy, cluster_queue, flavors, Amounts(res.gpus, res.cpus, res.memory_mb))
    if best is not None:
        raise NeverFits(_never_words(best, res, cluster_queue))
    return Route(who.tenant, queue, cluster_queue, priority, backend, spec, tuple(shaped), data, note)


def _shaped(
    drivers: Mapping[str, Driver], backends: list[str], spec: JobSpec, tenant: str, queue: str
) -> tuple[dict[str, JobSpec], list[str]]:
    """The spec as each backend would run it, keeping only backends that run it the same way
    as the first that accepts it; and the refusals of the others (a backend whose own queues
    cannot say whether they would admit it, its API not answering, is refused with those words)."""
    shaped: dict[str, JobSpec] = {}
    refusals = []
    for backend in backends:
        driver = drivers[backend]
        if spec.sweep is not None and not isinstance(driver, RunsSweeps):
            refusals.append(f"backend {backend!r} does not run sweeps (%%cluster map); pick one with --backend")
            continue
        try:
            mine = driver.shape(spec)
            driver.validate(mine)
            if isinstance(driver, ChecksQueue):
                driver.validate_for(mine, tenant, queue)
        except (SpecRejected, BackendUnreachable) as exc:
            refusals.append(f"{backend}: {exc}" if len(backends) > 1 else str(exc))
            continue
        if shaped and mine.resources != next(iter(shaped.values())).resources:
            continue  # its nodes would give the gang another shape: not a candidate
        shaped[backend] = mine
    return shaped, refusals


def _resolved(tenancy: Tenancy, spec: JobSpec) -> JobSpec:
    """The spec with each registered dataset's URL, version and options filled in from the
    tenancy (a version the job names wins): the job records exactly what it read."""
    unknown = [d.name for d in spec.datasets if d.url is None and d.name not in tenancy.datasets]
    if unknown:
        raise UnknownName(
            f"unknown dataset {', '.join(map(repr, unknown))}; registered datasets: "
            f"{', '.join(sorted(tenancy.datasets)) or 'none (an admin registers them in the tenancy)'}; "
            f"or give its URL: --data {unknown[0]}=s3://BUCKET/PATH@VERSION"
        )
    resolved = []
    for ref in spec.datasets:
        registered = tenancy.datasets.get(ref.name)
        if ref.url is None and registered is not None:
            ref = ref.model_copy(
                update={
                    "url": registered.url,
                    "version": ref.version or registered.version,
                    "storage_options": registered.storage_options,
                }
            )
        resolved.append(ref)
    return spec.model_copy(update={"datasets": resolved})


def _data(tenancy: Tenancy, spec: JobSpec) -> tuple[tuple[str, float], ...]:
    """(home site, GB) of each registered dataset it reads (one given only by URL has no home)."""
    return tuple(
        (tenancy.datasets[d.name].site, tenancy.datasets[d.name].size_gb)
        for d in spec.datasets
        if d.name in tenancy.datasets and d.url == tenancy.datasets[d.name].url
    )


def _backends(
    tenancy: Tenancy, drivers: Mapping[str, Driver], tenant: str, queue: str, cluster_queue: str, spec: JobSpec
) -> list[str]:
    """The backends the job may run on: the one asked for; else, when the queue's flavors
    have sites (or --site is given), those of every site it may use; else the queue's first."""
    if spec.backend is not None:
        return [_backend(tenancy, drivers, queue, cluster_queue, spec.backend)[0]]
    usable = [f for f in tenancy.flavors_for(cluster_queue) if tenancy.flavors[f].backend in drivers]
    sited = [f for f in usable if tenancy.flavors[f].site is not None]
    if spec.site in (None, "auto") and not (sited and (spec.site == "auto" or sited[0] == usable[0])):
        return [_backend(tenancy, drivers, queue, cluster_queue, None)[0]]
    if spec.site not in (None, "auto"):
        sited = [f for f in sited if tenancy.flavors[f].site == spec.site]
        if not sited:
            sites = sorted({tenancy.flavors[f].site for f in usable if tenancy.flavors[f].site})
            raise NoQuota(
                f"queue {queue} ({cluster_queue}) has no quota at site {spec.site!r}; "
                f"its sites: {', '.join(sites) or 'none'} (or --site auto)"
            )
    burst = spec.burst or tenancy.tenants[tenant].burst
    # --site NAME of a cloud pool asks for it
    pinned = spec.site not in (None, "auto") and spec.burst != BurstPolicy.never
    allowed = [f for f in sited if burst == BurstPolicy.allow or pinned or not tenancy.is_cloud(f)]
    if not allowed:
        raise NoQuota(
            f"queue {queue} ({cluster_queue}) has only cloud capacity at site {spec.site or 'auto'}, and bursting "
            f"is not allowed; add --burst allow"
        )
    return list(dict.fromkeys(tenancy.flavors[f].backend for f in allowed))


def _backend_slots(spec: JobSpec, drivers: list[Driver]) -> tuple[JobSpec, str | None]:
    """A sweep runs at most as many tasks at once as its largest backend holds (GPUs, cores,
    memory): --max-parallel beyond that is lowered, and the note says so."""
    task, most, why = spec.resources, spec.sweep.max_parallel, None
    for driver in drivers:
        cap = driver.capacity()
        fits = [
            (cap.capacity_gpus // task.gpus, f"{cap.capacity_gpus} GPU(s)") if task.gpus else None,
            (cap.capacity_cpus // task.cpus, f"{cap.capacity_cpus} CPUs") if cap.capacity_cpus else None,
            (cap.capacity_memory_mb // task.memory_mb, f"{cap.capacity_memory_mb} MiB")
            if cap.capacity_memory_mb and task.memory_mb
            else None,
        ]
        holds, words = min((f for f in fits if f is not None), default=(most, None))
        if holds < most:
            most, why = max(1, holds), f"backend {driver.name!r} has {words}"
    if why is None:
        return spec, None
    note = f"runs at most {most} tasks at once, not --max-parallel {spec.sweep.max_parallel}: {why}"
    return spec.model_copy(update={"sweep": spec.sweep.model_copy(update={"max_parallel": most})}), note


def _fewer_slots(best: Ceiling, spec: JobSpec, cluster_queue: str) -> tuple[JobSpec, str]:
    """A sweep whose --max-parallel tasks could never all be admitted at once runs as many as
    the queue can ever hold (--max-parallel is a bound, not a demand); one task that can never
    be admitted is refused."""
    task = spec.resources
    each = {Resource.gpu: task.gpus, Resource.cpu: task.cpus, Resource.memory: task.memory_mb}[best.resource]
    most = best.most // each if each else 0
    limit = amount_words(best.resource, best.most, best.flavor)
    if most < 1:
        raise NeverFits(
            f"one task of the sweep ({amount_words(best.resource, each, best.flavor)}) can never be admitted: queue "
            f"{cluster_queue} can get at most {limit}; ask for less per point, or ask an admin to raise the quota"
        )
    sweep = spec.sweep.model_copy(update={"max_parallel": most})
    note = (
        f"runs at most {most} tasks at once, not --max-parallel {spec.sweep.max_parallel}: queue {cluster_queue} "
        f"can get at most {limit}"
    )
    return spec.model_copy(update={"sweep": sweep}), note


def _never_words(best: Ceiling, res: Resources, cluster_queue: str) -> str:
    """What was asked, the most the queue can ever get, and the flag's value to ask for instead
    (the flag the user types: --gpus, --cpus per task, --mem per node)."""
    if best.resource is Resource.gpu:
        asked, ask = f"{res.gpus} GPUs", f"--gpus {best.most}"
    elif best.resource is Resource.cpu:
        asked, ask = f"{res.cpus} CPUs", ask_for(Resource.cpu, best.most, res)
    else:
        asked, ask = f"--mem {res.memory_mb_per_node}M on {res.nodes} node(s)", ask_for(Resource.memory, best.most, res)
    most = (
        f"{best.most} {best.flavor} GPUs"
        if best.resource is Resource.gpu
        else amount_words(best.resource, best.most, best.flavor)
    )
    return (
        f"{asked} can never be admitted: queue {cluster_queue} can get at most {most}{_why_most(best)}; "
        f"ask for at most {ask}, or ask an admin to raise the quota"
    )


def _why_most(best: Ceiling) -> str:
    """Where the ceiling comes from: the backend's size, or the quota (nominal + borrowable)."""
    if best.capacity is not None and best.most == best.capacity:
        return " (all the backend has)"
    if best.nominal is None:
        return ""
    return f" (nominal {best.nominal} + {best.borrowable} borrowable from its cohort)"


def ask_for(resource: Resource, most: int, res: Resources) -> str:
    """The flag, with its largest value, that keeps a job shaped like `res` within `most` of
    `resource` in all: --cpus is per task, --mem per node."""
    if resource is Resource.gpu:
        return f"--gpus {most}"
    if resource is Resource.cpu:
        per = res.nodes * (res.tasks_per_node or 1)
        return f"--cpus {max(1, most // per)}" if most >= per else f"--cpus 1 on at most {most} node(s)"
    per_node = max(1, most // res.nodes)
    return f"--mem {per_node // 1024}G" if per_node % 1024 == 0 else f"--mem {per_node}M"


def job_limits(
    tenancy: Tenancy, drivers: Mapping[str, Driver], who: Principal, queue: str | None, backend: str | None
) -> JobLimits:
    """The most one job of `who`'s queue can ever get on `backend`, or (none given) on the
    backends a job of that queue goes to: on each of their flavors the least of its quota's
    reach and the backend's size, the best flavor's."""
    if who.tenant is None:
        raise NoTenant(f"user {who.user} is in no tenant group; ask an admin to add you to a desk")
    try:
        queue, cluster_queue = tenancy.resolve_queue(who.tenant, queue)
    except ValueError as exc:
        raise UnknownName(str(exc)) from exc
    if backend is not None and backend not in drivers:
        raise UnknownName(f"unknown backend {backend!r}; backends: {', '.join(sorted(drivers))}")
    placed = _backends(tenancy, drivers, who.tenant, queue, cluster_queue, JobSpec(source="pass", backend=backend))
    flavors = [f for f in tenancy.flavors_for(cluster_queue) if tenancy.flavors[f].backend in placed]
    best = [0, 0, 0]
    for flavor in flavors:
        size = _size(drivers[tenancy.flavors[flavor].backend])
        for i, ceiling in enumerate(limits(tenancy, cluster_queue, flavor, None if size is None else {flavor: size})):
            best[i] = max(best[i], ceiling.most)
    gpus, cpus, memory = (None if most >= UNLIMITED else most for most in best)
    return JobLimits(queue=queue, cluster_queue=cluster_queue, gpus=gpus, cpus=cpus, memory_mb=memory)


def _size(driver: Driver) -> Amounts | None:
    """All a backend has (its largest gang), or None while it does not answer."""
    try:
        cap = driver.capacity()
    except BackendUnreachable:
        return None
    return Amounts(cap.capacity_gpus, cap.capacity_cpus or UNLIMITED, cap.capacity_memory_mb or UNLIMITED)


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
