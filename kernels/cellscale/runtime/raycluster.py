"""A private Ray head for one attempt of a `--launcher ray` job.

The cell is the Ray driver: it calls `ray.init()` and finds this head through RAY_ADDRESS.
The head gets its own temp dir and ports, and is stopped by process group (never with
`ray stop`, which kills every Ray process on the machine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from cellscale.runtime.jobdir import LaunchPlan
from cellscale.spec import Launcher

START_TIMEOUT_SECONDS = 90


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def head_argv(plan: LaunchPlan, temp_dir: str, port: int) -> list[str]:
    ray = str(Path(sys.executable).with_name("ray"))
    ports = {name: free_port() for name in (
        "ray-client-server-port", "node-manager-port", "object-manager-port",
        "dashboard-agent-grpc-port", "dashboard-agent-listen-port", "metrics-export-port",
        "runtime-env-agent-port",
    )}
    return [
        ray, "start", "--head", "--block", f"--port={port}",
        f"--num-gpus={plan.gpus_per_node}", f"--num-cpus={max(2, plan.gpus_per_node)}",
        f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats",
        "--object-store-memory=300000000",
        *(f"--{name}={value}" for name, value in ports.items()),
    ]


@contextlib.contextmanager
def head_if(plan: LaunchPlan, attempt_dir: Path, env: dict[str, str], log_fd: int) -> Iterator[None]:
    """Run a Ray head around the block when the plan's launcher is Ray; else do nothing."""
    if plan.launcher is not Launcher.ray:
        yield
        return
    temp_dir = f"/tmp/csray-{plan.job_id[-8:]}-{plan.attempt}"
    port = free_port()
    with open(attempt_dir / "ray-head.log", "wb") as head_log:
        head = subprocess.Popen(
            head_argv(plan, temp_dir, port), env=env, stdin=subprocess.DEVNULL,
            stdout=head_log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait_ready(head, attempt_dir / "ray-head.log")
        os.write(log_fd, f"[cellscale] ray head ready at 127.0.0.1:{port} with {plan.gpus_per_node} GPUs\n".encode())
        env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        yield
    finally:
        _stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_ready(head: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if b"Ray runtime started" in log.read_bytes():
            return
        if head.poll() is not None:
            raise RuntimeError(f"the Ray head exited with {head.returncode}; see {log}")
        time.sleep(0.2)
    raise RuntimeError(f"the Ray head did not start within {START_TIMEOUT_SECONDS}s; see {log}")


def _stop(head: subprocess.Popen[bytes]) -> None:
    for signum, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(head.pid, signum)
        except ProcessLookupError:
            return
        try:
            head.wait(timeout=wait)
            # the head's children (gcs, raylet) share its process group
            time.sleep(0.5)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGKILL)
