"""Scheduling quality with a real engine: one slice of the Philly trace run on the Slurm dev
cluster's gpu partition (node[1-4], 8 emulated GPUs each: 32 GPUs) twice, one path after the
other, each on an idle cluster:

1. raw Slurm: every job is `runuser -u USER -- sbatch --parsable --account=DESK --gres=gpu:G
   --nodes=N --time=L ... sleep.sh SECONDS` at its submit time; Slurm's multifactor priority
   (PriorityWeightFairshare=10000, Fair Tree, the desks' accounts as the benchmark found them),
   sched/backfill and the time limits decide;
2. cellscale: the same jobs at the same times through the control plane's API (POST /api/jobs
   as the job's user: a `plain` cell that sleeps the same seconds, `--backend slurm`, the same
   shape and --time); cellscale's admission decides, and its controller submits what it
   admits to Slurm (`runuser -u USER -- sbatch`, as in production).

The slice (`--skip-days`, default 72, `--jobs` 200, `--quick` 60; `--skip-jobs` shifts it):
- the trace's jobs in submit order from `--skip-days` days after its first submit
  (trace_replay.load_trace and slice_jobs); day 72 is a window where both desks ask for more
  than half of the 32 GPUs for a while (offered load 1.50 of the partition over the arrival
  span at the default, desk-a 0.79 and desk-b 0.71; 1.30 with --quick, 0.60 and 0.71; the
  script prints it);
- desks: every one of the trace's 15 virtual clusters (VCs) is hashed onto a desk of the dev
  cluster (hub/cellscale_hub/dev/slurm.py TENANTS): the first byte of sha256(VC) even:
  desk-a, odd: desk-b; within desk-a the second byte picks alice or carol (desk-b is bob's).
  That puts 103959, 11cb48, 2869ce and 7f04ca on desk-a and the 11 others on desk-b;
- GPUs: 1-8 as in the trace on one node; more than 8 become whole nodes of 8 (12 and 16: 2
  nodes, 24: 3, 32 and more: all 4 nodes, 32 GPUs). Every job asks 4 cores per GPU (a GPU
  node's 32 cores / 8 GPUs) on one task per node: Slurm's fair share charges CPU-seconds
  (this cluster sets no TRESBillingWeights), so this makes both engines count the same thing;
- time: one factor k compresses submit times and durations alike: k = the slice's submit span
  / the arrival window (`--arrival-s`, 240 s, --quick 80 s). A scaled duration is at least
  15 s (`MIN_DURATION_S`: cellscale's per-job overhead, a second or two of start and end,
  stays small beside it) and at most a cap, which is half the arrival window, lowered until the slice's
  GPU-seconds fit `--budget-s` (360 s, --quick 130 s) of the whole partition. The script
  prints k, the cap and how many jobs each bound changed (at the default most of the trace's
  jobs are shorter than 15 s x k and run 15 s);
- time limit: the scaled duration x 2.5 (`--limit-factor`), rounded up to whole minutes (a
  15-s job gets 1 min): an overestimate, as users give; Slurm's backfill plans with it.

The cellscale tenancy is the dev one (config/tenants.yaml) cut to its `slurm` flavor: desk-a and
desk-b each nominal 16 GPUs and 64 cores, no borrowing or lending limits, weight 1, both in
cohort trading: fair share against fair share, half the 32 GPUs each, borrowing what the other
leaves idle. The controller mirrors it onto the Slurm accounts (GrpTRES cpu=128, gres/gpu=32,
Fairshare=500, as production does); the benchmark puts the accounts' GrpTRES and Fairshare back
as it found them afterwards. The control plane runs in this process as benchmarks/slurm.py runs
it: FastAPI's TestClient with the test suite's table identity (tests/controlplane/conftest.py),
SQLite, the real controller thread (0.5 s cycles) and a SlurmDriver.

Metrics, both paths (sacct's whole-second Start and End for both; submit = when this script
ran sbatch or sent the POST; a start a fraction of a second before that, from sacct's rounding,
counts as the submit time):
- JCT = end of the job's last Slurm job - submit; queueing delay = start of its first Slurm job
  - submit; mean, p50, p95, overall and per desk; for cellscale also JCT from the store
  (finished_at - created_at);
- makespan (first submit to last end), utilization = GPU-seconds held in Slurm / (32 x
  makespan), useful utilization = the jobs' scaled durations x GPUs / (32 x makespan), and
  utilization while jobs wait;
- fair share (as trace_replay): each desk's demand = GPUs of its submitted, unfinished jobs;
  its entitled share = the weighted (1:1) max-min share of 32 GPUs given both demands; while
  the demands add up to 32 or more (contended), received (GPUs it held) and entitled are
  integrated. Reported: received/entitled per desk over the contended time, and the gap
  sum|received - entitled| / (2 x 32 x window) per `--window-s` (30 s) window whose average
  demand is at least 32 (mean, p95), and integrated instant by instant;
- where a job's time goes: POST -> ADMITTED (cellscale's own queue, from the store's events),
  ADMITTED -> Slurm submit (the launch: job dir, script, runuser sbatch), Slurm submit ->
  start (Slurm's queue and scheduling pass), Slurm run time - the scaled duration (srun, the
  supervisor's and the cell's Python start; raw: bash), sacct End -> the store's finished_at
  (the controller's poll); a difference of one of this script's clocks and a sacct time reads
  ~0.5 s low on average (sacct floors to the second);
- cellscale's reservations: GPU-seconds from each ADMITTED to the end the controller saw
  (what admission counted as taken) against the GPU-seconds Slurm ran them; preempted
  attempts' GPU-seconds (lost: a `plain` cell has no checkpoint); the controller's Slurm calls
  (count and seconds of Driver.submit, poll, start_estimate).

Slurm's fair share remembers (PriorityDecayHalfLife 7 days, in slurmdbd): the raw path starts
from whatever the desks used before (earlier tests, earlier runs of this script, cellscale's
own Slurm jobs of the previous run), so the script prints `sshare`'s factors before each path
and keeps them in the results. cellscale's history starts empty (a fresh store).

The cluster is started if it is not running and stopped at the end (unless someone else's jobs
are queued by then); a running one is left running. Before each path the benchmark waits until
the queue is empty and the gpu nodes idle (other people's jobs are waited for, never cancelled).
It cancels only its own jobs (by Slurm id), and changes nothing but the two desks' accounts
(put back). Must run as root (runuser). Durations and the overheads: see benchmarks/README.md.

    .venv/bin/python benchmarks/slurm_vs_cellscale.py [--quick] [--jobs N] [--skip-days D]
        [--skip-jobs K] [--arrival-s S] [--budget-s B] [--limit-factor 2.5] [--window-s 30]
        [--paths raw,cellscale] [--out slurm_vs_cellscale]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _common import REPO, percentile, print_table, ratio, scheduling_digest, timing, write_results
from trace_replay import TRACE, TraceJob, load_trace, max_min_share, slice_jobs

CAPACITY = 32  # GPUs of the dev cluster's gpu partition
GPUS_PER_NODE = 8
MAX_NODES = 4
CPUS_PER_GPU = 4  # a GPU node's 32 cores / its 8 GPUs
MIN_DURATION_S = 15.0
LIMIT_FACTOR = 2.5
PARTITION = "gpu"
DESK_USERS = {"desk-a": ("alice", "carol"), "desk-b": ("bob",)}  # cellscale_hub.dev.slurm.TENANTS
DESKS = tuple(DESK_USERS)
WEIGHTS = {"desk-a": 1.0, "desk-b": 1.0}  # Slurm: equal Fairshare; cellscale: weight 1, nominal 16 each
DEFAULTS = {"jobs": 200, "arrival_s": 240.0, "budget_s": 360.0}
QUICK = {"jobs": 60, "arrival_s": 80.0, "budget_s": 130.0}
DEFAULT_SKIP_DAYS = 72.0
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
SLEEP_SCRIPT = '#!/bin/bash\nexec sleep "$1"\n'


# -- the slice ----------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchJob:
    index: int
    vc: str
    desk: str
    user: str
    trace_gpus: int
    nodes: int
    gpus_per_node: int
    trace_submit: float  # s after the slice's first submit, trace time
    trace_duration: float
    submit: float  # s after the replay starts (scaled)
    duration: float  # s it sleeps (scaled, clamped)
    limit_min: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def cpus_per_node(self) -> int:
        return CPUS_PER_GPU * self.gpus_per_node


def _byte(vc: str, n: int) -> int:
    return hashlib.sha256(vc.encode()).digest()[n]


def desk_of(vc: str) -> str:
    return DESKS[_byte(vc, 0) % 2]


def user_of(vc: str) -> str:
    users = DESK_USERS[desk_of(vc)]
    return users[_byte(vc, 1) % len(users)]


def fit_gpus(gpus: int) -> tuple[int, int]:
    """(nodes, GPUs per node) on the dev partition: up to 8 on one node, more as whole nodes of
    8, at most all 4 nodes."""
    if gpus <= GPUS_PER_NODE:
        return 1, max(gpus, 1)
    return min(MAX_NODES, math.ceil(gpus / GPUS_PER_NODE)), GPUS_PER_NODE


def time_limit_min(duration: float, factor: float = LIMIT_FACTOR) -> int:
    """The --time a user would give: the duration x `factor`, rounded up to whole minutes."""
    return max(1, math.ceil(factor * duration / 60 - 1e-9))


def _clamped(duration: float, k: float, cap: float, floor: float) -> float:
    return min(cap, max(floor, duration / k))


def _work(jobs: list[TraceJob], k: float, cap: float, floor: float) -> float:
    return sum(math.prod(fit_gpus(j.gpus)) * round(_clamped(j.duration, k, cap, floor), 1) for j in jobs)


def scale_slice(
    jobs: list[TraceJob],
    arrival_s: float,
    budget_s: float,
    capacity: int = CAPACITY,
    floor: float = MIN_DURATION_S,
    limit_factor: float = LIMIT_FACTOR,
) -> tuple[list[BenchJob], dict]:
    """The slice (times rebased to 0, submit order) compressed by one factor k = its submit span
    / `arrival_s`, each duration clamped to [floor, cap]: cap is half the arrival window,
    lowered (to 0.1 s) until the GPU-seconds fit `budget_s` of `capacity` GPUs (never below
    `floor`)."""
    if not jobs:
        raise ValueError("an empty slice")
    t0 = jobs[0].submit
    span = jobs[-1].submit - t0
    k = span / arrival_s if span > 0 else 1.0
    cap = max(floor, arrival_s / 2)
    if _work(jobs, k, cap, floor) > capacity * budget_s:
        lo, hi = floor, cap  # work(lo) may still exceed the budget: then the floor it is
        for _ in range(60):
            mid = (lo + hi) / 2
            if _work(jobs, k, mid, floor) > capacity * budget_s:
                hi = mid
            else:
                lo = mid
        cap = math.floor(lo * 10) / 10
    out = []
    for i, j in enumerate(jobs):
        nodes, per_node = fit_gpus(j.gpus)
        duration = round(_clamped(j.duration, k, cap, floor), 1)
        out.append(
            BenchJob(
                index=i,
                vc=j.tenant,
                desk=desk_of(j.tenant),
                user=user_of(j.tenant),
                trace_gpus=j.gpus,
                nodes=nodes,
                gpus_per_node=per_node,
                trace_submit=j.submit - t0,
                trace_duration=j.duration,
                submit=round((j.submit - t0) / k, 2),
                duration=duration,
                limit_min=time_limit_min(duration, limit_factor),
            )
        )
    work = sum(b.gpus * b.duration for b in out)
    desk_work = Counter()
    for b in out:
        desk_work[b.desk] += b.gpus * b.duration
    window = max(out[-1].submit, 1.0)
    info = {
        "jobs": len(out),
        "factor": k,
        "trace_span_h": span / 3600,
        "arrival_s": out[-1].submit,
        "floor_s": floor,
        "cap_s": cap,
        "raised_to_floor": sum(1 for j in jobs if j.duration / k < floor),
        "cut_to_cap": sum(1 for j in jobs if j.duration / k > cap),
        "gpu_s": work,
        "gpu_s_per_desk": {d: desk_work[d] for d in DESKS},
        "offered_load": work / (capacity * window),
        "offered_load_per_desk": {d: desk_work[d] / (capacity * window) for d in DESKS},
        "gpus_trace": dict(sorted(Counter(j.gpus for j in jobs).items())),
        "gpus_fitted": dict(sorted(Counter(b.gpus for b in out).items())),
        "jobs_per_desk": {d: sum(1 for b in out if b.desk == d) for d in DESKS},
        "jobs_per_user": dict(sorted(Counter(b.user for b in out).items())),
        "desk_of_vc": {vc: desk_of(vc) for vc in sorted({j.tenant for j in jobs})},
        "duration_s": {
            "min": min(b.duration for b in out),
            "p50": percentile([b.duration for b in out], 50),
            "max": max(b.duration for b in out),
        },
        "limit_min": dict(sorted(Counter(b.limit_min for b in out).items())),
    }
    return out, info


# -- the metrics --------------------------------------------------------------------------
@dataclass
class Outcome:
    """One job as it ran: times in epoch seconds."""

    desk: str
    gpus: int
    duration: float  # what it had to run (the scaled duration)
    submit: float
    runs: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each Slurm job it ran as
    end: float | None = None  # when it was done (its last run's end); None: never


def _stats(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {f"{prefix}_{k}_s": math.nan for k in ("mean", "p50", "p95", "max")}
    return {
        f"{prefix}_mean_s": sum(values) / len(values),
        f"{prefix}_p50_s": percentile(values, 50),
        f"{prefix}_p95_s": percentile(values, 95),
        f"{prefix}_max_s": max(values),
    }


def normalized(outcomes: list[Outcome]) -> list[Outcome]:
    """Runs clipped to start no earlier than the submit (sacct's whole seconds can put a start
    up to 1 s before the submit this script recorded), ends no earlier than starts."""
    out = []
    for o in outcomes:
        runs = [(max(s, o.submit), max(e, s, o.submit)) for s, e in o.runs]
        end = None if o.end is None else max(o.end, o.submit, *(e for _, e in runs))
        out.append(Outcome(o.desk, o.gpus, o.duration, o.submit, runs, end))
    return out


def summarize(
    outcomes: list[Outcome],
    capacity: int = CAPACITY,
    weights: dict[str, float] = WEIGHTS,
    window: float = 30.0,
) -> dict:
    """JCT, queueing, makespan, utilization and fair share of finished jobs (see the docstring)."""
    outcomes = normalized(outcomes)
    done = [o for o in outcomes if o.end is not None and o.runs]
    desks = list(weights)
    jct = [o.end - o.submit for o in done]
    wait = [o.runs[0][0] - o.submit for o in done]
    out: dict = {"jobs": len(outcomes), "finished": len(done)}
    out |= _stats(jct, "jct") | _stats(wait, "wait")
    if not done:
        return out
    first, last = min(o.submit for o in outcomes), max(o.end for o in done)
    makespan = last - first
    out["makespan_s"] = makespan
    out |= timeline(done, capacity, weights, window, first)
    held = sum(o.gpus * (e - s) for o in done for s, e in o.runs)
    out["gpu_s_held"] = held
    out["utilization"] = held / (capacity * makespan) if makespan else math.nan
    out["useful_utilization"] = sum(o.gpus * o.duration for o in done) / (capacity * makespan) if makespan else math.nan
    per_desk = {}
    for d in desks:
        mine = [o for o in done if o.desk == d]
        per_desk[d] = {
            "jobs": len(mine),
            **_stats([o.end - o.submit for o in mine], "jct"),
            **_stats([o.runs[0][0] - o.submit for o in mine], "wait"),
            "gpu_s_held": sum(o.gpus * (e - s) for o in mine for s, e in o.runs),
            "received_over_entitled": out["fair"]["received_over_entitled"][d],
        }
    out["per_desk"] = per_desk
    return out


def timeline(done: list[Outcome], capacity: int, weights: dict[str, float], window: float, origin: float) -> dict:
    """Sweep the demand (submitted, unfinished GPUs per desk) and the GPUs held per desk."""
    desks = list(weights)
    ix = {d: i for i, d in enumerate(desks)}
    w = tuple(weights[d] for d in desks)
    events: list[tuple[float, int, int, int]] = []  # (time, desk, d demand, d held)
    for o in done:
        i = ix[o.desk]
        events += [(o.submit, i, o.gpus, 0), (o.end, i, -o.gpus, 0)]
        events += [(s, i, 0, o.gpus) for s, _ in o.runs] + [(e, i, 0, -o.gpus) for _, e in o.runs]
    events.sort()
    n = len(desks)
    demand, held = [0] * n, [0] * n
    rec, ent = [0.0] * n, [0.0] * n
    used = waiting = used_waiting = contended = instant_gap = 0.0
    windows: dict[int, list[list[float]]] = {}  # window -> [received, entitled, demand] per desk
    now = events[0][0]
    for t, i, dd, dh in events:
        if t > now:
            dt = t - now
            total_held = sum(held)
            used += total_held * dt
            if sum(demand) > total_held:
                waiting += dt
                used_waiting += total_held * dt
            share = max_min_share(tuple(demand), w, capacity)
            if sum(demand) >= capacity:
                contended += dt
                instant_gap += sum(abs(h - s) for h, s in zip(held, share, strict=True)) * dt
                for k in range(n):
                    rec[k] += held[k] * dt
                    ent[k] += share[k] * dt
            a = now
            while a < t:  # per window, as trace_replay.Sim.advance
                wn = int((a - origin) // window)
                b = min(t, origin + (wn + 1) * window)
                acc = windows.setdefault(wn, [[0.0] * n for _ in range(3)])
                for k in range(n):
                    acc[0][k] += held[k] * (b - a)
                    acc[1][k] += share[k] * (b - a)
                    acc[2][k] += demand[k] * (b - a)
                a = b
            now = t
        demand[i] += dd
        held[i] += dh
    gaps = []
    end = now
    for wn in sorted(windows):
        r, e, dem = windows[wn]
        length = min(window, end - (origin + wn * window))
        if length <= 0 or sum(dem) < capacity * length * 0.999:
            continue  # not contended: everyone could have had its demand
        gaps.append(sum(abs(x - y) for x, y in zip(r, e, strict=True)) / (2 * capacity * length))
    return {
        "utilization_while_waiting": used_waiting / (capacity * waiting) if waiting else math.nan,
        "time_with_jobs_waiting_s": waiting,
        "fair": {
            "contended_s": contended,
            "received_gpu_s": dict(zip(desks, rec, strict=True)),
            "entitled_gpu_s": dict(zip(desks, ent, strict=True)),
            "received_over_entitled": {d: ratio(rec[k], ent[k]) for d, k in ix.items()},
            "gap_instant": instant_gap / (2 * capacity * contended) if contended else math.nan,
            "windows_contended": len(gaps),
            "gap_window_mean": sum(gaps) / len(gaps) if gaps else math.nan,
            "gap_window_p95": percentile(gaps, 95),
        },
    }


# -- Slurm --------------------------------------------------------------------------------
ENV: dict[str, str] = {}  # the Slurm client environment (set in main)


def slurm(*argv: str, user: str | None = None, timeout: float = 60) -> str:
    """A Slurm command (argv only), as root or as `user` through runuser."""
    full = ["runuser", "-u", user, "--", *argv] if user else list(argv)
    result = subprocess.run(full, capture_output=True, text=True, env=ENV, timeout=timeout, check=False)
    if result.returncode:
        raise RuntimeError(f"{shlex.join(full)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def queued_ids() -> list[str]:
    return slurm("squeue", "-h", "-o", "%i").split()


def wait_idle(timeout: float = 900) -> None:
    """Until the queue is empty and every gpu node is idle. Other people's jobs are waited for."""
    deadline = time.monotonic() + timeout
    while queued_ids() or set(slurm("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%T").split()) != {"idle"}:
        if time.monotonic() > deadline:
            raise TimeoutError(f"cluster not idle after {timeout:.0f} s:\n{slurm('squeue')}{slurm('sinfo')}")
        time.sleep(1)


