"""Scheduling quality on a real trace: the Philly jobs (philly-pollux.csv, 82k jobs, 15
virtual clusters) replayed on a simulated fleet through the same `schedule()`, under the
cellscale tenancy and under a FIFO baseline, in one run.

Policies (all but the Tiresias reference call `cellscale_hub.scheduling.cycle.schedule`;
only the tenancy differs; `policies()`):
- cellscale: each virtual cluster (VC) is a ClusterQueue in one cohort; its nominal quota
  is its share of the trace's total GPU-time (at least 1 GPU; quotas sum to the fleet),
  borrowing unlimited, fair-share weight = nominal, decayed-usage history with a
  half-life (`--half-life-hours`, default 1); inside each queue production's
  `Ordering()` (least attained service, backfill, reservation, preemption for service);
  preemption applied. cellscale-submit-order: the same with `Ordering.submit_order()`.
- fifo: one ClusterQueue owning the whole fleet: strict submit order (a head that does not
  fit blocks everything behind it), no preemption (every job has the same priority).
- greedy: one queue, submit order, whatever fits starts (no reservation, no preemption).
- tiresias / tiresias-charged: the issue's reference, re-implemented here
  (`Sim.tiresias_cycle`): levels at 0.5/5/50 GPU-hours received, FIFO within a level,
  greedy fill over running and waiting jobs, a running job left out is preempted at once;
  no fair share. tiresias loses no work at a preemption (as stated); -charged loses the
  work since its last checkpoint like every other policy.
Every preemption also costs `restart` seconds (60) on the job's GPUs when it runs again.

Simulation (discrete events, simulated clock):
- events: arrivals, completions, and the exits of preempted jobs; events at the same
  time are one batch, and `schedule()` runs after a batch that can change a decision: a
  completion or exit (GPUs freed) or an arrival into a queue with nothing pending. An
  arrival behind a waiting head of its queue is only queued (its head still cannot fit).
  Nothing pending: no cycle. A cycle that admitted something runs again at the same time
  (the controller's next pass) only while some queue's head waits although it had room (a
  blocked head of another queue of the tree claimed the flavor: its reason shows
  available >= needs); otherwise a second pass cannot admit anything, since usage only
  grows within a pass and preemptions free GPUs only after the grace period. A second
  pass can still choose victims the first did not (jobs it admitted are candidates now):
  those wait for the next event. `--settle` runs a second pass after every pass that
  admitted something while jobs wait, as the controller's next pass would (~2x slower).
- between events nothing is re-evaluated: fair-share history keeps decaying, but a new
  order alone (no GPUs freed, no new head) is only acted on at the next event (this trace
  has an arrival or a completion about once a minute on average);
- holders carry `started` and `last_checkpoint` (a checkpoint every 30 min of run,
  `--checkpoint-minutes`); `ends_by` is unknown (the trace has no time limits);
- a preempted job keeps its GPUs for a grace period (`--grace-seconds`, default 30, the
  controller's `preemption_grace`: it is warned first), then leaves, goes back to pending
  with its submit time, and loses the work since its last checkpoint (lost GPU-hours);
- each queue's history is its decayed GPU-seconds as `fairshare.average_gpus`, kept by the
  admission engine's memory (`fairshare.Memory`: decayed lazily, by time stamp, never rewritten
  per event);
- every policy but the Tiresias reference decides through the admission engine
  (`scheduling.engine`), fed each arrival, start, checkpoint, preemption and end, as the
  controller feeds it: a cycle costs the queues' heads, not the backlog. `--backfill-depth N`
  bounds backfill as production does (100 by default; `none`: every job every cycle, the
  oracle's decisions); `--engine oracle` decides instead with `cycle.schedule()` over a
  snapshot of every waiting job and holder (slow at large backlogs) from the same history: the
  two are compared by the chained digest of every cycle's decisions (`decisions_crc32`).

Metrics, for both policies:
- JCT = finish - submit; queueing delay = first start - submit (mean, p50, p95, hours);
- utilization = GPU-seconds held / (fleet x busy span: first submit to last finish), and
  utilization while jobs wait = the same over the time when at least one job was pending
  (idle GPUs while someone waits: head-of-line blocking, all-or-nothing fragmentation);
- preemptions and lost GPU-hours (work since the last checkpoint);
- fairness per window (6 h, `--window-hours`): each tenant's entitled share is the
  weighted max-min fair share of the fleet given its demand (GPUs of its running and
  pending jobs), weights = the nominal quotas, recomputed at every event and integrated
  over the window; received = GPUs it held, integrated. Per window:
  gap = sum_i |received_i - entitled_i| / (2 x fleet x window): the fraction of the fleet
  that went to a tenant other than the fair one (0 = fair, 1 = all of it); reported over
  contended windows (average demand >= the fleet). Jain's index of received/entitled
  over the tenants entitled to something is reported beside it.

Fleet size (`--fleet`, default 640 = 80 servers of 8): the trace is a subset of Philly's
VCs (Philly had ~2,500 GPUs). Its first ~19 days have almost no submissions and its load
comes in weekly waves (an unlimited cluster would run 450-830 GPUs at once most days from
day 20 to day 70). Offered load = GPU-seconds submitted / (fleet x time): at 640 GPUs it is
0.58 over the whole submit span and 0.73 over the middle 90% of submits; FIFO queueing is
significant (a mean wait of hours) yet drains after every wave. At 512 (0.92) FIFO's
backlog grows to 13k jobs and its mean wait to ~130 h; at 768 (0.61) it rarely queues
(mean wait 0.4 h). The script prints the offered load for the size it runs.

    .venv/bin/python benchmarks/trace_replay.py [--quick] [--fleet 640] [--skip-days D] [--days D]
        [--limit N] [--half-life-hours 1] [--checkpoint-minutes 30] [--grace-seconds 30]
        [--window-hours 6] [--settle] [--policies cellscale,fifo] [--out trace_replay]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import heapq
import math
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from _common import REPO, percentile, print_table, ratio, scheduling_digest, write_results

from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.engine import BACKFILL_DEPTH, Engine
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.tenancy import SHORT_WORK_SHARE, Ordering, Tenancy

TRACE = REPO.parent / "shared" / "traces" / "philly-pollux.csv"
FLAVOR = "gpu"
HOUR = 3600.0
DAY = 86400.0
MAX_RERUNS = 50


# -- the trace ------------------------------------------------------------------------------
@dataclass
class TraceJob:
    tenant: str
    gpus: int
    submit: float  # seconds since the first submit of the slice
    duration: float


def load_trace(path: Path = TRACE) -> list[TraceJob]:
    """Every job in submit order (ties: file order), times in seconds since the first submit."""
    rows = []
    with open(path, newline="") as f:
        for n, row in enumerate(csv.DictReader(f)):
            rows.append(
                (
                    datetime.fromisoformat(row["timestamp"]).timestamp(),
                    n,
                    row["cluster"],
                    int(row["num_gpus"]),
                    float(row["duration"]),
                )
            )
    rows.sort()
    t0 = rows[0][0] if rows else 0.0
    return [TraceJob(cluster, gpus, ts - t0, duration) for ts, _, cluster, gpus, duration in rows]


def slice_jobs(
    jobs: list[TraceJob], skip: int = 0, skip_days: float = 0.0, days: float | None = None, limit: int | None = None
) -> list[TraceJob]:
    """A contiguous submit-time window, rebased to 0: `skip` jobs and the first `skip_days`
    days dropped, then at most `days` days and `limit` jobs."""
    kept = [j for j in jobs[skip:] if j.submit >= skip_days * DAY]
    if not kept:
        return []
    t0 = kept[0].submit
    if days is not None:
        kept = [j for j in kept if j.submit - t0 < days * DAY]
    if limit is not None:
        kept = kept[:limit]
    return [TraceJob(j.tenant, j.gpus, j.submit - t0, j.duration) for j in kept]


# -- policies -------------------------------------------------------------------------------
def largest_remainder(total: int, weights: dict[str, float], floor: int = 0) -> dict[str, int]:
    names = list(weights)
    rest = total - floor * len(names)
    exact = {n: rest * weights[n] / sum(weights.values()) for n in names}
    out = {n: math.floor(exact[n]) for n in names}
    for n in sorted(names, key=lambda n: (out[n] - exact[n], n))[: rest - sum(out.values())]:
        out[n] += 1
    return {n: floor + out[n] for n in names}


def nominal_quotas(jobs: list[TraceJob], fleet: int) -> dict[str, int]:
    """Each tenant's share of the slice's GPU-time, at least 1 GPU each, summing to `fleet`."""
    gpu_time = Counter()
    for j in jobs:
        gpu_time[j.tenant] += j.gpus * j.duration
    return largest_remainder(fleet, dict(sorted(gpu_time.items())), floor=1)


def cellscale_tenancy(
    nominal: dict[str, int], ordering: Ordering | None = None, short_work_share: float = SHORT_WORK_SHARE
) -> Tenancy:
    return Tenancy.model_validate(
        {
            "flavors": {FLAVOR: {"backend": "sim"}},
            "cohorts": {"philly": {"short_work_share": short_work_share}},
            "cluster_queues": {
                t: {"cohort": "philly", "weight": n, "quotas": {FLAVOR: {"nominal": n}}} for t, n in nominal.items()
            },
            "tenants": {t: {"queues": {"default": {"cluster_queue": t}}} for t in nominal},
            "ordering": (ordering or Ordering()).model_dump(),
        }
    )


TIRESIAS_LEVELS_H = (0.5, 5.0, 50.0)  # the reference's attained-service thresholds (GPU-hours)
GREEDY = Ordering(service_levels_gpu_hours=[], backfill=True, reserve_after_minutes=1e12, preempt_for_service=False)


@dataclass
class Policy:
    name: str
    tenancy: Tenancy
    queue_of: dict[str, str]  # tenant -> ClusterQueue
    kind: str = "schedule"  # "schedule": production's schedule(); "tiresias": the reference, re-implemented
    charge_lost: bool = True  # a preempted job loses the work since its last checkpoint

    @property
    def strict(self) -> bool:
        """Submit order with a blocking head: only each queue's first jobs can matter."""
        return self.kind == "schedule" and not self.tenancy.ordering.backfill


