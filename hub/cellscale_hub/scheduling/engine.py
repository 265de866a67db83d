"""The admission engine: the cycle of `scheduling.cycle` over state kept between cycles, so that
a cycle costs the queues' heads and what changed, not every waiting job.

What it keeps, and what changes it (no I/O: the controller and the replays feed it):
- each ClusterQueue's waiting jobs in order (`cycle.in_queue_order`: priority, the least service
  received, submit time), with how many have a time limit and their total demand: `add` and
  `remove` are a binary search and a list insert;
- when each waiting job above level 0 is promoted back to it (`Service.promoted`): a heap, so
  the order follows the clock by time stamp, never by re-sorting a queue;
- the holders, what they hold per (queue, flavor), and each flavor's holders in order of
  their ends (a blocked head's start estimate reads them), by deltas (`hold`, `release`);
- each queue's recent use, decayed lazily (`fairshare.Memory`);
- what the tenancy fixes for every cycle (`cycle.Fixed`: quota book, fair-share tree, flavors);
- where backfill stopped in each queue: a cycle looks at no more than `backfill_depth` jobs
  behind a queue's first waiting job and the next cycle resumes at the first one it did not
  reach (Slurm's bf_max_job_test and bf_continue); the jobs it did not reach wait in order with
  their reason, and are looked at in a later cycle.

A cycle takes the next queue from a heap of the queues' order keys (`Kept.next_queue`): within
a cycle usage only grows, so the stored key of a queue that did not move is a lower bound of its
true key, and a popped key that is still true is the smallest: the queue the oracle's scan of
every queue takes. With `backfill_depth=None` the engine's decisions are the oracle's
(`cycle.schedule` over the same snapshot, sorting every queue); tests check that on windows of
the real trace.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import KeysView
from dataclasses import dataclass, field

from cellscale_hub.scheduling.cycle import Fixed, Line, Run
from cellscale_hub.scheduling.fairshare import Memory
from cellscale_hub.scheduling.placement import SiteState, Spend
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.scheduling.service import HOUR, Service
from cellscale_hub.scheduling.types import Decision, Holder, Snapshot, Workload, end_of
from cellscale_hub.scheduling.why import queued
from cellscale_hub.tenancy import Tenancy

BACKFILL_DEPTH = 100  # jobs a cycle looks at behind a queue's first waiting job (bf_max_job_test)


@dataclass
class _Queue:
    """One ClusterQueue's waiting jobs, in order (`keys[i]` is `jobs[i]`'s place)."""

    keys: list[tuple] = field(default_factory=list)
    jobs: list[Workload] = field(default_factory=list)
    timed: int = 0  # jobs with a time limit
    total: Amounts = field(default_factory=Amounts)
    resume: tuple | None = None  # the key of the first job backfill did not reach last cycle

    def insert(self, key: tuple, job: Workload) -> None:
        at = bisect_left(self.keys, key)
        self.keys.insert(at, key)
        self.jobs.insert(at, job)

    def delete(self, key: tuple) -> None:
        at = bisect_left(self.keys, key)
        del self.keys[at]
        del self.jobs[at]


class Engine:
    """Admission with its state kept between cycles (see the module docstring). Feed it the
    waiting jobs (`add`, `remove`) and the holders (`hold`, `release`); `cycle()` decides."""

    def __init__(self, tenancy: Tenancy, backfill_depth: int | None = BACKFILL_DEPTH, half_life_s: float = 0.0):
        self.backfill_depth = backfill_depth
        self.memory = Memory(half_life_s)
        self.tenancy = tenancy
        self._fixed = Fixed.of(tenancy)  # quota book, fair-share tree, flavors: built once per tenancy
        self._service = Service(tenancy.ordering, tenancy.resource_weights, 0.0)  # levels by service alone
        self._ceilings: dict = {}  # the cycle's never-fits memos, kept while tenancy and capacity stay
        self._capacity: dict | None = None
        self._queues: dict[str, _Queue] = {}
        self._keys: dict[str, tuple] = {}  # waiting job id -> its key
        self._jobs: dict[str, Workload] = {}
        self._promotions: list[tuple[float, str]] = []  # (when, job id) for jobs above level 0
        self._holders: dict[str, Holder] = {}
        self._by_end: dict[str, list[tuple[float, str, Holder]]] = {}  # flavor -> its holders by end
        self._held: dict[tuple[str, str], Amounts] = {}
        self._short: dict[str, Holder] = {}  # the holders admitted on a short-work share
        self._lent: set[str] = set()  # flavors whose list of holders by end the last cycle's reasons read

    # -- the waiting -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def waiting_ids(self) -> KeysView[str]:
        return self._jobs.keys()

    def get(self, job_id: str) -> Workload | None:
        return self._jobs.get(job_id)

    def add(self, job: Workload) -> None:
        """A job joins its queue (or replaces its earlier version there)."""
        self.remove(job.job_id)
        key = self._key(job)
        self._place(job, key)
        promotion = self._promotion(job, key)
        if promotion:
            heapq.heappush(self._promotions, promotion)

    def _key(self, job: Workload) -> tuple:
        """Its place before any promotion (`cycle.in_queue_order` with the level by service alone)."""
        return (-job.priority, self._service.level(job.attained), job.submitted, job.job_id)

    def _promotion(self, job: Workload, key: tuple) -> tuple[float, str] | None:
        """When a job above level 0 goes back to it: once it has waited `promote_after_hours`."""
        if not key[1]:
            return None
        since = job.queued_at if job.queued_at is not None else job.submitted
        return since + self.tenancy.ordering.promote_after_hours * HOUR, job.job_id

    def add_many(self, jobs: list[Workload]) -> None:
        """Jobs join their queues at once (a restart's one pass): each queue sorted once."""
        if self._jobs:
            for job in jobs:
                self.add(job)
            return
        by_queue: dict[str, list[tuple[tuple, Workload]]] = {}
        for job in jobs:
            key = self._key(job)
            by_queue.setdefault(job.cluster_queue, []).append((key, job))
            self._keys[job.job_id], self._jobs[job.job_id] = key, job
            promotion = self._promotion(job, key)
            if promotion:
                self._promotions.append(promotion)
        for cq, entries in by_queue.items():
            entries.sort(key=lambda entry: entry[0])
            queue = self._queues[cq] = _Queue([k for k, _ in entries], [j for _, j in entries])
            queue.timed = sum(bool(j.time_limit_s) for j in queue.jobs)
            jobs = queue.jobs
            queue.total = Amounts(sum(j.gpus for j in jobs), sum(j.cpus for j in jobs), sum(j.memory for j in jobs))
        heapq.heapify(self._promotions)

    def remove(self, job_id: str) -> Workload | None:
        """A job leaves the queue (admitted, cancelled, gone); None if it was not waiting."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return None
        queue = self._queues[job.cluster_queue]
        queue.delete(self._keys.pop(job_id))
        queue.timed -= bool(job.time_limit_s)
        queue.total = queue.total.minus(job.demand)
        return job

    def retenancy(self, tenancy: Tenancy) -> None:
        """A new tenancy (the ordering's levels may have changed): every queue re-keyed once."""
        jobs = list(self._jobs.values())
        self.tenancy, self._queues, self._keys, self._jobs, self._promotions = tenancy, {}, {}, {}, []
        self._fixed = Fixed.of(tenancy)
        self._service = Service(tenancy.ordering, tenancy.resource_weights, 0.0)
        self._ceilings, self._capacity = {}, None
        self.add_many(jobs)

    def _place(self, job: Workload, key: tuple) -> None:
        queue = self._queues.get(job.cluster_queue)
        if queue is None:
            queue = self._queues[job.cluster_queue] = _Queue()
        queue.insert(key, job)
        queue.timed += bool(job.time_limit_s)
        queue.total = queue.total.plus(job.demand)
        self._keys[job.job_id] = key
        self._jobs[job.job_id] = job

    def _promote(self, service: Service) -> None:
        """Jobs that have waited `promote_after_hours` by now go back to level 0."""
        due, later = self._promotions, []
        while due and due[0][0] <= service.now:
            when, job_id = heapq.heappop(due)
            job = self._jobs.get(job_id)
            key = self._keys.get(job_id)
            if job is None or key is None or key[1] == 0:
                continue  # gone, or re-added since
            if not service.promoted(job):
                later.append((when, job_id))  # a rounding hair short: next cycle
                continue
            queue = self._queues[job.cluster_queue]
            queue.delete(key)
            del self._keys[job_id], self._jobs[job_id]
            queue.timed -= bool(job.time_limit_s)
            queue.total = queue.total.minus(job.demand)
            self._place(job, (key[0], 0, key[2], key[3]))
        for item in later:
            heapq.heappush(due, item)

    # -- the holders -----------------------------------------------------------------------
    @property
    def holders(self) -> dict[str, Holder]:
        return self._holders

    def hold(self, holder: Holder) -> None:
        """A job holds quota (admitted), or its record changed (started, checkpointed, warned):
        a changed record keeps its place among the holders (victims are tried in that order)."""
        old = self._holders.get(holder.job_id)
        if old is not None:
            self._count(old, -1)
            self._unsort(old)
        self._holders[holder.job_id] = holder
        if holder.short_share:
            self._short[holder.job_id] = holder
        else:
            self._short.pop(holder.job_id, None)
        self._count(holder, 1)
        insort(self._ordered(holder.flavor), (end_of(holder), holder.job_id, holder))

    def release(self, job_id: str, ended: float) -> Holder | None:
        """A holder's attempt ended at `ended`: its quota is free, its use is history."""
        holder = self._holders.pop(job_id, None)
        self._short.pop(job_id, None)
        if holder is not None:
            self._count(holder, -1, ended)
            self._unsort(holder)
        return holder

    def _unsort(self, holder: Holder) -> None:
        ordered = self._ordered(holder.flavor)
        del ordered[bisect_left(ordered, (end_of(holder), holder.job_id))]

    def _ordered(self, flavor: str) -> list[tuple[float, str, Holder]]:
        """The flavor's holders by end, to change: copied first when the last cycle's reasons
        may still read them (they are built when asked, after the caller applied the decision)."""
        ordered = self._by_end.get(flavor)
        if ordered is None:
            ordered = self._by_end[flavor] = []
        elif flavor in self._lent:
            ordered = self._by_end[flavor] = list(ordered)
            self._lent.discard(flavor)
        return ordered

    def _count(self, holder: Holder, sign: int, ended: float | None = None) -> None:
        """Add (sign 1) or take away (-1) what the holder holds, and its running use; taken away
        at its end (`ended`), that use becomes history."""
        key = holder.cluster_queue, holder.flavor
        held = self._held.get(key, Amounts())
        held = held.plus(holder.demand) if sign > 0 else held.minus(holder.demand)
        if any(held):
            self._held[key] = held
        else:
            self._held.pop(key, None)
        if holder.started is None:
            return
        size = self._size(holder)
        if sign > 0:
            self.memory.start(holder.cluster_queue, size, holder.started)
        elif ended is None:
            self.memory.forget(holder.cluster_queue, size, holder.started)
        else:
            self.memory.stop(holder.cluster_queue, size, holder.started, ended)

    def _size(self, holder: Holder) -> float:
        return holder.demand.weight(self.tenancy.resource_weights)

    # -- a cycle ---------------------------------------------------------------------------
    def cycle(
        self,
        now: float,
        capacity: dict[str, int | Amounts],
        sites: dict[str, SiteState] | None = None,
        spend: dict[str, Spend] | None = None,
        history: dict[str, float] | None = None,
    ) -> Decision:
        """One admission cycle at `now` (`history`: each queue's, when the caller keeps it
        itself; else the engine's memory). The caller applies the decision: `remove` and `hold`
        what it admits, `release` what ends."""
        t = self.tenancy
        service = Service(t.ordering, t.resource_weights, now)
        self._promote(service)
        snap = Snapshot(
            t,
            capacity,
            tuple(self._holders.values()),
            (),
            self.memory.averages(now) if history is None else history,
            now,
            sites or {},
            spend or {},
        )
        lines = {
            cq: Line(queue.jobs, timed=queue.timed > 0, total=queue.total)
            for cq, queue in self._queues.items()
            if queue.jobs and cq in t.cluster_queues
        }
        if capacity != self._capacity:
            self._ceilings, self._capacity = {}, dict(capacity)
        short = self._short.values()
        run = Kept(snap, service, lines, self._held, self._fixed, self._queues, self.backfill_depth, short)
        run.cycle.ceilings = self._ceilings.setdefault("ceilings", {})
        run.cycle.verdicts = self._ceilings.setdefault("verdicts", {})
        run.cycle.by_end = dict(self._by_end)
        self._lent = set(self._by_end)
        return run.run()


class Kept(Run):
    """A cycle over the engine's kept queues: the next queue from a heap of order keys, and
    backfill bounded per queue, resumed where it stopped."""

    def __init__(
        self, snap, service, lines, held, fixed: Fixed, queues: dict[str, _Queue], depth: int | None, on_short
    ) -> None:
        super().__init__(snap, service, lines, held, fixed, on_short)
        self.queues = queues
        self.depth = depth
        self.node_use = self.tree.node_usage(self.queue_use)
        self.heap: list[tuple[tuple, int, str]] = []
        self.version: dict[str, int] = {}

    def run(self) -> Decision:
        for cq in list(self.lines):
            if self.waits_anyway(cq):
                self.next_of(cq)
        self.version = dict.fromkeys(self.lines, 0)
        self.heap = [(self.order_of(cq, self.node_use), 0, cq) for cq in self.lines]
        heapq.heapify(self.heap)
        while self.lines:
            cq = self.next_queue()
            self.step(cq)
            if cq in self.lines:  # its current job changed: its key may be smaller now
                version = self.version[cq] = self.version[cq] + 1
                heapq.heappush(self.heap, (self.order_of(cq, self.node_use), version, cq))
        return self.decision

    def next_queue(self) -> str:
        heap = self.heap
        while True:
            key, version, cq = heap[0]
            if cq not in self.lines or version != self.version[cq]:
                heapq.heappop(heap)
                continue
            true = self.order_of(cq, self.node_use)
            if true == key:
                return cq
            version = self.version[cq] = version + 1
            heapq.heapreplace(heap, (true, version, cq))

    def admit(self, cq, job, flavor, best, offers, short=False) -> None:
        super().admit(cq, job, flavor, best, offers, short)
        self.node_use = self.tree.node_usage(self.queue_use)  # as the oracle computes it: the same floats

    def advance(self, cq: str, line: Line) -> bool:
        if self.depth is None or not line.waiting:
            return line.advance()
        queue = self.queues[cq]
        if line.tested == 0 and queue.resume is not None:  # resume where the last cycle stopped
            target = bisect_left(queue.keys, queue.resume)
            if target > line.at + 1:
                self.untested(line, line.at + 1, target)
                line.at = target - 1
        if not line.advance():
            queue.resume = None  # reached the end: the next cycle starts right behind the head
            return False
        line.tested += 1
        if line.tested > self.depth:
            queue.resume = queue.keys[line.at]
            self.untested(line, line.at, len(line.jobs))
            line.at = len(line.jobs)
            return False
        return True

    def untested(self, line: Line, lo: int, hi: int) -> None:
        """Jobs this cycle does not look at: they wait in order behind the queue's first waiting job."""
        self.decision.pending.queue_behind(line.head, line.jobs[lo:hi], start=len(line.waiting) + 1, words=queued)
