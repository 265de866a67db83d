"""Why a job waits, in words: the `PendingReason` of a head that does not fit (what it waits
for and who holds it), of a job queued behind a head or its reservation, of a job that never
fits, and of a job with a choice of sites (the table of offers). Built from the cycle's
usage and state; only the heads' reasons are built in the cycle, the others when asked.
"""

from __future__ import annotations

import dataclasses
import heapq

from cellscale.vocabulary import PendingCode, Resource
from cellscale_hub.scheduling.ceiling import Ceiling
from cellscale_hub.scheduling.offers import tenant_spend
from cellscale_hub.scheduling.placement import Offer, table_words
from cellscale_hub.scheduling.resources import RESOURCES, Amounts, amount_words
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.state import Cycle, claimant, estimate
from cellscale_hub.scheduling.types import Ahead, Holder, PendingReason, Snapshot, Workload
from cellscale_hub.scheduling.usage import Usage

MAX_AHEAD = 10  # holders named in a waiting job's reason


def ahead_of(h: Holder, why: str, i: int = 0) -> Ahead:
    """A holder in the way, with what it holds of resource `i` in words."""
    return Ahead(h.job_id, h.cluster_queue, h.gpus, why, _held(h, i), h.owner, h.name)


def job_words(h: Holder) -> str:
    """ "alice's job big1": its owner's (the API says "your job" to its owner) and its name, else its id."""
    name = h.name or h.job_id
    return f"{h.owner}'s job {name}" if h.owner else f"job {name}"


def placed_words(snap: Snapshot, job: Workload, best: Offer, offers: list[Offer], cycle: Cycle) -> str:
    spend = tenant_spend(snap, cycle, job.tenant)
    return f"placed at {best.site}: {table_words(offers, job.tenant, spend)}"


def site_reason(
    snap: Snapshot, usage: Usage, job: Workload, best: Offer | None, offers: list[Offer], cycle: Cycle
) -> PendingReason:
    """Why a job with a choice of sites waits: the table, and what blocks the site it waits for."""
    table = table_words(offers, job.tenant, tenant_spend(snap, cycle, job.tenant))
    if best is None:
        return PendingReason(
            PendingCode.NoFlavor, f"no site may take it now: {table}", 1, needs=job.gpus, offers=tuple(offers)
        )
    blocked = blocked_reason(snap, usage, job, [best.flavor], cycle)
    return dataclasses.replace(
        blocked, message=f"waits for {best.site} ({table}); {blocked.message}", offers=tuple(offers)
    )


def never_fits_reason(job: Workload, best: Ceiling | None) -> PendingReason:
    if best is None:
        return PendingReason(
            PendingCode.NoFlavor, f"queue {job.cluster_queue} has no flavor this job may use", 1, needs=job.gpus
        )
    resource, needs = best.resource, job.demand[RESOURCES.index(best.resource)]
    has = f"{best.capacity} GPUs" if resource is Resource.gpu else amount_words(resource, best.capacity)
    if best.capacity_short:
        why = (
            f"the {best.flavor} backend has {has} now (fewer than the queue's quota: nodes down, or the "
            "backend did not answer); it waits until it has enough"
        )
    else:
        why = (
            f"queue {job.cluster_queue} can get at most {amount_words(resource, best.most, best.flavor)} "
            "(nominal + borrowable); ask an admin to raise the quota or submit a smaller job"
        )
    return PendingReason(
        PendingCode.NeverFits,
        f"needs {amount_words(resource, needs)} but {why}",
        1,
        flavor=best.flavor,
        needs=needs,
        available=best.most,
        resource=resource,
    )


