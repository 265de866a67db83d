"""Cloud burst on the dev topology: how long a gang waits for powered-down CLOUD nodes, and
how soon they power down again (`dev.slurm up --sites`: dca's partition burst, Slurm's own
power saving, the cloud simulation booting each node's slurmd after its boot delay).

Each run, on an idle burst partition (every cloud node `idle~`): `runuser -u alice -- sbatch
-p burst -N2 --gres=gpu:8` of a script that prints its start time, `srun`s one rank per node
(each prints its node and time), sleeps 1 s and prints its end time. Measured:
- submit -> batch script start, and submit -> every rank running (the latest rank's time),
  against the goal boot delay + 35 s (the 30 s PERIODIC_TIMEOUT launch delay of 22.05 that
  the PrologSlurmctld removes, plus 5 s);
- job end -> both nodes powered down (`idle~`, sinfo polled every 0.25 s), against
  SuspendTime + SuspendTimeout (+ 2 s of Slurm's 1 s power-save loop);
- what the simulated cloud billed per instance (seconds, $).
Only with the PrologSlurmctld (the dev config always has it; the spike measured 6.5-32.7 s
without it at a 3 s boot delay, docs/sites.md). N runs (3, --quick 1).

    .venv/bin/python benchmarks/burst.py [--quick] [--runs N] [--boot-delay S]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import median, print_table, ratio, write_results  # noqa: E402
from cellscale_hub.dev import cloud as dev_cloud  # noqa: E402
from cellscale_hub.dev import slurm as dev_slurm  # noqa: E402

SCRIPT = (
    "echo START $(date +%s.%N); "
    'srun -l bash -c "echo RANK \\$SLURMD_NODENAME \\$(date +%s.%N)"; '
    "sleep 1; echo END $(date +%s.%N)"
)


def sh(argv: list[str], env: dict[str, str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=60).stdout


def states(env: dict[str, str], nodes: list[str]) -> dict[str, str]:
    out = sh(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t"], env)
    return dict(line.split() for line in out.splitlines() if line.strip())


def wait_powered_down(env, nodes, timeout=120.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(s == "idle~" for s in states(env, nodes).values()):
            return time.time()
        time.sleep(0.25)
    raise TimeoutError(nodes)


def one_run(cluster: dev_slurm.Cluster, env: dict[str, str]) -> dict:
    wait_powered_down(env, list(dev_slurm.CLOUD_NODES))
    jobs = cluster.jobs_dir
    submitted = time.time()
    out = sh(
        [
            *("runuser", "-u", "alice", "--", "sbatch", "--parsable", "-p", dev_slurm.BURST_PARTITION),
            *("-N2", "--ntasks-per-node=1", "--gres=gpu:8", "-A", "desk-a", "--time=5"),
            *(f"--chdir={jobs}", f"--output={jobs}/burst-%j.out", "--wrap", SCRIPT),
        ],
        env,
    )
    job = out.strip().split(";")[0]
    while sh(["squeue", "-h", "-j", job, "-o", "%T"], env).strip():
        time.sleep(0.25)
    text = (jobs / f"burst-{job}.out").read_text()
    lines = [line.split(": ", 1)[-1].split() for line in text.splitlines()]
    start = next(float(f[1]) for f in lines if f and f[0] == "START")
    end = next(float(f[1]) for f in lines if f and f[0] == "END")
    ranks = {f[1]: float(f[2]) for f in lines if f and f[0] == "RANK"}
    down = wait_powered_down(env, sorted(ranks))
    return {
        "job": job,
        "nodes": sorted(ranks),
        "submit_to_batch_s": round(start - submitted, 2),
        "submit_to_all_ranks_s": round(max(ranks.values()) - submitted, 2),
        "end_to_powered_down_s": round(down - end, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int)
    parser.add_argument("--boot-delay", type=float, default=dev_slurm.BOOT_DELAY)
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    state_dir = Path(os.environ.get("CELLSCALE_SLURM_STATE_DIR", dev_slurm.DEFAULT_STATE_DIR))
    cluster = dev_slurm.up(state_dir, sites=True, log=lambda line: None)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, **cluster.env}
    cloud = dev_cloud.CloudClient(state_dir)
    cloud.mode("ok", delay=args.boot_delay)
    billed_before = len(cloud.ledger()["instances"])
    results = []
    try:
        for i in range(runs):
            results.append(one_run(cluster, env))
            print(f"run {i + 1}/{runs}: {results[-1]}", flush=True)
    finally:
        cloud.mode("ok", delay=dev_slurm.BOOT_DELAY)
    instances = cloud.ledger()["instances"][billed_before:]
    goal_start = args.boot_delay + 35
    goal_down = dev_slurm.SUSPEND_TIME + dev_slurm.SUSPEND_TIMEOUT + 2
    start = median([r["submit_to_all_ranks_s"] for r in results])
    down = median([r["end_to_powered_down_s"] for r in results])
    print_table(
        ["measure", "median s", "max s", "goal s", "median / goal"],
        [
            [
                "submit -> batch start",
                median([r["submit_to_batch_s"] for r in results]),
                max(r["submit_to_batch_s"] for r in results),
                goal_start,
                ratio(median([r["submit_to_batch_s"] for r in results]), goal_start),
            ],
            [
                "submit -> all ranks",
                start,
                max(r["submit_to_all_ranks_s"] for r in results),
                goal_start,
                ratio(start, goal_start),
            ],
            [
                "job end -> idle~",
                down,
                max(r["end_to_powered_down_s"] for r in results),
                goal_down,
                ratio(down, goal_down),
            ],
        ],
    )
    print(f"boot delay {args.boot_delay} s: submit -> all ranks is {ratio(start, args.boot_delay):.2f}x the boot delay")
    seconds, dollars = sum(i["billed_s"] for i in instances), sum(i["dollars"] for i in instances)
    print(f"billed: {len(instances)} instances, {seconds} s, ${dollars:.4f}")
    write_results(
        "burst",
        args.quick,
        {
            "boot_delay_s": args.boot_delay,
            "prolog_slurmctld": True,
            "goal_start_s": goal_start,
            "goal_powered_down_s": goal_down,
            "runs": results,
            "median_submit_to_all_ranks_s": start,
            "median_end_to_powered_down_s": down,
            "billed": [{k: i[k] for k in ("node", "gpus", "billed_s", "dollars", "end")} for i in instances],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
