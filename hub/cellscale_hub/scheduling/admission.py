"""Admission: which pending jobs get quota now, which admitted jobs to preempt, and why the
rest wait. Pure functions over a `Snapshot`; the controller builds the snapshot from the
store and applies the `Decision`.

Rules, in order:
- **All or nothing**: a job is admitted on one flavor with all its GPUs, CPUs and memory, or
  not at all.
- **Quota**, per resource: a ClusterQueue uses its nominal quota, then borrows from its
  cohort tree up to its `borrowing_limit`; the tree's shared pool is every queue's lendable
  quota (nominal less what its `lending_limit` keeps private). A resource the queue has no
  quota on is bounded by capacity only. A flavor's physical capacity caps it all.
- **Order**: priority class, then hierarchical fair share (see `fairshare`; usage is
  weighed in GPU-equivalents, `Tenancy.resource_weights`), then submit time. A queue is
  strictly ordered: when its head cannot fit, nothing behind it in that queue goes first (a
  big gang is never starved by small ones), and no other queue of the same tree may
  *borrow* that flavor in this cycle (the head keeps its claim).
- **Preemption**: a head that fits within its own nominal quota reclaims GPUs lent to
  borrowing queues; a head may also preempt lower-priority jobs of its own queue. Victims
  are chosen to lose the least work (weighted resource-seconds since their last checkpoint),
  then lower priority, then the most-borrowing queue; the fewest victims that make room.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from cellscale.vocabulary import PendingCode, Resource
from cellscale_hub.scheduling.ceiling import Ceiling, limits, over
from cellscale_hub.scheduling.fairshare import FairTree
from cellscale_hub.scheduling.resources import RESOURCES, UNLIMITED, Amounts, amount_words, capacity_of
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.placement import Offer, SiteState, Spend, choose, offer, table_words
from cellscale_hub.tenancy import Tenancy

MAX_AHEAD = 10  # holders named in a waiting job's reason


@dataclass(frozen=True)
class Workload:
    """A pending job."""

    job_id: str
    cluster_queue: str
    gpus: int
    priority: int = 0
    submitted: float = 0.0
    flavors: tuple[str, ...] | None = None  # None: every flavor of its queue
    tenant: str = ""
    cpus: int = 0
    memory: int = 0  # MiB asked for (0: none asked)
    data: tuple[tuple[str, float], ...] = ()  # (home site, GB) of each dataset and checkpoint it reads
    runtime_s: float = 3600.0  # expected run time (for dollars): its time limit, or a desk's typical run
    attained: float = 0.0  # service received in its earlier attempts, GPU-equivalent seconds
    queued_at: float | None = None  # when it last joined the queue (None: when submitted)
    time_limit_s: float | None = None  # its --time: a hard bound (the backend stops it there)

    @cached_property
    def demand(self) -> Amounts:
        return Amounts(self.gpus, self.cpus, self.memory)


@dataclass(frozen=True)
class Holder:
    """A job that holds quota: admitted, running, or being preempted."""

    job_id: str
    cluster_queue: str
    flavor: str
    gpus: int
    priority: int = 0
    started: float | None = None
    last_checkpoint: float | None = None
    ends_by: float | None = None  # start + its time limit: when its GPUs are free at the latest
    preempting: bool = False
    tenant: str = ""
    cpus: int = 0
    memory: int = 0
    attained: float = 0.0  # service received before this attempt, GPU-equivalent seconds
    preemptions: int = 0  # how often it was preempted so far
    owner: str = ""  # who submitted it: a reason says "alice's job big1" (the API: "your job big1")
    name: str = ""  # its JobSpec.name

    @cached_property
    def demand(self) -> Amounts:
        return Amounts(self.gpus, self.cpus, self.memory)


@dataclass(frozen=True)
class Snapshot:
    tenancy: Tenancy
    capacity: Mapping[str, int | Amounts]  # flavor -> physical GPUs (or GPUs, CPUs and memory)
    holders: tuple[Holder, ...] = ()
    pending: tuple[Workload, ...] = ()
    history: dict[str, float] = field(default_factory=dict)  # cluster queue -> recent average GPUs
    now: float = 0.0
    sites: Mapping[str, SiteState] = field(default_factory=dict)  # flavor -> its site, for flavors that have one
    spend: Mapping[str, Spend] = field(default_factory=dict)  # tenant -> cloud spend against its budget
    # cluster queue -> the demand of its waiting jobs left out of `pending` (a caller that passes
    # only the first jobs of each queue): a head's wait for a site counts the queues ahead of it
    unlisted: Mapping[str, Amounts] = field(default_factory=dict)


@dataclass(frozen=True)
class Admission:
    job_id: str
    flavor: str
    borrowed: int  # GPUs beyond its queue's nominal quota, at admission
    placed: str | None = None  # why this site, in words, when it had a choice of sites


@dataclass(frozen=True)
class Preemption:
    job_id: str
    for_job: str
    reason: str


@dataclass(frozen=True)
class Ahead:
    job_id: str
    cluster_queue: str
    gpus: int
    why: str
    holds: str = ""  # what it holds (or waits for) of the resource in the way: "4 GPUs", "8 CPUs"
    owner: str = ""
    name: str = ""


def ahead_of(h: Holder, why: str, i: int = 0) -> Ahead:
    """A holder in the way, with what it holds of resource `i` in words."""
    return Ahead(h.job_id, h.cluster_queue, h.gpus, why, _held(h, i), h.owner, h.name)


def job_words(h: Holder) -> str:
    """ "alice's job big1": its owner's (the API says "your job" to its owner) and its name, else its id."""
    name = h.name or h.job_id
    return f"{h.owner}'s job {name}" if h.owner else f"job {name}"


