"""Placement across sites at fleet scale (issue 12): the Philly trace replayed on three sites
with 20,000 GPUs and 100 desks through the same `cycle.schedule()`, under cellscale's
placement (`scheduling.placement`) and four baselines re-implemented on the same fleet, desks and
quotas, in one run.

Fleet (`--east/--west/--burst`, GPUs in 8-GPU nodes):
- dc-east: on-prem, 12,000 GPUs; dc-west: on-prem, 6,000 GPUs. Amortised $1.00 per GPU-hour,
  $0.02/GB and 1.25 GB/s between the datacenters.
- burst: a cloud pool of 2,000 GPUs at $2.50 per GPU-hour, billed by the second from the
  request (boot 300 s) to the end of the idle tail (600 s after the job), egress $0.09/GB at
  0.5 GB/s. Each job bills its own boot and tail (no warm reuse; conservative).

Desks: the trace's 15 virtual clusters (VCs) are split into 100 desks: desks per VC by the
VC's share of the trace's GPU-time (at least one each, largest remainder); a job goes to
desk crc32("<job index>:<replica>") mod (its VC's desks) -- deterministic, never random.
Every desk is a ClusterQueue in its VC's cohort under one fleet cohort (fair-share weights =
nominal GPUs); its nominal quota on each datacenter is its share of the datacenter (its
share of the replayed GPU-time, at least 1 GPU), borrowing unlimited. The burst pool's
quota belongs to a lender queue with no jobs ("cloud"), so every burst use borrows: each
desk's own datacenter quota comes first under every policy. Each desk has one dataset
with a home datacenter (dc-east for 2/3 of the desks, dc-west for the rest, by crc32 of the
desk's name) and a size from 10 GB to 2 TB (log-uniform in crc32 of the name), and a cloud
budget per period (`--budget-period`, default a day of simulated time): together
`--budget-fraction` (0.25) of what the whole burst pool would cost in a period, split by the
desks' GPU-time shares. `burst: allow` and the default wait value ($2 per GPU-hour).

Load: the trace (82k jobs over 109 days, 374 GPUs on average) is replicated `--replicas`
times (default 4; replica r of a job is submitted r x 24 h / R later in trace time, and goes
to the desk its own hash picks) and its submit times are divided by `--compress` (default
10): 329k jobs over ~11 days, ~15,000 GPUs demanded on average and ~19,000 over the middle
90% of submits (the script prints the offered load against the datacenters and the fleet).
Durations are the trace's. Gangs larger than a datacenter are capped to it (none by
default).

What each job carries into `schedule()`:
- `runtime_s`, duration-blind: its desk's running mean of the durations of the desk's jobs
  that had finished when it was submitted (1 h before the first one). Holders' `ends_by` is
  the start plus that estimate (plus boot and transfer); when a job outlives it, it is
  pushed out to start + twice the time run so far (a heavy-tailed job that has run long is
  expected to run longer), at that moment (lazily, one event per extension).
- `data`: (home, GB) of its desk's dataset and, once it has one, of its newest checkpoint
  (`--ckpt-gb-per-gpu` 4 GB per GPU, kept where it last ran; one every 30 min of run).

Simulation (discrete events; `trace_replay.py` has the event rules this follows): a cycle
runs on a tick of `--interval` seconds (default 30, a controller's period) when something
changed since the last one (GPUs freed, a queue got a head, or a spend period started).
Admitted at a site away from a dataset or checkpoint: the job holds its GPUs while its data
moves (the largest item / the source's bandwidth; bytes counted, egress paid), then runs; on
the cloud it also holds them through the boot. A preempted job leaves after 30 s and keeps
the work up to its last checkpoint. Every policy decides through the admission engine
(`scheduling.engine`, fed each arrival, admission, checkpoint, preemption and end; its memory
is the fair-share history), backfill bounded as in production (`--backfill-depth`, 100;
`none`: every job every cycle); the first-fit baselines assign sites to the first K jobs of
each queue per pass (redone with K x 4 when a queue's K were all admitted). `--engine oracle`
decides instead with `schedule()` over the first K jobs of each queue, the GPUs of the rest as
`Snapshot.unlisted` (the desks' order is submit order, so the first K are its heads), from
the same history; the decisions' digest compares the two. Cloud
spend is charged by the second to the periods it falls in; the snapshot's `Spend` is the
period's bill so far plus the expected rest of the running cloud jobs (estimate + tail).

Policies (all through `schedule()` on the same tenancy; only the flavors a job may use differ):
- sites: cellscale, `Snapshot.sites` and `spend` given: one offer per site, `placement.choose`.
- slurm-M: `sbatch -M east,west,burst`: when the job is first seen it goes to the site with
  the earliest estimated start (the same estimator, `offers.site_offers`, without data; the
  cloud adds its boot), ties to the first; the job's flavors are that one for good.
- multikueue (AllAtOnce), skypilot, burst-when-pending: every cycle, each job passed to
  `schedule()` (oldest first) is restricted to the first site in its order whose quota admits
  it now (tracked as they are assigned); when none does, it may use all three and waits for
  whichever frees first. Orders: multikueue, a permutation per job chosen by crc32 of the
  seed and the job (the race: no preference); skypilot, the cheapest first (price, then
  egress: the desk's home datacenter, the other one, the cloud), failing over to the next;
  burst-when-pending, dc-east, dc-west, then the cloud at once.
The baselines run with `Snapshot.sites` empty (the single-site rules) and their cloud use is
not held to budgets (they have none).

Metrics: JCT mean/p95, queueing, burst spend ($, with the identity: the sum of per-job cloud
bills), egress dollars, cross-site bytes moved, desks over budget in some period, split gangs
(asserted 0 from the holders: one flavor per holder, no flavor over its capacity),
preemptions; and speed: simulated time / wall time, simulated time / CPU time (one core's
cost: on a shared machine wall time also counts waiting for a core) and the CPU time of each
scheduling+placement cycle (p50/p95). With `--warm-up-days W` the W days before `--skip-days`
are replayed first (so a window starts with the fleet holding the long jobs still running from
before, as it would) and the metrics are over the jobs submitted in the window (desks over
budget: in the periods from its start); speed is over the whole replay.

    nice .venv/bin/python benchmarks/fleet_replay.py [--quick] [--replicas 4] [--compress 10]
        [--interval 30] [--skip-days S] [--days D] [--warm-up-days W]
        [--policies sites,slurm-M,multikueue,skypilot,burst-when-pending] [--out fleet_replay]
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import heapq
import itertools
import json
import math
import sys
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from _common import RESULTS, percentile, print_table, ratio, scheduling_digest, write_results
from trace_replay import TRACE, largest_remainder, load_trace

from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.engine import BACKFILL_DEPTH, Engine
from cellscale_hub.scheduling.offers import site_offers
from cellscale_hub.scheduling.placement import SiteState, Spend
from cellscale_hub.scheduling.resources import Amounts, capacity_of
from cellscale_hub.scheduling.service import Service
from cellscale_hub.scheduling.state import Cycle
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.scheduling.usage import Usage, held_per_queue
from cellscale_hub.tenancy import Budget, Ordering, Tenancy

HOUR, DAY = 3600.0, 86400.0
EAST, WEST, BURST = "dc-east", "dc-west", "burst"
FLAVORS = (EAST, WEST, BURST)
ONPREM = (EAST, WEST)
FIRST_K = 8
MAX_RERUNS = 20
PRIOR_RUNTIME_S = HOUR
MIN_RUNTIME_S = 60.0
POLICIES = ("sites", "slurm-M", "multikueue", "skypilot", "burst-when-pending")
FIRST_FIT = ("multikueue", "skypilot", "burst-when-pending")
PERMUTATIONS = tuple(itertools.permutations(FLAVORS))
DONE, EXIT, MARK = 0, 1, 2


def crc(text: str) -> int:
    return zlib.crc32(text.encode())


# -- the fleet ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FleetConfig:
    east: int = 12_000
    west: int = 6_000
    burst: int = 2_000
    desks: int = 100
    replicas: int = 4
    compress: float = 10.0
    onprem_usd: float = 1.0
    dc_egress_usd_gb: float = 0.02
    dc_bandwidth_gb_s: float = 1.25
    cloud_usd: float = 2.5
    boot_s: float = 300.0
    idle_tail_s: float = 600.0
    cloud_egress_usd_gb: float = 0.09
    cloud_bandwidth_gb_s: float = 0.5
    budget_fraction: float = 0.25
    budget_period: str = "day"
    ckpt_gb_per_gpu: float = 4.0
    checkpoint_s: float = 1800.0
    grace_s: float = 30.0
    interval_s: float = 30.0
    half_life_s: float = HOUR
    seed: int = 12

    @property
    def capacity(self) -> dict[str, int]:
        return {EAST: self.east, WEST: self.west, BURST: self.burst}

    def sites(self) -> dict:
        dc = {"gpu_hour_usd": self.onprem_usd, "egress_usd_per_gb": self.dc_egress_usd_gb}
        dc["bandwidth_gb_s"] = self.dc_bandwidth_gb_s
        return {
            EAST: dc,
            WEST: dict(dc),
            BURST: {
                "kind": "cloud",
                "gpu_hour_usd": self.cloud_usd,
                "boot_s": self.boot_s,
                "idle_tail_s": self.idle_tail_s,
                "egress_usd_per_gb": self.cloud_egress_usd_gb,
                "bandwidth_gb_s": self.cloud_bandwidth_gb_s,
            },
        }


@dataclass
class FleetJob:
    vc: str
    desk: str
    gpus: int
    submit: float
    duration: float


def desk_names(vc_gpu_time: dict[str, float], desks: int) -> dict[str, list[str]]:
    per_vc = largest_remainder(desks, dict(sorted(vc_gpu_time.items())), floor=1)
    return {vc: [f"{vc}-{k:02d}" for k in range(n)] for vc, n in per_vc.items()}


def fleet_jobs(trace, cfg: FleetConfig, onprem: int | None = None) -> tuple[list[FleetJob], dict[str, list[str]]]:
    """The trace replicated and time-compressed (see the module docstring), in submit order."""
    vc_time = Counter()
    for j in trace:
        vc_time[j.tenant] += j.gpus * j.duration
    desks = desk_names(vc_time, cfg.desks)
    cap = onprem or max(cfg.east, cfg.west)
    out = []
    for r in range(cfg.replicas):
        shift = r * DAY / cfg.replicas
        for i, j in enumerate(trace):
            names = desks[j.tenant]
            desk = names[crc(f"{i}:{r}") % len(names)]
            out.append(FleetJob(j.tenant, desk, min(j.gpus, cap), (j.submit + shift) / cfg.compress, j.duration))
    out.sort(key=lambda j: j.submit)  # stable: replicas in order at equal times
    t0 = out[0].submit if out else 0.0
    for j in out:
        j.submit -= t0
    return out, desks


def dataset_of(desk: str) -> tuple[str, float]:
    home = EAST if crc(desk) % 3 < 2 else WEST
    u = (crc(desk + "/size") % 1000) / 1000
    return home, round(10.0 * 200.0**u)


def build_tenancy(cfg: FleetConfig, jobs: list[FleetJob], desks: dict[str, list[str]]):
    """The desks' tenancy (the same under every policy)."""
    work = Counter()
    for j in jobs:
        work[j.desk] += j.gpus * j.duration
    names = [d for vc in sorted(desks) for d in desks[vc]]
    weights = {d: work[d] + 1.0 for d in names}
    nominal = {f: largest_remainder(cfg.capacity[f], weights, floor=1) for f in ONPREM}
    period_s = Budget(usd=0, period=cfg.budget_period).seconds
    pool_usd = cfg.burst * period_s / HOUR * cfg.cloud_usd * cfg.budget_fraction
    total = sum(weights.values())
    budgets = {d: round(pool_usd * weights[d] / total, 2) for d in names}
    vc_weight = {vc: sum(nominal[EAST][d] + nominal[WEST][d] for d in ds) for vc, ds in desks.items()}
    cqs = {}
    for vc, ds in desks.items():
        for d in ds:
            quotas = {f: {"nominal": nominal[f][d]} if f in ONPREM else {"nominal": 0} for f in FLAVORS}
            cqs[d] = {
                "cohort": f"vc-{vc}",
                "weight": nominal[EAST][d] + nominal[WEST][d],
                "quotas": quotas,
            }
    cqs["cloud"] = {"cohort": "fleet", "weight": 1.0, "quotas": {BURST: {"nominal": cfg.burst}}}
    tenancy = Tenancy.model_validate(
        {
            "sites": cfg.sites(),
            "flavors": {f: {"backend": f"slurm-{f}", "site": f} for f in FLAVORS},
            "datasets": {f"{d}-data": {"site": dataset_of(d)[0], "size_gb": dataset_of(d)[1]} for d in names},
            "cohorts": {"fleet": {}, **{f"vc-{vc}": {"parent": "fleet", "weight": w} for vc, w in vc_weight.items()}},
            "cluster_queues": cqs,
            "tenants": {
                d: {
                    "queues": {"default": {"cluster_queue": d}},
                    "burst": "allow",
                    "budget": {"usd": budgets[d], "period": cfg.budget_period},
                }
                for d in names
            },
            # placement across sites is what this replay measures: submit order inside each desk (the
            # FIRST_K shortcut relies on it); the ordering inside desks is benchmarks/scheduling_quality.py's
            "ordering": Ordering.submit_order().model_dump(),
        }
    )
    return tenancy, nominal, budgets