def _epoch(stamp: str) -> float | None:
    if not stamp or stamp in ("Unknown", "None"):
        return None
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def sacct(ids: list[str], since: float) -> dict[str, dict]:
    """sacct's record of each job (allocation only): state, submit, start, end (epoch s)."""
    rows: dict[str, dict] = {}
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
    for n in range(0, len(ids), 200):
        out = slurm(
            "sacct", "-n", "-X", "-P", "-S", start, "-j", ",".join(ids[n : n + 200]),
            "-o", "JobID,JobName,Account,User,State,Submit,Start,End,NodeList",
        )  # fmt: skip
        for line in out.splitlines():
            jid, name, account, user, state, submit, begin, end, nodes = line.split("|")
            rows[jid] = {
                "name": name,
                "account": account,
                "user": user,
                "state": state.split()[0] if state else "",
                "submit": _epoch(submit),
                "start": _epoch(begin),
                "end": _epoch(end),
                "nodes": nodes,
            }
    return rows


def settled_sacct(ids: list[str], since: float, timeout: float = 120) -> dict[str, dict]:
    """sacct once every job has an end (slurmdbd hears of the end a moment after squeue)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = sacct(ids, since)
        missing = [i for i in ids if i not in rows or rows[i]["end"] is None]
        if not missing or time.monotonic() > deadline:
            if missing:
                print(f"  sacct: {len(missing)} job(s) without an end after {timeout:.0f} s: {missing[:10]}")
            return rows
        time.sleep(2)


def accounts() -> dict[str, dict[str, str]]:
    """The desks' account associations in this cluster: Fairshare and GrpTRES."""
    cluster = slurm("scontrol", "show", "config").split("ClusterName", 1)[1].split("=", 1)[1].split()[0]
    out = slurm(
        "sacctmgr", "-n", "-P", "show", "assoc", "where", f"cluster={cluster}", f"account={','.join(DESKS)}",
        "format=account,user,fairshare,grptres",
    )  # fmt: skip
    found = {}
    for line in out.splitlines():
        account, user, share, grptres = line.split("|")
        if not user:
            found[account] = {"cluster": cluster, "fairshare": share, "grptres": grptres}
    return found


