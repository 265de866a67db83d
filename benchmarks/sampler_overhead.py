"""What the in-job usage meter costs a node: the CPU its sampling thread takes.

A UsageMeter (cellscale.runtime.usage) with 8 simulated GPUs meters a process tree of 8
sleeping children (`sleep`, as a node's idle ranks) from a thread that samples every
--interval seconds (the supervisor's default, CELLSCALE_USAGE_SAMPLE_S) for --seconds. The
thread's own CPU time (time.thread_time) over the wall time is its share of one core; the
cost of one sample is reported too. psutil lists a tree's processes by reading /proc, so a
sample costs more on a host with more processes: their count is in the results.

    .venv/bin/python benchmarks/sampler_overhead.py [--quick] [--seconds 60] [--interval 2.0] [--children 8]
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time

import psutil
from _common import median, print_table, write_results

from cellscale.runtime.usage import DEFAULT_SAMPLE_S, SimulatedGpus, UsageMeter

GPUS = 8


def meter_for(seconds: float, interval: float) -> tuple[UsageMeter, list[float], float]:
    """Sample every `interval` for `seconds` in a thread; the CPU seconds of each sample and of
    the whole thread."""
    meter = UsageMeter(GPUS, SimulatedGpus(GPUS, duty=0.5))
    costs: list[float] = []
    total: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        start = time.thread_time()
        while not stop.wait(interval):
            before = time.thread_time()
            meter.sample()
            costs.append(time.thread_time() - before)
        total.append(time.thread_time() - start)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    return meter, costs, total[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 s instead of --seconds")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to meter")
    parser.add_argument("--interval", type=float, default=DEFAULT_SAMPLE_S, help="seconds between samples")
    parser.add_argument("--children", type=int, default=8, help="sleeping processes to meter")
    args = parser.parse_args()
    seconds = 20.0 if args.quick else args.seconds

    children = [subprocess.Popen(["sleep", str(seconds + 60)]) for _ in range(args.children)]
    try:
        meter, costs, thread_cpu_s = meter_for(seconds, args.interval)
        tree = len(meter.root.children(recursive=True))
    finally:
        for child in children:
            child.kill()
            child.wait()
    share = thread_cpu_s / seconds
    print_table(
        ["metered", "samples", "ms/sample (median)", "ms/sample (max)", "thread CPU s", "share of a core"],
        [[f"{tree} processes", len(costs), median(costs) * 1e3, max(costs) * 1e3, thread_cpu_s, f"{share:.5%}"]],
    )
    write_results(
        "sampler_overhead",
        args.quick,
        {
            "seconds": seconds,
            "interval_s": args.interval,
            "gpus": GPUS,
            "processes_metered": tree,
            "host_processes": len(psutil.pids()),
            "samples": len(costs),
            "sample_cpu_ms_median": median(costs) * 1e3,
            "sample_cpu_ms_max": max(costs) * 1e3,
            "thread_cpu_s": thread_cpu_s,
            "cpu_share": share,
        },
    )


if __name__ == "__main__":
    main()
