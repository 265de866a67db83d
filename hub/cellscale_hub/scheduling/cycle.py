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

This module is the cycle itself (`schedule` and its steps); the data it reads and decides are
in `types`, the quota bookkeeping in `usage`, victim choice in `preemption`, the site offers
and the budget gate in `offers`, and the words of each pending reason in `why`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from cellscale.vocabulary import PendingCode
from cellscale_hub.scheduling.fairshare import FairTree
from cellscale_hub.scheduling.offers import across_sites, over_budget, site_offers
from cellscale_hub.scheduling.placement import Offer, choose
from cellscale_hub.scheduling.preemption import make_room, make_short_room, short_victim_reason, victim_reason
from cellscale_hub.scheduling.resources import Amounts, capacity_of
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.state import Cycle, claimant
from cellscale_hub.scheduling.types import Admission, Decision, Holder, Preemption, Snapshot, Workload
from cellscale_hub.scheduling.usage import QuotaBook, Usage, held_per_queue, on_short_share
from cellscale_hub.scheduling.why import (
    behind_reservation,
    behind_words,
    blocked_reason,
    head_words,
    never_fits_reason,
    placed_words,
    queued,
    short_code,
    site_reason,
)
from cellscale_hub.tenancy import Tenancy

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
    total: Amounts | None = None  # the demand of all its jobs, when the caller keeps it (else summed here)
    tested: int = 0  # jobs looked at behind its first waiting job (the engine bounds them)

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

    def queued(self, unlisted: Amounts | None) -> Amounts:
        """The demand of its current job and of every job behind it (`queued_from`)."""
        if self.total is None:
            return queued_from(self.jobs, self.at, unlisted)
        ahead = Amounts()
        for job in self.jobs[: self.at]:
            ahead = ahead.plus(job.demand)
        return (unlisted or Amounts()).plus(self.total).minus(ahead)

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
    """One admission cycle over `snap`, by the rules above, from scratch: every queue sorted
    here. The engine (`scheduling.engine`) keeps them sorted between cycles; this is its oracle."""
    service = Service(snap.tenancy.ordering, snap.tenancy.resource_weights, snap.now)
    queues = _queues(snap.pending, service)
    lines = {cq: Line(jobs, timed=any(j.time_limit_s for j in jobs)) for cq, jobs in queues.items()}
    return Run(snap, service, lines, held_per_queue(snap.holders)).run()


@dataclass(frozen=True)
class Fixed:
    """What a tenancy fixes for every cycle: the quota book, the fair-share tree, each queue's
    flavors by kind. A from-scratch cycle builds it; the engine keeps one per tenancy."""

    book: QuotaBook
    tree: FairTree
    flavors_of: dict[str, tuple[list[str], list[str]]]

    @classmethod
    def of(cls, t: Tenancy) -> Fixed:
        flavors_of = {cq: _by_kind(t, list(queue.quotas)) for cq, queue in t.cluster_queues.items()}
        return cls(QuotaBook(t), FairTree.of(t), flavors_of)


