"""Victim choice: which admitted jobs a waiting head preempts, and the reason each victim is
given. Victims are chosen to lose the least work (weighted resource-seconds since their last
checkpoint), then lower priority, then the most-borrowing queue; the fewest victims that
make room.
"""

from __future__ import annotations

from cellscale.vocabulary import Resource
from cellscale_hub.scheduling.resources import RESOURCES, Amounts, amount_words
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.state import Cycle
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.scheduling.usage import Usage


def make_room(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> list[Holder]:
    """Promise `job` the GPUs of jobs already being preempted, or choose new victims, on its
    first flavor where that makes it fit; returns the new victims. A victim's GPUs are
    promised to one head only: the next head does not count on them."""
    for flavor in flavors:
        if usage.fits(job.cluster_queue, flavor, job.demand):
            continue  # it fits but may not borrow there now: another head claimed it (HeldForAhead)
        leaving = [h for h in cycle.leaving.values() if h.flavor == flavor]
        enough = _fewest(usage, job, flavor, leaving)
        if enough is not None:
            _promise(cycle, job, enough)
            return []
        candidates = sorted(_candidates(snap, usage, job, flavor, cycle), key=lambda h: _loss(snap, usage, h))
        chosen = _fewest(usage.without(leaving), job, flavor, candidates, lenders_only=True)
        if chosen:
            _promise(cycle, job, leaving + chosen)
            return chosen
    return []


def make_short_room(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> list[Holder]:
    """For a level-0 job its tree's short-work share has room for (`flavors`): free its GPUs
    from work other desks of its tree run on borrowed GPUs (beyond their nominal quota) that
    has passed level 0 and is of no higher priority, losing the least work, as a lender
    reclaims what it lent. Returns the new victims (none when leaving jobs already free enough)."""
    for flavor in flavors:
        if usage.idle_fits(flavor, job.demand):
            continue  # idle already: another job took it in this cycle
        leaving = [h for h in cycle.leaving.values() if h.flavor == flavor]
        enough = _fewest_idle(usage, job, flavor, leaving)
        if enough is not None:
            _promise(cycle, job, enough)
            return []
        candidates = sorted(_borrowed_work(snap, usage, job, flavor, cycle), key=lambda h: _loss(snap, usage, h))
        chosen = _fewest_idle(usage, job, flavor, leaving + candidates, len(leaving))
        if chosen:
            _promise(cycle, job, chosen)
            return [v for v in chosen if not v.preempting]  # those already leaving are only promised
    return []


def _borrowed_work(snap: Snapshot, usage: Usage, job: Workload, flavor: str, cycle: Cycle) -> list[Holder]:
    """Other queues' holders of the job's tree on `flavor` whose queue borrows there, past level 0."""
    out = []
    tree = usage.root[job.cluster_queue]
    for q, held in cycle.holders_by_queue(snap, flavor).items():
        if q == job.cluster_queue or usage.root.get(q) != tree or not usage.is_borrowing(q, flavor):
            continue
        out.extend(
            h for h in held if not _spared(h, cycle) and h.priority <= job.priority and cycle.service.of_holder(h) > 0
        )
    return out


def _fewest_idle(
    usage: Usage, job: Workload, flavor: str, candidates: list[Holder], kept: int = 0
) -> list[Holder] | None:
    """The first candidates (the first `kept` always) whose ends leave the job's demand idle on
    `flavor`, taking from each queue no more than it borrows there, less any it does not need
    after all; None if all of them are not enough."""
    free = Amounts(*(c - p for c, p in zip(usage.capacity.get(flavor, Amounts()), usage.physical[flavor], strict=True)))
    left = {}
    chosen: list[Holder] = []
    for n, victim in enumerate(candidates):
        if free.covers(job.demand):
            break
        q = victim.cluster_queue
        left.setdefault(q, usage.borrowed(q, flavor))
        if n >= kept and left[q] < victim.gpus:
            continue  # that queue would be back within its own quota
        left[q] -= victim.gpus
        chosen.append(victim)
        free = free.plus(victim.demand)
    if not free.covers(job.demand):
        return None
    for victim in reversed(chosen[kept:]):
        if free.minus(victim.demand).covers(job.demand):
            chosen.remove(victim)
            free = free.minus(victim.demand)
    return chosen


def short_victim_reason(victim: Holder, job: Workload, service: Service) -> str:
    ckpt = victim.last_checkpoint if victim.last_checkpoint is not None else victim.started
    since = "" if ckpt is None else f"; it checkpointed {(service.now - ckpt) / 60:.0f} min ago and resumes from there"
    return (
        f"preempted for short job {job.job_id} of queue {job.cluster_queue} (under "
        f"{service.ordering.service_levels_gpu_hours[0]:g} GPU-hours received), on the short-work share of its "
        f"cohort: {victim.cluster_queue} was borrowing these {victim.flavor} GPUs beyond its nominal quota{since}"
    )


def _promise(cycle: Cycle, job: Workload, victims: list[Holder]) -> None:
    for victim in victims:
        cycle.leaving.pop(victim.job_id, None)
        cycle.taken.add(victim.job_id)
    cycle.promised[job.job_id] = victims


def _candidates(snap: Snapshot, usage: Usage, job: Workload, flavor: str, cycle: Cycle) -> list[Holder]:
    """The holders on `flavor` that `job` may preempt, in no particular order (the caller
    sorts them by `_loss`). A queue's conditions are checked once per queue, not per holder."""
    cq = job.cluster_queue
    within_nominal = not usage.borrows(cq, flavor, job.demand)
    level = cycle.service.of_job(job)
    for_service = cycle.service.ordering.preempt_for_service  # else `victim_for` is False for every holder
    out = []
    for q, held in cycle.holders_by_queue(snap, flavor).items():
        if q == cq:
            for h in held:
                if _spared(h, cycle):
                    continue
                if h.priority < job.priority:
                    out.append(h)  # priority preemption within the queue
                elif for_service and h.priority == job.priority and cycle.service.victim_for(h, level):
                    out.append(h)  # it received more service and just checkpointed: least service first
        elif (within_nominal or for_service) and (
            usage.root.get(q) == usage.root[cq] and usage.is_borrowing(q, flavor)
        ):
            for h in held:
                if _spared(h, cycle):
                    continue
                if within_nominal:
                    out.append(h)  # reclaim what was lent
                elif h.priority <= job.priority and cycle.service.victim_for(h, level):
                    out.append(h)  # a loan to work of a higher level goes to less-served work (borrowWithinCohort)
    return out


def _spared(h: Holder, cycle: Cycle) -> bool:
    """Not a candidate: already leaving or promised, or on a short-work share while it stays at
    level 0 (what that share lends is bounded, and so is how long it lends it)."""
    return h.preempting or h.job_id in cycle.taken or cycle.service.lent_short(h)


def _loss(snap: Snapshot, usage: Usage, h: Holder):
    """Weighted resource-seconds since the victim's last checkpoint (or start) first: the work
    it loses."""
    marks = [x for x in (h.last_checkpoint, h.started) if x is not None]
    size = h.demand.weight(snap.tenancy.resource_weights)
    work_lost = size * max(0.0, snap.now - max(marks)) if marks else 0.0
    return (work_lost, h.priority, -usage.borrowed(h.cluster_queue, h.flavor), size, h.job_id)


def _fewest(
    usage: Usage, job: Workload, flavor: str, candidates: list[Holder], lenders_only: bool = False
) -> list[Holder] | None:
    """Take candidates in order until the job fits, then drop any it does not need after
    all; None if even all of them are not enough. With `lenders_only`, another queue's job
    is taken only while that queue still borrows."""
    chosen: list[Holder] = []
    trial = usage
    for victim in candidates:
        if trial.fits(job.cluster_queue, flavor, job.demand):
            break
        if (
            lenders_only
            and victim.cluster_queue != job.cluster_queue
            and not trial.is_borrowing(victim.cluster_queue, flavor)
        ):
            continue  # that queue is back within its own quota
        chosen.append(victim)
        trial = usage.without(chosen)
    if not trial.fits(job.cluster_queue, flavor, job.demand):
        return None
    for victim in reversed(list(chosen)):
        rest = [v for v in chosen if v is not victim]
        if usage.without(rest).fits(job.cluster_queue, flavor, job.demand):
            chosen = rest
    return chosen


def victim_reason(usage: Usage, victim: Holder, job: Workload, service: Service) -> str:
    if victim.cluster_queue == job.cluster_queue and victim.priority < job.priority:
        return f"preempted for higher-priority job {job.job_id} in queue {job.cluster_queue}"
    if victim.cluster_queue == job.cluster_queue or usage.borrows(job.cluster_queue, victim.flavor, job.demand):
        borrowing = "" if victim.cluster_queue == job.cluster_queue else f" (borrowing {victim.flavor} GPUs)"
        return (
            f"preempted for job {job.job_id} of queue {job.cluster_queue}{borrowing}, which has received less service "
            f"({job.attained / 3600:.1f} vs {service.received(victim) / 3600:.1f} GPU-hours; least service goes "
            "first within a desk and among borrowers); it checkpointed "
            f"{(service.now - victim.last_checkpoint) / 60:.0f} min ago and resumes from there"
        )
    resource = usage.borrowing(victim.cluster_queue, victim.flavor) or Resource.gpu
    i = RESOURCES.index(resource)
    lent = min(victim.demand[i], usage.borrowed(victim.cluster_queue, victim.flavor, i))
    return (
        f"reclaimed by {job.cluster_queue}: {victim.cluster_queue} was borrowing "
        f"{amount_words(resource, lent, victim.flavor)} (this job held {victim.demand[i]}) that "
        f"{job.cluster_queue} needs within its nominal quota for job {job.job_id}"
    )
