"""What one scheduling cycle has decided so far beyond the usage (claims, promised victims,
cloud dollars spent), its per-cycle memos, and what is read from them: the head that
claims a flavor (`claimant`) and when the jobs in the way have ended (`estimate`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field

from cellscale.vocabulary import PendingCode
from cellscale_hub.scheduling.ceiling import Ceiling, limits, over
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload, end_of
from cellscale_hub.scheduling.usage import Usage


@dataclass
class Cycle:
    """What one scheduling cycle has decided so far, beyond the usage."""

    service: Service  # the ordering inside each queue, at this cycle's time
    claims: dict[tuple[str, str], Workload] = field(default_factory=dict)  # (tree, flavor) -> blocked head
    claim_start: dict[tuple[str, str], float | None] = field(default_factory=dict)  # its estimated start
    leaving: dict[str, Holder] = field(default_factory=dict)  # being preempted, not yet promised to a head
    promised: dict[str, list[Holder]] = field(default_factory=dict)  # head -> the victims freeing its GPUs
    taken: set[str] = field(default_factory=set)  # victims promised to some head
    ceilings: dict[tuple[str, str], tuple[Ceiling, ...]] = field(default_factory=dict)  # memo: (queue, flavor)
    verdicts: dict[tuple, Ceiling | None] = field(default_factory=dict)  # memo: (queue, flavors, demand)
    spent: dict[str, float] = field(default_factory=dict)  # tenant -> cloud dollars admitted in this cycle
    waiting_for: dict[str, list[int]] = field(default_factory=dict)  # flavor -> demand of the queues waiting there
    on_flavor: dict[str, list[Holder]] | None = None  # memo: the holders of each flavor
    on_queue: dict[str, dict[str, list[Holder]]] = field(default_factory=dict)  # memo: flavor -> queue -> holders
    freeing: dict[tuple, tuple[list[float], list[int]]] = field(default_factory=dict)  # memo: see ends_in_the_way
    holding: dict[tuple[str, int], dict[str, list[Holder]]] = field(default_factory=dict)  # memo: see holding_on
    # each flavor's holders as (end, job id, holder) in order, when the caller keeps them so (the engine)
    by_end: dict[str, list[tuple[float, str, Holder]]] | None = None

    def holders_on(self, snap: Snapshot, flavor: str) -> list[Holder]:
        if self.on_flavor is None:
            self.on_flavor = defaultdict(list)
            for h in snap.holders:
                self.on_flavor[h.flavor].append(h)
        return self.on_flavor.get(flavor, [])

    def holding_on(self, snap: Snapshot, flavor: str, i: int) -> dict[str, list[Holder]]:
        """Each queue's holders on `flavor` that hold some of resource `i`, largest first."""
        key = flavor, i
        if key not in self.holding:
            by_queue: dict[str, list[Holder]] = {}
            for q, held in self.holders_by_queue(snap, flavor).items():
                mine = sorted((h for h in held if h.demand[i]), key=lambda h: (-h.demand[i], h.job_id))
                if mine:
                    by_queue[q] = mine
            self.holding[key] = by_queue
        return self.holding[key]

    def in_the_way(
        self, snap: Snapshot, usage: Usage, cq: str, flavor: str, code: PendingCode, i: int
    ) -> dict[str, list[Holder]]:
        """Whose end would help a job of `cq` short of resource `i` on `flavor` (`code` says
        why), by queue, largest first: its own queue's jobs when its quota is the limit;
        otherwise the jobs of its tree (of the whole flavor when the backend is full); only
        jobs that hold some of the resource."""
        holding = self.holding_on(snap, flavor, i)
        if code is PendingCode.QuotaExhausted:
            return {cq: holding[cq]} if cq in holding else {}
        if code is PendingCode.CapacityFull:
            return holding
        return {q: held for q, held in holding.items() if usage.root.get(q) == usage.root[cq]}

    def holders_by_queue(self, snap: Snapshot, flavor: str) -> dict[str, list[Holder]]:
        if flavor not in self.on_queue:
            by_queue = self.on_queue[flavor] = defaultdict(list)
            for h in self.holders_on(snap, flavor):
                by_queue[h.cluster_queue].append(h)
        return self.on_queue[flavor]

    def ends_in_the_way(
        self, snap: Snapshot, usage: Usage, cq: str, flavor: str, code: PendingCode, i: int
    ) -> tuple[list[float], list[int]]:
        """The ends of the holders whose end would help a job of `cq` short of resource `i` on
        `flavor` (`in_the_way`), in order (unknown ends last, as inf), and the running sum of what
        they free. The same for every job of the scope (its queue, its tree or the whole flavor,
        by `code`) in one cycle, since the holders do not change within it: built once."""
        scope = (
            cq if code is PendingCode.QuotaExhausted else None if code is PendingCode.CapacityFull else usage.root[cq]
        )
        key = (flavor, i, code is PendingCode.QuotaExhausted, scope)
        if key not in self.freeing:
            if code is PendingCode.QuotaExhausted or self.by_end is None:
                held = self.in_the_way(snap, usage, cq, flavor, code, i).values()
                found = sorted(((end_of(h), h.demand[i]) for hs in held for h in hs), key=_first)
            else:  # the flavor's or the tree's holders, from the flavor's kept in order of their ends
                root = usage.root.get
                found = [
                    (end, h.demand[i])
                    for end, _, h in self.by_end.get(flavor, ())
                    if h.demand[i] and (scope is None or root(h.cluster_queue) == scope)
                ]
            ends = [end for end, _ in found]
            freed = list(itertools.accumulate(amount for _, amount in found))
            self.freeing[key] = ends, freed
        return self.freeing[key]

    def never_fits(self, snap: Snapshot, job: Workload, flavors: list[str]) -> Ceiling | None:
        """The never-fits rule (scheduling.ceiling) against the flavors' capacity now,
        memoized per cycle: None if the job fits on one of them."""
        verdict = (job.cluster_queue, tuple(flavors), job.demand)
        if verdict not in self.verdicts:
            self.verdicts[verdict] = self._never_fits(snap, job, flavors)
        return self.verdicts[verdict]

    def _never_fits(self, snap: Snapshot, job: Workload, flavors: list[str]) -> Ceiling | None:
        blocked = []
        for flavor in flavors:
            key = (job.cluster_queue, flavor)
            if key not in self.ceilings:
                self.ceilings[key] = limits(snap.tenancy, job.cluster_queue, flavor, snap.capacity)
            ceiling = over(self.ceilings[key], job.demand)
            if ceiling is None:
                return None
            blocked.append((self.ceilings[key][0].most, ceiling))
        return max(blocked, key=lambda b: b[0])[1]


def claimant(usage: Usage, cycle: Cycle, job: Workload, flavor: str) -> Workload | None:
    """The blocked head of the job's tree that keeps it from borrowing on `flavor`, if any: a
    job whose time limit ends before that head's estimated start delays nobody."""
    key = usage.root[job.cluster_queue], flavor
    head = cycle.claims.get(key)
    if head is None or head.job_id == job.job_id:
        return None
    start = cycle.claim_start.get(key)
    if job.time_limit_s is not None and start is not None and cycle.service.now + job.time_limit_s <= start:
        return None
    return head


def _first(pair: tuple) -> float:
    return pair[0]


def estimate(
    snap: Snapshot, usage: Usage, job: Workload, flavor: str, code: PendingCode, i: int, cycle: Cycle, shortfall: int
) -> float | None:
    """When `shortfall` of resource `i` is free on `flavor` if each holder in the way runs to
    its time limit; None if one that must end first has no limit we know."""
    if shortfall <= 0:
        return snap.now
    ends, freed = cycle.ends_in_the_way(snap, usage, job.cluster_queue, flavor, code, i)
    k = bisect.bisect_left(freed, shortfall)
    if k == len(freed) or ends[k] == math.inf:
        return None
    return max(snap.now, ends[k])
