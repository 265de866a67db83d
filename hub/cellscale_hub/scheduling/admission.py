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
from collections.abc import Iterable
from dataclasses import dataclass, field

from cellscale_hub.scheduling.fairshare import FairTree
from cellscale_hub.tenancy import Tenancy


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

    code: str  # Queued | QuotaExhausted | PoolLent | CapacityFull | Preempting | NeverFits | NoFlavor
    message: str
    position: int  # 1 = next in its ClusterQueue
    flavor: str | None = None
    needs: int = 0
    available: int = 0
    ahead: tuple[Ahead, ...] = ()
    estimated_start: float | None = None


@dataclass
class Decision:
    admit: list[Admission] = field(default_factory=list)
    preempt: list[Preemption] = field(default_factory=list)
    pending: dict[str, PendingReason] = field(default_factory=dict)


# -- usage bookkeeping --------------------------------------------------------------------
class Usage:
    """GPUs held per (queue, flavor), with the tree pool and physical checks."""

    def __init__(self, tenancy: Tenancy, capacity: dict[str, int], holders: Iterable[Holder]):
        self.t = tenancy
        self.capacity = capacity
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        self.physical: dict[str, int] = defaultdict(int)
        self.root = {cq: tenancy.root_of(cq) for cq in tenancy.cluster_queues}
        self.members: dict[str, list[str]] = defaultdict(list)
        for cq, root in self.root.items():
            self.members[root].append(cq)
        for h in holders:
            self.add(h.cluster_queue, h.flavor, h.gpus)

    def add(self, cq: str, flavor: str, gpus: int) -> None:
        self.used[cq, flavor] += gpus
        self.physical[flavor] += gpus

    def quota(self, cq: str, flavor: str):
        return self.t.cluster_queues[cq].quotas[flavor]

    def borrowed(self, cq: str, flavor: str) -> int:
        return max(0, self.used[cq, flavor] - self.quota(cq, flavor).nominal)

    def _from_pool(self, cq: str, flavor: str, used: int) -> int:
        q = self.quota(cq, flavor)
        return max(0, used - (q.nominal - q.lendable))  # beyond its private part

    def pool(self, cq: str, flavor: str) -> tuple[int, int]:
        """(size, in use) of the shared pool of the queue's tree for one flavor."""
        queues = [m for m in self.members[self.root[cq]] if flavor in self.t.cluster_queues[m].quotas]
        size = sum(self.quota(m, flavor).lendable for m in queues)
        return size, sum(self._from_pool(m, flavor, self.used[m, flavor]) for m in queues)

    def headroom(self, cq: str, flavor: str) -> tuple[int, str]:
        """The most GPUs the queue could get on the flavor now, and the binding limit."""
        q = self.quota(cq, flavor)
        used = self.used[cq, flavor]
        limits = []
        if q.borrowing_limit is not None:
            limits.append((q.nominal + q.borrowing_limit - used, "QuotaExhausted"))
        size, in_pool = self.pool(cq, flavor)
        private_free = max(0, (q.nominal - q.lendable) - used)
        limits.append((private_free + size - in_pool, "PoolLent"))
        limits.append((self.capacity.get(flavor, 0) - self.physical[flavor], "CapacityFull"))
        amount, code = min(limits, key=lambda limit: limit[0])  # on a tie the quota explains best
        return max(0, amount), code

    def fits(self, cq: str, flavor: str, gpus: int) -> bool:
        return self.headroom(cq, flavor)[0] >= gpus

    def without(self, victims: Iterable[Holder]) -> "Usage":
        copy = Usage.__new__(Usage)
        copy.t, copy.capacity, copy.root, copy.members = self.t, self.capacity, self.root, self.members
        copy.used, copy.physical = defaultdict(int, self.used), defaultdict(int, self.physical)
        for v in victims:
            copy.add(v.cluster_queue, v.flavor, -v.gpus)
        return copy


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
    claimed: set[tuple[str, str]] = set()  # (tree root, flavor) a blocked head holds on to
    preempting = {h.job_id for h in snap.holders if h.preempting}
    while heads:
        node_use = tree.node_usage(queue_use)
        cq = min(heads, key=lambda c: _order(queues[c][heads[c]], tree.key(c, node_use)))
        job = queues[cq][heads[cq]]
        flavors = _flavors(t, job)
        if not flavors or job.gpus > max(t.max_admissible(cq, f) for f in flavors):
            decision.pending[job.job_id] = _never_fits(t, job, flavors)
            _advance(heads, queues, cq)
            continue
        flavor = _choose_flavor(usage, job, flavors, claimed)
        if flavor is not None:
            usage.add(cq, flavor, job.gpus)
            queue_use[cq] = queue_use.get(cq, 0.0) + job.gpus
            decision.admit.append(Admission(job.job_id, flavor, usage.borrowed(cq, flavor)))
            _advance(heads, queues, cq)
            continue
        victims = _preemption_for(snap, usage, job, flavors, preempting)
        for victim in victims:
            preempting.add(victim.job_id)
            decision.preempt.append(Preemption(victim.job_id, job.job_id, _victim_reason(usage, victim, job)))
        decision.pending[job.job_id] = _blocked_reason(snap, usage, job, flavors, preempting)
        for f in flavors:
            claimed.add((usage.root[cq], f))
        _explain_behind(decision, queues[cq][heads[cq] + 1:], job, start=2)
        del heads[cq]
    return decision