@dataclass(frozen=True)
class PendingReason:
    """Why a job waits, structured (for the API and the panel) and in words."""

    code: PendingCode
    message: str
    position: int  # 1 = next in its ClusterQueue
    flavor: str | None = None
    needs: int = 0  # of `resource`
    available: int = 0
    ahead: tuple[Ahead, ...] = ()
    estimated_start: float | None = None
    resource: Resource = Resource.gpu  # the one it waits for
    offers: tuple[Offer, ...] = ()  # every site it may use, when it has a choice


class Reasons(Mapping[str, PendingReason]):
    """Why each waiting job waits. The heads' reasons are built in the cycle; a job queued
    behind a blocked head gets its reason (position, the head it waits behind) only when
    asked, so a cycle over 100k waiting jobs builds a hundred reasons, not 100k."""

    def __init__(self) -> None:
        self.explicit: dict[str, PendingReason] = {}
        self._lines: list[tuple[Workload, dict[str, Workload], dict[str, int]]] = []  # head, behind, positions
        self._later: dict[str, tuple[PendingCode, Callable[[], PendingReason]]] = {}  # built when asked
        self._groups: list[tuple[PendingCode, dict[str, tuple[Workload, int]], Callable]] = []  # the same, many

    def later(self, job_id: str, code: PendingCode, build: Callable[[], PendingReason]) -> None:
        """A reason built only when asked (from the cycle's final state), its code known now."""
        self._later[job_id] = (code, build)

    def group(
        self, code: PendingCode, build: Callable[[Workload, int], PendingReason]
    ) -> dict[str, tuple[Workload, int]]:
        """Many jobs that wait for the same reason: fill the returned dict with job id ->
        (job, position); each one's reason is built when asked."""
        members: dict[str, tuple[Workload, int]] = {}
        self._groups.append((code, members, build))
        return members

    def queue_behind(self, head: Workload, behind: list[Workload], start: int) -> None:
        jobs = {job.job_id: job for job in behind}
        self._lines.append((head, jobs, dict(zip(jobs, range(start, start + len(jobs)), strict=True))))

    def __setitem__(self, job_id: str, reason: PendingReason) -> None:
        self.explicit[job_id] = reason

    def __getitem__(self, job_id: str) -> PendingReason:
        if job_id in self.explicit:
            return self.explicit[job_id]
        if job_id in self._later:
            reason = self.explicit[job_id] = self._later[job_id][1]()
            return reason
        for _, members, build in self._groups:
            if job_id in members:
                reason = self.explicit[job_id] = build(*members[job_id])
                return reason
        for head, jobs, positions in self._lines:  # one line per blocked queue: a hundred, not 100k
            if job_id in jobs:
                return _queued(self.explicit[head.job_id], head, jobs[job_id], positions[job_id])
        raise KeyError(job_id)

    def __contains__(self, job_id: object) -> bool:
        return (
            job_id in self.explicit
            or job_id in self._later
            or any(job_id in members for _, members, _ in self._groups)
            or any(job_id in jobs for _, jobs, _ in self._lines)
        )

    def codes(self) -> dict[str, PendingCode]:
        """Each waiting job's reason code, without building the reasons of those queued behind a head."""
        out = {job_id: code for job_id, (code, _) in self._later.items()}
        for code, members, _ in self._groups:
            out.update(dict.fromkeys(members, code))
        out.update({job_id: reason.code for job_id, reason in self.explicit.items()})
        for _, jobs, _ in self._lines:
            out.update(dict.fromkeys(jobs, PendingCode.Queued))
        return out

    def __iter__(self) -> Iterator[str]:
        yield from self.explicit
        yield from (job_id for job_id in self._later if job_id not in self.explicit)
        for _, members, _ in self._groups:
            yield from (job_id for job_id in members if job_id not in self.explicit)
        for _, jobs, _ in self._lines:
            yield from jobs

    def __len__(self) -> int:
        lazy = [*self._later, *(job_id for _, members, _ in self._groups for job_id in members)]
        built = sum(1 for job_id in lazy if job_id in self.explicit)
        return len(self.explicit) + len(lazy) - built + sum(len(jobs) for _, jobs, _ in self._lines)