class Run:
    """One cycle over a snapshot: each queue's `Line`, the usage and fair-share use so far,
    the cycle's state and the decision being built. Its methods are the cycle's steps."""

    def __init__(
        self,
        snap: Snapshot,
        service: Service,
        lines: dict[str, Line],
        held: dict[tuple[str, str], Amounts],
        fixed: Fixed | None = None,
        on_short: Iterable[Holder] | None = None,
    ) -> None:
        t = snap.tenancy
        fixed = fixed or Fixed.of(t)
        self.snap = snap
        self.weights = t.resource_weights
        self.usage = Usage(t, {f: capacity_of(c) for f, c in snap.capacity.items()}, held, fixed.book)
        self.tree = fixed.tree
        self.queue_use = dict(snap.history)
        for (cq, _), amounts in held.items():
            self.queue_use[cq] = self.queue_use.get(cq, 0.0) + amounts.weight(self.weights)
        self.lines = lines
        self.decision = Decision()
        self.cycle = Cycle(service, leaving={h.job_id: h for h in snap.holders if h.preempting})
        self.flavors_of = fixed.flavors_of
        # GPUs each tree's short-work share lends now (`on_short`: the holders admitted on it,
        # when the caller keeps them apart; else found among all holders)
        self.on_short = self.usage.off_quota(on_short_share(snap.holders if on_short is None else on_short, service))

    def run(self) -> Decision:
        for cq in list(self.lines):
            if self.waits_anyway(cq):
                self.next_of(cq)
        while self.lines:
            self.step(self.next_queue())
        return self.decision

    def waits_anyway(self, cq: str) -> bool:
        """The queue's current job cannot start now, whatever other queues do (its reason is
        set): a cycle over 100k waiting jobs chooses between queues only for the others."""
        snap, cycle, decision = self.snap, self.cycle, self.decision
        line = self.lines[cq]
        job = line.job
        flavors = _flavors(self.flavors_of[cq], job)
        too_big = cycle.never_fits(snap, job, flavors) if flavors else None
        if not flavors or too_big:
            decision.pending[job.job_id] = never_fits_reason(job, too_big)
            return True
        held = over_budget(snap, job)
        if held is not None:
            decision.pending[job.job_id] = held
            return True
        usable = line.usable(job, flavors, snap.now)
        if not usable or (line.hopeless(job, usable) and self.on_short_share(job, usable) is None):
            self.wait_behind(line, job, flavors, usable)
            return True
        return False

    def on_short_share(self, job: Workload, flavors: list[str]) -> str | None:
        """The first flavor where the job may start on its tree's short-work share: it has
        received less service than the first level, its GPUs are physically idle there, and the
        share lends fewer than its size allows (`Cohort.short_work_share`), and no blocked head
        that reserved needs those GPUs (`unreserved`)."""
        return next(
            (
                f
                for f in self.short_flavors(job, flavors)
                if self.usage.idle_fits(f, job.demand) and self.unreserved(job, f)
            ),
            None,
        )

    def unreserved(self, job: Workload, flavor: str) -> bool:
        """The share may take idle GPUs a blocked head of the job's tree claims (it delays that
        head by a bounded time), unless the head has reserved (`Service.reserves`) and could not
        start while the share lends all it may: a gang that large would otherwise wait for as
        long as short work keeps coming."""
        head = claimant(self.usage, self.cycle, job, flavor)
        if head is None or not self.cycle.service.reserves(head):
            return True
        room = self.usage.short_room.get((self.usage.root[job.cluster_queue], flavor), 0)
        return head.gpus <= self.usage.capacity.get(flavor, Amounts())[0] - room

    def short_flavors(self, job: Workload, flavors: list[str]) -> list[str]:
        """The flavors whose short-work share has room for the job, if it may use one: it is at
        level 0 and has no choice of sites (placement across sites does not use the share)."""
        if not job.gpus or not self.cycle.service.short_work(job):
            return []
        if self.snap.sites and across_sites(self.snap, _flavors(self.flavors_of[job.cluster_queue], job)):
            return []
        usage, cq = self.usage, job.cluster_queue
        tree = usage.root.get(cq)
        others = Amounts(0, job.cpus, job.memory)  # the share lends GPUs: cores and memory within its quota
        return [
            f
            for f in flavors
            if job.gpus <= usage.short_room.get((tree, f), 0) - self.on_short.get((tree, f), 0)
            and usage.has(cq, f)
            and (not any(others) or usage.fits(cq, f, others))
        ]

    def preempt_for(self, job: Workload, usable: list[str]) -> None:
        """Victims for a waiting job (`make_room`); failing that, for a level-0 job its tree's
        short-work share has room for, borrowed work that frees idle GPUs (`make_short_room`),
        the share's room held for it in this cycle."""
        snap, usage, cycle, decision = self.snap, self.usage, self.cycle, self.decision
        for victim in make_room(snap, usage, job, usable, cycle):
            decision.preempt.append(
                Preemption(victim.job_id, job.job_id, victim_reason(usage, victim, job, cycle.service))
            )
        if job.job_id in cycle.promised:
            return
        room = [f for f in self.short_flavors(job, usable) if self.unreserved(job, f)]
        for victim in make_short_room(snap, usage, job, room, cycle) if room else ():
            decision.preempt.append(
                Preemption(victim.job_id, job.job_id, short_victim_reason(victim, job, cycle.service))
            )
        if job.job_id in cycle.promised:
            self.on_short[usage.root[job.cluster_queue], cycle.promised[job.job_id][0].flavor] += job.gpus

    def next_of(self, cq: str) -> None:
        """On to the queue's next job that may start now; the queue leaves when none is left."""
        line = self.lines[cq]
        while self.advance(cq, line):
            if not self.waits_anyway(cq):
                return
        del self.lines[cq]

    def advance(self, cq: str, line: Line) -> bool:
        """On to the queue's next job; False when none is left (the engine also stops at its
        backfill bound)."""
        return line.advance()

    def next_queue(self) -> str:
        """The queue whose current job goes next (`_order`)."""
        node_use = self.tree.node_usage(self.queue_use)
        return min(self.lines, key=lambda c: self.order_of(c, node_use))

    def order_of(self, cq: str, node_use: dict[str, float]) -> tuple:
        line = self.lines[cq]
        flavors = _flavors(self.flavors_of[cq], line.job)
        return _order(self.usage, flavors, line.job, self.tree.key(cq, node_use), self.cycle.service)

    def step(self, cq: str) -> None:
        """The queue's current job starts on a flavor (at a site, when it has a choice of
        sites), or waits: behind its queue's first waiting job, or as that first job."""
        snap, usage, cycle = self.snap, self.usage, self.cycle
        line = self.lines[cq]
        job = line.job
        flavors = _flavors(self.flavors_of[cq], job)
        usable = line.usable(job, flavors, snap.now)
        offers = site_offers(snap, usage, job, usable, cycle) if across_sites(snap, usable) else None
        best = choose(offers) if offers else None
        short = False
        if offers is None:
            flavor = _choose_flavor(usage, job, usable, cycle)
            if flavor is None:
                flavor = self.on_short_share(job, usable)
                short = flavor is not None
        else:
            flavor = best.flavor if best is not None and best.fits_now else None
        if flavor is not None:
            self.admit(cq, job, flavor, best, offers, short)
            self.next_of(cq)
            return
        if offers is not None:
            usable = [best.flavor] if best is not None else []
        if line.head is not None:
            self.wait_behind(line, job, flavors, usable, preempt=True)
            if offers is None:
                line.note_failed(job, usable)
            self.next_of(cq)
            return
        self.head_waits(cq, line, job, usable, best, offers)

    def admit(
        self,
        cq: str,
        job: Workload,
        flavor: str,
        best: Offer | None,
        offers: list[Offer] | None,
        short: bool = False,
    ) -> None:
        """`short`: on its tree's short-work share (`on_short_share`), beyond its desk's quota."""
        usage, cycle = self.usage, self.cycle
        if short:
            usage.add_short(cq, flavor, job.demand)
            self.on_short[usage.root[cq], flavor] += job.gpus
        else:
            usage.add(cq, flavor, job.demand)
        self.queue_use[cq] = self.queue_use.get(cq, 0.0) + job.demand.weight(self.weights)
        placed = placed_words(self.snap, job, best, offers, cycle) if offers else None
        if offers and best.cloud:
            cycle.spent[job.tenant] = cycle.spent.get(job.tenant, 0.0) + best.total_usd
        self.decision.admit.append(Admission(job.job_id, flavor, usage.borrowed(cq, flavor), placed, short))

    def head_waits(
        self, cq: str, line: Line, job: Workload, usable: list[str], best: Offer | None, offers: list[Offer] | None
    ) -> None:
        """The first waiting job of its queue: it may choose victims, gets its reason, and
        claims its flavors (reserves them, once it has waited long enough); when nothing
        behind it may start anywhere, its whole queue waits behind it."""
        snap, usage, cycle, decision = self.snap, self.usage, self.cycle, self.decision
        line.waiting.append(job)
        if usable and usable[0] in snap.sites:  # heads that wait for this site later queue behind its queue
            acc = cycle.waiting_for.setdefault(usable[0], [0, 0, 0])
            for i, amount in enumerate(line.queued(snap.unlisted.get(cq))):
                acc[i] += amount
        if usable:
            self.preempt_for(job, usable)
        line.may_preempt -= 1
        if offers is None:
            reason = blocked_reason(snap, usage, job, usable, cycle)
        else:
            reason = site_reason(snap, usage, job, best, offers, cycle)
        reserves = cycle.service.reserves(job)
        decision.pending[job.job_id] = head_words(reason, job, cycle.service, reserves, line.at + 1 < len(line.jobs))
        if offers is None:
            line.note_failed(job, usable)
        for f in usable:  # no other queue of its tree may borrow there now (the head keeps its claim)
            if (usage.root[cq], f) not in cycle.claims:
                cycle.claims[usage.root[cq], f] = job
                cycle.claim_start[usage.root[cq], f] = reason.estimated_start
            if reserves:
                line.reserved[f] = (job, reason.estimated_start)
        if reserves and (
            not snap.tenancy.ordering.backfill
            or (not line.timed and line.reserved.keys() >= set(sum(self.flavors_of[cq], [])))
        ):
            decision.pending.queue_behind(job, line.jobs[line.at + 1 :], start=len(line.waiting) + 1, words=queued)
            del self.lines[cq]  # nothing behind it may start anywhere: they wait in order
            return
        self.next_of(cq)

    def wait_behind(
        self, line: Line, job: Workload, flavors: list[str], usable: list[str], preempt: bool = False
    ) -> None:
        """A job behind its queue's first waiting job that does not start: it may still choose
        victims (a few per queue per cycle: for service, or reclaiming its desk's lent GPUs), and
        its reason is built only when someone asks (a queue of 10k costs no 10k reasons)."""
        snap, usage, cycle, decision = self.snap, self.usage, self.cycle, self.decision
        waiting = line.waiting  # only grows: the jobs ahead of this one stay its first position - 1
        waiting.append(job)
        position = len(waiting)
        if preempt and usable and line.may_preempt > 0:
            line.may_preempt -= 1
            self.preempt_for(job, usable)
        flavor = None if usable else next((f for f in flavors if f in line.reserved), None)
        if flavor is not None:
            members = line.behind.get(flavor)
            if members is None:
                head, start = line.reserved[flavor]
                members = line.behind[flavor] = decision.pending.group(
                    PendingCode.Queued,
                    lambda job, position, head=head, flavor=flavor, start=start: behind_reservation(
                        job, head, flavor, start, position, cycle.service
                    ),
                )
            members[job.job_id] = (job, position)
            return
        decision.pending.later(
            job.job_id,
            short_code(usage, cycle, job, usable),
            lambda: behind_words(
                blocked_reason(snap, usage, job, usable, cycle), job, waiting[: position - 1], position, cycle.service
            ),
        )


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
        jobs.sort(key=lambda j: in_queue_order(j, service))
    return queues


def in_queue_order(job: Workload, service: Service) -> tuple:
    """A job's place in its queue: priority, then the least service received, then submit time."""
    return (-job.priority, service.of_job(job), job.submitted, job.job_id)


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
        if usage.borrows(cq, f, job.demand) and claimant(usage, cycle, job, f):
            continue
        if usage.fits(cq, f, job.demand):
            return f
    return None