def blocked_reason(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> PendingReason:
    cq = job.cluster_queue
    victims = cycle.promised.get(job.job_id)
    if victims:
        flavor = victims[0].flavor
        resource = usage.short(cq, flavor, job.demand)
        resource = resource[0] if resource else Resource.gpu
        i = RESOURCES.index(resource)
        names = ", ".join(h.job_id for h in victims)
        return PendingReason(
            PendingCode.Preempting,
            f"waiting for {amount_words(resource, sum(h.demand[i] for h in victims), flavor)} being freed by "
            f"preempting {names} (they were warned and may checkpoint first)",
            1,
            flavor,
            job.demand[i],
            usage.headroom(cq, flavor, resource)[0],
            tuple(ahead_of(h, "being preempted", i) for h in victims),
            resource=resource,
        )
    held = [f for f in flavors if usage.fits(cq, f, job.demand) and claimant(usage, cycle, job, f)]
    if held:
        head = claimant(usage, cycle, job, held[0])
        return PendingReason(
            PendingCode.HeldForAhead,
            f"waiting: it would borrow {held[0]} GPUs that {head.job_id} "
            f"({head.cluster_queue}, {_plural(head.gpus, 'GPU')}) is waiting for and goes first; it may run "
            f"within its own quota",
            1,
            held[0],
            job.gpus,
            usage.headroom(cq, held[0])[0],
            (Ahead(head.job_id, head.cluster_queue, head.gpus, "waiting ahead", _plural(head.gpus, "GPU")),),
        )
    shortages = {f: usage.short(cq, f, job.demand) for f in flavors}
    flavor = min(
        (f for f in flavors if shortages[f]),
        key=lambda f: (
            RESOURCES.index(shortages[f][0]),
            job.demand[RESOURCES.index(shortages[f][0])] - shortages[f][1],
        ),
    )
    resource, available, code = shortages[flavor]
    i = RESOURCES.index(resource)
    needs = job.demand[i]
    holders = _first_in_the_way(snap, usage, job, flavor, code, i, cycle)
    details = _blocked_words(usage, job, flavor, resource, available, code)
    ahead = tuple(ahead_of(h, _why(usage, h, cq, i, cycle.service), i) for h in holders[:MAX_AHEAD])
    if ahead:
        details += "; held by " + ", ".join(f"{a.job_id} ({a.cluster_queue}, {a.holds}, {a.why})" for a in ahead[:3])
    message = f"{_headline(usage, job, flavor, resource, available, code, holders, cycle.service)}. Details: {details}"
    return PendingReason(
        code,
        message,
        1,
        flavor,
        needs,
        available,
        ahead,
        estimate(snap, usage, job, flavor, code, i, cycle, needs - available),
        resource,
    )


def _headline(
    usage: Usage,
    job: Workload,
    flavor: str,
    resource: Resource,
    available: int,
    code: PendingCode,
    holders: list[Holder],
    service: Service,
) -> str:
    """The first sentence, in a researcher's words: what it waits for and who has it ("waiting
    for 4 GPUs at once, 0 free to it: your job big1 holds 4 of the desk's GPUs"); quota trees
    and cohorts are in the details."""
    i = RESOURCES.index(resource)
    wants = _plural(job.gpus, "GPU") + " at once" if resource is Resource.gpu else amount_words(resource, job.demand[i])
    free = amount_words(resource, available) if resource is Resource.memory else str(available)
    start = f"waiting for {wants}, {free} free to it"
    noun = {Resource.gpu: "GPUs", Resource.cpu: "CPUs", Resource.memory: "memory"}[resource]
    if not holders:
        are = "is" if resource is Resource.memory else "are"
        if code is PendingCode.CapacityFull:
            return f"{start}: all the {noun} of {flavor} {are} in use"
        return f"{start}: the {noun} its desk may use {are} in use"
    h = holders[0]
    amount = str(h.demand[i]) if resource is not Resource.memory else amount_words(resource, h.demand[i])
    if service.lent_short(h):
        holds = f"({h.tenant or h.cluster_queue}) holds {amount} {noun} {_why(usage, h, job.cluster_queue, i, service)}"
    elif h.cluster_queue == job.cluster_queue:
        holds = f"holds {amount} of the desk's {noun}"
    elif code is PendingCode.CapacityFull:
        holds = f"({h.tenant or h.cluster_queue}) holds {amount} of the {flavor} {noun}"
    else:
        lent = " borrowed from the pool your desk shares" if usage.borrowed(h.cluster_queue, flavor, i) else ""
        holds = f"({h.tenant or h.cluster_queue}) holds {amount} {noun}{lent}"
    more = len(holders) - 1
    others = f" (and {_plural(more, 'other job')})" if more else ""
    return f"{start}: {job_words(h)} {holds}{others}"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _blocked_words(
    usage: Usage, job: Workload, flavor: str, resource: Resource, available: int, code: PendingCode
) -> str:
    cq, i = job.cluster_queue, RESOURCES.index(resource)
    q = usage.quotas[cq, flavor][i]
    what = flavor if resource is Resource.gpu else f"{flavor} {resource.value}"
    capacity = usage.capacity.get(flavor, Amounts())[i]
    words = {
        PendingCode.QuotaExhausted: (
            f"queue {cq} is at its {what} quota ({q.nominal if q else 0} nominal + "
            f"{q.borrowing_limit if q else 0} borrowable)"
        ),
        PendingCode.PoolLent: (
            f"the rest of the {what} quota of {usage.root[cq].partition(':')[2]}'s tree is in use"
            if usage.root[cq] != f"cq:{cq}"
            else f"queue {cq} is at its {what} quota ({q.nominal if q else 0} nominal, no cohort to borrow from)"
        ),
        PendingCode.CapacityFull: (
            f"all {capacity} {flavor} GPUs are in use"
            if resource is Resource.gpu
            else f"all {amount_words(resource, capacity, flavor)} are in use"
        ),
    }[code]
    return words


def _held(h: Holder, i: int) -> str:
    return _plural(h.gpus, "GPU") if i == 0 else amount_words(RESOURCES[i], h.demand[i])


def _first_in_the_way(
    snap: Snapshot, usage: Usage, job: Workload, flavor: str, code: PendingCode, i: int, cycle: Cycle
) -> list[Holder]:
    """The MAX_AHEAD holders a waiting job's reason names (`Cycle.in_the_way`): the most
    borrowing queues' first, then the largest. Each queue's list is sorted already, so only
    its first MAX_AHEAD can be among them (a flavor may have thousands of holders)."""
    queues = cycle.in_the_way(snap, usage, job.cluster_queue, flavor, code, i)
    borrowed = {q: usage.borrowed(q, flavor, i) for q in queues}
    firsts = [h for held in queues.values() for h in held[:MAX_AHEAD]]
    service = cycle.service
    return heapq.nsmallest(
        MAX_AHEAD,
        firsts,
        key=lambda h: (not service.lent_short(h), -borrowed[h.cluster_queue], -h.demand[i], h.job_id),
    )


SHORT_SHARE_WHY = "on the short-work share"  # how a reason names a holder a short-work share lends GPUs to


def _why(usage: Usage, h: Holder, cq: str, i: int, service: Service) -> str:
    """Why `h` holds what is in the way: borrowing only when its queue borrows that resource;
    on the short-work share, until when it cannot be reclaimed."""
    if service.lent_short(h):
        return f"{SHORT_SHARE_WHY}, reclaimable in {_minutes(service.level_zero_left(h))}"
    if usage.borrowed(h.cluster_queue, h.flavor, i):
        return "borrowing"
    return "same queue" if h.cluster_queue == cq else "within its quota"


def queued(head_reason: PendingReason, head: Workload, job: Workload, position: int) -> PendingReason:
    resource = head_reason.resource
    i = RESOURCES.index(resource)
    return PendingReason(
        PendingCode.Queued,
        f"position {position} in queue {job.cluster_queue}, behind {head.job_id} "
        f"which waits for {amount_words(resource, head.demand[i])}; it needs {amount_words(resource, job.demand[i])}",
        position,
        head_reason.flavor,
        job.demand[i],
        head_reason.available,
        (Ahead(head.job_id, head.cluster_queue, head.gpus, "next in queue", amount_words(resource, head.demand[i])),),
        None,
        resource,
    )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def head_words(reason: PendingReason, job: Workload, service: Service, reserves: bool, behind: bool) -> PendingReason:
    """The first waiting job of its queue: whether it holds a reservation yet."""
    o = service.ordering
    if reserves and o.backfill:
        start = (
            f", ~{_minutes(reason.estimated_start - service.now)}"
            if reason.estimated_start is not None and reason.estimated_start > service.now
            else ""
        )
        extra = (
            f"; reserved (it waited {_minutes(service.waited(job))}): it starts when "
            f"{amount_words(reason.resource, reason.needs)} are free{start}; jobs behind it start there "
            "only if their --time ends before"
        )
    elif not reserves and behind:
        extra = (
            f"; smaller jobs behind it may start first until it has waited {o.reserve_after_minutes:g} min, "
            "then it reserves"
        )
    else:
        extra = ""
    return dataclasses.replace(reason, message=reason.message + extra) if extra else reason


def behind_reservation(
    job: Workload, head: Workload, flavor: str, start: float | None, position: int, service: Service
) -> PendingReason:
    when = f" (~{_minutes(start - service.now)})" if start is not None and start > service.now else ""
    return PendingReason(
        PendingCode.Queued,
        f"position {position} in queue {job.cluster_queue}: {head.job_id} ({_plural(head.gpus, 'GPU')}) waited "
        f"{_minutes(service.waited(head))} and has reserved {flavor}; jobs behind it start there only if their "
        f"--time ends before it starts{when}",
        position,
        flavor,
        job.gpus,
        0,
        (Ahead(head.job_id, head.cluster_queue, head.gpus, "reserved ahead", _plural(head.gpus, "GPU")),),
        None,
    )


def behind_words(
    reason: PendingReason, job: Workload, ahead: list[Workload], position: int, service: Service
) -> PendingReason:
    """A waiting job that is not its queue's first: who goes before it, and why it cannot start."""
    level = service.of_job(job)
    less = sum(1 for a in ahead if a.priority == job.priority and service.of_job(a) < level)
    higher = sum(1 for a in ahead if a.priority > job.priority)
    why = [f"{less} with less service received"] if less else []
    why += [f"{higher} of higher priority"] if higher else []
    earlier = len(ahead) - less - higher
    why += [f"{earlier} submitted earlier"] if earlier else []
    return dataclasses.replace(
        reason,
        message=f"position {position} in queue {job.cluster_queue}: "
        + ("1 waiting job goes before it" if len(ahead) == 1 else f"{len(ahead)} waiting jobs go before it")
        + f" ({', '.join(why)}); it starts when it fits: {reason.message}",
        position=position,
    )


def short_code(usage: Usage, cycle: Cycle, job: Workload, flavors: list[str]) -> PendingCode:
    """The code of a waiting job's reason without building it."""
    if job.job_id in cycle.promised:
        return PendingCode.Preempting
    short = usage.short(job.cluster_queue, flavors[0], job.demand) if flavors else None
    return short[2] if short else PendingCode.HeldForAhead
