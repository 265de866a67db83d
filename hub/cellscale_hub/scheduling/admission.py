"""Admission: which pending jobs get quota now, which admitted jobs to preempt, and why the
rest wait. Pure functions over a `Snapshot`; the controller builds the snapshot from the
store and applies the `Decision`.

Rules, in order:
- **All or nothing**: a job is admitted on one flavor with all its GPUs, or not at all.
- **Quota**: a ClusterQueue uses its nominal quota, then borrows from its cohort tree up to
  its `borrowing_limit`; the tree's shared pool is every queue's lendable quota (nominal
  less what its `lending_limit` keeps private). A flavor's physical capacity caps it all.
- **Order**: priority class, then hierarchical fair share (see `fairshare`), then submit
  time. A queue is strictly ordered: when its head cannot fit, nothing behind it in that
  queue goes first (a big gang is never starved by small ones), and no other queue of the
  same tree may *borrow* that flavor in this cycle (the head keeps its claim).
- **Preemption**: a head that fits within its own nominal quota reclaims GPUs lent to
  borrowing queues; a head may also preempt lower-priority jobs of its own queue. Victims
  are chosen to lose the least work (GPU-seconds since their last checkpoint), then lower
  priority, then the most-borrowing queue; the fewest victims that make room.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from cellscale.vocabulary import PendingCode
from cellscale_hub.scheduling.ceiling import Ceiling, best_ceiling
from cellscale_hub.scheduling.fairshare import FairTree
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


@dataclass(frozen=True)
class Snapshot:
    tenancy: Tenancy
    capacity: dict[str, int]  # flavor -> physical GPUs
    holders: tuple[Holder, ...] = ()
    pending: tuple[Workload, ...] = ()
    history: dict[str, float] = field(default_factory=dict)  # cluster queue -> recent average GPUs
    now: float = 0.0


@dataclass(frozen=True)
class Admission:
    job_id: str
    flavor: str
    borrowed: int  # GPUs beyond its queue's nominal quota, at admission


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


@dataclass(frozen=True)
class PendingReason:
    """Why a job waits, structured (for the API and the panel) and in words."""

    code: PendingCode
    message: str
    position: int  # 1 = next in its ClusterQueue
    flavor: str | None = None
    needs: int = 0
    available: int = 0
    ahead: tuple[Ahead, ...] = ()
    estimated_start: float | None = None


class Reasons(Mapping[str, PendingReason]):
    """Why each waiting job waits. The heads' reasons are built in the cycle; a job queued
    behind a blocked head gets its reason (position, the head it waits behind) only when
    asked, so a cycle over 100k waiting jobs builds a hundred reasons, not 100k."""

    def __init__(self) -> None:
        self.explicit: dict[str, PendingReason] = {}
        self._lines: list[tuple[Workload, dict[str, Workload], dict[str, int]]] = []  # head, behind, positions

    def queue_behind(self, head: Workload, behind: list[Workload], start: int) -> None:
        jobs = {job.job_id: job for job in behind}
        self._lines.append((head, jobs, dict(zip(jobs, range(start, start + len(jobs)), strict=True))))

    def __setitem__(self, job_id: str, reason: PendingReason) -> None:
        self.explicit[job_id] = reason

    def __getitem__(self, job_id: str) -> PendingReason:
        if job_id in self.explicit:
            return self.explicit[job_id]
        for head, jobs, positions in self._lines:  # one line per blocked queue: a hundred, not 100k
            if job_id in jobs:
                return _queued(self.explicit[head.job_id], head, jobs[job_id], positions[job_id])
        raise KeyError(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.explicit or any(job_id in jobs for _, jobs, _ in self._lines)

    def __iter__(self) -> Iterator[str]:
        yield from self.explicit
        for _, jobs, _ in self._lines:
            yield from jobs

    def __len__(self) -> int:
        return len(self.explicit) + sum(len(jobs) for _, jobs, _ in self._lines)


@dataclass
class Decision:
    admit: list[Admission] = field(default_factory=list)
    preempt: list[Preemption] = field(default_factory=list)
    pending: Reasons = field(default_factory=Reasons)


# -- usage bookkeeping --------------------------------------------------------------------
class Usage:
    """GPUs held per (queue, flavor), with running totals of each tree's shared pool (so a
    fit check costs the same however many queues share the tree) and of physical use."""

    def __init__(self, tenancy: Tenancy, capacity: dict[str, int], holders: Iterable[Holder]):
        self.t = tenancy
        self.capacity = capacity
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        self.physical: dict[str, int] = defaultdict(int)
        self.root = {cq: tenancy.root_of(cq) for cq in tenancy.cluster_queues}
        self.pool_size: dict[tuple[str, str], int] = defaultdict(int)  # (tree root, flavor) -> lendable GPUs
        for cq, root in self.root.items():
            for flavor, q in tenancy.cluster_queues[cq].quotas.items():
                self.pool_size[root, flavor] += q.lendable
        self.in_pool: dict[tuple[str, str], int] = defaultdict(int)  # (tree root, flavor) -> GPUs used from it
        for h in holders:
            self.add(h.cluster_queue, h.flavor, h.gpus)

    def has(self, cq: str, flavor: str) -> bool:
        """The queue exists and has a quota on the flavor (an admin may have removed either
        while jobs still hold GPUs: those count physically only)."""
        queue = self.t.cluster_queues.get(cq)
        return queue is not None and flavor in queue.quotas

    def add(self, cq: str, flavor: str, gpus: int) -> None:
        self.physical[flavor] += gpus
        if not self.has(cq, flavor):
            return
        before = self.used[cq, flavor]
        self.used[cq, flavor] = before + gpus
        self.in_pool[self.root[cq], flavor] += self._from_pool(cq, flavor, before + gpus) - self._from_pool(
            cq, flavor, before
        )

    def quota(self, cq: str, flavor: str):
        return self.t.cluster_queues[cq].quotas[flavor]

    def borrowed(self, cq: str, flavor: str) -> int:
        return max(0, self.used[cq, flavor] - self.quota(cq, flavor).nominal) if self.has(cq, flavor) else 0

    def borrows(self, cq: str, flavor: str, gpus: int) -> bool:
        return self.used[cq, flavor] + gpus > self.quota(cq, flavor).nominal

    def _from_pool(self, cq: str, flavor: str, used: int) -> int:
        q = self.quota(cq, flavor)
        return max(0, used - (q.nominal - q.lendable))  # beyond its private part

    def headroom(self, cq: str, flavor: str) -> tuple[int, PendingCode]:
        """The most GPUs the queue could get on the flavor now, and the binding limit."""
        q = self.quota(cq, flavor)
        used = self.used[cq, flavor]
        limits = []
        if q.borrowing_limit is not None:
            limits.append((q.nominal + q.borrowing_limit - used, PendingCode.QuotaExhausted))
        key = self.root[cq], flavor
        private_free = max(0, (q.nominal - q.lendable) - used)
        limits.append((private_free + self.pool_size[key] - self.in_pool[key], PendingCode.PoolLent))
        limits.append((self.capacity.get(flavor, 0) - self.physical[flavor], PendingCode.CapacityFull))
        amount, code = min(limits, key=lambda limit: limit[0])  # on a tie the quota explains best
        return max(0, amount), code

    def fits(self, cq: str, flavor: str, gpus: int) -> bool:
        return self.headroom(cq, flavor)[0] >= gpus

    def without(self, victims: Iterable[Holder]) -> Usage:
        copy = Usage.__new__(Usage)
        copy.t, copy.capacity, copy.root, copy.pool_size = self.t, self.capacity, self.root, self.pool_size
        copy.used, copy.physical = defaultdict(int, self.used), defaultdict(int, self.physical)
        copy.in_pool = defaultdict(int, self.in_pool)
        for v in victims:
            copy.add(v.cluster_queue, v.flavor, -v.gpus)
        return copy


@dataclass
class Cycle:
    """What one scheduling cycle has decided so far, beyond the usage."""

    claims: dict[tuple[str, str], Workload] = field(default_factory=dict)  # (tree, flavor) -> blocked head
    leaving: dict[str, Holder] = field(default_factory=dict)  # being preempted, not yet promised to a head
    promised: dict[str, list[Holder]] = field(default_factory=dict)  # head -> the victims freeing its GPUs
    taken: set[str] = field(default_factory=set)  # victims promised to some head
    ceilings: dict[tuple[str, tuple[str, ...]], Ceiling] = field(default_factory=dict)  # memo: (queue, flavors)

    def never_fits(self, snap: Snapshot, job: Workload, flavors: list[str]) -> Ceiling | None:
        """The never-fits rule (scheduling.ceiling) against the flavors' GPUs now, memoized per cycle."""
        key = (job.cluster_queue, tuple(flavors))
        if key not in self.ceilings:
            self.ceilings[key] = best_ceiling(snap.tenancy, job.cluster_queue, flavors, snap.capacity)
        best = self.ceilings[key]
        return best if job.gpus > best.gpus else None