@dataclass
class Decision:
    admit: list[Admission] = field(default_factory=list)
    preempt: list[Preemption] = field(default_factory=list)
    pending: Reasons = field(default_factory=Reasons)


# -- usage bookkeeping --------------------------------------------------------------------
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


class Usage:
    """Resources held per (queue, flavor), with running totals of each tree's shared pool (so
    a fit check costs the same however many queues share the tree) and of physical use."""

    def __init__(self, tenancy: Tenancy, capacity: Mapping[str, Amounts], held: Mapping[tuple[str, str], Amounts]):
        self.capacity = capacity
        self.used: dict[tuple[str, str], Amounts] = defaultdict(Amounts)
        self.physical: dict[str, Amounts] = defaultdict(Amounts)
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
        self.in_pool: dict[tuple[str, str], Amounts] = defaultdict(Amounts)  # (tree root, flavor) -> used from it
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

    def without(self, victims: Iterable[Holder]) -> Usage:
        copy = Usage.__new__(Usage)
        copy.capacity, copy.root, copy.pool_size = self.capacity, self.root, self.pool_size
        copy.quotas, copy.private = self.quotas, self.private
        copy.used, copy.physical = defaultdict(Amounts, self.used), defaultdict(Amounts, self.physical)
        copy.in_pool = defaultdict(Amounts, self.in_pool)
        for v in victims:
            copy.add(v.cluster_queue, v.flavor, Amounts().minus(v.demand))
        return copy


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
            found = [h for held in self.in_the_way(snap, usage, cq, flavor, code, i).values() for h in held]
            found.sort(key=_end)
            ends = [_end(h) for h in found]
            freed = [0] * len(found)
            total = 0
            for n, h in enumerate(found):
                total += h.demand[i]
                freed[n] = total
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


# -- the cycle ----------------------------------------------------------------------------
PREEMPTING_PER_QUEUE = 8  # waiting jobs of one queue that may choose victims in one cycle