def _order(job: Workload, fair_key: tuple[float, ...]):
    return (-job.priority, fair_key, job.submitted, job.job_id)


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


def _flavors(t: Tenancy, job: Workload) -> list[str]:
    own = list(t.cluster_queues[job.cluster_queue].quotas)
    return own if job.flavors is None else [f for f in own if f in job.flavors]


def _choose_flavor(usage: Usage, job: Workload, flavors: list[str], claimed: set[tuple[str, str]]) -> str | None:
    """The first flavor that fits, preferring one that needs no borrowing (Kueue's
    flavor fungibility); a flavor a blocked head of this tree claims allows no borrowing."""
    cq = job.cluster_queue
    within = [f for f in flavors if usage.used[cq, f] + job.gpus <= usage.quota(cq, f).nominal]
    for f in within + [f for f in flavors if f not in within]:
        borrows = usage.used[cq, f] + job.gpus > usage.quota(cq, f).nominal
        if borrows and (usage.root[cq], f) in claimed:
            continue
        if usage.fits(cq, f, job.gpus):
            return f
    return None


# -- preemption ---------------------------------------------------------------------------
def _preemption_for(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str],
                    preempting: set[str]) -> list[Holder]:
    """The victims that make room for `job` on its first flavor where preemption can, or
    none: when the GPUs already being freed suffice, or when nothing can make room."""
    for flavor in flavors:
        leaving = [h for h in snap.holders if h.job_id in preempting and h.flavor == flavor]
        if usage.without(leaving).fits(job.cluster_queue, flavor, job.gpus):
            return []  # wait for the preemptions under way
        candidates = sorted(_candidates(snap, usage, job, flavor, preempting), key=lambda h: _loss(snap, usage, h))
        chosen = _fewest_victims(usage.without(leaving), job, flavor, candidates)
        if chosen:
            return chosen
    return []


def _candidates(snap: Snapshot, usage: Usage, job: Workload, flavor: str, preempting: set[str]) -> list[Holder]:
    cq = job.cluster_queue
    within_nominal = usage.used[cq, flavor] + job.gpus <= usage.quota(cq, flavor).nominal
    out = []
    for h in snap.holders:
        if h.flavor != flavor or h.job_id in preempting:
            continue
        if h.cluster_queue == cq:
            if h.priority < job.priority:
                out.append(h)  # priority preemption within the queue
        elif within_nominal and usage.root[h.cluster_queue] == usage.root[cq] and usage.borrowed(h.cluster_queue, flavor):
            out.append(h)  # reclaim what was lent
    return out


def _loss(snap: Snapshot, usage: Usage, h: Holder):
    """GPU-seconds since the victim's last checkpoint (or start) first: the work it loses."""
    marks = [x for x in (h.last_checkpoint, h.started) if x is not None]
    work_lost = h.gpus * max(0.0, snap.now - max(marks)) if marks else 0.0
    return (work_lost, h.priority, -usage.borrowed(h.cluster_queue, h.flavor), h.gpus, h.job_id)


def _fewest_victims(usage: Usage, job: Workload, flavor: str, candidates: list[Holder]) -> list[Holder]:
    """Take victims in order of least loss until the job fits (a lender's queue is only
    taken from while it still borrows), then drop any the job does not need after all."""
    chosen: list[Holder] = []
    trial = usage
    for victim in candidates:
        if victim.cluster_queue != job.cluster_queue and not trial.borrowed(victim.cluster_queue, flavor):
            continue  # that queue is back within its own quota
        chosen.append(victim)
        trial = usage.without(chosen)
        if trial.fits(job.cluster_queue, flavor, job.gpus):
            break
    else:
        return []
    for victim in reversed(list(chosen)):
        rest = [v for v in chosen if v is not victim]
        if usage.without(rest).fits(job.cluster_queue, flavor, job.gpus):
            chosen = rest
    return chosen


def _victim_reason(usage: Usage, victim: Holder, job: Workload) -> str:
    if victim.cluster_queue == job.cluster_queue:
        return f"preempted for higher-priority job {job.job_id} in queue {job.cluster_queue}"
    lent = min(victim.gpus, usage.borrowed(victim.cluster_queue, victim.flavor))
    return (f"reclaimed by {job.cluster_queue}: {victim.cluster_queue} was borrowing {lent} {victim.flavor} GPU(s) "
            f"(this job held {victim.gpus}) that {job.cluster_queue} needs within its nominal quota for job {job.job_id}")


