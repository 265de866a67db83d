"""Scheduling quality across trace windows and offered loads: cellscale's ordering inside each
desk (least attained service, backfill, reservation, preemption for service) against its
submit-order predecessor and three fleet-wide baselines, in one run, through the same
simulator (`trace_replay.Sim`).

For each window of the Philly trace (`--windows SKIP:DAYS,...`: days after the first submit,
and length) and each offered load (`--loads`), the fleet is sized so that the window's
GPU-time over its submit span is that fraction of it (rounded to whole 8-GPU servers). The
desks (virtual clusters) get nominal quotas in proportion to their GPU-time in the window.

Policies (trace_replay.policies):
- cellscale: fair share between desks, `Ordering()` defaults inside each (production's);
- cellscale-submit-order: the same tenancy with `Ordering.submit_order()` (the policy before);
- fifo: one queue, strict submit order; greedy: one queue, submit order, whatever fits starts;
- tiresias: the reference of the issue (discretized least attained service, 0.5/5/50
  GPU-hours, FIFO within a level, greedy fill, preemption costs 60 s of restart only, no fair
  share); tiresias-charged: the same, also losing the work since the last checkpoint.

Every preemption of every policy is charged `--restart-seconds` (60 s: above the 11-15 s the
recovery benchmark measures from fault to first step on the dev cluster, and the 0.1-0.7 s
checkpoint save of benchmarks/checkpoint.py) on the job's GPUs, and (except `tiresias`) the
work since its last checkpoint (one every `--checkpoint-minutes` of run).

    .venv/bin/python benchmarks/scheduling_quality.py [--quick] [--windows 25:10,40:10,60:10]
        [--loads 0.6,0.85,1.0,1.1] [--policies ...] [--out scheduling_quality]
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import print_table, ratio, scheduling_digest, write_results
from trace_replay import HOUR, cap_jobs, load_trace, nominal_quotas, offered_load, policies, replay, slice_jobs

from cellscale_hub.tenancy import SHORT_WORK_SHARE

POLICIES = "fifo,greedy,tiresias,tiresias-charged,cellscale-submit-order,cellscale"
KEYS = (
    ("jct_mean_h", "JCT mean (h)"),
    ("jct_p95_h", "JCT p95 (h)"),
    ("short_wait_p95_h", "short jobs' wait p95 (h)"),
    ("fair_gap_mean", "fair-share gap (demand-capped)"),
    ("entitled_gap_mean", "entitled-share shortfall"),
    ("lender_wait_p99_min", "lender's wait p99 (min)"),
    ("short_share_admissions", "starts on the short-work share"),
    ("preemptions", "preemptions"),
    ("lost_fraction_of_work", "lost work / work"),
    ("preemption_cost_fraction", "lost + restart / work"),
)


def fleet_for(jobs, load: float) -> int:
    """Whole 8-GPU servers whose offered load from `jobs` is closest to `load`."""
    demand = offered_load(jobs, 1)["avg_demand_gpus"]
    return max(8, round(demand / load / 8) * 8)


def run_case(trace, skip: float, days: float, load: float, names: list[str], options: dict) -> dict:
    options = dict(options)
    window = slice_jobs(trace, skip_days=skip, days=days)
    fleet = fleet_for(window, load)
    jobs, capped = cap_jobs(window, fleet)
    nominal = nominal_quotas(jobs, fleet)
    pols = policies(nominal, fleet, options.pop("short_work_share"))
    case = {
        "window": {"skip_days": skip, "days": days},
        "fleet_gpus": fleet,
        "jobs": len(jobs),
        "capped_to_fleet": capped,
        "short_jobs": sum(1 for j in jobs if j.gpus * j.duration < HOUR),
        "load": offered_load(jobs, fleet),
        "results": {},
    }
    print(
        f"\nwindow days {skip:g}-{skip + days:g}: {len(jobs)} jobs on {fleet} GPUs, "
        f"offered load {case['load']['offered_load']:.2f}",
        flush=True,
    )
    for name in names:
        t0 = time.perf_counter()
        result = replay(jobs, pols[name], fleet, nominal, **options)
        result.pop("per_tenant")
        case["results"][name] = result
        print(f"  {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    res = case["results"]
    rows = []
    for key, label in KEYS:
        row = [label, *(res[n][key] for n in names)]
        if "cellscale" in res and "fifo" in res:
            row.append(ratio(res["cellscale"][key], res["fifo"][key]))
        if "cellscale" in res and "tiresias" in res:
            row.append(ratio(res["cellscale"][key], res["tiresias"][key]))
        rows.append(row)
    extra = (["ours/fifo"] if "fifo" in res and "cellscale" in res else []) + (
        ["ours/tiresias"] if "tiresias" in res and "cellscale" in res else []
    )
    print_table(["metric", *names, *extra], rows)
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one 5-day window at loads 0.85 and 1.1")
    parser.add_argument("--windows", default="25:10,40:10,60:10", help="SKIP_DAYS:DAYS,...")
    parser.add_argument("--loads", default="0.6,0.85,1.0,1.1")
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--restart-seconds", type=float, default=60.0)
    parser.add_argument("--checkpoint-minutes", type=float, default=30.0)
    parser.add_argument(
        "--short-work-share",
        type=float,
        default=SHORT_WORK_SHARE,
        help="the cellscale policy's Cohort.short_work_share",
    )
    parser.add_argument("--out", default="scheduling_quality")
    args = parser.parse_args()
    if args.quick:
        args.windows, args.loads = "25:5", "0.85,1.1"
    windows = [tuple(float(x) for x in w.split(":")) for w in args.windows.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    names = args.policies.split(",")
    options = {
        "restart": args.restart_seconds,
        "checkpoint": args.checkpoint_minutes * 60,
        "short_work_share": args.short_work_share,
    }
    t0 = time.perf_counter()
    trace = load_trace()
    cases = [run_case(trace, skip, days, load, names, options) for skip, days in windows for load in loads]
    summary = [
        [
            f"{c['window']['skip_days']:g}+{c['window']['days']:g}d",
            c["load"]["offered_load"],
            *(
                ratio(c["results"]["cellscale"][k], c["results"][base][k])
                for base in ("fifo", "tiresias")
                for k in ("jct_mean_h", "jct_p95_h")
            ),
            c["results"]["cellscale"]["short_wait_p95_h"] * 60,
            c["results"]["cellscale"]["fair_gap_mean"],
            c["results"]["tiresias"]["fair_gap_mean"],
            c["results"]["cellscale"]["preemption_cost_fraction"],
        ]
        for c in cases
        if "cellscale" in c["results"] and "fifo" in c["results"] and "tiresias" in c["results"]
    ]
    if summary:
        print("\ncellscale against FIFO and against the Tiresias reference (ratios; < 1 is better)")
        print_table(
            [
                "window",
                "load",
                "mean/fifo",
                "p95/fifo",
                "mean/tiresias",
                "p95/tiresias",
                "short wait p95 (min)",
                "gap",
                "tiresias gap",
                "preemption cost",
            ],
            summary,
        )
    wall = time.perf_counter() - t0
    print(f"\nwall time {wall:.0f} s")
    write_results(
        args.out,
        args.quick,
        {
            "options": {**options, "windows": windows, "loads": loads},
            "scheduling_source_sha256": scheduling_digest(),
            "cases": cases,
            "wall_s": wall,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