@dataclass
class Line:
    """One ClusterQueue's waiting jobs in a cycle, in order (`_queues`), and what the jobs
    already looked at decided for those behind them."""

    jobs: list[Workload]
    at: int = 0
    waiting: list[Workload] = field(default_factory=list)  # jobs looked at that still wait, in order
    reserved: dict[str, tuple[Workload, float | None]] = field(default_factory=dict)  # flavor -> (head, its start)
    failed: dict[str, Amounts] = field(default_factory=dict)  # flavor -> the smallest demand that did not fit
    behind: dict[str, dict] = field(default_factory=dict)  # flavor -> the jobs waiting behind its reservation
    may_preempt: int = PREEMPTING_PER_QUEUE
    timed: bool = False  # some job of it has a time limit (may backfill before a reservation)

    @property
    def job(self) -> Workload:
        return self.jobs[self.at]

    @property
    def head(self) -> Workload | None:
        """The first job of the queue that waits."""
        return self.waiting[0] if self.waiting else None

    def advance(self) -> bool:
        """Next job; False when none is left."""
        self.at += 1
        return self.at < len(self.jobs)

    def usable(self, job: Workload, flavors: list[str], now: float) -> list[str]:
        """The flavors this job may take now: not one a head of its queue reserved, unless its
        time limit ends before that head's estimated start (backfill that delays nobody)."""
        out = []
        for f in flavors:
            reservation = self.reserved.get(f)
            if reservation is None:
                out.append(f)
                continue
            start = reservation[1]
            if job.time_limit_s is not None and start is not None and now + job.time_limit_s <= start:
                out.append(f)
        return out

    def hopeless(self, job: Workload, flavors: list[str]) -> bool:
        """A smaller job of this queue already did not fit on each flavor (usage only grows
        within a cycle): this one cannot either."""
        return all(f in self.failed and job.demand.covers(self.failed[f]) for f in flavors)

    def note_failed(self, job: Workload, flavors: list[str]) -> None:
        for f in flavors:
            known = self.failed.get(f)
            if known is None or known.covers(job.demand):
                self.failed[f] = job.demand