# -- why pending --------------------------------------------------------------------------
def _never_fits(t: Tenancy, job: Workload, flavors: list[str]) -> PendingReason:
    if not flavors:
        return PendingReason("NoFlavor", f"queue {job.cluster_queue} has no flavor this job may use", 1, needs=job.gpus)
    best = max(flavors, key=lambda f: t.max_admissible(job.cluster_queue, f))
    most = t.max_admissible(job.cluster_queue, best)
    return PendingReason("NeverFits", f"needs {job.gpus} GPU(s) but queue {job.cluster_queue} can get at most {most} "
                         f"{best} GPU(s) (nominal + borrowable); ask an admin to raise the quota or submit a smaller job",
                         1, flavor=best, needs=job.gpus, available=most)


def _blocked_reason(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], preempting: set[str]) -> PendingReason:
    cq = job.cluster_queue
    flavor = min(flavors, key=lambda f: job.gpus - usage.headroom(cq, f)[0])
    available, code = usage.headroom(cq, flavor)
    leaving = [h for h in snap.holders if h.job_id in preempting and h.flavor == flavor]
    if leaving and usage.without(leaving).fits(cq, flavor, job.gpus):
        names = ", ".join(h.job_id for h in leaving)
        return PendingReason("Preempting", f"waiting for {sum(h.gpus for h in leaving)} {flavor} GPU(s) being freed by "
                             f"preempting {names} (they were warned and may checkpoint first)", 1, flavor, job.gpus,
                             available, tuple(Ahead(h.job_id, h.cluster_queue, h.gpus, "being preempted") for h in leaving))
    holders = _holders_in_the_way(snap, usage, job, flavor, code)
    q = usage.quota(cq, flavor)
    words = {
        "QuotaExhausted": f"queue {cq} is at its {flavor} quota ({q.nominal} nominal + {q.borrowing_limit} borrowable)",
        "PoolLent": f"the rest of the {flavor} quota of {usage.root[cq].partition(':')[2]}'s tree is in use",
        "CapacityFull": f"all {usage.capacity.get(flavor, 0)} {flavor} GPUs are in use",
    }[code]
    message = f"waiting for {job.gpus} {flavor} GPU(s) at once; {available} free to it: {words}"
    if holders:
        message += "; held by " + ", ".join(f"{h.job_id} ({h.cluster_queue}, {h.gpus} GPUs, {h.why})" for h in holders[:3])
    return PendingReason(code, message, 1, flavor, job.gpus, available, tuple(holders),
                         _estimate(snap, usage, job, flavor, job.gpus - available))


def _holders_in_the_way(snap: Snapshot, usage: Usage, job: Workload, flavor: str, code: str) -> list[Ahead]:
    """Who holds what the job waits for: its own queue's jobs when its quota is the limit;
    otherwise the jobs of its tree (of the whole flavor when the backend is full),
    borrowers first."""
    cq = job.cluster_queue

    def in_the_way(h: Holder) -> bool:
        if code == "QuotaExhausted":
            return h.cluster_queue == cq
        return code == "CapacityFull" or usage.root[h.cluster_queue] == usage.root[cq]

    def why(h: Holder) -> str:
        if usage.borrowed(h.cluster_queue, flavor):
            return "borrowing"
        return "same queue" if h.cluster_queue == cq else "within its quota"

    found = [h for h in snap.holders if h.flavor == flavor and in_the_way(h)]
    found.sort(key=lambda h: (-usage.borrowed(h.cluster_queue, flavor), -h.gpus, h.job_id))
    return [Ahead(h.job_id, h.cluster_queue, h.gpus, why(h)) for h in found]


def _estimate(snap: Snapshot, usage: Usage, job: Workload, flavor: str, shortfall: int) -> float | None:
    """When enough GPUs are free if every holder runs to its time limit; None if some
    holder has no limit we know."""
    if shortfall <= 0:
        return snap.now
    freed = 0
    for h in sorted((h for h in snap.holders if h.flavor == flavor), key=lambda h: h.ends_by or float("inf")):
        if h.ends_by is None:
            return None
        freed += h.gpus
        if freed >= shortfall:
            return max(snap.now, h.ends_by)
    return None


def _explain_behind(decision: Decision, behind: list[Workload], head: Workload, start: int) -> None:
    ahead = (Ahead(head.job_id, head.cluster_queue, head.gpus, "next in queue"),)
    head_reason = decision.pending[head.job_id]
    for position, job in enumerate(behind, start=start):
        decision.pending[job.job_id] = PendingReason(
            "Queued", f"position {position} in queue {job.cluster_queue}, behind {head.job_id} "
            f"which waits for {head.gpus} GPU(s); it needs {job.gpus}", position, head_reason.flavor, job.gpus,
            head_reason.available, ahead, None)