def policies(nominal: dict[str, int], fleet: int, short_work_share: float = SHORT_WORK_SHARE) -> dict[str, Policy]:
    """cellscale (fair share between VCs, least attained service inside each), its submit-order
    predecessor, and three fleet-wide baselines without fair share: strict FIFO, greedy backfill
    (submit order, whatever fits starts) and the Tiresias reference (as stated in the issue: a
    preemption costs only the restart; and charged like ours: plus the work since the last
    checkpoint)."""
    fleet_wide = {t: "fleet" for t in nominal}
    single = Tenancy.single("fleet", {FLAVOR: fleet})
    return {
        "cellscale": Policy(
            "cellscale", cellscale_tenancy(nominal, short_work_share=short_work_share), {t: t for t in nominal}
        ),
        "cellscale-no-short-share": Policy(
            "cellscale-no-short-share", cellscale_tenancy(nominal, short_work_share=0.0), {t: t for t in nominal}
        ),
        "cellscale-submit-order": Policy(
            "cellscale-submit-order", cellscale_tenancy(nominal, Ordering.submit_order()), {t: t for t in nominal}
        ),
        "fifo": Policy("fifo", single.model_copy(update={"ordering": Ordering.submit_order()}), fleet_wide),
        "greedy": Policy("greedy", single.model_copy(update={"ordering": GREEDY}), fleet_wide),
        "tiresias": Policy("tiresias", single, fleet_wide, kind="tiresias", charge_lost=False),
        "tiresias-charged": Policy("tiresias-charged", single, fleet_wide, kind="tiresias"),
    }