def schedule(snap: Snapshot) -> Decision:
    t = snap.tenancy
    weights = t.resource_weights
    service = Service(t.ordering, weights, snap.now)
    held = _held_per_queue(snap.holders)
    usage = Usage(t, {f: capacity_of(c) for f, c in snap.capacity.items()}, held)
    tree = FairTree.of(t)
    queue_use = dict(snap.history)
    for (cq, _), amounts in held.items():
        queue_use[cq] = queue_use.get(cq, 0.0) + amounts.weight(weights)
    queues = _queues(snap.pending, service)
    lines = {cq: Line(jobs, timed=any(j.time_limit_s for j in jobs)) for cq, jobs in queues.items()}
    decision = Decision()
    cycle = Cycle(service, leaving={h.job_id: h for h in snap.holders if h.preempting})
    flavors_of = {cq: _by_kind(t, list(t.cluster_queues[cq].quotas)) for cq in lines}

    def waits_anyway(cq: str) -> bool:
        """The queue's current job cannot start now, whatever other queues do (its reason is
        set): a cycle over 100k waiting jobs chooses between queues only for the others."""
        line = lines[cq]
        job = line.job
        flavors = _flavors(flavors_of[cq], job)
        too_big = cycle.never_fits(snap, job, flavors) if flavors else None
        if not flavors or too_big:
            decision.pending[job.job_id] = _never_fits(job, too_big)
            return True
        held = _over_budget(snap, job)
        if held is not None:
            decision.pending[job.job_id] = held
            return True
        usable = line.usable(job, flavors, snap.now)
        if not usable or line.hopeless(job, usable):
            _wait_behind(decision, snap, usage, cycle, line, job, flavors, usable)
            return True
        return False

    def next_of(cq: str) -> None:
        """On to the queue's next job that may start now; the queue leaves when none is left."""
        line = lines[cq]
        while line.advance():
            if not waits_anyway(cq):
                return
        del lines[cq]

    for cq in list(lines):
        if waits_anyway(cq):
            next_of(cq)
    while lines:
        node_use = tree.node_usage(queue_use)
        cq = min(
            lines,
            key=lambda c: _order(
                usage, _flavors(flavors_of[c], lines[c].job), lines[c].job, tree.key(c, node_use), service
            ),
        )
        line = lines[cq]
        job = line.job
        flavors = _flavors(flavors_of[cq], job)
        usable = line.usable(job, flavors, snap.now)
        offers = _offers(snap, usage, job, usable, cycle) if _across_sites(snap, usable) else None
        best = choose(offers) if offers else None
        if offers is None:
            flavor = _choose_flavor(usage, job, usable, cycle)
        else:
            flavor = best.flavor if best is not None and best.fits_now else None
        if flavor is not None:
            usage.add(cq, flavor, job.demand)
            queue_use[cq] = queue_use.get(cq, 0.0) + job.demand.weight(weights)
            placed = _placed_words(snap, job, best, offers, cycle) if offers else None
            if offers and best.cloud:
                cycle.spent[job.tenant] = cycle.spent.get(job.tenant, 0.0) + best.total_usd
            decision.admit.append(Admission(job.job_id, flavor, usage.borrowed(cq, flavor), placed))
            next_of(cq)
            continue
        if offers is not None:
            usable = [best.flavor] if best is not None else []
        if line.head is not None:
            _wait_behind(decision, snap, usage, cycle, line, job, flavors, usable, preempt=True)
            if offers is None:
                line.note_failed(job, usable)
            next_of(cq)
            continue
        line.waiting.append(job)
        if usable and usable[0] in snap.sites:  # heads that wait for this site later queue behind its queue
            acc = cycle.waiting_for.setdefault(usable[0], [0, 0, 0])
            for i, amount in enumerate(queued_from(line.jobs, line.at, snap.unlisted.get(cq))):
                acc[i] += amount
        for victim in _make_room(snap, usage, job, usable, cycle) if usable else ():
            decision.preempt.append(Preemption(victim.job_id, job.job_id, _victim_reason(usage, victim, job, service)))
        line.may_preempt -= 1
        if offers is None:
            reason = _blocked_reason(snap, usage, job, usable, cycle)
        else:
            reason = _site_reason(snap, usage, job, best, offers, cycle)
        reserves = service.reserves(job)
        decision.pending[job.job_id] = _head_words(reason, job, service, reserves, line.at + 1 < len(line.jobs))
        if offers is None:
            line.note_failed(job, usable)
        for f in usable:  # no other queue of its tree may borrow there now (the head keeps its claim)
            if (usage.root[cq], f) not in cycle.claims:
                cycle.claims[usage.root[cq], f] = job
                cycle.claim_start[usage.root[cq], f] = reason.estimated_start
            if reserves:
                line.reserved[f] = (job, reason.estimated_start)
        if reserves and (
            not t.ordering.backfill or (not line.timed and line.reserved.keys() >= set(sum(flavors_of[cq], [])))
        ):
            decision.pending.queue_behind(job, line.jobs[line.at + 1 :], start=len(line.waiting) + 1)
            del lines[cq]  # nothing behind it may start anywhere: they wait in order
            continue
        next_of(cq)
    return decision


def queued_from(jobs: list[Workload], at: int, unlisted: Amounts | None = None) -> Amounts:
    """The demand of a queue's head (`jobs[at]`) and of every job waiting behind it, listed
    or not: what a head of another queue that waits for the same place waits behind. The
    whole queue, not the head alone: a head that counted only the heads before it would see
    its site a few ends away however many thousands queue there, so waiting would always look
    cheaper than moving."""
    total = unlisted or Amounts()
    for job in jobs[at:]:
        total = total.plus(job.demand)
    return total


