"""Run one attempt of a job on one node: `python -m cellscale.runtime.supervisor DIR N`.

The supervisor holds the attempt's lock for as long as it lives (so the control plane can
tell a live attempt from a dead one even after its own restart), starts the launcher,
writes heartbeats, enforces the time limit, forwards cancellation, and writes the exit
record that the control plane reads.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from cellscale.runtime import raycluster
from cellscale.runtime.jobdir import ExitRecord, JobDir, LaunchPlan, open_log, write_atomic
from cellscale.runtime.pump import pump_lines
from cellscale.spec import Launcher

HEARTBEAT_SECONDS = 2.0
GRACE_SECONDS = 10.0


def launcher_argv(plan: LaunchPlan, job: JobDir) -> list[str]:
    rank = [sys.executable, "-m", "cellscale.runtime.rank", str(job.root), str(plan.attempt)]
    if plan.launcher is Launcher.torchrun:
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--standalone", "--nnodes=1", f"--nproc-per-node={plan.procs_per_node}",
            "--max-restarts=0", "--monitor-interval=0.1",
            *rank[1:],
        ]
    return rank


class Supervisor:
    def __init__(self, job: JobDir, attempt: int):
        self.job = job
        self.attempt = attempt
        self.dir = job.attempt_dir(attempt)
        self.plan = job.read_plan()
        self.child: subprocess.Popen[bytes] | None = None
        self.stop_reason: str | None = None
        self.done = threading.Event()

    def run(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o640)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # held until this process ends
        if self.job.read_exit(self.attempt) is not None or (self.dir / "started").exists():
            return 0  # this attempt already ran: never run it twice
        write_atomic(self.dir / "started", json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        log_fd = open_log(self.job.log)
        os.write(log_fd, f"[cellscale] attempt {self.attempt} starting on {socket.gethostname()}\n".encode())
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        threading.Thread(target=self._heartbeat, daemon=True).start()
        try:
            record = self._launch(log_fd)
        except Exception as exc:  # the launcher could not start: an infrastructure fault
            record = ExitRecord(code=127, reason="launch_failed", message=f"{type(exc).__name__}: {exc}")
        self.done.set()
        os.write(log_fd, f"[cellscale] attempt {self.attempt} ended: {record.reason} (exit {record.code})\n".encode())
        self.job.write_exit(self.attempt, record)
        return record.code

    def _launch(self, log_fd: int) -> ExitRecord:
        env = self._environment()
        with raycluster.head_if(self.plan, self.dir, env, log_fd):
            self.child = subprocess.Popen(
                launcher_argv(self.plan, self.job), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )
            pump = pump_lines(self.child.stdout, log_fd, "[launcher] ")
            try:
                code = self.child.wait(timeout=self.plan.timeout_min * 60)
            except subprocess.TimeoutExpired:
                self.stop_reason = "timeout"
                self._terminate()
                code = self.child.wait()
            pump.join(timeout=5)
        return self._record(code)

    def _record(self, code: int) -> ExitRecord:
        if self.stop_reason == "timeout":
            return ExitRecord(code=code, reason="timeout", message=f"ran past --time {self.plan.timeout_min} min")
        if self.stop_reason == "cancelled":
            return ExitRecord(code=code, reason="cancelled")
        if code == 0:
            return ExitRecord(code=0, reason="succeeded")
        error = _read_json(self.dir / "error.json")
        if error:
            return ExitRecord(code=code, reason="user_error", message=error.get("summary"))
        return ExitRecord(code=code, reason="failed", message=f"a rank exited with status {code}")

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.plan.env)
        env.update(
            CELLSCALE_JOB_ID=self.plan.job_id,
            CELLSCALE_ATTEMPT=str(self.attempt),
            CELLSCALE_GPU_IDS=",".join(map(str, self.plan.gpu_ids)),
            CUDA_VISIBLE_DEVICES=",".join(map(str, self.plan.gpu_ids)),
            PYTHONUNBUFFERED="1",
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stop_reason = self.stop_reason or "cancelled"
        threading.Thread(target=self._terminate, daemon=True).start()

    def _terminate(self) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        _killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _killpg(child.pid, signal.SIGKILL)

    def _heartbeat(self) -> None:
        path = self.dir / "heartbeat.json"
        while not self.done.is_set():
            write_atomic(path, json.dumps({"at": time.time(), "pid": os.getpid()}).encode())
            self.done.wait(HEARTBEAT_SECONDS)


def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m cellscale.runtime.supervisor JOB_DIR ATTEMPT", file=sys.stderr)
        return 2
    return Supervisor(JobDir(argv[0]), int(argv[1])).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
