"""Wrap one rank: `python -m cellscale.runtime.rank DIR N` (started by the launcher).

The rank forks: the child runs the cell (`cellscale.runtime.cell`) with its stdout and
stderr on a pipe, and this process appends each line from that pipe to the job log,
prefixed with the rank. So everything the rank writes, from Python or from native code
and subprocesses, reaches the log as whole lines, and the lines a cell wrote just before
it crashed (a segfault, a SIGKILL) are still read. A fork rather than a new interpreter:
the cell starts without a second Python start-up and its imports.
"""

from __future__ import annotations

import os
import signal
import sys

from cellscale.runtime import cell
from cellscale.runtime.jobdir import JobDir, open_log
from cellscale.runtime.pump import pump_lines

FORWARDED = (signal.SIGTERM, signal.SIGINT)


def visible_devices(node_gpus: str, local_rank: int, procs_per_node: int) -> str:
    """One GPU per rank when the node has one per rank; otherwise every GPU of the node."""
    ids = [gpu for gpu in node_gpus.split(",") if gpu]
    if procs_per_node > 1 and len(ids) == procs_per_node:
        return ids[local_rank]
    return ",".join(ids)


def main(argv: list[str]) -> int:
    job, attempt = JobDir(argv[0]), int(argv[1])
    plan = job.read_plan_fields()
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    node_gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices(node_gpus, local_rank, plan["procs_per_node"])
    read_end, write_end = os.pipe()
    pid = os.fork()  # before any thread starts: the child is this process, single-threaded
    if pid == 0:
        os.close(read_end)
        _output_to(write_end)
        return cell.run(job, attempt, plan)  # then the interpreter's normal exit (atexit, threads, flush)
    os.close(write_end)
    job.mark_rank_started(attempt, rank)
    for signum in FORWARDED:
        signal.signal(signum, lambda s, _f: os.kill(pid, s))
    pump = pump_lines(os.fdopen(read_end, "rb"), open_log(job.log), f"[rank {rank}] ")
    status = os.waitpid(pid, 0)[1]
    for signum in FORWARDED:  # the cell is reaped: nothing to forward to, and its pid may be reused
        signal.signal(signum, signal.SIG_IGN)
    pump.join()  # until every process that holds the pipe (the cell's own children too) has closed it
    return os.waitstatus_to_exitcode(status)


def _output_to(pipe: int) -> None:
    """The cell's stdin is empty and its stdout and stderr go to the pipe, for its own
    children too (they inherit the descriptors)."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(pipe, 1)
    os.dup2(pipe, 2)
    os.close(pipe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