def _tres(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def restore_accounts(saved: dict[str, dict[str, str]]) -> list[str]:
    """Put the desks' Fairshare and GrpTRES back as `saved` had them; returns what changed."""
    changed = []
    now = accounts()
    for account, before in saved.items():
        after = now.get(account)
        if after is None or (after["fairshare"], _tres(after["grptres"])) == (
            before["fairshare"],
            _tres(before["grptres"]),
        ):
            continue
        old, new = _tres(before["grptres"]), _tres(after["grptres"])
        grp = ",".join(f"{key}={old.get(key, '-1')}" for key in sorted(set(old) | set(new)))
        slurm(
            "sacctmgr", "-i", "modify", "account", "where", f"name={account}", f"cluster={before['cluster']}",
            "set", f"GrpTRES={grp}", f"Fairshare={before['fairshare']}",
        )  # fmt: skip
        changed.append(f"{account}: {after['fairshare']} {after['grptres']} -> {before['fairshare']} {grp}")
    return changed


def fair_share_state() -> list[dict[str, str]]:
    """sshare of the desks and their users: what Slurm's fair-share factor starts from."""
    keys = ["account", "user", "raw_shares", "norm_shares", "raw_usage", "effective_usage", "fairshare", "level_fs"]
    out = slurm(
        "sshare", "-n", "-P", "-a", "-A", ",".join(DESKS),
        "-o", "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare,LevelFS",
    )  # fmt: skip
    return [dict(zip(keys, (v.strip() for v in line.split("|")), strict=False)) for line in out.splitlines()]


def cluster_facts() -> dict:
    config = {
        key.strip(): value.strip()
        for key, _, value in (line.partition(" = ") for line in slurm("scontrol", "show", "config").splitlines())
    }
    wanted = (
        "SchedulerType", "SchedulerParameters", "PriorityType", "PriorityFlags", "PriorityDecayHalfLife",
        "PriorityCalcPeriod", "PriorityWeightFairShare", "PriorityWeightAge", "PriorityWeightJobSize",
        "PriorityWeightQOS", "PriorityMaxAge", "SelectTypeParameters", "PreemptType",
    )  # fmt: skip
    partition = slurm("scontrol", "-o", "show", "partition", PARTITION).split()
    return {
        **{key: config.get(key) for key in wanted},
        "partition": {
            k: v for k, _, v in (p.partition("=") for p in partition) if k in ("Nodes", "TRES", "TRESBillingWeights")
        },
    }


# -- replaying ----------------------------------------------------------------------------
def replay(jobs: list[BenchJob], submit, lead: float = 3.0) -> tuple[float, list[float]]:
    """Call submit(job) at each job's scaled time (one thread, in order); returns the start
    time and when each submit was made (a submit late behind a burst is late, and counted
    from when it was made)."""
    t0 = time.time() + lead
    stamps = []
    for job in jobs:
        delay = t0 + job.submit - time.time()
        if delay > 0:
            time.sleep(delay)
        stamps.append(time.time())
        submit(job)
    return t0, stamps


def lateness(jobs: list[BenchJob], t0: float, stamps: list[float]) -> dict[str, float]:
    late = [s - (t0 + j.submit) for j, s in zip(jobs, stamps, strict=True)]
    return {"mean_s": sum(late) / len(late), "max_s": max(late)}


def _progress(label: str, counts: dict[str, int]) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {label}: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)


