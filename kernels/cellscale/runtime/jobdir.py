"""The job directory: the channel between the control plane and a running job.

Like submitit's shared folder, each job owns a directory on storage that both the control
plane and every node can read (local disk for the local backend, the cluster's shared
filesystem for Slurm). The control plane writes the launch plan and the inputs; the
runtime appends rank-prefixed logs, heartbeats, the exit record and rank 0's outputs.
Nothing in it is unpickled by the control plane.

    <job>/plan.json             LaunchPlan for the current attempt
    <job>/cell.py               the cell's source
    <job>/inputs.pkl            pickled notebook variables (opaque to the control plane)
    <job>/output.log            every attempt's rank-prefixed lines, appended
    <job>/result.pkl            rank 0's named outputs
    <job>/attempts/<n>/node<k>/lock     flock held by node k's supervisor while it lives
    <job>/attempts/<n>/node<k>/started  written by that supervisor once it holds the lock
    <job>/attempts/<n>/node<k>/heartbeat.json
    <job>/attempts/<n>/node<k>/exit.json
    <job>/attempts/<n>/ranks/<rank>     one empty file per rank that has started the cell
    <job>/attempts/<n>/error.json       the first failing rank's exception
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from pydantic import BaseModel, Field

from cellscale.spec import Launcher


class LaunchPlan(BaseModel):
    """What the runtime needs to start one attempt on its nodes."""

    job_id: str
    attempt: int
    launcher: Launcher
    nodes: int
    gpus_per_node: int
    procs_per_node: int
    gpu_ids: list[int] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    input_names: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = 3600.0
    master_addr: str | None = Field(None, description="Address of node 0; None: the first host Slurm allocated.")
    master_port: int | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def expected_ranks(self) -> int:
        """How many rank processes run the cell: one per GPU for torchrun, one per node for plain,
        one driver for Ray."""
        if self.launcher is Launcher.ray:
            return 1
        return self.nodes * self.procs_per_node


class ExitRecord(BaseModel):
    code: int
    reason: str
    message: str | None = None


class JobDir:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    plan = property(lambda self: self.root / "plan.json")
    cell = property(lambda self: self.root / "cell.py")
    inputs = property(lambda self: self.root / "inputs.pkl")
    log = property(lambda self: self.root / "output.log")
    result = property(lambda self: self.root / "result.pkl")

    def attempt_dir(self, attempt: int) -> Path:
        return self.root / "attempts" / str(attempt)

    def node_dir(self, attempt: int, node: int = 0) -> Path:
        """Where the supervisor of one node of an attempt keeps its lock, heartbeat and exit record."""
        return self.attempt_dir(attempt) / f"node{node}"

    def read_plan(self) -> LaunchPlan:
        return LaunchPlan.model_validate_json(self.plan.read_text())

    def write_plan(self, plan: LaunchPlan) -> None:
        write_atomic(self.plan, plan.model_dump_json(indent=1).encode())

    def read_exit(self, attempt: int, node: int = 0) -> ExitRecord | None:
        try:
            return ExitRecord.model_validate_json((self.node_dir(attempt, node) / "exit.json").read_text())
        except FileNotFoundError:
            return None

    def write_exit(self, attempt: int, node: int, record: ExitRecord) -> None:
        write_atomic(self.node_dir(attempt, node) / "exit.json", record.model_dump_json().encode())

    def read_heartbeat(self, attempt: int, node: int = 0) -> dict | None:
        try:
            return json.loads((self.node_dir(attempt, node) / "heartbeat.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def preempt_notice(self, attempt: int) -> Path:
        """Exists once the attempt was warned of preemption (any node's supervisor writes it)."""
        return self.attempt_dir(attempt) / "preempt-notice"

    def checkpoints_log(self, attempt: int) -> Path:
        """cellscale.checkpoint's notifier appends one JSON line per committed checkpoint."""
        return self.attempt_dir(attempt) / "checkpoints.jsonl"

    def read_checkpoints(self, attempt: int) -> list[dict]:
        """The checkpoints rank 0 committed in this attempt, oldest first."""
        return read_jsonl(self.checkpoints_log(attempt))

    def latest_checkpoint(self, attempt: int) -> dict | None:
        """The newest committed checkpoint, from the log's tail only: the control plane asks
        every cycle, and the log grows with the job."""
        try:
            with open(self.checkpoints_log(attempt), "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
                tail = log.read().decode(errors="replace").splitlines()
        except OSError:
            return None
        for line in reversed(tail):
            try:
                return json.loads(line)
            except ValueError:
                continue  # torn (being written), or cut by the seek
        return None

    def resume_report(self, attempt: int) -> Path:
        """What the attempt resumed from (written once by cellscale.checkpoint on rank 0)."""
        return self.attempt_dir(attempt) / "resume.json"

    def read_resume(self, attempt: int) -> dict | None:
        try:
            return json.loads(self.resume_report(attempt).read_text())
        except (OSError, ValueError):
            return None

    def progress(self, attempt: int) -> Path:
        """Rank 0's last reported training step (JobEnvironment.report_step)."""
        return self.attempt_dir(attempt) / "progress.json"

    def read_step(self, attempt: int) -> int | None:
        try:
            return json.loads(self.progress(attempt).read_text())["step"]
        except (OSError, ValueError, KeyError):
            return None

    def read_error(self, attempt: int) -> dict | None:
        try:
            return json.loads((self.attempt_dir(attempt) / "error.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def mark_rank_started(self, attempt: int, rank: int) -> None:
        ranks = self.attempt_dir(attempt) / "ranks"
        ranks.mkdir(exist_ok=True)
        (ranks / str(rank)).touch()

    def ranks_started(self, attempt: int) -> int:
        try:
            return sum(1 for _ in (self.attempt_dir(attempt) / "ranks").iterdir())
        except FileNotFoundError:
            return 0

    def started(self, attempt: int, node: int = 0) -> dict | None:
        """What the node's supervisor wrote when it took the attempt (pid, host), or None."""
        try:
            return json.loads((self.node_dir(attempt, node) / "started").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def supervisor_alive(self, attempt: int, node: int = 0) -> bool:
        """True while a supervisor holds the node's lock (the kernel drops it on death)."""
        lock = self.node_dir(attempt, node) / "lock"
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


def read_jsonl(path: Path) -> list[dict]:
    """One JSON value per line, oldest first; a torn line (being written) is skipped."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so readers see either nothing or all of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def append_line(fd: int, prefix: bytes, line: bytes) -> None:
    """Append one prefixed line with a single write (O_APPEND keeps ranks' lines whole)."""
    if not line.endswith(b"\n"):
        line += b"\n"
    os.write(fd, prefix + line)


def open_log(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