# -- the cycle ----------------------------------------------------------------------------
def schedule(snap: Snapshot) -> Decision:
    t = snap.tenancy
    usage = Usage(t, snap.capacity, snap.holders)
    tree = FairTree.of(t)
    queue_use = dict(snap.history)
    for h in snap.holders:
        queue_use[h.cluster_queue] = queue_use.get(h.cluster_queue, 0.0) + h.gpus
    queues = _queues(snap.pending)
    heads = {cq: 0 for cq in queues}
    decision = Decision()
    cycle = Cycle(leaving={h.job_id: h for h in snap.holders if h.preempting})
    flavors_of = {cq: list(t.cluster_queues[cq].quotas) for cq in queues}
    while heads:
        node_use = tree.node_usage(queue_use)
        cq = min(
            heads,
            key=lambda c: _order(
                usage, _flavors(flavors_of[c], queues[c][heads[c]]), queues[c][heads[c]], tree.key(c, node_use)
            ),
        )
        job = queues[cq][heads[cq]]
        flavors = _flavors(flavors_of[cq], job)
        too_big = cycle.never_fits(snap, job, flavors) if flavors else None
        if not flavors or too_big:
            decision.pending[job.job_id] = _never_fits(job, too_big)
            _advance(heads, queues, cq)
            continue
        flavor = _choose_flavor(usage, job, flavors, cycle.claims)
        if flavor is not None:
            usage.add(cq, flavor, job.gpus)
            queue_use[cq] = queue_use.get(cq, 0.0) + job.gpus
            decision.admit.append(Admission(job.job_id, flavor, usage.borrowed(cq, flavor)))
            _advance(heads, queues, cq)
            continue
        for victim in _make_room(snap, usage, job, flavors, cycle):
            decision.preempt.append(Preemption(victim.job_id, job.job_id, _victim_reason(usage, victim, job)))
        decision.pending[job.job_id] = _blocked_reason(snap, usage, job, flavors, cycle)
        for f in flavors:
            cycle.claims.setdefault((usage.root[cq], f), job)
        decision.pending.queue_behind(job, queues[cq][heads[cq] + 1 :], start=2)
        del heads[cq]
    return decision