def run_raw(jobs: list[BenchJob], jobs_dir: Path, mine: set[str], deadline_s: float) -> dict:
    """Path 1: sbatch at the submit times; Slurm decides."""
    work = Path(tempfile.mkdtemp(prefix="svc-raw-", dir=jobs_dir))
    work.chmod(0o755)
    script = work / "sleep.sh"
    script.write_text(SLEEP_SCRIPT)
    script.chmod(0o755)
    ids: dict[int, str] = {}
    tag = time.strftime("%H%M%S")

    def submit(job: BenchJob) -> None:
        out = slurm(
            "sbatch", "--parsable", f"--job-name=svc-raw-{tag}-{job.index:03d}", f"--account={job.desk}",
            f"--partition={PARTITION}", f"--nodes={job.nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={job.cpus_per_node}", f"--gres=gpu:{job.gpus_per_node}", f"--time={job.limit_min}",
            "--chdir=/tmp", "--output=/dev/null", "--no-requeue", str(script), f"{job.duration:g}",
            user=job.user,
        )  # fmt: skip
        ids[job.index] = out.strip().split(";")[0]
        mine.add(ids[job.index])

    began = time.time()
    try:
        t0, stamps = replay(jobs, submit)
        print(f"  submitted {len(jobs)} jobs in {time.time() - t0:.0f} s", flush=True)
        deadline, last = time.monotonic() + deadline_s, 0.0
        while True:
            ours = set(ids.values())
            left = [i for i in queued_ids() if i in ours]
            if not left:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw: {len(left)} jobs still queued after {deadline_s:.0f} s")
            if time.monotonic() - last > 30:
                states = Counter(slurm("squeue", "-h", "-o", "%T", "-j", ",".join(left)).split())
                _progress("raw", dict(states) | {"done": len(jobs) - len(left)})
                last = time.monotonic()
            time.sleep(2)
        rows = settled_sacct(list(ids.values()), began - 60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    outcomes, states = [], Counter()
    for job, stamp in zip(jobs, stamps, strict=True):
        row = rows.get(ids[job.index], {})
        states[row.get("state", "missing")] += 1
        ok = row.get("start") is not None and row.get("end") is not None
        outcomes.append(
            Outcome(job.desk, job.gpus, job.duration, stamp, [(row["start"], row["end"])] if ok else [],
                    row["end"] if ok else None)
        )  # fmt: skip
    run_over = [
        (rows[ids[j.index]]["end"] - rows[ids[j.index]]["start"]) - j.duration
        for j in jobs
        if rows.get(ids[j.index], {}).get("end") and rows[ids[j.index]].get("start")
    ]
    to_slurm = [
        rows[ids[j.index]]["submit"] - s
        for j, s in zip(jobs, stamps, strict=True)
        if rows.get(ids[j.index], {}).get("submit")
    ]
    in_queue = [r["start"] - r["submit"] for r in rows.values() if r["start"] and r["submit"]]
    return {
        "outcomes": outcomes,
        "slurm_states": dict(states),
        "lateness": lateness(jobs, t0, stamps),
        "overhead": {
            **_stats(to_slurm, "submit_to_slurm_submit"),
            **_stats(in_queue, "slurm_submit_to_start"),
            **_stats(run_over, "run_minus_duration"),
        },
        "slurm_ids": [ids[j.index] for j in jobs],
        "jobs": [  # per job, seconds after the replay's start
            {
                "slurm": [
                    {
                        k: (round(v - t0, 2) if isinstance(v, float) else v)
                        for k, v in rows.get(ids[j.index], {}).items()
                    }
                ]
            }
            for j in jobs
        ],
    }


def dev_tenancy():
    """config/tenants.yaml cut to the `slurm` flavor (and its site): desk-a and desk-b nominal
    16 GPUs and 64 cores each, in cohort trading."""
    import yaml

    from cellscale_hub.tenancy import Tenancy

    data = yaml.safe_load((REPO / "config" / "tenants.yaml").read_text())
    flavor = data["flavors"]["slurm"]
    data["flavors"] = {"slurm": flavor}
    data["sites"] = {flavor["site"]: data["sites"][flavor["site"]]} if flavor.get("site") else {}
    data.pop("datasets", None)
    for cq in data["cluster_queues"].values():
        cq["quotas"] = {name: quota for name, quota in cq["quotas"].items() if name == "slurm"}
    return Tenancy.model_validate(data)


def run_cellscale(
    jobs: list[BenchJob], cluster, jobs_dir: Path, mine: set[str], deadline_s: float, tenancy_out: dict
) -> dict:
    """Path 2: POST /api/jobs at the submit times; cellscale's admission decides."""
    from sqlalchemy import select

    sys.path.insert(0, str(REPO))  # for the test suite's in-process Plane
    from cellscale_hub.drivers.slurm import SlurmDriver
    from cellscale_hub.drivers.slurm.accounts import account_limits
    from cellscale_hub.store import Store
    from cellscale_hub.store.models import Attempt, Event, Job
    from tests.controlplane.conftest import Plane

    tenancy = dev_tenancy()
    tenancy_out["tenancy"] = tenancy.model_dump(mode="json")
    tmp = Path(tempfile.mkdtemp(prefix="cellscale-bench-svc-"))
    jobs_root = Path(tempfile.mkdtemp(prefix="svc-", dir=jobs_dir))
    jobs_root.chmod(0o711)  # each user reaches their own job dirs, nothing else
    store = Store(f"sqlite:///{tmp / 'cellscale.sqlite'}")
    store.migrate()
    driver = SlurmDriver(name="slurm", slurm_conf=cluster.env["SLURM_CONF"], master_addr="127.0.0.1")
    tenancy_out["mirrored_to_slurm"] = {
        a: asdict(limits) for a, limits in account_limits(tenancy, ["slurm"], driver._cluster_amounts()).items()
    }
    plane = Plane(tmp, store, drivers={"slurm": driver}, tenancy=tenancy, jobs_root=jobs_root)
    calls = {name: timing(driver, name) for name in ("submit", "poll", "start_estimate")}
    ids: dict[int, str] = {}

    def refs() -> set[str]:
        with store.session() as session:
            return {r for r in session.scalars(select(Attempt.backend_ref)) if r}

    def submit(job: BenchJob) -> None:
        spec = {
            "name": f"svc-{job.index:03d}",
            "source": f"import time\ntime.sleep({job.duration:g})\n",
            "launcher": "plain",
            "backend": "slurm",
            "resources": {
                "nodes": job.nodes,
                "gpus_per_node": job.gpus_per_node,
                "cpus_per_task": job.cpus_per_node,
                "timeout_min": job.limit_min,
            },
        }
        response = plane.http.post("/api/jobs", json={"spec": spec}, headers=plane.as_(job.user))
        if response.status_code != 201:
            raise RuntimeError(f"POST /api/jobs for job {job.index} answered {response.status_code}: {response.text}")
        ids[job.index] = response.json()["id"]

    began = time.time()
    try:
        plane.controller.start()
        t0, stamps = replay(jobs, submit)
        print(f"  submitted {len(jobs)} jobs in {time.time() - t0:.0f} s", flush=True)
        deadline, last = time.monotonic() + deadline_s, 0.0
        while True:
            mine.update(refs())
            with store.session() as session:
                phases = Counter(str(p) for p in session.scalars(select(Job.phase)))
            if sum(phases[p] for p in TERMINAL) >= len(jobs):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"cellscale: jobs not finished after {deadline_s:.0f} s: {dict(phases)}")
            if time.monotonic() - last > 30:
                _progress("cellscale", dict(phases))
                last = time.monotonic()
            time.sleep(2)
        plane.controller.stop()
        with store.session() as session:
            rows = {j.id: j for j in session.scalars(select(Job))}
            attempts: dict[str, list] = {}
            for a in session.scalars(select(Attempt).order_by(Attempt.job_id, Attempt.number)):
                attempts.setdefault(a.job_id, []).append(a)
            events: dict[str, list[tuple[float, str]]] = {}  # job -> (at, to phase), in order
            for e in session.scalars(select(Event).where(Event.to_phase.is_not(None)).order_by(Event.id)):
                events.setdefault(e.job_id, []).append((e.at.timestamp(), str(e.to_phase)))
            session.expunge_all()
        mine.update(refs())
        slurm_ids = sorted({a.backend_ref for lst in attempts.values() for a in lst if a.backend_ref})
        acct = settled_sacct(slurm_ids, began - 60)
    finally:
        plane.controller.stop()
        try:  # what the controller submitted since the last look, then nothing of ours may run on
            mine.update(refs())
            cancel_mine(mine)
        finally:
            store.dispose()
        shutil.rmtree(jobs_root, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    outcomes, store_jct, detail = [], [], []
    stage: dict[str, list[float]] = {k: [] for k in STAGES}
    phases, attempt_counts, end_reasons, slurm_states = Counter(), Counter(), Counter(), Counter()
    reserved_gpu_s = lost_gpu_s = 0.0
    for job, stamp in zip(jobs, stamps, strict=True):
        row = rows[ids[job.index]]
        phases[str(row.phase)] += 1
        mine_attempts = attempts.get(row.id, [])
        attempt_counts[len(mine_attempts)] += 1
        admitted = [at for at, phase in events.get(row.id, []) if phase == "ADMITTED"]
        for at, until in reservations(events.get(row.id, [])):
            reserved_gpu_s += job.gpus * (until - at)
        runs = []
        for n, a in enumerate(mine_attempts):
            if a.end_reason:
                end_reasons[a.end_reason.split(":")[0][:60]] += 1
            r = acct.get(a.backend_ref or "", {})
            slurm_states[r.get("state", "never in Slurm")] += 1
            if r.get("start") and r.get("end"):
                runs.append((r["start"], r["end"]))
                if r["state"] == "COMPLETED":
                    stage["run_minus_duration"].append((r["end"] - r["start"]) - job.duration)
                else:
                    lost_gpu_s += job.gpus * (r["end"] - r["start"])
            if r.get("start") and r.get("submit"):
                stage["slurm_submit_to_start"].append(r["start"] - r["submit"])
            if n < len(admitted) and r.get("submit"):
                stage["admitted_to_slurm_submit"].append(r["submit"] - admitted[n])
        if admitted:
            stage["submit_to_admitted"].append(admitted[0] - stamp)
        first = acct.get((mine_attempts[0].backend_ref if mine_attempts else None) or "", {})
        if first.get("submit"):
            stage["submit_to_slurm_submit"].append(first["submit"] - stamp)
        done = str(row.phase) == "SUCCEEDED" and runs
        outcomes.append(Outcome(job.desk, job.gpus, job.duration, stamp, runs, runs[-1][1] if done else None))
        detail.append(  # per job, seconds after the replay's start: its phases, and each attempt in Slurm
            {
                "phases": [(round(at - t0, 2), phase) for at, phase in events.get(row.id, [])],
                "slurm": [
                    {
                        k: (round(v - t0, 2) if isinstance(v, float) else v)
                        for k, v in acct.get(a.backend_ref, {}).items()
                    }
                    for a in mine_attempts
                    if a.backend_ref
                ],
            }
        )
        if row.finished_at and row.created_at:
            store_jct.append(row.finished_at.timestamp() - row.created_at.timestamp())
        if done and row.finished_at:
            stage["slurm_end_to_finished"].append(row.finished_at.timestamp() - runs[-1][1])
    overhead: dict[str, float] = {}
    for key, values in stage.items():
        overhead |= _stats(values, key)
    return {
        "outcomes": outcomes,
        "phases": dict(phases),
        "attempts_per_job": dict(sorted(attempt_counts.items())),
        "end_reasons": dict(end_reasons.most_common(8)),
        "slurm_states": dict(slurm_states),
        "lateness": lateness(jobs, t0, stamps),
        "store": _stats(store_jct, "jct"),
        "overhead": overhead,
        "gpu_s_reserved": reserved_gpu_s,
        "gpu_s_lost": lost_gpu_s,
        "jobs": detail,
        "driver_calls": {
            name: {"calls": len(x), "total_s": sum(x), "p50_s": percentile(x, 50), "p95_s": percentile(x, 95)}
            for name, x in calls.items()
        },
        "slurm_ids": slurm_ids,
    }


STAGES = (
    "submit_to_admitted",  # cellscale's own queue: POST -> its quota reserved
    "admitted_to_slurm_submit",  # the launch: job dir, script, runuser sbatch
    "submit_to_slurm_submit",  # both of those (raw: sbatch itself)
    "slurm_submit_to_start",  # Slurm's queue and its scheduling pass
    "run_minus_duration",  # srun, the supervisor and the cell's Python start, and the exit
    "slurm_end_to_finished",  # until the controller's poll saw the end
)


def reservations(events: list[tuple[float, str]]) -> list[tuple[float, float]]:
    """When cellscale held a job's quota: from each ADMITTED to the next phase that is not
    ADMITTED, STARTING or RUNNING (SUCCEEDED, FAILED, CANCELLED, or PENDING again)."""
    out, since = [], None
    for at, phase in events:
        if phase == "ADMITTED" and since is None:
            since = at
        elif phase not in ("ADMITTED", "STARTING", "RUNNING") and since is not None:
            out.append((since, at))
            since = None
    return out


def cancel_mine(mine: set[str], timeout: float = 120) -> int:
    """scancel (as root) this benchmark's jobs still queued, and wait until they have left."""
    left = [i for i in queued_ids() if i in mine]
    for n in range(0, len(left), 200):
        slurm("scancel", *left[n : n + 200])
    deadline = time.monotonic() + timeout
    while [i for i in queued_ids() if i in mine] and time.monotonic() < deadline:
        time.sleep(1)
    return len(left)


# -- main ---------------------------------------------------------------------------------
ROWS = [
    ("jct_mean_s", "JCT mean (s)"),
    ("jct_p50_s", "JCT p50 (s)"),
    ("jct_p95_s", "JCT p95 (s)"),
    ("wait_mean_s", "queueing mean (s)"),
    ("wait_p50_s", "queueing p50 (s)"),
    ("wait_p95_s", "queueing p95 (s)"),
    ("makespan_s", "makespan (s)"),
    ("utilization", "utilization (GPUs held)"),
    ("useful_utilization", "useful utilization (durations)"),
    ("utilization_while_waiting", "utilization while jobs wait"),
    ("fair.gap_window_mean", "fair-share gap, windows mean"),
    ("fair.gap_window_p95", "fair-share gap, windows p95"),
    ("fair.gap_instant", "fair-share gap, instant"),
    ("fair.received_over_entitled.desk-a", "desk-a received/entitled"),
    ("fair.received_over_entitled.desk-b", "desk-b received/entitled"),
    ("fair.contended_s", "contended time (s)"),
]


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part, {}) if isinstance(d, dict) else {}
    return d if not isinstance(d, dict) else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="60 jobs, an 80-s arrival window, 130 s of work")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--skip-days", type=float, default=DEFAULT_SKIP_DAYS)
    parser.add_argument("--skip-jobs", type=int, default=0, help="start this many jobs later")
    parser.add_argument("--arrival-s", type=float, help="the scaled submit span")
    parser.add_argument("--budget-s", type=float, help="the slice's GPU-seconds fit this many s of 32 GPUs")
    parser.add_argument("--limit-factor", type=float, default=LIMIT_FACTOR)
    parser.add_argument("--window-s", type=float, default=30.0, help="fair-share gap window")
    parser.add_argument("--paths", default="raw,cellscale")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--out", default="slurm_vs_cellscale")
    args = parser.parse_args()
    sizes = QUICK if args.quick else DEFAULTS
    n_jobs = args.jobs or sizes["jobs"]
    arrival_s = args.arrival_s or sizes["arrival_s"]
    budget_s = args.budget_s or sizes["budget_s"]
    paths = args.paths.split(",")
    if unknown := set(paths) - {"raw", "cellscale"}:
        parser.error(f"unknown paths {unknown}")
    logging.basicConfig(level=logging.WARNING)

    trace = slice_jobs(load_trace(args.trace), skip=args.skip_jobs, skip_days=args.skip_days, limit=n_jobs)
    jobs, info = scale_slice(trace, arrival_s, budget_s, limit_factor=args.limit_factor)
    print(
        f"{len(jobs)} jobs from day {args.skip_days:g} ({info['trace_span_h']:.1f} h of trace) compressed "
        f"{info['factor']:.0f}x into {info['arrival_s']:.0f} s of arrivals; durations {MIN_DURATION_S:g}-"
        f"{info['cap_s']:g} s ({info['raised_to_floor']} raised to the floor, {info['cut_to_cap']} cut to the cap)"
    )
    print(
        f"  {info['gpu_s']:.0f} GPU-s: offered load {info['offered_load']:.2f} of {CAPACITY} GPUs over the arrivals "
        f"(desk-a {info['offered_load_per_desk']['desk-a']:.2f}, "
        f"desk-b {info['offered_load_per_desk']['desk-b']:.2f}); "
        f"jobs per user {info['jobs_per_user']}; GPUs {info['gpus_fitted']}; --time (min) {info['limit_min']}",
        flush=True,
    )

    from cellscale_hub import proc
    from cellscale_hub.dev import slurm as dev_slurm

    t_start = time.perf_counter()
    cluster = dev_slurm.up(dev_slurm.DEFAULT_STATE_DIR, log=lambda line: print(f"[slurm up] {line}"))
    ENV.update(proc.job_environment(cluster.env))
    mine: set[str] = set()
    saved_accounts = accounts()
    results: dict[str, dict] = {}
    runs: dict[str, dict] = {}
    tenancy_out: dict = {}
    fair_state: dict[str, list] = {}
    deadline_s = info["arrival_s"] + 4 * budget_s + 300
    restored: list[str] = []
    try:
        facts = cluster_facts()
        for path in paths:
            print(f"\n{path}: waiting for an idle cluster ...", flush=True)
            wait_idle()
            fair_state[path] = fair_share_state()
            t0 = time.perf_counter()
            if path == "raw":
                runs[path] = run_raw(jobs, cluster.jobs_dir, mine, deadline_s)
            else:
                runs[path] = run_cellscale(jobs, cluster, cluster.jobs_dir, mine, deadline_s, tenancy_out)
            runs[path]["wall_s"] = time.perf_counter() - t0
            results[path] = summarize(runs[path]["outcomes"], window=args.window_s)
            if path == "cellscale" and results[path].get("makespan_s"):
                results[path]["reserved_utilization"] = runs[path]["gpu_s_reserved"] / (
                    CAPACITY * results[path]["makespan_s"]
                )
            print(
                f"  {path} took {runs[path]['wall_s']:.0f} s; "
                f"makespan {results[path].get('makespan_s', math.nan):.0f} s"
            )
            cancel_mine(mine)
        fair_state["after"] = fair_share_state()
    finally:
        try:
            cancelled = cancel_mine(mine)
            if cancelled:
                print(f"[bench] cancelled {cancelled} of this benchmark's jobs", file=sys.stderr)
            restored = restore_accounts(saved_accounts)
            for line in restored:
                print(f"[bench] account put back: {line}")
            others = queued_ids()
        except Exception as exc:
            print(f"[bench] cleanup: {type(exc).__name__}: {exc}", file=sys.stderr)
            others = ["?"]
        if "slurmctld" in cluster.started and others:
            print(f"[bench] leaving the cluster running: other jobs are queued ({others[:10]})", file=sys.stderr)
        elif "slurmctld" in cluster.started:
            dev_slurm.down(cluster.state_dir, log=lambda line: print(f"[slurm down] {line}"))

    both = "raw" in results and "cellscale" in results
    for run in runs.values():  # the results first: a table that fails to print loses nothing
        run["outcomes"] = [asdict(o) for o in run["outcomes"]]
    write_results(
        args.out,
        args.quick,
        {
            "trace": args.trace.name,
            "slice": {"skip_days": args.skip_days, "skip_jobs": args.skip_jobs, **info},
            "jobs": [asdict(j) for j in jobs],
            "cluster": facts,
            "accounts_found": saved_accounts,
            "accounts_put_back": restored,
            "slurm_fair_share_before": fair_state,
            "cellscale_tenancy": tenancy_out,
            "scheduling_source_sha256": scheduling_digest(),
            "results": results,
            "runs": runs,
            "ratio_cellscale_slurm": (
                {key: ratio(_get(results["cellscale"], key), _get(results["raw"], key)) for key, _ in ROWS}
                if both
                else {}
            ),
            "wall_s": time.perf_counter() - t_start,
        },
    )

    names = [p for p in ("raw", "cellscale") if p in results]
    both = len(names) == 2
    label = {"raw": "raw slurm", "cellscale": "cellscale"}
    print(f"\n{len(jobs)} jobs, {CAPACITY} GPUs, fair share over {args.window_s:g}-s windows")
    print_table(
        ["metric", *(label[n] for n in names), *(["cellscale/slurm"] if both else [])],
        [
            [text, *(_get(results[n], key) for n in names)]
            + ([ratio(_get(results["cellscale"], key), _get(results["raw"], key))] if both else [])
            for key, text in ROWS
        ],
    )
    print("\nper desk: mean JCT and queueing (s), GPU-s held")
    rows = []
    for d in DESKS:
        row = [d, info["jobs_per_desk"][d]]
        for key in ("jct_mean_s", "wait_mean_s", "wait_p95_s", "gpu_s_held"):
            row += [results[n]["per_desk"][d][key] for n in names]
        rows.append(row)
    heads = [f"{k} {label[n]}" for k in ("JCT", "wait", "wait p95", "GPU-s") for n in names]
    print_table(["desk", "jobs", *heads], rows)
    print("\nwhere the time goes (mean / p95 / max s)")
    over_rows = []
    for key, text in (
        ("submit_to_admitted", "submit -> admitted (cellscale's queue)"),
        ("admitted_to_slurm_submit", "admitted -> Slurm submit"),
        ("submit_to_slurm_submit", "submit -> Slurm submit"),
        ("slurm_submit_to_start", "Slurm submit -> start"),
        ("run_minus_duration", "Slurm run time - duration (completed)"),
        ("slurm_end_to_finished", "Slurm end -> store finished"),
    ):
        over_rows.append(
            [text]
            + [" / ".join(f"{runs[n]['overhead'].get(f'{key}_{k}_s', math.nan):.2f}" for k in ("mean", "p95", "max"))
               for n in names]
        )  # fmt: skip
    print_table(["", *(label[n] for n in names)], over_rows)
    for n in names:
        r = runs[n]
        print(
            f"{label[n]}: {r['wall_s']:.0f} s wall; submits late by {r['lateness']['mean_s']:.2f} s on average "
            f"(max {r['lateness']['max_s']:.2f}); Slurm states {r['slurm_states']}"
        )
    if "cellscale" in runs:
        r = runs["cellscale"]
        print(
            f"cellscale: phases {r['phases']}, attempts per job {r['attempts_per_job']}, JCT from the store "
            f"mean {r['store']['jct_mean_s']:.1f} s (sacct: {results['cellscale']['jct_mean_s']:.1f} s); "
            f"end reasons {r['end_reasons']}"
        )
        c = results["cellscale"]
        print(
            f"cellscale reserved {r['gpu_s_reserved']:.0f} GPU-s (ADMITTED to the end it saw: utilization "
            f"{c.get('reserved_utilization', math.nan):.3f}) for {c.get('gpu_s_held', math.nan):.0f} GPU-s held in "
            f"Slurm; {r['gpu_s_lost']:.0f} GPU-s held by attempts that did not complete (preempted)"
        )
        print(
            "controller's Slurm calls: "
            + "; ".join(
                f"{name} {x['calls']} x, {x['total_s']:.1f} s (p50 {x['p50_s']:.2f}, p95 {x['p95_s']:.2f})"
                for name, x in r["driver_calls"].items()
            )
        )
    for path, rows_ in fair_state.items():
        users = {row["user"]: row["fairshare"] for row in rows_ if row["user"]}
        levels = {row["account"]: row["level_fs"] for row in rows_ if not row["user"]}
        when = "after both paths" if path == "after" else f"before {path}"
        print(f"Slurm fair share {when}: users' factors {users}, desks' LevelFS {levels}")


if __name__ == "__main__":
    main()
