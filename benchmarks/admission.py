"""Cost of one admission cycle (`schedule()`) with 1k, 10k and 100k pending jobs: the
cellscale tenancy (100 ClusterQueues in a cohort tree) against a FIFO baseline (one
ClusterQueue owning the whole fleet), through the same code.

The workload (seeded, so every run builds the same snapshots):
- fleet: 1,024 GPUs of one flavor;
- tenancy: firm -> 10 divisions -> 10 desks each = 100 ClusterQueues; nominal quotas are
  skewed (log-normal weights, at least 2 GPUs each) and sum to the fleet; every 4th desk
  lends only half its nominal quota, every 3rd may borrow at most 64 GPUs; fair-share
  weights are the nominal quotas (a division's is its desks' sum);
- holders: jobs admitted by `schedule()` itself from a warm-up backlog, then ~10% of the
  fleet freed again (jobs that finished), so each cycle has room to admit, lent GPUs to
  reclaim and full queues to explain; started up to a day ago, a checkpoint every 30 min,
  two in three with a known time limit;
- pending: N jobs spread over the desks by a Zipf-like activity (busy desks want far more
  than their quota), sizes 1-64 GPUs (1: 45%, 2: 15%, 4: 15%, 8: 14%, 16: 6%, 32: 4%,
  64: 1%), priorities 10% high / 80% normal / 10% low, submitted over the last day;
- history: each queue's decayed GPU-seconds (half-life 1 h) over the last day, from its
  holders and a synthetic record of earlier jobs, as `fairshare.average_gpus`.

FIFO is the same snapshot with every job and holder moved into one ClusterQueue of 1,024
GPUs (no cohort, no history): the same `schedule()` code, the least work it can do.

One cycle = one `schedule(snapshot)` call on a prebuilt snapshot (building the snapshot
from the store is not included). Decisions = admissions + pending reasons produced (every
pending job gets either); decisions/s = decisions / median cycle time.

The same cellscale snapshot is also run over three resources (`with_cpus_and_memory`: CPU and
memory quotas, demands and capacity beside the GPUs), against GPUs only.

    .venv/bin/python benchmarks/admission.py [--quick] [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import random
import time
from collections import Counter
from dataclasses import replace

from _common import median, percentile, print_table, ratio, scheduling_digest, write_results

from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.engine import BACKFILL_DEPTH, Engine
from cellscale_hub.scheduling.fairshare import average_gpus, decayed_gpu_seconds
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.tenancy import Tenancy

FLEET = 1024
DIVISIONS, DESKS = 10, 10
FLAVOR = "gpu"
HALF_LIFE = 3600.0
CHECKPOINT = 1800.0
NOW = 10 * 86400.0
DAY = 86400.0
SIZES = [(1, 45), (2, 15), (4, 15), (8, 14), (16, 6), (32, 4), (64, 1)]
PRIORITIES = [(100, 10), (0, 80), (-100, 10)]
FREE_FRACTION = 0.10
REPS = {1000: 15, 10000: 9, 100000: 5}
QUICK_REPS = {1000: 5, 10000: 3, 100000: 2}


def largest_remainder(total: int, weights: list[float], floor: int = 0) -> list[int]:
    """Integers proportional to `weights`, each at least `floor`, summing to `total`."""
    rest = total - floor * len(weights)
    exact = [rest * w / sum(weights) for w in weights]
    out = [math.floor(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: out[i] - exact[i])[: rest - sum(out)]:
        out[i] += 1
    return [floor + x for x in out]


def desk_names() -> list[str]:
    return [f"div{d}-desk{k}" for d in range(DIVISIONS) for k in range(DESKS)]


def firm_tenancy(rng: random.Random) -> Tenancy:
    names = desk_names()
    nominal = largest_remainder(FLEET, [rng.lognormvariate(0, 0.8) for _ in names], floor=2)
    cqs = {}
    for i, (name, n) in enumerate(zip(names, nominal, strict=True)):
        quota: dict = {"nominal": n}
        if i % 4 == 0:
            quota["lending_limit"] = n // 2
        if i % 3 == 0:
            quota["borrowing_limit"] = 64
        cqs[name] = {"cohort": name.split("-")[0], "weight": n, "quotas": {FLAVOR: quota}}
    division_weight = Counter()
    for name, n in zip(names, nominal, strict=True):
        division_weight[name.split("-")[0]] += n
    cohorts = {
        "firm": {},
        **{f"div{d}": {"parent": "firm", "weight": division_weight[f"div{d}"]} for d in range(DIVISIONS)},
    }
    return Tenancy.model_validate(
        {
            "flavors": {FLAVOR: {"backend": "slurm"}},
            "cohorts": cohorts,
            "cluster_queues": cqs,
            "tenants": {name: {"queues": {"default": {"cluster_queue": name}}} for name in names},
        }
    )


def fifo_tenancy() -> Tenancy:
    return Tenancy.single("fleet", {FLAVOR: FLEET})


def pick(rng: random.Random, table: list[tuple[int, int]]) -> int:
    return rng.choices([v for v, _ in table], [w for _, w in table])[0]


def jobs(rng: random.Random, n: int, activity: list[float], start: float, end: float, prefix: str) -> list[Workload]:
    names = desk_names()
    out = []
    for i in range(n):
        cq = rng.choices(names, activity)[0]
        out.append(
            Workload(f"{prefix}{i:06d}", cq, pick(rng, SIZES), pick(rng, PRIORITIES), rng.uniform(start, end), None, cq)
        )
    return out


def holders_and_history(rng: random.Random, t: Tenancy, activity: list[float]) -> tuple[list[Holder], dict[str, float]]:
    """Holders admitted by schedule() from a warm-up backlog, then ~10% of the fleet freed;
    history from the holders and a day of earlier jobs."""
    backlog = jobs(rng, 4000, activity, NOW - 2 * DAY, NOW - DAY, "warm-")
    admitted = schedule(Snapshot(t, {FLAVOR: FLEET}, (), tuple(backlog), {}, NOW - DAY)).admit
    by_id = {w.job_id: w for w in backlog}
    holders = []
    for a in admitted:
        w = by_id[a.job_id]
        started = rng.uniform(NOW - DAY, NOW - 600)
        marks = int((NOW - started) // CHECKPOINT)
        ckpt = started + marks * CHECKPOINT if marks else None
        ends_by = started + rng.choice([4, 8, 24, 48]) * 3600 if rng.random() < 2 / 3 else None
        holders.append(
            Holder(w.job_id, w.cluster_queue, a.flavor, w.gpus, w.priority, started, ckpt, ends_by, False, w.tenant)
        )
    rng.shuffle(holders)
    while sum(h.gpus for h in holders) > FLEET * (1 - FREE_FRACTION):
        holders.pop()
    decayed = Counter()
    for h in holders:
        decayed[h.cluster_queue] += decayed_gpu_seconds(h.gpus, h.started, NOW, NOW, HALF_LIFE)
    for w in jobs(rng, 3000, activity, NOW - DAY, NOW, "past-"):
        start = w.submitted
        decayed[w.cluster_queue] += decayed_gpu_seconds(
            w.gpus, start, min(NOW, start + rng.expovariate(1 / 3600)), NOW, HALF_LIFE
        )
    return holders, {cq: average_gpus(d, HALF_LIFE) for cq, d in decayed.items()}


def snapshots(n: int, seed: int = 7) -> tuple[Snapshot, Snapshot]:
    rng = random.Random(seed)
    t = firm_tenancy(rng)
    names = desk_names()
    activity = [1 / (rank + 1) ** 0.9 for rank in range(len(names))]
    rng.shuffle(activity)
    holders, history = holders_and_history(rng, t, activity)
    pending = jobs(rng, n, activity, NOW - DAY, NOW, "job-")
    ours = Snapshot(t, {FLAVOR: FLEET}, tuple(holders), tuple(pending), history, NOW)
    fifo = Snapshot(
        fifo_tenancy(),
        {FLAVOR: FLEET},
        tuple(replace(h, cluster_queue="fleet") for h in holders),
        tuple(replace(w, cluster_queue="fleet") for w in pending),
        {},
        NOW,
    )
    return ours, fifo


CORES_PER_GPU, MIB_PER_GPU = 16, 128 * 1024


def with_cpus_and_memory(snap: Snapshot) -> Snapshot:
    """The same snapshot over three resources: every queue also has a CPU and a memory quota
    (16 cores and 128 GiB per nominal GPU, its limits scaled alike), every job and holder asks
    for 16 cores and 128 GiB per GPU, and the flavor has the cores and memory to match. The
    decisions are the same; what differs is the work of checking three resources."""

    def scaled(quota: dict, factor: int) -> dict:
        return {k: (v * factor if v is not None else None) for k, v in quota.items()}

    doc = snap.tenancy.model_dump()
    for queue in doc["cluster_queues"].values():
        for name, quota in queue["quotas"].items():
            queue["quotas"][name] = quota | {"cpu": scaled(quota, CORES_PER_GPU), "memory": scaled(quota, MIB_PER_GPU)}
    weights = snap.tenancy.resource_weights
    per_gpu = Amounts(1, CORES_PER_GPU, MIB_PER_GPU).weight(weights)
    capacity = {
        flavor: Amounts(gpus, gpus * CORES_PER_GPU, gpus * MIB_PER_GPU) for flavor, gpus in snap.capacity.items()
    }
    return Snapshot(
        Tenancy.model_validate(doc),
        capacity,
        tuple(replace(h, cpus=h.gpus * CORES_PER_GPU, memory=h.gpus * MIB_PER_GPU) for h in snap.holders),
        tuple(replace(w, cpus=w.gpus * CORES_PER_GPU, memory=w.gpus * MIB_PER_GPU) for w in snap.pending),
        {cq: gpus * per_gpu for cq, gpus in snap.history.items()},  # usage history in the same GPU-equivalents
        snap.now,
    )


def timed(snap: Snapshot, seed: int = 11) -> Snapshot:
    """The same snapshot with every waiting job carrying a time limit (10 min to 24 h), as in
    production, where a job without --time has its desk's default: backfill looks behind heads."""
    rng = random.Random(seed)
    limits = [600.0, 3600.0, 4 * 3600.0, 24 * 3600.0]
    return replace(snap, pending=tuple(replace(w, time_limit_s=rng.choice(limits)) for w in snap.pending))


def kept_engine(snap: Snapshot, depth: int | None) -> tuple[Engine, float]:
    """An engine holding the snapshot's waiting jobs and holders, and the seconds its one-pass
    build took (a restart's)."""
    engine = Engine(snap.tenancy, backfill_depth=depth)
    t0 = time.perf_counter()
    engine.add_many(list(snap.pending))
    for h in snap.holders:
        engine.hold(h)
    return engine, time.perf_counter() - t0


def measure_engine(snap: Snapshot, reps: int, depth: int | None, oracle) -> dict:
    """Cycles of the engine over the same state (nothing changed between them: the cost of a
    cycle after a submit that changes no head), and whether it decided what the oracle did."""
    engine, build = kept_engine(snap, depth)
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        decision = engine.cycle(snap.now, dict(snap.capacity), history=dict(snap.history))
        times.append(time.perf_counter() - t0)
    decisions = len(decision.admit) + len(decision.pending)
    assert decisions == len(snap.pending), "every pending job is admitted or given a reason"
    cycle = median(times)
    return {
        "backfill_depth": depth,
        "build_s": build,
        "cycle_median_s": cycle,
        "cycle_p95_s": percentile(times, 95),
        "decisions_per_s": decisions / cycle,
        "admitted": len(decision.admit),
        "preempted": len(decision.preempt),
        "same_admissions_as_oracle": decision.admit == oracle.admit,
        "same_preemptions_as_oracle": decision.preempt == oracle.preempt,
        "admissions_not_in_oracle": len({a.job_id for a in decision.admit} - {a.job_id for a in oracle.admit}),
    }


def churn(snap: Snapshot, rounds: int, depth: int | None, oracle: bool = False) -> dict:
    """Sustained admission: each round the 8 oldest holders end (their GPUs free), one cycle
    runs, and what it admits starts (removed from the queue, held). Admissions per second of
    cycle time, with the engine (state kept) or the oracle (a snapshot of everything each round)."""
    engine, _ = kept_engine(snap, depth)
    pending = {w.job_id: w for w in snap.pending}
    holders = dict(engine.holders)
    now, spent, admitted = snap.now, 0.0, 0
    for _ in range(rounds):
        for h in sorted(holders.values(), key=lambda h: (h.started or 0.0, h.job_id))[:8]:
            del holders[h.job_id]
            engine.release(h.job_id, now)
        t0 = time.perf_counter()
        if oracle:
            state = replace(snap, holders=tuple(holders.values()), pending=tuple(pending.values()), now=now)
            decision = schedule(state)
        else:
            decision = engine.cycle(now, dict(snap.capacity), history=dict(snap.history))
        spent += time.perf_counter() - t0
        for a in decision.admit:
            w = pending.pop(a.job_id)
            holders[a.job_id] = Holder(w.job_id, w.cluster_queue, a.flavor, w.gpus, w.priority, now, tenant=w.tenant)
            t0 = time.perf_counter()
            engine.remove(a.job_id)  # the engine's bookkeeping is its cost
            engine.hold(holders[a.job_id])
            spent += 0.0 if oracle else time.perf_counter() - t0
        admitted += len(decision.admit)
        now += 60.0
    return {"rounds": rounds, "admitted": admitted, "cycle_s": spent, "admissions_per_s": admitted / spent}


