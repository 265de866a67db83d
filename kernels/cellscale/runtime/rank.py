"""Wrap one rank: `python -m cellscale.runtime.rank DIR N` (started by the launcher).

Runs the cell in a child process so that everything the rank writes, from Python or from
native code and subprocesses, reaches the job log as whole lines prefixed with the rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from cellscale.runtime.jobdir import JobDir, open_log
from cellscale.runtime.pump import pump_lines


def visible_devices(node_gpus: str, local_rank: int, procs_per_node: int) -> str:
    """One GPU per rank when the node has one per rank; otherwise every GPU of the node."""
    ids = [gpu for gpu in node_gpus.split(",") if gpu]
    if procs_per_node > 1 and len(ids) == procs_per_node:
        return ids[local_rank]
    return ",".join(ids)


def main(argv: list[str]) -> int:
    job, attempt = JobDir(argv[0]), int(argv[1])
    plan = job.read_plan()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    node_gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible_devices(node_gpus, local_rank, plan.procs_per_node))
    child = subprocess.Popen(
        [sys.executable, "-u", "-m", "cellscale.runtime.cell", str(job.root), str(attempt)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    job.mark_rank_started(attempt, rank)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: child.send_signal(s))
    pump = pump_lines(child.stdout, open_log(job.log), f"[rank {rank}] ")
    code = child.wait()
    pump.join()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
