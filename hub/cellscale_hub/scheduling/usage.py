"""Quota bookkeeping of one cycle: what each (queue, flavor) holds, with running totals of
each cohort tree's shared pool and of physical use, so that a fit check costs the same
however many queues share a tree.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from cellscale.vocabulary import PendingCode, Resource
from cellscale_hub.scheduling.resources import RESOURCES, UNLIMITED, Amounts
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.types import Holder
from cellscale_hub.tenancy import Tenancy

_INDEXES = range(len(RESOURCES))
_NONE = Amounts()
_NO_QUOTAS = (None,) * len(RESOURCES)  # a queue without a quota on the flavor: it counts physically only


def _pooled(before: Amounts, after: Amounts, private: Amounts) -> Amounts:
    """How much more of the tree's pool a queue uses going from `before` to `after`: what it
    uses beyond its private (unlent) part comes from the pool. Unrolled: admission's hot path."""
    return Amounts(
        max(0, after[0] - private[0]) - max(0, before[0] - private[0]),
        max(0, after[1] - private[1]) - max(0, before[1] - private[1]),
        max(0, after[2] - private[2]) - max(0, before[2] - private[2]),
    )


class QuotaBook:
    """What a tenancy fixes for the bookkeeping: each queue's tree root, its quotas per flavor,
    the part of them it does not lend, and each tree's lendable pool. The engine keeps one per
    tenancy; a from-scratch cycle builds its own."""

    def __init__(self, tenancy: Tenancy):
        self.root = {cq: tenancy.root_of(cq) for cq in tenancy.cluster_queues}
        self.quotas = {  # (queue, flavor) -> each resource's quota, None where it has none
            (cq, f): tuple(q.of(r) for r in RESOURCES)
            for cq, queue in tenancy.cluster_queues.items()
            for f, q in queue.quotas.items()
        }
        self.pool_size: dict[tuple[str, str], Amounts] = defaultdict(Amounts)  # (tree root, flavor) -> lendable
        self.private: dict[tuple[str, str], Amounts] = {}  # (queue, flavor) -> what it does not lend
        for (cq, flavor), quotas in self.quotas.items():
            lendable = Amounts(*(q.lendable if q is not None else 0 for q in quotas))
            self.pool_size[self.root[cq], flavor] = self.pool_size[self.root[cq], flavor].plus(lendable)
            self.private[cq, flavor] = Amounts(
                *(q.nominal - q.lendable if q is not None else UNLIMITED for q in quotas)
            )
        self.short_room = _short_rooms(tenancy, self.root, self.quotas)


def _short_rooms(tenancy: Tenancy, root: dict[str, str], quotas: dict) -> dict[tuple[str, str], int]:
    """(tree root, flavor) -> the GPUs of the tree's short-work share there: its root cohort's
    `short_work_share` of the nominal GPUs of the tree's queues on the flavor (trees only: a
    queue without a cohort has no one to share with)."""
    nominal: dict[tuple[str, str], int] = defaultdict(int)
    for (cq, flavor), quota in quotas.items():
        if quota[0] is not None and root[cq].startswith("cohort:"):
            nominal[root[cq], flavor] += quota[0].nominal
    return {
        (tree, flavor): math.floor(tenancy.cohorts[tree.partition(":")[2]].short_work_share * gpus)
        for (tree, flavor), gpus in nominal.items()
    }


def on_short_share(holders: Iterable[Holder], service: Service) -> list[Holder]:
    """The holders a short-work share lends GPUs to now: admitted on it and still at level 0
    (past it, they are borrowed work like any other)."""
    return [h for h in holders if service.lent_short(h)]