def _order(usage: Usage, flavors: list[str], job: Workload, fair_key: tuple[float, ...]):
    """Jobs within their queue's nominal quota before jobs that would borrow (as in Kueue: a
    loan is never made in the cycle that needs it back), then priority, fair share, age."""
    borrows = all(usage.borrows(job.cluster_queue, f, job.gpus) for f in flavors)
    return (borrows, -job.priority, fair_key, job.submitted, job.job_id)


def _queues(pending: Iterable[Workload]) -> dict[str, list[Workload]]:
    queues: dict[str, list[Workload]] = defaultdict(list)
    for job in pending:
        queues[job.cluster_queue].append(job)
    for jobs in queues.values():
        jobs.sort(key=lambda j: (-j.priority, j.submitted, j.job_id))
    return queues


def _advance(heads: dict[str, int], queues: dict[str, list[Workload]], cq: str) -> None:
    heads[cq] += 1
    if heads[cq] >= len(queues[cq]):
        del heads[cq]


def _flavors(own: list[str], job: Workload) -> list[str]:
    """The queue's flavors (in its order) this job may use."""
    return own if job.flavors is None else [f for f in own if f in job.flavors]


def _choose_flavor(usage: Usage, job: Workload, flavors: list[str], claims: dict) -> str | None:
    """The first flavor that fits, preferring one that needs no borrowing (Kueue's
    flavor fungibility); a flavor a blocked head of this tree claims allows no borrowing."""
    cq = job.cluster_queue
    within = [f for f in flavors if not usage.borrows(cq, f, job.gpus)]
    for f in within + [f for f in flavors if f not in within]:
        if usage.borrows(cq, f, job.gpus) and _claimant(usage, claims, job, f):
            continue
        if usage.fits(cq, f, job.gpus):
            return f
    return None


def _claimant(usage: Usage, claims: dict, job: Workload, flavor: str) -> Workload | None:
    head = claims.get((usage.root[job.cluster_queue], flavor))
    return head if head is not None and head.job_id != job.job_id else None


