"""Execute the cell in one rank, in the process `cellscale.runtime.rank` forks for it.

This is the only place where the job's inputs are unpickled: inside the job's own
sandbox, never in the control plane. Nothing here imports pydantic or cloudpickle before
the cell runs: the cell starts as soon as the rank does.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from typing import Any

from cellscale.runtime.environment import EXIT_PREEMPTED, Preempted
from cellscale.runtime.ioprofile import profiled
from cellscale.runtime.jobdir import JobDir


def load_namespace(job: JobDir, names: list[str]) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "__main__"}
    if names:
        with open(job.inputs, "rb") as handle:
            namespace.update(pickle.load(handle))
    return namespace


def save_outputs(job: JobDir, namespace: dict[str, object], names: list[str]) -> None:
    import cloudpickle

    missing = [name for name in names if name not in namespace]
    if missing:
        raise NameError(f"--outputs names {', '.join(missing)}, which the cell never defined")
    job.write_result(cloudpickle.dumps({name: namespace[name] for name in names}))


# What a collective raises on the survivors when a peer rank dies: a consequence of someone
# else's fault, not an error in the cell.
PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote process exited",
    "NCCL communicator was aborted",
    "Broken pipe",
)


def lost_a_peer(exc: BaseException) -> bool:
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    kinds = tuple(k for k in (getattr(dist, "DistNetworkError", None), getattr(dist, "DistBackendError", None)) if k)
    return (bool(kinds) and isinstance(exc, kinds)) or any(marker in str(exc) for marker in PEER_LOST)


def record_error(job: JobDir, attempt: int, exc: BaseException) -> None:
    """The first failing rank explains the failure, except that an error in the cell
    replaces a survivor's report of a lost peer (it says more)."""
    from cellscale.runtime.records import RankError

    rank = os.environ.get("RANK", "0")
    kind = "peer_lost" if lost_a_peer(exc) else "exception"
    earlier = job.read_error(attempt)
    if earlier is None or (earlier.peer_lost and kind == "exception"):
        summary = f"rank {rank}: {type(exc).__name__}: {exc}"
        job.write_error(attempt, RankError(rank=int(rank), summary=summary, kind=kind))


def run(job: JobDir, attempt: int, plan: dict[str, Any]) -> int:
    """Run the cell (`plan`: plan.json's fields); the rank's exit status."""
    try:
        namespace = load_namespace(job, plan["input_names"])
        code = compile(job.cell.read_text(), str(job.cell), "exec")
        with profiled(job, attempt):  # this rank's I/O profile, however the cell ends
            exec(code, namespace)  # noqa: S102 - running the user's cell is this module's purpose
        if os.environ.get("RANK", "0") == "0":
            save_outputs(job, namespace, plan["outputs"])
    except Preempted:
        print(f"[cellscale] rank {os.environ.get('RANK', '0')} stopped for preemption", flush=True)
        return EXIT_PREEMPTED
    except BaseException as exc:  # noqa: BLE001 - every failure of user code is reported
        traceback.print_exception(exc.__class__, exc, _user_frames(exc.__traceback__))
        record_error(job, attempt, exc)
        return 1
    return 0


def _user_frames(tb):
    """Drop this module's own frames so the traceback starts in the cell."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb
