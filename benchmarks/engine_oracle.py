"""The admission engine against its oracle on the real trace: proof that keeping state between
cycles changed the cost and not the decisions, and what bounding backfill gives up.

For each window of the Philly trace (`--windows SKIP:DAYS,...`) and each offered load
(`--loads`; the fleet is sized as in `scheduling_quality.fleet_for`), the cellscale policy
(production's `Ordering()`: least attained service, backfill, reservation, preemption for
service) is replayed three times through `trace_replay.Sim`, fed the same events:
- oracle: `cycle.schedule()` from scratch over a snapshot of every waiting job and holder;
- engine, exact: `scheduling.engine.Engine` with no backfill bound;
- engine, bounded: the engine as production runs it (`--backfill-depth`, 100 jobs a cycle
  behind each queue's first waiting one, resumed where it stopped).
All three read the same fair-share history (the engine's memory). The oracle and the exact
engine must make the same decisions: every cycle's admissions and preemptions are chained
into a crc32 (`decisions_crc32`), compared here. The bounded engine is compared by its
outcomes (JCT, waits, short jobs' wait), the quality the bound gives up. The CPU time spent in
cycles is reported for each, side by side.

    .venv/bin/python benchmarks/engine_oracle.py [--quick] [--windows 25:10,40:10,60:10]
        [--loads 0.85,1.1] [--backfill-depth 100]
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import print_table, ratio, scheduling_digest, write_results
from scheduling_quality import fleet_for
from trace_replay import cap_jobs, load_trace, nominal_quotas, offered_load, policies, replay, slice_jobs

from cellscale_hub.scheduling.engine import BACKFILL_DEPTH

KEYS = ("jct_mean_h", "jct_p95_h", "wait_mean_h", "wait_p95_h", "short_wait_p95_h", "preemptions")


def run_case(trace, skip: float, days: float, load: float, depth: int) -> dict:
    window = slice_jobs(trace, skip_days=skip, days=days)
    fleet = fleet_for(window, load)
    jobs, _ = cap_jobs(window, fleet)
    nominal = nominal_quotas(jobs, fleet)
    policy = policies(nominal, fleet)["cellscale"]
    modes = {
        "oracle": {"engine_mode": "oracle", "backfill_depth": None},
        "engine_exact": {"engine_mode": "kept", "backfill_depth": None},
        "engine_bounded": {"engine_mode": "kept", "backfill_depth": depth},
    }
    case = {"window": {"skip_days": skip, "days": days}, "fleet_gpus": fleet, "jobs": len(jobs)}
    case["load"] = offered_load(jobs, fleet)["offered_load"]
    print(f"\nwindow days {skip:g}-{skip + days:g}: {len(jobs)} jobs on {fleet} GPUs, load {case['load']:.2f}")
    results = {}
    for name, options in modes.items():
        t0 = time.perf_counter()
        result = replay(jobs, policy, fleet, nominal, **options)
        sim = result["sim"]
        results[name] = {k: result[k] for k in KEYS} | {
            "cycles": sim["schedule_calls"],
            "cycle_s": sim["schedule_s"],
            "decisions_crc32": sim["decisions_crc32"],
            "max_pending": result["max_pending"],
            "wall_s": time.perf_counter() - t0,
        }
        print(f"  {name}: {results[name]['wall_s']:.0f} s, crc32 {sim['decisions_crc32']}", flush=True)
    case["results"] = results
    case["same_decisions"] = results["oracle"]["decisions_crc32"] == results["engine_exact"]["decisions_crc32"]
    case["bounded_over_oracle"] = {k: ratio(results["engine_bounded"][k], results["oracle"][k]) for k in KEYS}
    case["cycle_cpu_oracle_over_engine"] = ratio(results["oracle"]["cycle_s"], results["engine_bounded"]["cycle_s"])
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one 5-day window at load 1.0")
    parser.add_argument("--windows", default="25:10,40:10,60:10", help="SKIP_DAYS:DAYS,...")
    parser.add_argument("--loads", default="0.85,1.1")
    parser.add_argument("--backfill-depth", type=int, default=BACKFILL_DEPTH)
    args = parser.parse_args()
    if args.quick:
        args.windows, args.loads = "25:5", "1.0"
    windows = [tuple(float(x) for x in w.split(":")) for w in args.windows.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    t0 = time.perf_counter()
    trace = load_trace()
    cases = [run_case(trace, skip, days, load, args.backfill_depth) for skip, days in windows for load in loads]
    print("\nOracle vs engine: same decisions (exact), the bounded engine's outcomes over the oracle's, cycle CPU")
    print_table(
        ["window", "load", "same", "jct mean", "jct p95", "wait p95", "short p95", "oracle s", "engine s", "ratio"],
        [
            [
                f"{c['window']['skip_days']:g}+{c['window']['days']:g}d",
                c["load"],
                c["same_decisions"],
                c["bounded_over_oracle"]["jct_mean_h"],
                c["bounded_over_oracle"]["jct_p95_h"],
                c["bounded_over_oracle"]["wait_p95_h"],
                c["bounded_over_oracle"]["short_wait_p95_h"],
                c["results"]["oracle"]["cycle_s"],
                c["results"]["engine_bounded"]["cycle_s"],
                c["cycle_cpu_oracle_over_engine"],
            ]
            for c in cases
        ],
    )
    wall = time.perf_counter() - t0
    print(f"\nwall time {wall:.0f} s")
    write_results(
        "engine_oracle",
        args.quick,
        {
            "options": {"windows": windows, "loads": loads, "backfill_depth": args.backfill_depth},
            "scheduling_source_sha256": scheduling_digest(),
            "cases": cases,
            "all_same_decisions": all(c["same_decisions"] for c in cases),
            "wall_s": wall,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