# -- the simulation -------------------------------------------------------------------------
@dataclass
class FleetSim:
    jobs: list[FleetJob]
    policy: str
    tenancy: Tenancy
    cfg: FleetConfig
    budgets: dict[str, float]
    first_k: int = FIRST_K
    engine_mode: str = "kept"  # kept: the admission engine decides; oracle: schedule() over a snapshot
    backfill_depth: int | None = BACKFILL_DEPTH
    measured_from: float = 0.0  # the metrics are over the jobs submitted from then on (after a warm-up)
    cycle_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        cfg, n = self.cfg, len(self.jobs)
        self.capacity = cfg.capacity
        self.site = {f: self.tenancy.sites[f] for f in FLAVORS}
        self.site_states = {f: SiteState(f, self.site[f]) for f in FLAVORS} if self.policy == "sites" else {}
        self.period_s = Budget(usd=0, period=cfg.budget_period).seconds
        self.remaining = [j.duration for j in self.jobs]
        self.first_start: list[float | None] = [None] * n
        self.finish: list[float | None] = [None] * n
        self.gen = [0] * n
        self.est = [0.0] * n
        self.ckpt_site: list[str | None] = [None] * n
        self.chosen: list[str | None] = [None] * n  # slurm-M: the cluster it was sent to
        self.stint: dict[int, tuple[str, float, float, float]] = {}  # job -> (flavor, admitted, ready, ends_by)
        self.workloads: list[Workload | None] = [None] * n
        self.queues = sorted(self.tenancy.cluster_queues)
        self.pending: dict[str, list[int]] = {q: [] for q in self.queues}
        self.holders: dict[int, Holder] = {}
        self.events: list[tuple[float, int, int, int]] = []
        self.held_f = Counter()
        self.unchosen: list[int] = []  # slurm-M: jobs not sent to a cluster yet
        # the admission engine, fed every change; its memory is the history of both modes
        self.engine = Engine(self.tenancy, self.backfill_depth, self.cfg.half_life_s)
        self.desk_done, self.desk_sum = Counter(), Counter()
        self.now = 0.0
        self.arrived = 0  # jobs[:arrived] have been submitted
        self.dirty = False
        self.last_period = 0
        # metrics
        self.bills: list[float] = [0.0] * n  # each job's cloud bill, all stints
        self.spent: dict[tuple[str, int], float] = defaultdict(float)  # (desk, period) -> cloud dollars
        self.egress_usd = [0.0] * n  # per job, all stints
        self.moved_gb = [0.0] * n
        self.preempted = [0] * n
        self.lost_gpu_s = [0.0] * n
        self.decisions: list[tuple[int, float, str]] = []  # every (job, time, site or "preempt"), in order
        self.used_gpu_s = Counter()
        self.admitted_at = Counter()
        self.split_gangs = 0
        self.cycles = self.schedule_calls = self.redone = 0
        self.schedule_s = 0.0
        self.max_pending = 0
        self.last_finish = 0.0

    # -- helpers ---------------------------------------------------------------------------
    def data(self, i: int) -> tuple[tuple[str, float], ...]:
        home, gb = dataset_of(self.jobs[i].desk)
        items = [(home, gb)]
        if self.ckpt_site[i] is not None:
            items.append((self.ckpt_site[i], self.cfg.ckpt_gb_per_gpu * self.jobs[i].gpus))
        return tuple(items)

    def workload(self, i: int) -> Workload:
        j = self.jobs[i]
        flavors = (self.chosen[i],) if self.chosen[i] is not None else None
        return Workload(
            f"j{i:07d}", j.desk, j.gpus, 0, j.submit, flavors, j.desk, data=self.data(i), runtime_s=self.est[i]
        )

    def bill(self, desk: str, gpus: int, start: float, end: float) -> float:
        """Cloud dollars for gpus from start to end, charged to the periods they fall in."""
        rate = gpus * self.cfg.cloud_usd / HOUR
        a, total = start, 0.0
        while a < end:
            p = int(a // self.period_s)
            b = min(end, (p + 1) * self.period_s)
            self.spent[desk, p] += rate * (b - a)
            total += rate * (b - a)
            a = b
        return total

    def spends(self, t: float) -> dict[str, Spend]:
        p = int(t // self.period_s)
        committed = Counter()
        for i, (flavor, admitted, _, ends_by) in self.stint.items():
            if flavor == BURST:
                j = self.jobs[i]
                start = max(admitted, p * self.period_s)
                committed[j.desk] += (
                    j.gpus * (max(ends_by, t) + self.cfg.idle_tail_s - start) * self.cfg.cloud_usd / HOUR
                )
        return {
            d: Spend(Budget(usd=usd, period=self.cfg.budget_period), self.spent.get((d, p), 0.0) + committed[d])
            for d, usd in self.budgets.items()
        }

    # -- state changes ---------------------------------------------------------------------
    def arrive(self, i: int) -> bool:
        desk = self.jobs[i].desk
        mean = self.desk_sum[desk] / self.desk_done[desk] if self.desk_done[desk] else PRIOR_RUNTIME_S
        self.est[i] = max(MIN_RUNTIME_S, mean)
        self.workloads[i] = self.workload(i)
        if self.policy == "slurm-M":
            self.unchosen.append(i)  # sent to a cluster at the next cycle
        lst = self.pending[desk]
        lst.append(i)
        self.engine.add(self.workloads[i])
        return len(lst) == 1

    def admit(self, i: int, flavor: str, t: float) -> None:
        j = self.jobs[i]
        lst = self.pending[j.desk]
        lst.pop(bisect.bisect_left(lst, i))
        self.engine.remove(f"j{i:07d}")
        moving = [(home, gb) for home, gb in self.data(i) if home != flavor]
        move_s = max((gb / self.site[home].bandwidth_gb_s for home, gb in moving), default=0.0)
        self.decisions.append((i, t, flavor))
        if moving:
            self.moved_gb[i] += sum(gb for _, gb in moving)
            self.egress_usd[i] += sum(gb * self.site[home].egress_usd_per_gb for home, gb in moving)
        boot = self.cfg.boot_s if flavor == BURST else 0.0
        ready = t + boot + move_s
        ends_by = ready + self.est[i]
        self.stint[i] = (flavor, t, ready, ends_by)
        self.held_f[flavor] += j.gpus
        if self.held_f[flavor] > self.capacity[flavor]:
            raise AssertionError(f"{flavor}: {self.held_f[flavor]} GPUs held > {self.capacity[flavor]}")
        self.admitted_at[flavor] += 1
        if self.first_start[i] is None:
            self.first_start[i] = t
        self.holders[i] = Holder(f"j{i:07d}", j.desk, flavor, j.gpus, 0, t, None, ends_by, False, j.desk)
        self.engine.hold(self.holders[i])
        heapq.heappush(self.events, (ready + self.remaining[i], DONE, i, self.gen[i]))
        heapq.heappush(self.events, (min(ready + self.cfg.checkpoint_s, ends_by), MARK, i, self.gen[i]))

    def _release(self, i: int, t: float) -> tuple[str, float, float]:
        flavor, admitted, ready, _ = self.stint.pop(i)
        j = self.jobs[i]
        del self.holders[i]
        self.engine.release(f"j{i:07d}", t)
        self.held_f[flavor] -= j.gpus
        self.used_gpu_s[flavor] += j.gpus * (t - admitted)
        if flavor == BURST:
            self.bills[i] += self.bill(j.desk, j.gpus, admitted, t + self.cfg.idle_tail_s)
        self.gen[i] += 1
        self.dirty = True
        return flavor, admitted, ready

    def complete(self, i: int, t: float) -> None:
        self._release(i, t)
        j = self.jobs[i]
        self.finish[i] = t
        self.remaining[i] = 0.0
        self.desk_done[j.desk] += 1
        self.desk_sum[j.desk] += j.duration
        self.last_finish = max(self.last_finish, t)

    def preempt(self, i: int, t: float) -> None:
        self.holders[i] = replace(self.holders[i], preempting=True)
        self.engine.hold(self.holders[i])
        self.preempted[i] += 1
        self.decisions.append((i, t, "preempt"))
        heapq.heappush(self.events, (t + self.cfg.grace_s, EXIT, i, self.gen[i]))

    def leave(self, i: int, t: float) -> None:
        flavor, _, ready = self._release(i, t)
        ran = max(0.0, t - ready)
        kept = math.floor(ran / self.cfg.checkpoint_s) * self.cfg.checkpoint_s
        self.lost_gpu_s[i] += (ran - kept) * self.jobs[i].gpus
        self.remaining[i] -= kept
        if kept > 0:
            self.ckpt_site[i] = flavor
        self.workloads[i] = self.workload(i)
        bisect.insort(self.pending[self.jobs[i].desk], i)
        self.engine.add(self.workloads[i])

    def mark(self, i: int, t: float) -> None:
        """A checkpoint passed, or the job outlived its expected end: renew its Holder."""
        h = self.holders[i]
        flavor, admitted, ready, ends_by = self.stint[i]
        if t >= ends_by:
            ends_by = max(ready + 2 * max(t - ready, self.est[i]), t + MIN_RUNTIME_S)
            self.stint[i] = (flavor, admitted, ready, ends_by)
        every = self.cfg.checkpoint_s
        n = int(max(0.0, t - ready) // every)
        while ready + (n + 1) * every <= t:  # float rounding at a checkpoint's own time
            n += 1
        self.holders[i] = replace(h, last_checkpoint=ready + n * every if n else None, ends_by=ends_by)
        self.engine.hold(self.holders[i])
        nxt = ready + (n + 1) * every
        heapq.heappush(self.events, (min(nxt, ends_by), MARK, i, self.gen[i]))

    # -- baselines: each job's flavors -------------------------------------------------------
    def slurm_choose(self, t: float, holders: tuple[Holder, ...], new: list[int]) -> None:
        """`sbatch -M`: the earliest estimated start (no data), ties to the first; once."""
        usage = Usage(self.tenancy, {f: capacity_of(c) for f, c in self.capacity.items()}, held_per_queue(holders))
        states = {f: SiteState(f, self.site[f]) for f in FLAVORS}
        snap = Snapshot(self.tenancy, self.capacity, holders, (), {}, t, sites=states)
        # one Cycle for all: `site_offers` only reads it (no claims, no heads waiting) and its memos
        # (the holders by flavor, their ends) depend on the holders, not on the usage added here
        cycle = Cycle(Service(self.tenancy.ordering, self.tenancy.resource_weights, t))
        for i in new:
            w = replace(self.workloads[i], data=())
            fits = next((f for f in ONPREM if usage.fits(w.cluster_queue, f, w.demand)), None)
            if fits is not None:  # starts now there: no estimate is earlier (the cloud boots first)
                self.chosen[i] = fits
            else:
                offers = site_offers(snap, usage, w, list(FLAVORS), cycle)
                best = min(range(len(offers)), key=lambda k: (offers[k].start_in_s, k))
                self.chosen[i] = offers[best].flavor
                fits = offers[best].flavor if offers[best].fits_now else None
            if fits is not None:
                usage.add(w.cluster_queue, fits, w.demand)
            self.workloads[i] = self.workload(i)
            self.engine.add(self.workloads[i])

    def order_of(self, i: int) -> tuple[str, ...]:
        if self.policy == "multikueue":  # the race: a per-job order, seeded by the job
            return PERMUTATIONS[crc(f"{self.cfg.seed}:{i}") % len(PERMUTATIONS)]
        if self.policy == "skypilot":  # price, then egress: home datacenter, the other one, the cloud
            home = dataset_of(self.jobs[i].desk)[0]
            return (home, WEST if home == EAST else EAST, BURST)
        return FLAVORS  # burst-when-pending: on-prem if it fits now, else the cloud

    def first_fit(self, holders: tuple[Holder, ...], ids: list[int]) -> None:
        """multikueue, skypilot, burst-when-pending: each job's flavors this cycle are the first
        site in its order that admits it now (oldest jobs first), or all of them when none does
        (it waits for whichever frees first)."""
        usage = Usage(self.tenancy, {f: capacity_of(c) for f, c in self.capacity.items()}, held_per_queue(holders))
        for i in sorted(ids):
            w = self.workloads[i]
            f = next((f for f in self.order_of(i) if usage.fits(w.cluster_queue, f, w.demand)), None)
            if f is not None:
                usage.add(w.cluster_queue, f, w.demand)
            flavors = (f,) if f is not None else None
            if w.flavors != flavors:
                self.workloads[i] = replace(w, flavors=flavors)
                self.engine.add(self.workloads[i])

    # -- one scheduling cycle --------------------------------------------------------------
    def cycle(self, t: float) -> None:
        """One scheduling+placement cycle; its CPU time counts the snapshot's history and spend
        and slurm-M's choice of cluster too (on a shared machine wall time also counts waiting
        for a core)."""
        c0 = time.process_time()
        self.cycles += 1
        spend = self.spends(t) if self.policy == "sites" else {}
        holders = tuple(self.holders.values()) if self.policy in FIRST_FIT or self.policy == "slurm-M" else ()
        if self.policy == "slurm-M" and self.unchosen:
            self.slurm_choose(t, holders, self.unchosen)
            self.unchosen = []
        for _ in range(MAX_RERUNS):
            decision = self.decide(t, holders, spend)
            for p in decision.preempt:
                self.preempt(int(p.job_id[1:]), t)
            ids = Counter(a.job_id for a in decision.admit)
            self.split_gangs += sum(1 for a in decision.admit if ids[a.job_id] > 1 or a.job_id in self.holders)
            for a in decision.admit:
                self.admit(int(a.job_id[1:]), a.flavor, t)
            if not decision.admit or not decision.pending:
                break
            if not any(
                r.position == 1 and r.code != "Preempting" and r.available >= r.needs
                for r in decision.pending.explicit.values()
            ):
                break
            holders = tuple(self.holders.values()) if self.policy in FIRST_FIT else ()
            if self.policy == "sites":
                spend = self.spends(t)
        self.cycle_s.append(time.process_time() - c0)

    def decide(self, t: float, holders: tuple[Holder, ...], spend: dict):
        """One pass: the engine over its kept state (the first-fit baselines first assign sites
        to the first K jobs of each queue, as they would to the jobs passed to schedule(), and
        the pass is redone with K x 4 when a queue's K were all admitted); or the oracle,
        `schedule()` over a snapshot of the first K jobs of each queue (the rest as
        `Snapshot.unlisted`), from the same history: the engine's memory."""
        k, oracle = self.first_k, self.engine_mode == "oracle"
        while True:
            ids, cut, unlisted = [], [], {}
            for q, lst in self.pending.items() if oracle or self.policy in FIRST_FIT else ():
                if lst:
                    ids.extend(lst[:k])
                    if len(lst) > k:
                        cut.append(q)
                        if oracle:
                            unlisted[q] = Amounts(sum(self.jobs[i].gpus for i in lst[k:]))
            if self.policy in FIRST_FIT:
                self.first_fit(holders, ids)
            t0 = time.process_time()
            if not oracle:
                decision = self.engine.cycle(t, self.capacity, self.site_states, spend)
            else:
                pending = tuple(self.workloads[i] for i in ids)
                history = self.engine.memory.averages(t)
                snap = Snapshot(
                    self.tenancy,
                    self.capacity,
                    tuple(self.holders.values()),
                    pending,
                    history,
                    t,
                    self.site_states,
                    spend,
                    unlisted,
                )
                decision = schedule(snap)
            self.schedule_s += time.process_time() - t0
            self.schedule_calls += 1
            per_queue = Counter(self.jobs[int(a.job_id[1:])].desk for a in decision.admit) if cut else {}
            if any(per_queue[q] >= k for q in cut):
                k *= 4
                self.redone += 1
                continue
            return decision

    def run(self, until: float = math.inf) -> bool:
        """Replay to the end (True), or stop before the first step at `until` or later
        (simulated seconds; False); `run` again resumes."""
        jobs, n, events, dt = self.jobs, len(self.jobs), self.events, self.cfg.interval_s
        ai = self.arrived
        tick = 0.0
        while ai < n or events or self.dirty:
            self.arrived = ai
            if self.now >= until:
                return False
            nxt = min(jobs[ai].submit if ai < n else math.inf, events[0][0] if events else math.inf)
            if self.dirty and any(self.pending.values()):
                tick = math.floor(self.now / dt) * dt + dt if dt > 0 else self.now
                if tick <= nxt:  # the cycle comes before the next event
                    self.now = tick
                    self.dirty = False
                    self.cycle(tick)
                    self.max_pending = max(self.max_pending, sum(len(v) for v in self.pending.values()))
                    continue
            else:
                self.dirty = False
            if nxt == math.inf:
                break
            t = self.now = nxt
            if int(t // self.period_s) != self.last_period:
                self.last_period = int(t // self.period_s)
                self.dirty = self.policy == "sites"  # budgets renewed
            while events and events[0][0] <= t:
                _, kind, i, g = heapq.heappop(events)
                if g != self.gen[i]:
                    continue
                if kind == DONE:
                    self.complete(i, t)
                elif kind == EXIT:
                    self.leave(i, t)
                else:
                    self.mark(i, t)
            while ai < n and jobs[ai].submit <= t:
                self.dirty |= self.arrive(ai)
                ai += 1
        self.arrived = ai
        return True

    def progress(self, w0: float, cpu0: float) -> str:
        pending = sum(len(v) for v in self.pending.values())
        return (
            f"    day {self.now / DAY:.2f}: {time.perf_counter() - w0:.0f} s wall, "
            f"{time.process_time() - cpu0:.0f} s CPU, "
            f"{self.cycles} cycles, {pending} pending, held {dict(self.held_f)}"
        )

    # -- results ---------------------------------------------------------------------------
    def check(self) -> None:
        """Invariants: every job finished, nothing held, the bills add up, no gang split."""
        assert all(f is not None for f in self.finish), "every job finishes"
        assert not self.holders and not any(self.held_f.values())
        assert self.split_gangs == 0

    def digest(self, since: int = 0) -> str:
        """sha256 of the decisions from the `since`-th on: equal digests, equal replays (an
        optimisation must not change one)."""
        return hashlib.sha256(repr(self.decisions[since:]).encode()).hexdigest()

    def measured(self) -> list[int]:
        """The jobs the metrics are about: those submitted after the warm-up."""
        return [i for i, j in enumerate(self.jobs) if j.submit >= self.measured_from]

    def metrics(self) -> dict:
        self.check()
        ids = self.measured()
        n = len(ids)
        jct = [(self.finish[i] - self.jobs[i].submit) / HOUR for i in ids]
        wait = [(self.first_start[i] - self.jobs[i].submit) / HOUR for i in ids]
        burst_usd = sum(self.bills[i] for i in ids)
        per_period = sum(self.spent.values())
        first_period = int(self.measured_from // self.period_s)
        periods = {k: usd for k, usd in self.spent.items() if k[1] >= first_period}
        over = sorted({d for (d, _), usd in periods.items() if usd > self.budgets[d] * (1 + 1e-9) + 0.01})
        worst = max((usd / self.budgets[d] for (d, _), usd in periods.items() if self.budgets[d]), default=0.0)
        span = self.last_finish
        cycle_ms = [s * 1000 for s in self.cycle_s]
        return {
            "jobs": n,
            "warm_up_jobs": len(self.jobs) - n,
            "decisions_sha256": self.digest(),
            "jct_mean_h": sum(jct) / n,
            "jct_p50_h": percentile(jct, 50),
            "jct_p95_h": percentile(jct, 95),
            "wait_mean_h": sum(wait) / n,
            "wait_p95_h": percentile(wait, 95),
            "burst_usd": burst_usd,
            "burst_usd_by_period_sum": per_period,
            "burst_usd_all_jobs": sum(self.bills),
            "egress_usd": sum(self.egress_usd[i] for i in ids),
            "moved_tb": sum(self.moved_gb[i] for i in ids) / 1000,
            "jobs_moved": sum(1 for i in ids if self.moved_gb[i]),
            "admitted_per_site": dict(self.admitted_at),
            "gpu_hours_per_site": {f: s / HOUR for f, s in self.used_gpu_s.items()},
            "desks_over_budget": len(over),
            "over_budget_desks": over,
            "worst_period_spend_over_budget": worst,
            "split_gangs": self.split_gangs,
            "preemptions": sum(self.preempted[i] for i in ids),
            "lost_gpu_hours": sum(self.lost_gpu_s[i] for i in ids) / HOUR,
            "max_pending": self.max_pending,
            "sim": {
                "simulated_s": span,
                "scheduling_cycles": self.cycles,
                "schedule_calls": self.schedule_calls,
                "schedule_s": self.schedule_s,
                "cycle_ms_p50": percentile(cycle_ms, 50),
                "cycle_ms_p95": percentile(cycle_ms, 95),
                "cycle_ms_max": max(cycle_ms, default=float("nan")),
                "cycles_redone_with_more_jobs": self.redone,
                "engine": self.engine_mode,
                "backfill_depth": self.backfill_depth,
            },
        }


def make_sim(jobs, desks, cfg: FleetConfig, policy: str, **options) -> FleetSim:
    tenancy, _, budgets = build_tenancy(cfg, jobs, desks)
    return FleetSim(jobs, policy, tenancy, cfg, budgets, **options)


def offered_load(jobs: list[FleetJob], cfg: FleetConfig) -> dict:
    work = sum(j.gpus * j.duration for j in jobs)
    subs = [j.submit for j in jobs]
    span = (subs[-1] - subs[0]) or 1.0
    lo, hi = percentile(subs, 5), percentile(subs, 95)
    mid = sum(j.gpus * j.duration for j in jobs if lo <= j.submit <= hi) / max(hi - lo, 1.0)
    onprem, fleet = cfg.east + cfg.west, cfg.east + cfg.west + cfg.burst
    return {
        "submit_span_days": span / DAY,
        "gpu_hours": work / HOUR,
        "avg_demand_gpus": work / span,
        "offered_load_fleet": work / span / fleet,
        "offered_load_onprem": work / span / onprem,
        "middle_90pct_days": (hi - lo) / DAY,
        "avg_demand_gpus_middle_90pct": mid,
        "offered_load_fleet_middle_90pct": mid / fleet,
        "offered_load_onprem_middle_90pct": mid / onprem,
    }


KEYS = [
    ("jct_mean_h", "JCT mean (h)"),
    ("jct_p95_h", "JCT p95 (h)"),
    ("wait_mean_h", "queueing mean (h)"),
    ("wait_p95_h", "queueing p95 (h)"),
    ("burst_usd", "burst spend ($)"),
    ("egress_usd", "egress ($)"),
    ("moved_tb", "cross-site TB moved"),
    ("jobs_moved", "jobs moved"),
    ("desks_over_budget", "desks over budget"),
    ("worst_period_spend_over_budget", "worst desk-period spend/budget"),
    ("split_gangs", "split gangs"),
    ("preemptions", "preemptions"),
    ("lost_gpu_hours", "lost GPU-hours"),
    ("max_pending", "most jobs pending"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a 1.5-day slice of the scaled trace (days 2-3.5, where the load rises past on-prem)",
    )
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--compress", type=float, default=10.0)
    parser.add_argument("--east", type=int, default=12_000)
    parser.add_argument("--west", type=int, default=6_000)
    parser.add_argument("--burst", type=int, default=2_000)
    parser.add_argument("--desks", type=int, default=100)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between scheduling cycles")
    parser.add_argument("--budget-fraction", type=float, default=0.25)
    parser.add_argument("--budget-period", default="day", choices=["day", "week", "month"])
    parser.add_argument("--skip-days", type=float, default=0.0, help="of the scaled trace")
    parser.add_argument("--days", type=float, help="replay only D days of the scaled trace")
    parser.add_argument(
        "--warm-up-days",
        type=float,
        default=0.0,
        help="also replay the W days before --skip-days first (the fleet then holds the jobs still running "
        "from them), and measure only the jobs submitted after",
    )
    parser.add_argument("--first-k", type=int, default=FIRST_K)
    parser.add_argument("--engine", choices=("kept", "oracle"), default="kept", help="see the docstring")
    parser.add_argument(
        "--backfill-depth", default=str(BACKFILL_DEPTH), help="jobs a cycle looks at behind a queue's head, or none"
    )
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--progress-every-days", type=float, default=0.25, help="print progress every D simulated days")
    parser.add_argument("--profile", action="store_true", help="cProfile the first policy, print the top 25")
    parser.add_argument("--out", default="fleet_replay", help="results name (benchmarks/results/NAME.json)")
    parser.add_argument("--combine", help="NAME,NAME: print and write one table from earlier results files")
    args = parser.parse_args()
    if args.combine:
        return combine(args.combine.split(","), args.out)
    if args.quick:
        args.skip_days, args.days = args.skip_days or 2.0, args.days or 1.5
    cfg = FleetConfig(
        east=args.east,
        west=args.west,
        burst=args.burst,
        desks=args.desks,
        replicas=args.replicas,
        compress=args.compress,
        interval_s=args.interval,
        budget_fraction=args.budget_fraction,
        budget_period=args.budget_period,
    )
    t_start = time.perf_counter()
    jobs, desks = fleet_jobs(load_trace(args.trace), cfg)
    start = max(0.0, args.skip_days - args.warm_up_days) * DAY
    jobs = [j for j in jobs if j.submit >= start]
    if args.days is not None:
        jobs = [j for j in jobs if j.submit < (args.skip_days + args.days) * DAY]
    t0 = jobs[0].submit
    for j in jobs:
        j.submit -= t0
    measured_from = max(0.0, args.skip_days * DAY - t0)
    load = offered_load([j for j in jobs if j.submit >= measured_from], cfg)
    fleet = cfg.east + cfg.west + cfg.burst
    measured = sum(j.submit >= measured_from for j in jobs)
    print(
        f"{measured} jobs measured after {len(jobs) - measured} warm-up jobs, {args.desks} desks, fleet {fleet} GPUs "
        f"({cfg.east} + {cfg.west} on-prem + {cfg.burst} burst); trace x{cfg.replicas} replicas, "
        f"time /{cfg.compress:g}"
    )
    print(
        f"offered load {load['offered_load_onprem']:.2f} of on-prem ({load['offered_load_fleet']:.2f} of the fleet) "
        f"over the {load['submit_span_days']:.1f}-day submit span; {load['offered_load_onprem_middle_90pct']:.2f} "
        f"of on-prem over the middle 90% ({load['avg_demand_gpus_middle_90pct']:.0f} GPUs)",
        flush=True,
    )
    results = {}
    for n, name in enumerate(args.policies.split(",")):
        print(f"replaying under {name} ...", flush=True)
        sim = make_sim(
            [replace(j) for j in jobs],
            desks,
            cfg,
            name,
            first_k=args.first_k,
            measured_from=measured_from,
            engine_mode=args.engine,
            backfill_depth=None if args.backfill_depth == "none" else int(args.backfill_depth),
        )
        w0, cpu0 = time.perf_counter(), time.process_time()
        if args.profile and n == 0:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(sim.run)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)
        else:
            while not sim.run(until=sim.now + args.progress_every_days * DAY):
                print(sim.progress(w0, cpu0), flush=True)
        wall, cpu = time.perf_counter() - w0, time.process_time() - cpu0
        results[name] = sim.metrics()
        s = results[name]["sim"]
        s["wall_s"], s["cpu_s"] = wall, cpu
        s["sim_over_wall"] = s["simulated_s"] / wall
        s["sim_over_cpu"] = s["simulated_s"] / cpu
        print(
            f"  {wall:.0f} s wall, {cpu:.0f} s CPU, {s['simulated_s'] / DAY:.1f} simulated days "
            f"({s['sim_over_wall']:,.0f}x wall, {s['sim_over_cpu']:,.0f}x CPU); "
            f"{s['scheduling_cycles']} cycles, p50 {s['cycle_ms_p50']:.1f} ms, p95 {s['cycle_ms_p95']:.1f} ms; "
            f"decisions {results[name]['decisions_sha256'][:16]}",
            flush=True,
        )
    report(results)
    wall = time.perf_counter() - t_start
    print(f"\nwall time {wall:.0f} s")
    write_results(
        args.out,
        args.quick,
        {
            "trace": str(args.trace.name),
            "jobs": len(jobs),
            "fleet": {"dc-east": cfg.east, "dc-west": cfg.west, "burst": cfg.burst, "desks": args.desks},
            "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
            "load": load,
            "options": {
                "skip_days": args.skip_days,
                "days": args.days,
                "warm_up_days": args.warm_up_days,
                "first_k": args.first_k,
                "engine": args.engine,
                "backfill_depth": args.backfill_depth,
            },
            "scheduling_source_sha256": scheduling_digest(),
            "results": results,
            "ratios": ratios(results),
            "wall_s": wall,
        },
    )


def ratios(results: dict) -> dict:
    ref = "sites" if "sites" in results else next(iter(results))
    return {f"{ref}/{o}": {k: ratio(results[ref][k], results[o][k]) for k, _ in KEYS} for o in results if o != ref}


def report(results: dict) -> None:
    names = list(results)
    ref = "sites" if "sites" in results else names[0]
    others = [n for n in names if n != ref]
    print()
    print_table(
        ["metric", *names, *(f"{ref}/{o}" for o in others)],
        [
            [label, *(results[n][k] for n in names), *(ratio(results[ref][k], results[o][k]) for o in others)]
            for k, label in KEYS
        ],
    )
    print()
    print_table(
        ["speed", *names],
        [
            ["wall (s)", *(results[n]["sim"]["wall_s"] for n in names)],
            ["simulated days", *(results[n]["sim"]["simulated_s"] / DAY for n in names)],
            ["simulated / wall", *(results[n]["sim"]["sim_over_wall"] for n in names)],
            ["CPU (s)", *(results[n]["sim"].get("cpu_s", math.nan) for n in names)],
            ["simulated / CPU", *(results[n]["sim"].get("sim_over_cpu", math.nan) for n in names)],
            ["cycles", *(results[n]["sim"]["scheduling_cycles"] for n in names)],
            ["cycle p50 (ms)", *(results[n]["sim"]["cycle_ms_p50"] for n in names)],
            ["cycle p95 (ms)", *(results[n]["sim"]["cycle_ms_p95"] for n in names)],
        ],
    )


def combine(names: list[str], out: str) -> None:
    """One table from results files of runs of the same replay (e.g. policies run in parallel).
    Runs of different scheduling code (one policy rerun after a change the others do not go
    through) are combined with each run's code digest, and said so."""
    runs = [json.loads((RESULTS / f"{n}.json").read_text()) for n in names]
    first = runs[0]
    for run in runs[1:]:
        for key in ("jobs", "fleet", "config", "load", "options"):
            assert run[key] == first[key], f"{key} differs between the runs"
    results = {name: r for run in runs for name, r in run["results"].items()}
    report(results)
    data = {k: first[k] for k in ("trace", "jobs", "fleet", "config", "load", "options")}
    code = {n: run["scheduling_source_sha256"] for n, run in zip(names, runs, strict=True)}
    if all(c == code[names[0]] for c in code.values()):
        data["scheduling_source_sha256"] = code[names[0]]
    else:
        print("the runs measured different scheduling code: scheduling_source_sha256 is per run")
        data["scheduling_source_sha256"] = code
    write_results(
        out,
        first["quick"],
        {
            **data,
            "results": results,
            "ratios": ratios(results),
            "combined_from": names,
            "wall_s": sum(r["wall_s"] for r in runs),
        },
    )


if __name__ == "__main__":
    sys.exit(main())
