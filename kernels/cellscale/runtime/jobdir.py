"""The job directory: the channel between the control plane and a running job.

Like submitit's shared folder, each job owns a directory on storage that both the control
plane and every node can read (local disk for the local backend, the cluster's shared
filesystem for Slurm). The control plane writes the launch plan and the inputs; the
runtime appends rank-prefixed logs, heartbeats, the exit record and rank 0's outputs.
Nothing in it is unpickled by the control plane. `JobDir` is the one owner of its paths and
formats (records in `cellscale.runtime.records`): every reader and writer goes through it.

    <job>/plan.json             LaunchPlan for the current attempt
    <job>/cell.py               the cell's source
    <job>/inputs.pkl            pickled notebook variables (opaque to the control plane)
    <job>/output.log            every attempt's rank-prefixed lines, appended
    <job>/result.pkl            rank 0's named outputs
    <job>/result.key            the secret the outputs are signed with (from the submitting kernel)
    <job>/result.tag            HMAC-SHA256 of result.pkl under that key: the kernel checks it
    <job>/attempts/<n>/node<k>/lock     flock held by node k's supervisor while it lives
    <job>/attempts/<n>/node<k>/started  Started, written by that supervisor once it holds the lock
    <job>/attempts/<n>/node<k>/heartbeat.json   Heartbeat
    <job>/attempts/<n>/node<k>/exit.json        ExitRecord
    <job>/attempts/<n>/node<k>/usage.json       NodeUsage: what the node used, so far
    <job>/attempts/<n>/node<k>/stage.json       StageRecord list: the datasets the node staged
    <job>/attempts/<n>/ranks/<rank>     one empty file per rank that has started the cell
    <job>/attempts/<n>/io/rank<r>.json  RankIoProfile: what rank r read over its cell's run
    <job>/attempts/<n>/error.json       RankError: the first failing rank's exception
    <job>/attempts/<n>/progress.json    Progress: rank 0's last reported step
    <job>/attempts/<n>/preempt-notice   PreemptNotice: warned of preemption
    <job>/attempts/<n>/checkpoints.jsonl  one Checkpoint per line, as rank 0 commits them
    <job>/attempts/<n>/resume.json      ResumeReport: what the attempt resumed from
    <job>/attempts/<n>/ray-done         node 0's Ray cell ended (worker nodes leave)
    <job>/staging/plan.json             StagePlan: datasets to copy to the nodes it will start on
    <job>/staging/<node>.json           StageProgress: that node's copying, as bytes land
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from types import ModuleType

    from pydantic import BaseModel

    from cellscale.runtime.records import (
        Checkpoint,
        ExitRecord,
        Heartbeat,
        LaunchPlan,
        NodeUsage,
        PreemptNotice,
        Progress,
        RankError,
        RankIoProfile,
        ResumeReport,
        StagePlan,
        StageProgress,
        StageRecord,
        Started,
    )

R = TypeVar("R", bound="BaseModel")
CHECKPOINT_TAIL_BYTES = 4096


def _records() -> ModuleType:
    """The record models, imported on first use: pydantic takes ~0.1 s to import, and a rank
    starts its cell without reading or writing a record (`read_plan_fields`)."""
    from cellscale.runtime import records

    return records


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

    # -- written by the control plane --------------------------------------------------------
    def prepare(
        self, attempt: int, source: str, plan: LaunchPlan, bundle: Path | None, result_key: str | None = None
    ) -> None:
        """Write what an attempt's runtime reads. Re-running it for the same attempt is harmless."""
        self.attempt_dir(attempt).mkdir(parents=True, exist_ok=True)
        write_atomic(self.cell, source.encode())
        if result_key is not None:
            write_atomic(self.result_key_file, result_key.encode(), mode=0o600)
        if bundle is not None and not self.inputs.exists():
            shutil.copyfile(bundle, self.inputs)
        self.write_plan(plan)

    def read_plan(self) -> LaunchPlan:
        return _records().LaunchPlan.model_validate_json(self.plan.read_text())

    def write_plan(self, plan: LaunchPlan) -> None:
        write_atomic(self.plan, plan.model_dump_json(indent=1).encode())

    def read_plan_fields(self) -> dict[str, Any]:
        """plan.json as plain JSON (a LaunchPlan's fields by name), for a rank: the control
        plane wrote it from a validated LaunchPlan, and the cell should not wait for pydantic."""
        return json.loads(self.plan.read_bytes())

    # -- staging ahead: written by the control plane (the plan) and each node's stager -------
    staging = property(lambda self: self.root / "staging")

    def read_stage_plan(self) -> StagePlan | None:
        return _read(self.staging / "plan.json", _records().StagePlan)

    def write_stage_plan(self, plan: StagePlan) -> None:
        """Private to the job's owner (it holds the job's --env: the source's credentials)."""
        self.staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(self.staging / "plan.json", plan.model_dump_json().encode(), mode=0o600)

    def write_stage_progress(self, progress: StageProgress) -> None:
        _write(self.staging / f"{progress.node}.json", progress)

    def read_stage_progress(self, nodes: list[str]) -> dict[str, StageProgress]:
        """Each node's staging progress, for the nodes that have written one."""
        found = {node: _read(self.staging / f"{node}.json", _records().StageProgress) for node in nodes}
        return {node: progress for node, progress in found.items() if progress is not None}

    # -- written by each node's supervisor ---------------------------------------------------
    def read_started(self, attempt: int, node: int = 0) -> Started | None:
        """What the node's supervisor wrote when it took the attempt (pid, host), or None."""
        return _read(self.node_dir(attempt, node) / "started", _records().Started)

    def write_started(self, attempt: int, node: int, record: Started) -> None:
        _write(self.node_dir(attempt, node) / "started", record)

    def read_heartbeat(self, attempt: int, node: int = 0) -> Heartbeat | None:
        return _read(self.node_dir(attempt, node) / "heartbeat.json", _records().Heartbeat)

    def write_heartbeat(self, attempt: int, node: int, beat: Heartbeat) -> None:
        _write(self.node_dir(attempt, node) / "heartbeat.json", beat)

    def read_exit(self, attempt: int, node: int = 0) -> ExitRecord | None:
        return _read(self.node_dir(attempt, node) / "exit.json", _records().ExitRecord)

    def write_exit(self, attempt: int, node: int, record: ExitRecord) -> None:
        _write(self.node_dir(attempt, node) / "exit.json", record)

    def read_usage(self, attempt: int, node: int = 0) -> NodeUsage | None:
        return _read(self.node_dir(attempt, node) / "usage.json", _records().NodeUsage)

    def write_usage(self, attempt: int, node: int, usage: NodeUsage) -> None:
        _write(self.node_dir(attempt, node) / "usage.json", usage)

    def read_stage(self, attempt: int, node: int = 0) -> list[StageRecord]:
        """The datasets the node staged for the attempt ([]: none, or not written yet)."""
        try:
            lines = json.loads((self.node_dir(attempt, node) / "stage.json").read_bytes())
            return [_records().StageRecord.model_validate(line) for line in lines]
        except (OSError, ValueError):  # a pydantic ValidationError is a ValueError
            return []

    def write_stage(self, attempt: int, node: int, records: list[StageRecord]) -> None:
        data = json.dumps([record.model_dump(mode="json") for record in records])
        write_atomic(self.node_dir(attempt, node) / "stage.json", data.encode())

    def process_log(self, attempt: int, node: int, process: str) -> Path:
        """The own output of a helper process on a node (the supervisor as the local backend
        starts it, a Ray node): kept for debugging, never streamed to the user."""
        return self.node_dir(attempt, node) / f"{process}.log"

    def lock_file(self, attempt: int, node: int = 0) -> Path:
        return self.node_dir(attempt, node) / "lock"

    def supervisor_alive(self, attempt: int, node: int = 0) -> bool:
        """True while a supervisor holds the node's lock (the kernel drops it on death)."""
        return lock_held(self.lock_file(attempt, node))

    def preempt_notice(self, attempt: int) -> Path:
        return self.attempt_dir(attempt) / "preempt-notice"

    def read_preempt_notice(self, attempt: int) -> PreemptNotice | None:
        return _read(self.preempt_notice(attempt), _records().PreemptNotice)

    def write_preempt_notice(self, attempt: int, notice: PreemptNotice) -> None:
        _write(self.preempt_notice(attempt), notice)

    def preempt_requested(self, attempt: int) -> bool:
        """The attempt was warned of preemption (a stat: cheap enough for every step)."""
        return self.preempt_notice(attempt).exists()

    def gate(self, attempt: int) -> Path:
        return self.attempt_dir(attempt) / "gate"

    def pass_gate(self, attempt: int, claim: str) -> str:
        """Claim the attempt for `claim` ("started": a node's supervisor; "fenced": the control
        plane moved it elsewhere), unless it is claimed already; returns the claim that holds.
        The first claim wins, atomically (a hard link fails if the gate exists, on NFS too):
        an attempt the control plane fenced never starts, and one that started is never fenced."""
        gate = self.gate(attempt)
        tmp = gate.with_name(f"gate.{claim}.{os.getpid()}.{secrets.token_hex(4)}")
        tmp.write_text(claim)
        try:
            os.link(tmp, gate)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        return gate.read_text()

    def ray_done(self, attempt: int) -> Path:
        """Exists once node 0's Ray cell ended: the worker nodes leave the Ray cluster."""
        return self.attempt_dir(attempt) / "ray-done"

    # -- written by the ranks ------------------------------------------------------------------
    def mark_rank_started(self, attempt: int, rank: int) -> None:
        ranks = self.attempt_dir(attempt) / "ranks"
        ranks.mkdir(exist_ok=True)
        (ranks / str(rank)).touch()

    def ranks_started(self, attempt: int) -> int:
        try:
            return sum(1 for _ in (self.attempt_dir(attempt) / "ranks").iterdir())
        except FileNotFoundError:
            return 0

    def read_error(self, attempt: int) -> RankError | None:
        return _read(self.attempt_dir(attempt) / "error.json", _records().RankError)

    def write_error(self, attempt: int, error: RankError) -> None:
        _write(self.attempt_dir(attempt) / "error.json", error)

    def io_dir(self, attempt: int) -> Path:
        return self.attempt_dir(attempt) / "io"

    def write_io(self, attempt: int, profile: RankIoProfile) -> None:
        self.io_dir(attempt).mkdir(exist_ok=True)
        _write(self.io_dir(attempt) / f"rank{profile.rank}.json", profile)

    def read_io(self, attempt: int) -> list[RankIoProfile]:
        """The I/O profiles the attempt's ranks wrote so far, by rank (a rank writes its own when its cell ends)."""
        paths = self.io_dir(attempt).glob("rank*.json")
        profiles = [p for p in (_read(path, _records().RankIoProfile) for path in paths) if p is not None]
        return sorted(profiles, key=lambda p: p.rank)

    def read_progress(self, attempt: int) -> Progress | None:
        return _read(self.attempt_dir(attempt) / "progress.json", _records().Progress)

    def write_progress(self, attempt: int, progress: Progress) -> None:
        _write(self.attempt_dir(attempt) / "progress.json", progress)

    def read_step(self, attempt: int) -> int | None:
        progress = self.read_progress(attempt)
        return progress.step if progress else None

    result_key_file = property(lambda self: self.root / "result.key")
    result_tag_file = property(lambda self: self.root / "result.tag")

    def write_result(self, data: bytes) -> None:
        """Rank 0's pickled outputs, signed with the job's result key when it has one."""
        try:
            key = self.result_key_file.read_bytes()
        except FileNotFoundError:
            key = None
        if key is not None:
            write_atomic(self.result_tag_file, sign(key, data).encode())
        write_atomic(self.result, data)

    def has_result(self) -> bool:
        return self.result.exists()

    def read_result_tag(self) -> str | None:
        try:
            return self.result_tag_file.read_text().strip()
        except FileNotFoundError:
            return None

    # -- written by cellscale.checkpoint on rank 0 ---------------------------------------------
    def checkpoints_log(self, attempt: int) -> Path:
        return self.attempt_dir(attempt) / "checkpoints.jsonl"

    def append_checkpoint(self, attempt: int, checkpoint: Checkpoint) -> None:
        path = self.checkpoints_log(attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_log(path)
        try:
            append_line(fd, b"", checkpoint.model_dump_json(exclude={"verified"}).encode())
        finally:
            os.close(fd)

    def read_checkpoints(self, attempt: int) -> list[Checkpoint]:
        """The checkpoints rank 0 committed in this attempt, oldest first."""
        try:
            lines = self.checkpoints_log(attempt).read_bytes().splitlines()
        except OSError:
            return []
        return [c for c in map(_checkpoint_line, lines) if c is not None]

    def latest_checkpoint(self, attempt: int) -> Checkpoint | None:
        """The newest committed checkpoint, from the log's tail only: the control plane asks
        every cycle, and the log grows with the job."""
        try:
            with open(self.checkpoints_log(attempt), "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - CHECKPOINT_TAIL_BYTES))
                tail = log.read().splitlines()
        except OSError:
            return None
        return next((c for c in map(_checkpoint_line, reversed(tail)) if c is not None), None)

    def read_resume(self, attempt: int) -> ResumeReport | None:
        return _read(self.attempt_dir(attempt) / "resume.json", _records().ResumeReport)

    def write_resume(self, attempt: int, report: ResumeReport) -> None:
        _write(self.attempt_dir(attempt) / "resume.json", report)

    # -- the combined log -----------------------------------------------------------------------
    def read_log(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole lines from `offset` (a partial last line waits for its newline, unless one line
        is longer than `max_bytes`), and the log's size."""
        try:
            with open(self.log, "rb") as handle:
                handle.seek(offset)
                data = handle.read(max_bytes)
                size = handle.seek(0, os.SEEK_END)
        except FileNotFoundError:
            return b"", 0
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < max_bytes:
            return b"", size
        return (data[:cut] if cut else data), size


def _read(path: Path, record: type[R]) -> R | None:
    """A record, or None when the file is absent or not (yet) whole."""
    from pydantic import ValidationError  # loaded with the record's class

    try:
        return record.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def _write(path: Path, record: BaseModel) -> None:
    write_atomic(path, record.model_dump_json().encode())


def _checkpoint_line(line: bytes) -> Checkpoint | None:
    """One line of checkpoints.jsonl; a torn line (being written, or cut by a seek) is None."""
    from pydantic import ValidationError  # loaded with the record's class

    try:
        return _records().Checkpoint.model_validate_json(line)
    except ValidationError:
        return None


def lock_held(path: Path) -> bool:
    """True while a process holds an flock on `path` (the kernel drops it when the process dies)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def sign(key: bytes, data: bytes) -> str:
    """The tag of a job's outputs: HMAC-SHA256 under the key its kernel chose (hex)."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def write_atomic(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Write a file so readers see either nothing or all of it (`mode`, less the umask)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as handle:
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