def compare_engines(ours: Snapshot, reps: int, rounds: int) -> dict:
    """The oracle against the engine (exact: no backfill bound; and production's bound), on the
    snapshot as built and with every job timed; and sustained admission, side by side."""
    out = {}
    for shape, snap in (("untimed", ours), ("timed", timed(ours))):
        oracle = measure(snap, reps)
        decision = schedule(snap)
        out[shape] = {
            "oracle": oracle,
            "engine_exact": measure_engine(snap, reps, None, decision),
            "engine_bounded": measure_engine(snap, reps, BACKFILL_DEPTH, decision),
        }
        assert out[shape]["engine_exact"]["same_admissions_as_oracle"], "no bound: the oracle's decisions"
    timed_snap = timed(ours)
    out["churn"] = {
        "oracle": churn(timed_snap, max(3, rounds // 20), BACKFILL_DEPTH, oracle=True),
        "engine_bounded": churn(timed_snap, rounds, BACKFILL_DEPTH),
    }
    return out


def report_engines(engines: dict) -> None:
    rows = []
    for n, by_shape in engines.items():
        for shape in ("untimed", "timed"):
            e = by_shape[shape]
            o, x, b = e["oracle"], e["engine_exact"], e["engine_bounded"]
            rows.append(
                [
                    f"{int(n):,}",
                    shape,
                    o["cycle_median_s"],
                    x["cycle_median_s"],
                    b["cycle_median_s"],
                    ratio(o["cycle_median_s"], b["cycle_median_s"]),
                    f"{b['decisions_per_s']:,.0f}",
                    x["same_admissions_as_oracle"] and x["same_preemptions_as_oracle"],
                    b["admissions_not_in_oracle"],
                    x["build_s"],
                ]
            )
    print("\nThe oracle (from scratch) against the engine (kept state): one cycle, median seconds")
    print_table(
        ["pending", "jobs", "oracle", "exact", "bf=100", "oracle/bf", "dec/s bf", "exact=", "bf diff", "build"],
        rows,
    )
    print("\nSustained admission (timed jobs; 8 holders end per round): admissions per second of cycle time")
    print_table(
        ["pending", "oracle adm/s", "engine adm/s", "engine/oracle"],
        [
            [
                f"{int(n):,}",
                f"{e['churn']['oracle']['admissions_per_s']:,.0f}",
                f"{e['churn']['engine_bounded']['admissions_per_s']:,.0f}",
                ratio(e["churn"]["engine_bounded"]["admissions_per_s"], e["churn"]["oracle"]["admissions_per_s"]),
            ]
            for n, e in engines.items()
        ],
    )


def measure(snap: Snapshot, reps: int) -> dict:
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        decision = schedule(snap)
        times.append(time.perf_counter() - t0)
    decisions = len(decision.admit) + len(decision.pending)
    assert decisions == len(snap.pending), "every pending job is admitted or given a reason"
    cycle = median(times)
    return {
        "pending": len(snap.pending),
        "holders": len(snap.holders),
        "held_gpus": sum(h.gpus for h in snap.holders),
        "reps": reps,
        "cycle_median_s": cycle,
        "cycle_p95_s": percentile(times, 95),
        "cycle_min_s": min(times),
        "decisions": decisions,
        "decisions_per_s": decisions / cycle,
        "admitted": len(decision.admit),
        "admitted_gpus": sum(w.gpus for w in snap.pending if w.job_id in {a.job_id for a in decision.admit}),
        "preempted": len(decision.preempt),
        "reasons": dict(sorted(Counter(r.code for r in decision.pending.values()).items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer cycles per size")
    parser.add_argument("--sizes", default="1000,10000,100000", help="pending jobs per snapshot, comma-separated")
    parser.add_argument("--churn-rounds", type=int, default=200, help="rounds of the sustained-admission run")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    reps = QUICK_REPS if args.quick else REPS

    results: dict[str, dict] = {"cellscale": {}, "fifo": {}, "cellscale, three resources": {}}
    engines: dict[str, dict] = {}
    t_start = time.perf_counter()
    for n in sizes:
        ours, fifo = snapshots(n)
        r = reps.get(n, 3)
        print(f"{n} pending: {len(ours.holders)} holders, {r} cycles each", flush=True)
        results["cellscale"][str(n)] = measure(ours, r)
        results["fifo"][str(n)] = measure(fifo, r)
        three = measure(with_cpus_and_memory(ours), r)
        assert three["admitted"] == results["cellscale"][str(n)]["admitted"], "the same decisions over three resources"
        results["cellscale, three resources"][str(n)] = three
        engines[str(n)] = compare_engines(ours, r, args.churn_rounds)

    rows = []
    for n in sizes:
        o, f = results["cellscale"][str(n)], results["fifo"][str(n)]
        rows.append(
            [
                f"{n:,}",
                o["cycle_median_s"],
                o["cycle_p95_s"],
                f"{o['decisions_per_s']:,.0f}",
                o["admitted"],
                o["preempted"],
                f["cycle_median_s"],
                f["cycle_p95_s"],
                f"{f['decisions_per_s']:,.0f}",
                f["admitted"],
                ratio(o["cycle_median_s"], f["cycle_median_s"]),
            ]
        )
    print("\nOne schedule() cycle, seconds (median / p95); decisions/s = (admitted + reasons) / median")
    print_table(
        [
            "pending",
            "ours med",
            "ours p95",
            "ours dec/s",
            "ours adm",
            "ours pre",
            "fifo med",
            "fifo p95",
            "fifo dec/s",
            "fifo adm",
            "ours/fifo",
        ],
        rows,
    )

    scaling = {}
    for policy in ("cellscale", "fifo"):
        for small, big in itertools.pairwise(sizes):
            scaling.setdefault(policy, {})[f"{big}/{small}"] = ratio(
                results[policy][str(big)]["cycle_median_s"], results[policy][str(small)]["cycle_median_s"]
            )
    if scaling:
        print("\nCycle cost scaling (median ratio; linear would be the size ratio)")
        print_table(["policy", *scaling["cellscale"]], [[p, *scaling[p].values()] for p in scaling])
    ratios = {
        str(n): ratio(results["cellscale"][str(n)]["cycle_median_s"], results["fifo"][str(n)]["cycle_median_s"])
        for n in sizes
    }
    three_ratios = {
        str(n): ratio(
            results["cellscale, three resources"][str(n)]["cycle_median_s"],
            results["cellscale"][str(n)]["cycle_median_s"],
        )
        for n in sizes
    }
    print("\nGPUs, CPUs and memory against GPUs only (same jobs and decisions; issue 21's goal: at most 1.5)")
    print_table(
        ["pending", "GPUs only", "three resources", "three / GPUs only"],
        [
            [
                f"{n:,}",
                results["cellscale"][str(n)]["cycle_median_s"],
                results["cellscale, three resources"][str(n)]["cycle_median_s"],
                three_ratios[str(n)],
            ]
            for n in sizes
        ],
    )
    report_engines(engines)
    wall = time.perf_counter() - t_start
    print(f"\nwall time {wall:.0f} s")
    write_results(
        "admission",
        args.quick,
        {
            "workload": {
                "fleet_gpus": FLEET,
                "cluster_queues": DIVISIONS * DESKS,
                "tree": "firm -> 10 divisions -> 10 desks",
                "sizes": dict(SIZES),
                "priorities": dict(PRIORITIES),
                "free_fraction": FREE_FRACTION,
                "half_life_s": HALF_LIFE,
                "seed": 7,
            },
            "scheduling_source_sha256": scheduling_digest(),
            "results": results,
            "ratio_cellscale_fifo_cycle": ratios,
            "ratio_three_resources_gpus_only_cycle": three_ratios,
            "three_resources": {"cores_per_gpu": CORES_PER_GPU, "mib_per_gpu": MIB_PER_GPU},
            "scaling": scaling,
            "engine": engines,
            "wall_s": wall,
        },
    )


if __name__ == "__main__":
    main()