# -- fairness -------------------------------------------------------------------------------
def max_min_share(demand: tuple[int, ...], weights: tuple[float, ...], capacity: float) -> tuple[float, ...]:
    """Weighted max-min fair (water-filling) allocation of `capacity` given demands."""
    alloc = [0.0] * len(demand)
    active = [i for i, d in enumerate(demand) if d > 0]
    left = float(capacity)
    while active and left > 1e-9:
        wsum = sum(weights[i] for i in active)
        satisfied = [i for i in active if demand[i] <= left * weights[i] / wsum]
        if not satisfied:
            for i in active:
                alloc[i] = left * weights[i] / wsum
            break
        for i in satisfied:
            alloc[i] = float(demand[i])
            left -= demand[i]
        active = [i for i in active if i not in satisfied]
    return tuple(alloc)


# -- the simulation -------------------------------------------------------------------------
DONE, EXIT, CHECK, CROSS = 0, 1, 2, 3  # CHECK: a holder checkpoints; CROSS: it passes a Tiresias threshold


@dataclass
class Sim:
    jobs: list[TraceJob]
    policy: Policy
    fleet: int
    tenants: list[str]
    weights: tuple[float, ...]
    half_life: float = HOUR
    checkpoint: float = 1800.0
    grace: float = 30.0
    window: float = 6 * HOUR
    settle: bool = False  # run another pass after every pass that admitted something (slower)
    restart: float = 60.0  # what a preemption costs beyond lost work: stop, checkpoint load, restart (s)
    engine_mode: str = "kept"  # kept: the admission engine decides; oracle: schedule() over everything
    backfill_depth: int | None = BACKFILL_DEPTH
    # per-job state (lists indexed by job number)
    remaining: list[float] = field(init=False)
    first_start: list[float | None] = field(init=False)
    started: list[float | None] = field(init=False)
    finish: list[float | None] = field(init=False)
    gen: list[int] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.jobs)
        self.remaining = [j.duration for j in self.jobs]
        self.first_start, self.started, self.finish = [None] * n, [None] * n, [None] * n
        self.gen = [0] * n
        self.preempted_times = [0] * n
        self.attained = [0.0] * n  # GPU-seconds received before the current attempt
        self.service = Service(self.policy.tenancy.ordering, self.policy.tenancy.resource_weights, 0.0)
        self.tenant_ix = {t: i for i, t in enumerate(self.tenants)}
        self.job_tenant = [self.tenant_ix[j.tenant] for j in self.jobs]
        self.workloads = [
            Workload(f"j{i:06d}", self.policy.queue_of[j.tenant], j.gpus, 0, j.submit, None, j.tenant)
            for i, j in enumerate(self.jobs)
        ]
        self.queues = sorted(set(self.policy.queue_of.values()))
        self.pending: dict[str, list[int]] = {q: [] for q in self.queues}
        self.holders: dict[int, Holder] = {}  # running (or leaving) job -> its Holder as of its last checkpoint
        self.marks: list[tuple[float, int, int]] = []  # (next checkpoint, job, gen): when a Holder is due for renewal
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, job, gen)
        nt = len(self.tenants)
        self.held_t, self.pending_t = [0] * nt, [0] * nt
        self.sizes_t = [Counter() for _ in range(nt)]  # per tenant: waiting jobs by GPUs
        self.owed_since: list[float | None] = [None] * nt  # a waiting job fits its desk's nominal since
        self.owed_waits: list[float] = []  # each spell a desk waited for GPUs within its nominal quota (s)
        self.short_admissions = 0
        self.short_gpu_s = 0.0  # GPU-seconds run on the short-work share while at level 0
        # the admission engine, fed every change; its memory is the history of both modes
        self.engine = Engine(self.policy.tenancy, self.backfill_depth, self.half_life)
        self.decisions_crc = 0  # every cycle's admissions and preemptions, chained: equal runs decide alike
        self.capacity = {FLAVOR: self.fleet}
        # metrics
        self.now = 0.0
        self.first_event: float | None = None
        self.used_gpu_s = 0.0
        self.waiting_s = 0.0
        self.used_while_waiting = 0.0
        self.lost_gpu_s = 0.0  # work since the last checkpoint, lost at preemption
        self.restart_gpu_s = 0.0  # GPUs held while restarting after a preemption
        self.preemptions = 0
        self.preempted_young = 0  # victims that had run less than 5 minutes
        self.admit_and_reclaim = 0  # cycles that admitted a borrower and reclaimed lent GPUs
        self.windows: dict[int, list[list[float]]] = {}  # window -> [received, entitled, demand] per tenant
        self._share_cache: dict[tuple[int, ...], tuple[float, ...]] = {}
        self.cycles = self.schedule_calls = self.reruns_admitting = 0
        self.schedule_s = 0.0
        self.max_pending = 0
        self.last_finish = 0.0

    # -- accounting between events -----------------------------------------------------------
    def advance(self, t: float) -> None:
        dt = t - self.now
        if dt <= 0:
            return
        held = sum(self.held_t)
        self.used_gpu_s += held * dt
        if any(self.pending_t):
            self.waiting_s += dt
            self.used_while_waiting += held * dt
        demand = tuple(h + p for h, p in zip(self.held_t, self.pending_t, strict=True))
        share = self._share_cache.get(demand)
        if share is None:
            share = self._share_cache[demand] = max_min_share(demand, self.weights, self.fleet)
            if len(self._share_cache) > 200_000:
                self._share_cache.clear()
        a = self.now
        while a < t:
            w = int(a // self.window)
            b = min(t, (w + 1) * self.window)
            span = b - a
            acc = self.windows.get(w)
            if acc is None:
                acc = self.windows[w] = [[0.0] * len(self.tenants) for _ in range(4)]
            rec, ent, dem, due = acc
            for i, h in enumerate(self.held_t):
                if demand[i]:
                    rec[i] += h * span
                    ent[i] += share[i] * span
                    dem[i] += demand[i] * span
                    due[i] += min(demand[i], self.weights[i]) * span
            a = b
        self.now = t

    # -- state changes ---------------------------------------------------------------------------
    def arrive(self, i: int) -> bool:
        """Queue job i; True when it became its queue's head (a cycle can admit it)."""
        q = self.workloads[i].cluster_queue
        lst = self.pending[q]
        head = not lst
        lst.append(i)  # arrivals come in job order, behind every pending job of the queue
        self.engine.add(self.workloads[i])
        self.pending_t[self.job_tenant[i]] += self.jobs[i].gpus
        self.sizes_t[self.job_tenant[i]][self.jobs[i].gpus] += 1
        return head

    def start(self, i: int, t: float) -> None:
        lst = self.pending[self.workloads[i].cluster_queue]
        lst.pop(bisect.bisect_left(lst, i))
        self.engine.remove(self.workloads[i].job_id)
        g, ti = self.jobs[i].gpus, self.job_tenant[i]
        self.pending_t[ti] -= g
        self.sizes_t[ti][g] -= 1
        self.held_t[ti] += g
        self.run_from(i, t)

    def run_from(self, i: int, t: float) -> None:
        """Admitted job i runs from `t` (a node model may start it later: `fragmentation.py`)."""
        g = self.jobs[i].gpus
        self.started[i] = t
        if self.first_start[i] is None:
            self.first_start[i] = t
        heapq.heappush(self.events, (t + self.remaining[i], DONE, i, self.gen[i]))
        if self.policy.kind == "tiresias":
            for threshold in TIRESIAS_LEVELS_H:
                due = (threshold * HOUR - self.attained[i]) / g
                if 0 < due < self.remaining[i]:
                    heapq.heappush(self.events, (t + due, CROSS, i, self.gen[i]))
        elif self.policy.tenancy.ordering.preempt_for_service and self.checkpoint < self.remaining[i]:
            heapq.heappush(self.events, (t + self.checkpoint, CHECK, i, self.gen[i]))

    def hold(self, i: int, flavor: str, t: float, short: bool = False) -> None:
        """Job i holds quota from `t`; on the short-work share (`short`), a cycle is due when it
        passes level 0 and becomes reclaimable."""
        w = self.workloads[i]
        self.holders[i] = Holder(
            w.job_id,
            w.cluster_queue,
            flavor,
            w.gpus,
            0,
            self.started[i],  # None while it waits for a node (`fragmentation.py`)
            None,
            None,
            False,
            w.tenant,
            attained=self.attained[i],
            preemptions=self.preempted_times[i],
            short_share=short,
        )
        self.engine.hold(self.holders[i])
        if short:
            self.short_admissions += 1
            left = self.service.level_zero_left(self.holders[i])
            self.short_gpu_s += min(left, self.remaining[i]) * w.gpus
            if left < self.remaining[i]:
                heapq.heappush(self.events, (t + left, CROSS, i, self.gen[i]))
        heapq.heappush(self.marks, (t + self.checkpoint, i, self.gen[i]))

    def _release(self, i: int, t: float) -> None:
        if self.holders.pop(i, None) is not None:
            self.engine.release(self.workloads[i].job_id, t)
        g = self.jobs[i].gpus
        self.held_t[self.job_tenant[i]] -= g
        self.gen[i] += 1
        self.started[i] = None

    def complete(self, i: int, t: float) -> None:
        self._release(i, t)
        self.finish[i] = t
        self.remaining[i] = 0.0
        self.last_finish = max(self.last_finish, t)

    def preempt(self, i: int, t: float) -> None:
        """Warned now; it leaves after the grace period (unless it finishes first)."""
        started = self.holders[i].started
        self.preempted_young += started is not None and t - started < 300
        self.holders[i] = replace(self.holders[i], preempting=True)
        self.engine.hold(self.holders[i])
        self.preemptions += 1
        self.preempted_times[i] += 1
        heapq.heappush(self.events, (t + self.grace, EXIT, i, self.gen[i]))

    def leave(self, i: int, t: float) -> None:
        """A preempted job exits: it keeps the work up to its last checkpoint (all of it for the
        reference as stated), pays `restart` seconds on its GPUs when it runs again, and queues
        again with the service it received."""
        g = self.jobs[i].gpus
        ran = t - self.started[i]
        kept = math.floor(ran / self.checkpoint) * self.checkpoint if self.policy.charge_lost else ran
        self.lost_gpu_s += (ran - kept) * g
        self.restart_gpu_s += self.restart * g
        self.remaining[i] += self.restart - kept
        self.attained[i] += ran * g
        self._release(i, t)
        self.workloads[i] = replace(self.workloads[i], attained=self.attained[i], queued_at=t)
        bisect.insort(self.pending[self.workloads[i].cluster_queue], i)
        self.engine.add(self.workloads[i])
        self.pending_t[self.job_tenant[i]] += g
        self.sizes_t[self.job_tenant[i]][g] += 1

    def service_due(self, i: int, t: float) -> bool:
        """Job i just checkpointed: True if a waiting job of its queue has less service (it may
        be preempted for that job now), so a cycle is worth running."""
        heapq.heappush(self.events, (t + self.checkpoint, CHECK, i, self.gen[i]))
        service = replace(self.service, now=t)
        level = service.level(self.attained[i] + self.jobs[i].gpus * (t - self.started[i]))
        if level == 0 or self.preempted_times[i] >= service.ordering.max_preemptions:
            return False
        return any(service.of_job(self.workloads[k]) < level for k in self.pending[self.workloads[i].cluster_queue])

    # -- one scheduling pass ---------------------------------------------------------------------
    def renew_checkpoints(self, t: float) -> None:
        """Each holder's last checkpoint at `t` (renewed only when one passed)."""
        marks = self.marks
        while marks and marks[0][0] <= t:
            _, i, g = heapq.heappop(marks)
            if g != self.gen[i]:
                continue  # it finished or left
            h = self.holders[i]
            if h.started is None:
                continue  # admitted, waiting for a node: marked again when it starts
            n = int((t - h.started) // self.checkpoint)
            self.holders[i] = replace(h, last_checkpoint=h.started + n * self.checkpoint)
            self.engine.hold(self.holders[i])
            heapq.heappush(marks, (h.started + (n + 1) * self.checkpoint, i, g))

    def cycle(self, t: float) -> None:
        self.cycles += 1
        if self.policy.kind == "tiresias":
            self.tiresias_cycle(t)
            return
        for run in range(MAX_RERUNS):
            self.renew_checkpoints(t)
            t0 = time.perf_counter()
            decision = self.decide(t)
            self.schedule_s += time.perf_counter() - t0
            self.schedule_calls += 1
            self.decisions_crc = zlib.crc32(
                repr(
                    (t, [(a.job_id, a.flavor) for a in decision.admit], [p.job_id for p in decision.preempt])
                ).encode(),
                self.decisions_crc,
            )
            for p in decision.preempt:
                self.preempt(int(p.job_id[1:]), t)
            if any(a.borrowed for a in decision.admit) and any("borrowed" in p.reason for p in decision.preempt):
                self.admit_and_reclaim += 1
            for a in decision.admit:
                i = int(a.job_id[1:])
                self.start(i, t)
                self.hold(i, a.flavor, t, a.short_share)
            if not decision.admit or not decision.pending:
                return  # nothing admitted, or nothing left waiting
            if not self.settle and not any(
                r.position == 1 and r.code != "Preempting" and r.available >= r.needs
                for r in decision.pending.explicit.values()  # queued jobs are at position 2 or later
            ):
                return  # see the module docstring: only a head held back by a claim can be admitted in a second pass
            if run:
                self.reruns_admitting += 1
        raise RuntimeError(f"no settled cycle after {MAX_RERUNS} passes at t={t}")

    def decide(self, t: float):
        """One cycle: the engine over its kept state, or the oracle over a snapshot of every
        waiting job and holder (the same history: the engine's memory)."""
        if self.engine_mode == "kept":
            return self.engine.cycle(t, self.capacity)
        pending = tuple(self.workloads[i] for lst in self.pending.values() for i in lst)
        history = self.engine.memory.averages(t)
        holders = tuple(self.holders.values())
        return schedule(Snapshot(self.policy.tenancy, self.capacity, holders, pending, history, t))

    def tiresias_cycle(self, t: float) -> None:
        """The reference: every job, running or waiting, in (level, submit) order; whatever fits
        in the fleet runs (greedy fill), the running jobs left out are preempted at once."""
        t0 = time.perf_counter()
        thresholds = [h * HOUR for h in TIRESIAS_LEVELS_H]

        def level(i: int) -> int:
            got = self.attained[i]
            if self.started[i] is not None:
                got += self.jobs[i].gpus * (t - self.started[i])
            return bisect.bisect_right(thresholds, got)

        jobs = [i for lst in self.pending.values() for i in lst] + list(self.holders)
        jobs.sort(key=lambda i: (level(i), self.jobs[i].submit, i))
        free, keep = self.fleet, set()
        for i in jobs:
            if self.jobs[i].gpus <= free:
                keep.add(i)
                free -= self.jobs[i].gpus
        for i in [i for i in self.holders if i not in keep]:
            self.preemptions += 1
            self.preempted_times[i] += 1
            self.preempted_young += self.started[i] is not None and t - self.started[i] < 300
            self.leave(i, t)
        for i in sorted(keep):
            if i not in self.holders:
                self.start(i, t)
                self.holders[i] = None  # a placeholder: the reference needs no Holder
        self.schedule_s += time.perf_counter() - t0
        self.schedule_calls += 1

    def run(self) -> None:
        jobs, n, events = self.jobs, len(self.jobs), self.events
        ai = 0
        while ai < n or events:
            t = min(jobs[ai].submit if ai < n else math.inf, events[0][0] if events else math.inf)
            if self.first_event is None:
                self.first_event = self.now = t
            self.advance(t)
            changed = False
            while events and events[0][0] <= t:
                _, kind, i, g = heapq.heappop(events)
                if g != self.gen[i]:
                    continue  # stale: the job already finished or left
                if kind == DONE:
                    self.complete(i, t)
                    changed = True
                elif kind == EXIT:
                    self.leave(i, t)
                    changed = True
                elif kind == CHECK:
                    changed |= self.service_due(i, t)
                else:
                    changed = True  # CROSS: a running job sank a level
            while ai < n and jobs[ai].submit <= t:
                changed |= self.arrive(ai)
                ai += 1
            waiting = sum(len(v) for v in self.pending.values())
            self.max_pending = max(self.max_pending, waiting)
            if changed and waiting:
                self.cycle(t)
            self.note_owed(t)

    def note_owed(self, t: float) -> None:
        """Each desk with a waiting job that fits within its nominal quota beside what it holds is
        owed GPUs: how long each such spell lasts is the lender's wait for its quota (an upper
        bound: a desk's own reservation may also hold such a job back)."""
        for ti, sizes in enumerate(self.sizes_t):
            smallest = min((g for g, n in sizes.items() if n > 0), default=None)
            owed = smallest is not None and self.held_t[ti] + smallest <= self.weights[ti]
            since = self.owed_since[ti]
            if owed and since is None:
                self.owed_since[ti] = t
            elif not owed and since is not None:
                self.owed_waits.append(t - since)
                self.owed_since[ti] = None

    # -- results ---------------------------------------------------------------------------------
    def metrics(self) -> dict:
        n = len(self.jobs)
        assert all(f is not None for f in self.finish), "every job finishes"
        jct = [(self.finish[i] - self.jobs[i].submit) / HOUR for i in range(n)]
        wait = [(self.first_start[i] - self.jobs[i].submit) / HOUR for i in range(n)]
        short = [wait[i] for i, j in enumerate(self.jobs) if j.gpus * j.duration < HOUR]
        span = self.last_finish - self.first_event
        work = sum(j.gpus * j.duration for j in self.jobs)
        gaps, jains, contended_rec, contended_ent = [], [], Counter(), Counter()
        entitled_gaps = []
        for w in sorted(self.windows):
            rec, ent, dem, due = self.windows[w]
            length = min(self.window, self.last_finish - w * self.window) if w == max(self.windows) else self.window
            if sum(dem) < self.fleet * length * 0.999:
                continue  # not contended: everyone could have had its demand
            gaps.append(sum(abs(r - e) for r, e in zip(rec, ent, strict=True)) / (2 * self.fleet * length))
            entitled_gaps.append(sum(max(0.0, d - r) for r, d in zip(rec, due, strict=True)) / (self.fleet * length))
            xs = [r / e for r, e in zip(rec, ent, strict=True) if e > 0]
            jains.append(sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs else 1.0)
            for ti, name in enumerate(self.tenants):
                contended_rec[name] += rec[ti]
                contended_ent[name] += ent[ti]
        per_tenant = {}
        for ti, name in enumerate(self.tenants):
            mine = [i for i in range(n) if self.job_tenant[i] == ti]
            if not mine:
                continue
            per_tenant[name] = {
                "jobs": len(mine),
                "jct_mean_h": sum(jct[i] for i in mine) / len(mine),
                "wait_mean_h": sum(wait[i] for i in mine) / len(mine),
                "wait_p95_h": percentile([wait[i] for i in mine], 95),
                "received_over_entitled_contended": ratio(contended_rec[name], contended_ent[name]),
                "preempted": sum(self.preempted_times[i] for i in mine),
            }
        return {
            "jobs": n,
            "jct_mean_h": sum(jct) / n,
            "jct_p50_h": percentile(jct, 50),
            "jct_p95_h": percentile(jct, 95),
            "wait_mean_h": sum(wait) / n,
            "wait_p50_h": percentile(wait, 50),
            "wait_p95_h": percentile(wait, 95),
            "wait_p99_h": percentile(wait, 99),
            "waited_over_1h_fraction": sum(w > 1 for w in wait) / n,
            "short_jobs": len(short),
            "short_wait_p95_h": percentile(short, 95) if short else float("nan"),
            "short_wait_mean_h": sum(short) / len(short) if short else float("nan"),
            "busy_span_days": span / DAY,
            "utilization": self.used_gpu_s / (self.fleet * span),
            "useful_utilization": work / (self.fleet * span),
            "utilization_while_waiting": (
                self.used_while_waiting / (self.fleet * self.waiting_s) if self.waiting_s else float("nan")
            ),
            "time_with_jobs_waiting_days": self.waiting_s / DAY,
            "preemptions": self.preemptions,
            "jobs_preempted": sum(1 for x in self.preempted_times if x),
            "preempted_after_under_5min": self.preempted_young,
            "cycles_admitting_a_borrower_and_reclaiming": self.admit_and_reclaim,
            "lost_gpu_hours": self.lost_gpu_s / HOUR,
            "restart_gpu_hours": self.restart_gpu_s / HOUR,
            "lost_fraction_of_work": self.lost_gpu_s / work,
            "preemption_cost_fraction": (self.lost_gpu_s + self.restart_gpu_s) / work,
            "fair_windows_contended": len(gaps),
            "fair_gap_mean": sum(gaps) / len(gaps) if gaps else float("nan"),
            "fair_gap_p95": percentile(gaps, 95),
            "entitled_gap_mean": sum(entitled_gaps) / len(entitled_gaps) if entitled_gaps else float("nan"),
            "entitled_gap_p95": percentile(entitled_gaps, 95),
            "lender_waits": len(self.owed_waits),
            "lender_wait_p50_min": percentile(self.owed_waits, 50) / 60 if self.owed_waits else 0.0,
            "lender_wait_p99_min": percentile(self.owed_waits, 99) / 60 if self.owed_waits else 0.0,
            "lender_wait_max_min": max(self.owed_waits, default=0.0) / 60,
            "short_share_admissions": self.short_admissions,
            "short_share_gpu_hours": self.short_gpu_s / HOUR,
            "jain_mean": sum(jains) / len(jains) if jains else float("nan"),
            "jain_p5": percentile(jains, 5),
            "max_pending": self.max_pending,
            "sim": {
                "scheduling_cycles": self.cycles,
                "schedule_calls": self.schedule_calls,
                "schedule_s": self.schedule_s,
                "engine": self.engine_mode,
                "backfill_depth": self.backfill_depth,
                "decisions_crc32": self.decisions_crc,
                "reruns_that_admitted": self.reruns_admitting,
            },
            "per_tenant": per_tenant,
        }


def replay(jobs: list[TraceJob], policy: Policy, fleet: int, nominal: dict[str, int], **options) -> dict:
    tenants = sorted(nominal)
    sim = Sim(jobs, policy, fleet, tenants, tuple(float(nominal[t]) for t in tenants), **options)
    t0 = time.perf_counter()
    sim.run()
    out = sim.metrics()
    out["sim"]["wall_s"] = time.perf_counter() - t0
    return out


def cap_jobs(jobs: list[TraceJob], fleet: int) -> tuple[list[TraceJob], int]:
    """Jobs bigger than the fleet are capped to it (none at the default size)."""
    capped = sum(1 for j in jobs if j.gpus > fleet)
    return [TraceJob(j.tenant, min(j.gpus, fleet), j.submit, j.duration) for j in jobs], capped


def offered_load(jobs: list[TraceJob], fleet: int) -> dict:
    work = sum(j.gpus * j.duration for j in jobs)
    span = max(j.submit for j in jobs) - min(j.submit for j in jobs) or 1.0
    subs = sorted(j.submit for j in jobs)
    lo, hi = percentile(subs, 5), percentile(subs, 95)
    mid = sum(j.gpus * j.duration for j in jobs if lo <= j.submit <= hi)
    return {
        "submit_span_days": span / DAY,
        "gpu_hours": work / HOUR,
        "avg_demand_gpus": work / span,
        "offered_load": work / span / fleet,
        "middle_90pct_days": (hi - lo) / DAY,
        "offered_load_middle_90pct": mid / max(hi - lo, 1.0) / fleet,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="a 10-day slice (days 19-29, where the load starts): ~10 s"
    )
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--fleet", type=int, default=640)
    parser.add_argument("--limit", type=int, help="replay only the first N jobs (submit order)")
    parser.add_argument("--days", type=float, help="replay only the first D days")
    parser.add_argument("--skip-days", type=float, default=0.0, help="start D days after the first submit")
    parser.add_argument("--half-life-hours", type=float, default=1.0)
    parser.add_argument("--checkpoint-minutes", type=float, default=30.0)
    parser.add_argument("--grace-seconds", type=float, default=30.0)
    parser.add_argument("--window-hours", type=float, default=6.0)
    parser.add_argument(
        "--settle",
        action="store_true",
        help="after every cycle that admitted something, run another at the same time (~2x slower)",
    )
    parser.add_argument("--policies", default="cellscale,fifo")
    parser.add_argument("--engine", choices=("kept", "oracle"), default="kept", help="see the docstring")
    parser.add_argument(
        "--backfill-depth", default=str(BACKFILL_DEPTH), help="jobs a cycle looks at behind a queue's head, or none"
    )
    parser.add_argument("--out", default="trace_replay", help="results name (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    if args.quick:
        args.skip_days, args.days = args.skip_days or 19.0, args.days or 10.0

    t_start = time.perf_counter()
    jobs = slice_jobs(load_trace(args.trace), skip_days=args.skip_days, days=args.days, limit=args.limit)
    jobs, capped = cap_jobs(jobs, args.fleet)
    nominal = nominal_quotas(jobs, args.fleet)
    load = offered_load(jobs, args.fleet)
    print(f"{len(jobs)} jobs, {len(nominal)} tenants, fleet {args.fleet} GPUs, {capped} jobs capped to the fleet")
    print(
        f"offered load {load['offered_load']:.2f} of the fleet over the {load['submit_span_days']:.1f}-day "
        "submit span "
        f"({load['avg_demand_gpus']:.0f} GPUs on average); {load['offered_load_middle_90pct']:.2f} over the middle "
        f"90% of submits ({load['middle_90pct_days']:.1f} days)",
        flush=True,
    )
    options = {
        "half_life": args.half_life_hours * HOUR,
        "checkpoint": args.checkpoint_minutes * 60,
        "grace": args.grace_seconds,
        "window": args.window_hours * HOUR,
        "settle": args.settle,
        "engine_mode": args.engine,
        "backfill_depth": None if args.backfill_depth == "none" else int(args.backfill_depth),
    }
    pols = policies(nominal, args.fleet)
    results = {}
    for name in args.policies.split(","):
        print(f"replaying under {name} ...", flush=True)
        results[name] = replay(jobs, pols[name], args.fleet, nominal, **options)
        s = results[name]["sim"]
        print(
            f"  {s['wall_s']:.0f} s ({s['schedule_calls']} cycles, {s['schedule_s']:.0f} s in them; "
            f"decisions crc32 {s['decisions_crc32']})",
            flush=True,
        )

    keys = [
        ("jct_mean_h", "JCT mean (h)"),
        ("jct_p50_h", "JCT p50 (h)"),
        ("jct_p95_h", "JCT p95 (h)"),
        ("wait_mean_h", "queueing mean (h)"),
        ("wait_p50_h", "queueing p50 (h)"),
        ("wait_p95_h", "queueing p95 (h)"),
        ("waited_over_1h_fraction", "jobs waiting > 1 h"),
        ("utilization", "utilization (busy span)"),
        ("utilization_while_waiting", "utilization while jobs wait"),
        ("preemptions", "preemptions"),
        ("lost_gpu_hours", "lost GPU-hours"),
        ("fair_gap_mean", "fair-share gap, mean"),
        ("fair_gap_p95", "fair-share gap, p95"),
        ("jain_mean", "Jain index, mean"),
        ("max_pending", "most jobs pending"),
    ]
    names = list(results)
    both = "cellscale" in results and "fifo" in results
    print(
        f"\n{len(jobs)} jobs on {args.fleet} GPUs; fairness over {results[names[0]]['fair_windows_contended']} "
        f"contended {args.window_hours:g}-h windows"
    )
    print_table(
        ["metric", *names, *(["cellscale/fifo"] if both else [])],
        [
            [
                label,
                *(results[n][k] for n in names),
                *([ratio(results["cellscale"][k], results["fifo"][k])] if both else []),
            ]
            for k, label in keys
        ],
    )
    if both:
        print("\nper tenant (nominal GPUs): mean queueing (h) and received/entitled in contended windows")
        rows = []
        for t in sorted(nominal, key=lambda t: -nominal[t]):
            o, f = results["cellscale"]["per_tenant"].get(t), results["fifo"]["per_tenant"].get(t)
            if o and f:
                rows.append(
                    [
                        t,
                        nominal[t],
                        o["jobs"],
                        o["wait_mean_h"],
                        f["wait_mean_h"],
                        o["received_over_entitled_contended"],
                        f["received_over_entitled_contended"],
                    ]
                )
        print_table(["tenant", "nominal", "jobs", "ours wait", "fifo wait", "ours r/e", "fifo r/e"], rows)
    wall = time.perf_counter() - t_start
    print(f"\nwall time {wall:.0f} s")
    write_results(
        args.out,
        args.quick,
        {
            "trace": str(args.trace.name),
            "jobs": len(jobs),
            "capped_to_fleet": capped,
            "fleet_gpus": args.fleet,
            "nominal": nominal,
            "load": load,
            "options": {
                "half_life_h": args.half_life_hours,
                "checkpoint_min": args.checkpoint_minutes,
                "grace_s": args.grace_seconds,
                "window_h": args.window_hours,
                "settle": args.settle,
                "engine": args.engine,
                "backfill_depth": args.backfill_depth,
                "limit": args.limit,
                "days": args.days,
                "skip_days": args.skip_days,
            },
            "scheduling_source_sha256": scheduling_digest(),
            "results": results,
            "ratio_cellscale_fifo": (
                {k: ratio(results["cellscale"][k], results["fifo"][k]) for k, _ in keys} if both else {}
            ),
            "wall_s": wall,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