def _wait_behind(
    decision: Decision,
    snap: Snapshot,
    usage: Usage,
    cycle: Cycle,
    line: Line,
    job: Workload,
    flavors: list[str],
    usable: list[str],
    preempt: bool = False,
) -> None:
    """A job behind its queue's first waiting job that does not start: it may still choose
    victims (a few per queue per cycle: for service, or reclaiming its desk's lent GPUs), and
    its reason is built only when someone asks (a queue of 10k costs no 10k reasons)."""
    waiting = line.waiting  # only grows: the jobs ahead of this one stay its first position - 1
    waiting.append(job)
    position = len(waiting)
    if preempt and usable and line.may_preempt > 0:
        line.may_preempt -= 1
        for victim in _make_room(snap, usage, job, usable, cycle):
            decision.preempt.append(
                Preemption(victim.job_id, job.job_id, _victim_reason(usage, victim, job, cycle.service))
            )
    flavor = None if usable else next((f for f in flavors if f in line.reserved), None)
    if flavor is not None:
        members = line.behind.get(flavor)
        if members is None:
            head, start = line.reserved[flavor]
            members = line.behind[flavor] = decision.pending.group(
                PendingCode.Queued,
                lambda job, position, head=head, flavor=flavor, start=start: _behind_reservation(
                    job, head, flavor, start, position, cycle.service
                ),
            )
        members[job.job_id] = (job, position)
        return
    decision.pending.later(
        job.job_id,
        _short_code(usage, cycle, job, usable),
        lambda: _behind_words(
            _blocked_reason(snap, usage, job, usable, cycle), job, waiting[: position - 1], position, cycle.service
        ),
    )


def _held_per_queue(holders: Iterable[Holder]) -> dict[tuple[str, str], Amounts]:
    """What the holders hold per (queue, flavor), added up once."""
    sums: dict[tuple[str, str], list[int]] = {}
    for h in holders:
        acc = sums.setdefault((h.cluster_queue, h.flavor), [0, 0, 0])
        acc[0] += h.gpus
        acc[1] += h.cpus
        acc[2] += h.memory
    return {key: Amounts(*acc) for key, acc in sums.items()}


def _order(usage: Usage, flavors: list[str], job: Workload, fair_key: tuple[float, ...], service: Service):
    """Jobs within their queue's nominal quota before jobs that would borrow (as in Kueue: a
    loan is never made in the cycle that needs it back), then priority, then (among jobs that
    would borrow) the least service received: idle GPUs go to short work first, whichever
    desk it belongs to; then fair share, age."""
    borrows = all(usage.borrows(job.cluster_queue, f, job.demand) for f in flavors)
    level = service.of_job(job) if borrows else 0
    return (borrows, -job.priority, level, fair_key, job.submitted, job.job_id)


def _queues(pending: Iterable[Workload], service: Service) -> dict[str, list[Workload]]:
    """Each queue's jobs in order: priority, then the least service received (`service`),
    then submit time."""
    queues: dict[str, list[Workload]] = defaultdict(list)
    for job in pending:
        queues[job.cluster_queue].append(job)
    for jobs in queues.values():
        jobs.sort(key=lambda j: (-j.priority, service.of_job(j), j.submitted, j.job_id))
    return queues


def _advance(heads: dict[str, int], queues: dict[str, list[Workload]], cq: str) -> None:
    heads[cq] += 1
    if heads[cq] >= len(queues[cq]):
        del heads[cq]


def _by_kind(t: Tenancy, own: list[str]) -> tuple[list[str], list[str]]:
    """The queue's flavors (in its order) for GPU jobs, and for CPU jobs: its CPU pools when
    it has any (so CPU work never takes the cores of GPU nodes that GPU jobs need), else all."""
    pools = [f for f in own if t.flavors[f].cpu_only]
    return [f for f in own if not t.flavors[f].cpu_only], pools or own


def _flavors(own: tuple[list[str], list[str]], job: Workload) -> list[str]:
    """The queue's flavors (in its order) this job may use."""
    kind = own[1] if job.gpus == 0 else own[0]
    return kind if job.flavors is None else [f for f in kind if f in job.flavors]