class Usage:
    """Resources held per (queue, flavor), with running totals of each tree's shared pool (so
    a fit check costs the same however many queues share the tree) and of physical use."""

    def __init__(
        self,
        tenancy: Tenancy,
        capacity: Mapping[str, Amounts],
        held: Mapping[tuple[str, str], Amounts],
        book: QuotaBook | None = None,
    ):
        book = book or QuotaBook(tenancy)
        self.capacity = capacity
        self.used: dict[tuple[str, str], Amounts] = defaultdict(Amounts)
        self.physical: dict[str, Amounts] = defaultdict(Amounts)
        self.root, self.quotas, self.pool_size, self.private = book.root, book.quotas, book.pool_size, book.private
        self.short_room = book.short_room
        self.in_pool: dict[tuple[str, str], Amounts] = defaultdict(Amounts)  # (tree root, flavor) -> used from it
        self.borrowers: dict[tuple[str, str], set[str]] = {}  # (tree root, flavor) -> queues beyond nominal there
        for (cq, flavor), amounts in held.items():
            self.add(cq, flavor, amounts)

    def has(self, cq: str, flavor: str) -> bool:
        """The queue exists and has a quota on the flavor (an admin may have removed either
        while jobs still hold GPUs: those count physically only)."""
        return (cq, flavor) in self.quotas

    def add(self, cq: str, flavor: str, demand: Amounts) -> None:
        self.physical[flavor] = self.physical[flavor].plus(demand)
        private = self.private.get((cq, flavor))
        if private is None:
            return
        before = self.used[cq, flavor]
        after = self.used[cq, flavor] = before.plus(demand)
        key = self.root[cq], flavor
        self.in_pool[key] = self.in_pool[key].plus(_pooled(before, after, private))
        quotas = self.quotas[cq, flavor]
        if any(q is not None and after[i] > q.nominal for i, q in enumerate(quotas)):
            self.borrowers.setdefault(key, set()).add(cq)
        elif cq in self.borrowers.get(key, ()):
            self.borrowers[key].discard(cq)

    def is_borrowing(self, cq: str, flavor: str) -> bool:
        """The queue uses some resource beyond its nominal quota on the flavor (`borrowing`, kept
        by `add` so a victim search asks it of every queue at no cost)."""
        return cq in self.borrowers.get((self.root.get(cq), flavor), ())

    def borrowed(self, cq: str, flavor: str, i: int = 0) -> int:
        """How much of resource `i` (GPUs by default) the queue uses beyond its nominal quota."""
        quota = self.quotas.get((cq, flavor), _NO_QUOTAS)[i]
        return 0 if quota is None else max(0, self.used[cq, flavor][i] - quota.nominal)

    def borrowing(self, cq: str, flavor: str) -> Resource | None:
        """The first resource the queue uses beyond its nominal quota, if any."""
        return next((RESOURCES[i] for i in _INDEXES if self.borrowed(cq, flavor, i)), None)

    def borrows(self, cq: str, flavor: str, demand: Amounts) -> bool:
        used = self.used[cq, flavor]
        return any(q is not None and used[i] + demand[i] > q.nominal for i, q in enumerate(self.quotas[cq, flavor]))

    def headroom(self, cq: str, flavor: str, resource: Resource = Resource.gpu) -> tuple[int, PendingCode]:
        """The most of `resource` the queue could get on the flavor now, and the binding limit."""
        return self._headroom(cq, flavor, RESOURCES.index(resource))

    def _headroom(self, cq: str, flavor: str, i: int) -> tuple[int, PendingCode]:
        amount, code = self.capacity.get(flavor, _NONE)[i] - self.physical[flavor][i], PendingCode.CapacityFull
        q = self.quotas[cq, flavor][i]
        if q is not None:  # on a tie the quota explains best
            used = self.used[cq, flavor][i]
            key = self.root[cq], flavor
            pool = max(0, (q.nominal - q.lendable) - used) + self.pool_size[key][i] - self.in_pool[key][i]
            if pool <= amount:
                amount, code = pool, PendingCode.PoolLent
            if q.borrowing_limit is not None and q.nominal + q.borrowing_limit - used <= amount:
                amount, code = q.nominal + q.borrowing_limit - used, PendingCode.QuotaExhausted
        return max(0, amount), code

    def short(self, cq: str, flavor: str, demand: Amounts) -> tuple[Resource, int, PendingCode] | None:
        """The first resource the job cannot get now (with what is free of it and why), or None."""
        for i in _INDEXES:
            if demand[i]:
                available, code = self._headroom(cq, flavor, i)
                if available < demand[i]:
                    return RESOURCES[i], available, code
        return None

    def fits(self, cq: str, flavor: str, demand: Amounts) -> bool:
        return self.short(cq, flavor, demand) is None

    def off_quota(self, holders: Iterable[Holder]) -> dict[tuple[str, str], int]:
        """The GPUs of holders on a short-work share count physically only, not in their queue's
        quota (what the desk holds within its quota stays its own; their cores and memory stay
        in it); returns the GPUs each (tree root, flavor) share lends."""
        lent: dict[tuple[str, str], int] = defaultdict(int)
        for h in holders:
            self.add(h.cluster_queue, h.flavor, Amounts(-h.gpus))
            self.physical[h.flavor] = self.physical[h.flavor].plus(Amounts(h.gpus))
            lent[self.root.get(h.cluster_queue, ""), h.flavor] += h.gpus
        return lent

    def add_short(self, cq: str, flavor: str, demand: Amounts) -> None:
        """A job admitted on a short-work share: its GPUs physically only (`off_quota`)."""
        self.add(cq, flavor, Amounts(0, demand[1], demand[2]))
        self.physical[flavor] = self.physical[flavor].plus(Amounts(demand[0]))

    def idle_fits(self, flavor: str, demand: Amounts) -> bool:
        """The flavor has `demand` physically idle, whatever the quotas."""
        capacity, physical = self.capacity.get(flavor, _NONE), self.physical[flavor]
        return all(physical[i] + demand[i] <= capacity[i] for i in _INDEXES)

    def without(self, victims: Iterable[Holder]) -> Usage:
        copy = Usage.__new__(Usage)
        copy.capacity, copy.root, copy.pool_size = self.capacity, self.root, self.pool_size
        copy.quotas, copy.private, copy.short_room = self.quotas, self.private, self.short_room
        copy.used, copy.physical = defaultdict(Amounts, self.used), defaultdict(Amounts, self.physical)
        copy.in_pool = defaultdict(Amounts, self.in_pool)
        copy.borrowers = {key: set(queues) for key, queues in self.borrowers.items()}
        for v in victims:
            copy.add(v.cluster_queue, v.flavor, Amounts().minus(v.demand))
        return copy


def held_per_queue(holders: Iterable[Holder]) -> dict[tuple[str, str], Amounts]:
    """What the holders hold per (queue, flavor), added up once."""
    sums: dict[tuple[str, str], list[int]] = {}
    for h in holders:
        acc = sums.setdefault((h.cluster_queue, h.flavor), [0, 0, 0])
        acc[0] += h.gpus
        acc[1] += h.cpus
        acc[2] += h.memory
    return {key: Amounts(*acc) for key, acc in sums.items()}
