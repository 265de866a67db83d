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

from cellscale.runtime.jobdir import JobDir
from cellscale.runtime.records import LaunchPlan
from cellscale.vocabulary import Launcher

START_TIMEOUT_SECONDS = 90


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _node_argv(plan: LaunchPlan, temp_dir: str) -> list[str]:
    ray = str(Path(sys.executable).with_name("ray"))
    ports = {
        name: free_port()
        for name in (
            "node-manager-port",
            "object-manager-port",
            "dashboard-agent-grpc-port",
            "dashboard-agent-listen-port",
            "metrics-export-port",
            "runtime-env-agent-port",
        )
    }
    return [
        ray,
        "start",
        "--block",
        f"--num-gpus={plan.gpus_per_node}",
        f"--num-cpus={max(2, plan.gpus_per_node)}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        "--object-store-memory=300000000",
        *(f"--{name}={value}" for name, value in ports.items()),
    ]


def head_argv(plan: LaunchPlan, temp_dir: str, port: int) -> list[str]:
    return [
        *_node_argv(plan, temp_dir),
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}",
    ]


def worker_argv(plan: LaunchPlan, temp_dir: str, head: str, node: int) -> list[str]:
    argv = [*_node_argv(plan, temp_dir), f"--address={head}"]
    if plan.master_addr == "127.0.0.1":  # emulated nodes share one host: each needs its own address
        argv.append(f"--node-ip-address=127.0.0.{node + 1}")
    return argv


@contextlib.contextmanager
def head_if(plan: LaunchPlan, job: JobDir, env: dict[str, str], log_fd: int) -> Iterator[None]:
    """Run a Ray head around the block when the plan's launcher is Ray; else do nothing.
    Worker nodes (see `worker`) join it and leave when the block ends. A cluster the backend
    started (`plan.ray_cluster == "backend"`, KubeRay) is used as it is."""
    if plan.launcher is not Launcher.ray:
        yield
        return
    if plan.ray_cluster == "backend":  # KubeRay started the cluster; its job API set RAY_ADDRESS
        if not env.get("RAY_ADDRESS"):
            raise RuntimeError("the backend's Ray cluster is not named: RAY_ADDRESS is not set")
        os.write(log_fd, f"[cellscale] ray cluster of the backend: {plan.nodes} node(s), {plan.gpus} GPUs\n".encode())
        yield
        return
    temp_dir = f"/tmp/csray-{plan.job_id[-8:]}-{plan.attempt}-0"
    port = plan.master_port or free_port()
    log = job.process_log(plan.attempt, 0, "ray-node")
    head = _start(head_argv(plan, temp_dir, port), env, log)
    try:
        _wait_ready(head, log)
        if plan.nodes > 1:
            _wait_for_nodes(env, f"127.0.0.1:{port}", plan.nodes)
        os.write(log_fd, f"[cellscale] ray cluster ready: {plan.nodes} node(s), {plan.gpus} GPUs\n".encode())
        env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        yield
    finally:
        job.ray_done(plan.attempt).touch()
        _stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def worker(plan: LaunchPlan, job: JobDir, master: str, env: dict[str, str], node: int) -> int:
    """Join node 0's Ray head and stay until it says the cell is done; 0 when it ended that way."""
    temp_dir = f"/tmp/csray-{plan.job_id[-8:]}-{plan.attempt}-{node}"
    done = job.ray_done(plan.attempt)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    try:
        while not done.exists():
            process = _start(
                worker_argv(plan, temp_dir, f"{master}:{plan.master_port}", node),
                env,
                job.process_log(plan.attempt, node, "ray-node"),
            )
            while process.poll() is None and not done.exists():
                time.sleep(0.5)
            _stop(process)
            if done.exists():
                return 0
            if time.monotonic() > deadline:  # the head never came up: node 0 reports why
                return 1
            time.sleep(1)  # the head is not up yet: try again
        return 0
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait_for_nodes(env: dict[str, str], address: str, nodes: int) -> None:
    """Block until every worker node has joined, so the cell sees all GPUs at once."""
    probe = (
        "import ray, sys, time\n"
        f"ray.init(address={address!r}, logging_level='ERROR')\n"
        f"deadline = time.time() + {START_TIMEOUT_SECONDS}\n"
        f"while len([n for n in ray.nodes() if n['Alive']]) < {nodes}:\n"
        "    if time.time() > deadline: sys.exit(1)\n"
        "    time.sleep(0.5)\n"
    )
    if subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, timeout=START_TIMEOUT_SECONDS + 30
    ).returncode:
        raise RuntimeError(f"only some of the {nodes} Ray nodes joined within {START_TIMEOUT_SECONDS}s")


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