def _choose_flavor(usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> str | None:
    """The first flavor that fits, preferring one that needs no borrowing (Kueue's
    flavor fungibility); a flavor a blocked head of this tree claims allows no borrowing."""
    cq = job.cluster_queue
    within = [f for f in flavors if not usage.borrows(cq, f, job.demand)]
    for f in within + [f for f in flavors if f not in within]:
        if usage.borrows(cq, f, job.demand) and _claimant(usage, cycle, job, f):
            continue
        if usage.fits(cq, f, job.demand):
            return f
    return None


def _claimant(usage: Usage, cycle: Cycle, job: Workload, flavor: str) -> Workload | None:
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


# -- sites --------------------------------------------------------------------------------
def _across_sites(snap: Snapshot, flavors: list[str]) -> bool:
    """Placement weighs sites when the job may use flavors at more than one site, or a cloud
    site (whose dollars count against the desk's budget)."""
    sites = [snap.sites[f] for f in flavors if f in snap.sites]
    return len({s.name for s in sites}) > 1 or any(s.cloud for s in sites)


def _offers(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> list[Offer]:
    """One offer per flavor with a site (`scheduling.sites`): fits now, or when what is in
    its way ends."""
    tenant = snap.tenancy.tenants.get(job.tenant)
    wait_value = tenant.wait_usd_per_gpu_hour if tenant else 0.0
    out = []
    for f in flavors:
        if f not in snap.sites:
            continue
        cq = job.cluster_queue
        fits = usage.fits(cq, f, job.demand) and not (
            usage.borrows(cq, f, job.demand) and _claimant(usage, cycle, job, f)
        )
        out.append(
            offer(
                f,
                snap.sites[f],
                gpus=job.gpus,
                runtime_s=job.runtime_s,
                data=job.data,
                sites=snap.tenancy.sites,
                fits_now=fits,
                blocked_until_s=None if fits else _blocked_for(snap, usage, job, f, cycle),
                wait_usd_per_gpu_hour=wait_value,
                spend=_spend(snap, cycle, job.tenant),
            )
        )
    return out


def _spend(snap: Snapshot, cycle: Cycle, tenant: str) -> Spend | None:
    """The tenant's cloud spend, counting what this cycle already admitted to the cloud."""
    spend = snap.spend.get(tenant)
    if spend is None or not cycle.spent.get(tenant):
        return spend
    return Spend(spend.budget, spend.spent_usd + cycle.spent[tenant])


def _blocked_for(snap: Snapshot, usage: Usage, job: Workload, flavor: str, cycle: Cycle) -> float | None:
    """Seconds until the jobs in the way on `flavor` have ended (at their time limits), enough
    for this job and for the queues already waiting there ahead of it (`queued_from`)."""
    short = usage.short(job.cluster_queue, flavor, job.demand)
    ahead = cycle.waiting_for.get(flavor, (0, 0, 0))
    if short is None:
        if not any(ahead):
            return 0.0  # fits, but a blocked head ahead claims it: frees when that head starts
        resource = RESOURCES[next(i for i, a in enumerate(ahead) if a)]
        available, code = usage.headroom(job.cluster_queue, flavor, resource)[0], PendingCode.CapacityFull
    else:
        resource, available, code = short
    i = RESOURCES.index(resource)
    until = _estimate(snap, usage, job, flavor, code, i, cycle, job.demand[i] + ahead[i] - available)
    return None if until is None else until - snap.now


def _placed_words(snap: Snapshot, job: Workload, best: Offer, offers: list[Offer], cycle: Cycle) -> str:
    spend = _spend(snap, cycle, job.tenant)
    return f"placed at {best.site}: {table_words(offers, job.tenant, spend)}"


def _site_reason(
    snap: Snapshot, usage: Usage, job: Workload, best: Offer | None, offers: list[Offer], cycle: Cycle
) -> PendingReason:
    """Why a job with a choice of sites waits: the table, and what blocks the site it waits for."""
    table = table_words(offers, job.tenant, _spend(snap, cycle, job.tenant))
    if best is None:
        return PendingReason(
            PendingCode.NoFlavor, f"no site may take it now: {table}", 1, needs=job.gpus, offers=tuple(offers)
        )
    blocked = _blocked_reason(snap, usage, job, [best.flavor], cycle)
    return dataclasses.replace(
        blocked, message=f"waits for {best.site} ({table}); {blocked.message}", offers=tuple(offers)
    )


# -- preemption ---------------------------------------------------------------------------
def _make_room(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> list[Holder]:
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
                if h.preempting or h.job_id in cycle.taken:
                    continue
                if h.priority < job.priority:
                    out.append(h)  # priority preemption within the queue
                elif for_service and h.priority == job.priority and cycle.service.victim_for(h, level):
                    out.append(h)  # it received more service and just checkpointed: least service first
        elif (within_nominal or for_service) and (
            usage.has(q, flavor) and usage.root[q] == usage.root[cq] and usage.borrowing(q, flavor)
        ):
            for h in held:
                if h.preempting or h.job_id in cycle.taken:
                    continue
                if within_nominal:
                    out.append(h)  # reclaim what was lent
                elif h.priority <= job.priority and cycle.service.victim_for(h, level):
                    out.append(h)  # a loan to work of a higher level goes to less-served work (borrowWithinCohort)
    return out


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
            and not trial.borrowing(victim.cluster_queue, flavor)
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


def _victim_reason(usage: Usage, victim: Holder, job: Workload, service: Service) -> str:
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


# -- why pending --------------------------------------------------------------------------
def _over_budget(snap: Snapshot, job: Workload) -> PendingReason | None:
    """Held: its desk's budget is spent and stops new work (`hard_stop`)."""
    spend = snap.spend.get(job.tenant)
    if spend is None or not spend.budget.hard_stop or not spend.exhausted:
        return None
    return PendingReason(
        PendingCode.BudgetSpent,
        f"held: {job.tenant} has spent its budget ({spend.words(job.tenant)}), which stops new work; "
        "it starts when the period's spend falls below the budget or an admin raises it",
        1,
        needs=job.gpus,
    )


def _never_fits(job: Workload, best: Ceiling | None) -> PendingReason:
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


def _blocked_reason(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> PendingReason:
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
    held = [f for f in flavors if usage.fits(cq, f, job.demand) and _claimant(usage, cycle, job, f)]
    if held:
        head = _claimant(usage, cycle, job, held[0])
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
    ahead = tuple(ahead_of(h, _why(usage, h, cq, i), i) for h in holders[:MAX_AHEAD])
    if ahead:
        details += "; held by " + ", ".join(f"{a.job_id} ({a.cluster_queue}, {a.holds}, {a.why})" for a in ahead[:3])
    message = f"{_headline(usage, job, flavor, resource, available, code, holders)}. Details: {details}"
    return PendingReason(
        code,
        message,
        1,
        flavor,
        needs,
        available,
        ahead,
        _estimate(snap, usage, job, flavor, code, i, cycle, needs - available),
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
    if h.cluster_queue == job.cluster_queue:
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
    return heapq.nsmallest(MAX_AHEAD, firsts, key=lambda h: (-borrowed[h.cluster_queue], -h.demand[i], h.job_id))


def _why(usage: Usage, h: Holder, cq: str, i: int = 0) -> str:
    """Why `h` holds what is in the way: borrowing only when its queue borrows that resource."""
    if usage.borrowed(h.cluster_queue, h.flavor, i):
        return "borrowing"
    return "same queue" if h.cluster_queue == cq else "within its quota"


def _end(h: Holder) -> float:
    return math.inf if h.ends_by is None else h.ends_by


def _estimate(
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


def _queued(head_reason: PendingReason, head: Workload, job: Workload, position: int) -> PendingReason:
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


def _head_words(reason: PendingReason, job: Workload, service: Service, reserves: bool, behind: bool) -> PendingReason:
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


def _behind_reservation(
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


def _behind_words(
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


def _short_code(usage: Usage, cycle: Cycle, job: Workload, flavors: list[str]) -> PendingCode:
    """The code of a waiting job's reason without building it."""
    if job.job_id in cycle.promised:
        return PendingCode.Preempting
    short = usage.short(job.cluster_queue, flavors[0], job.demand) if flavors else None
    return short[2] if short else PendingCode.HeldForAhead