# -- preemption ---------------------------------------------------------------------------
def _make_room(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> list[Holder]:
    """Promise `job` the GPUs of jobs already being preempted, or choose new victims, on its
    first flavor where that makes it fit; returns the new victims. A victim's GPUs are
    promised to one head only: the next head does not count on them."""
    for flavor in flavors:
        if usage.fits(job.cluster_queue, flavor, job.gpus):
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
    cq = job.cluster_queue
    within_nominal = not usage.borrows(cq, flavor, job.gpus)
    out = []
    for h in snap.holders:
        if h.flavor != flavor or h.preempting or h.job_id in cycle.taken:
            continue
        if h.cluster_queue == cq:
            if h.priority < job.priority:
                out.append(h)  # priority preemption within the queue
        elif (
            within_nominal
            and usage.has(h.cluster_queue, flavor)
            and usage.root[h.cluster_queue] == usage.root[cq]
            and usage.borrowed(h.cluster_queue, flavor)
        ):
            out.append(h)  # reclaim what was lent
    return out


def _loss(snap: Snapshot, usage: Usage, h: Holder):
    """GPU-seconds since the victim's last checkpoint (or start) first: the work it loses."""
    marks = [x for x in (h.last_checkpoint, h.started) if x is not None]
    work_lost = h.gpus * max(0.0, snap.now - max(marks)) if marks else 0.0
    return (work_lost, h.priority, -usage.borrowed(h.cluster_queue, h.flavor), h.gpus, h.job_id)


def _fewest(
    usage: Usage, job: Workload, flavor: str, candidates: list[Holder], lenders_only: bool = False
) -> list[Holder] | None:
    """Take candidates in order until the job fits, then drop any it does not need after
    all; None if even all of them are not enough. With `lenders_only`, another queue's job
    is taken only while that queue still borrows."""
    chosen: list[Holder] = []
    trial = usage
    for victim in candidates:
        if trial.fits(job.cluster_queue, flavor, job.gpus):
            break
        if (
            lenders_only
            and victim.cluster_queue != job.cluster_queue
            and not trial.borrowed(victim.cluster_queue, flavor)
        ):
            continue  # that queue is back within its own quota
        chosen.append(victim)
        trial = usage.without(chosen)
    if not trial.fits(job.cluster_queue, flavor, job.gpus):
        return None
    for victim in reversed(list(chosen)):
        rest = [v for v in chosen if v is not victim]
        if usage.without(rest).fits(job.cluster_queue, flavor, job.gpus):
            chosen = rest
    return chosen


def _victim_reason(usage: Usage, victim: Holder, job: Workload) -> str:
    if victim.cluster_queue == job.cluster_queue:
        return f"preempted for higher-priority job {job.job_id} in queue {job.cluster_queue}"
    lent = min(victim.gpus, usage.borrowed(victim.cluster_queue, victim.flavor))
    return (
        f"reclaimed by {job.cluster_queue}: {victim.cluster_queue} was borrowing {lent} {victim.flavor} GPU(s) "
        f"(this job held {victim.gpus}) that {job.cluster_queue} needs within its nominal quota for job {job.job_id}"
    )


# -- why pending --------------------------------------------------------------------------
def _never_fits(job: Workload, best: Ceiling | None) -> PendingReason:
    if best is None:
        return PendingReason(
            PendingCode.NoFlavor, f"queue {job.cluster_queue} has no flavor this job may use", 1, needs=job.gpus
        )
    if best.capacity_short:
        why = (
            f"the {best.flavor} backend has {best.capacity} GPUs now (fewer than the queue's quota: nodes down, "
            "or the backend did not answer); it waits until it has enough"
        )
    else:
        why = (
            f"queue {job.cluster_queue} can get at most {best.gpus} {best.flavor} GPU(s) (nominal + borrowable); "
            "ask an admin to raise the quota or submit a smaller job"
        )
    return PendingReason(
        PendingCode.NeverFits,
        f"needs {job.gpus} GPU(s) but {why}",
        1,
        flavor=best.flavor,
        needs=job.gpus,
        available=best.gpus,
    )


def _blocked_reason(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> PendingReason:
    cq = job.cluster_queue
    victims = cycle.promised.get(job.job_id)
    if victims:
        flavor = victims[0].flavor
        names = ", ".join(h.job_id for h in victims)
        return PendingReason(
            PendingCode.Preempting,
            f"waiting for {sum(h.gpus for h in victims)} {flavor} GPU(s) being freed by "
            f"preempting {names} (they were warned and may checkpoint first)",
            1,
            flavor,
            job.gpus,
            usage.headroom(cq, flavor)[0],
            tuple(Ahead(h.job_id, h.cluster_queue, h.gpus, "being preempted") for h in victims),
        )
    held = [f for f in flavors if usage.fits(cq, f, job.gpus) and _claimant(usage, cycle.claims, job, f)]
    if held:
        head = _claimant(usage, cycle.claims, job, held[0])
        return PendingReason(
            PendingCode.HeldForAhead,
            f"waiting: it would borrow {held[0]} GPUs that {head.job_id} "
            f"({head.cluster_queue}, {head.gpus} GPUs) is waiting for and goes first; it may run "
            f"within its own quota",
            1,
            held[0],
            job.gpus,
            usage.headroom(cq, held[0])[0],
            (Ahead(head.job_id, head.cluster_queue, head.gpus, "waiting ahead"),),
        )
    flavor = min(flavors, key=lambda f: job.gpus - usage.headroom(cq, f)[0])
    available, code = usage.headroom(cq, flavor)
    holders = _holders_in_the_way(snap, usage, job, flavor, code)
    q = usage.quota(cq, flavor)
    words = {
        PendingCode.QuotaExhausted: (
            f"queue {cq} is at its {flavor} quota ({q.nominal} nominal + {q.borrowing_limit} borrowable)"
        ),
        PendingCode.PoolLent: f"the rest of the {flavor} quota of {usage.root[cq].partition(':')[2]}'s tree is in use",
        PendingCode.CapacityFull: f"all {usage.capacity.get(flavor, 0)} {flavor} GPUs are in use",
    }[code]
    message = f"waiting for {job.gpus} {flavor} GPU(s) at once; {available} free to it: {words}"
    ahead = tuple(Ahead(h.job_id, h.cluster_queue, h.gpus, _why(usage, h, cq)) for h in holders[:MAX_AHEAD])
    if ahead:
        message += "; held by " + ", ".join(
            f"{a.job_id} ({a.cluster_queue}, {a.gpus} GPUs, {a.why})" for a in ahead[:3]
        )
    return PendingReason(
        code, message, 1, flavor, job.gpus, available, ahead, _estimate(snap, holders, job.gpus - available)
    )


def _holders_in_the_way(snap: Snapshot, usage: Usage, job: Workload, flavor: str, code: PendingCode) -> list[Holder]:
    """Whose end would help: its own queue's jobs when its quota is the limit; otherwise the
    jobs of its tree (of the whole flavor when the backend is full), borrowers first."""
    cq = job.cluster_queue

    def helps(h: Holder) -> bool:
        if code is PendingCode.QuotaExhausted:
            return h.cluster_queue == cq
        return code is PendingCode.CapacityFull or usage.root.get(h.cluster_queue) == usage.root[cq]

    found = [h for h in snap.holders if h.flavor == flavor and helps(h)]
    borrowed = {q: usage.borrowed(q, flavor) for q in {h.cluster_queue for h in found}}
    found.sort(key=lambda h: (-borrowed[h.cluster_queue], -h.gpus, h.job_id))
    return found


def _why(usage: Usage, h: Holder, cq: str) -> str:
    if usage.borrowed(h.cluster_queue, h.flavor):
        return "borrowing"
    return "same queue" if h.cluster_queue == cq else "within its quota"


def _estimate(snap: Snapshot, holders: list[Holder], shortfall: int) -> float | None:
    """When enough of the GPUs in the way are free if each holder runs to its time limit;
    None if one that must end first has no limit we know."""
    if shortfall <= 0:
        return snap.now
    freed = 0
    for h in sorted(holders, key=lambda h: h.ends_by or float("inf")):
        if h.ends_by is None:
            return None
        freed += h.gpus
        if freed >= shortfall:
            return max(snap.now, h.ends_by)
    return None


def _queued(head_reason: PendingReason, head: Workload, job: Workload, position: int) -> PendingReason:
    return PendingReason(
        PendingCode.Queued,
        f"position {position} in queue {job.cluster_queue}, behind {head.job_id} "
        f"which waits for {head.gpus} GPU(s); it needs {job.gpus}",
        position,
        head_reason.flavor,
        job.gpus,
        head_reason.available,
        (Ahead(head.job_id, head.cluster_queue, head.gpus, "next in queue"),),
        None,
    )
