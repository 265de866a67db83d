"""Many followers of job logs (issue 20): what idle followers cost the control plane, and how
late lines reach 100 followers through JupyterHub's proxy.

idle  A personal control plane (`python -m cellscale_hub --personal --gpus 1`) runs 10 quiet
      jobs (no GPU; `time.sleep`, they print nothing) and holds 300 more PENDING behind a job
      that holds the one GPU. Its CPU (utime+stime of the process, from /proc) over --window
      seconds, as % of one core, with:
      - no follower;
      - 300 followers of the 10 running jobs (30 each);
      - 300 followers of the 300 pending jobs (one each).
      A follower is a server-sent-event stream (`/logs?follow=true`, httpx) that gets nothing
      but a keepalive every 15 s. Admission's 30 s refresh is moved out of the way
      (--ControlPlane.admission_interval=3600) so that it falls in no window.
hub   JupyterHub (config/jupyterhub_config.py, the demo's: as root, jobs run as their owners)
      with configurable-http-proxy, and the control plane as its managed service. As alice (a
      token from the hub's API), 4 jobs each print `tick I T` 20 times a second for 10 s, T
      being time.time() when printed, and 100 followers (25 a job) read them, first
      - direct: to the service's own port (http://127.0.0.1:PORT/services/cellscale/...), then
      - proxy: through the hub's public URL, i.e. configurable-http-proxy,
      with new jobs each time. Lag = arrival at the follower - T (one clock), for every line at
      every follower. Each job starts printing 5 s after it was submitted (its followers are
      connected by then); the control plane's CPU over the whole run is reported too.

With --compare REV each part runs a second time on the hub and kernels code of git revision
REV (`git archive`, first on PYTHONPATH, as in benchmarks/control_plane.py): before and after,
side by side in one run.

    .venv/bin/python benchmarks/log_followers.py [--parts idle,hub] [--compare REV] [--quick]
        [--idle-followers 300] [--idle-jobs 10] [--window 15]
        [--followers 100] [--jobs 4] [--rate 20] [--seconds 10] [--proxy PATH]

The hub part needs configurable-http-proxy (scripts/install puts it in .tools/; or --proxy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _common import (
    REPO,
    ControlPlane,
    control_plane,
    percentile,
    print_table,
    ratio,
    stop_control_plane,
    write_results,
)
from control_plane import checkout, child_env, cpu_ticks

from cellscale.client import Client
from cellscale.spec import JobSpec, JobView, Launcher, Phase, Resources

HZ = os.sysconf("SC_CLK_TCK")
PROXY = REPO / ".tools" / "node_modules" / ".bin" / "configurable-http-proxy"
USER_SCOPES = ["custom:cellscale:submit", "custom:cellscale:read", "access:services!service=cellscale"]
LEAD_S = 5.0  # from submit to a printing job's first line: its followers connect meanwhile
SETTLE_S = 3.0  # after the idle followers connected, before the CPU window


# -- followers -------------------------------------------------------------------------------
class Followers:
    """Server-sent-event streams of job logs, in a thread of their own (one asyncio loop, one
    httpx client, one connection each). Records each `tick` line's lag as it arrives."""

    def __init__(self, urls: list[str], token: str):
        self.urls, self.token = urls, token
        self.connected = self.ended = 0
        self.lags: list[float] = []
        self.errors: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Followers:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._loop and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)

    def wait(self, done, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done(self):
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.05)
        return True

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        timeout = httpx.Timeout(60.0, read=None)
        headers = {"Authorization": f"token {self.token}"}
        async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as http:
            follows = asyncio.gather(*(self._follow(http, url) for url in self.urls), return_exceptions=True)
            stop = asyncio.create_task(self._stop.wait())
            await asyncio.wait([follows, stop], return_when=asyncio.FIRST_COMPLETED)
            follows.cancel()
            stop.cancel()
            await asyncio.gather(follows, stop, return_exceptions=True)

    async def _follow(self, http: httpx.AsyncClient, url: str) -> None:
        try:
            async with http.stream("GET", url, params={"follow": "true"}) as response:
                response.raise_for_status()
                self.connected += 1
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        arrived = time.time()
                        chunk = json.loads(line[len("data: ") :])
                        self._record(chunk["text"], arrived)
                        if chunk["complete"]:
                            self.ended += 1
                            return
        except httpx.HTTPError as exc:
            self.errors.append(f"{url}: {type(exc).__name__}: {exc}")

    def _record(self, text: str, arrived: float) -> None:
        for line in text.splitlines():
            words = line.split()  # "[rank 0] tick I T"
            if len(words) == 5 and words[2] == "tick":
                self.lags.append(arrived - float(words[4]))


def logs_url(base: str, job_id: str) -> str:
    return f"{base.rstrip('/')}/api/jobs/{job_id}/logs"


# -- jobs ------------------------------------------------------------------------------------
def quiet(gpus: int) -> JobSpec:
    return JobSpec(
        name="bench-quiet",
        launcher=Launcher.plain,
        resources=Resources(gpus_per_node=gpus),
        source="import time\ntime.sleep(3600)\n",
    )


def printer(rate: float, seconds: float, start_at: float) -> JobSpec:
    source = f"""\
import time
for i in range({int(rate * seconds)}):
    time.sleep(max(0.0, {start_at} + i / {rate} - time.time()))
    print(f"tick {{i}} {{time.time():.6f}}", flush=True)
"""
    return JobSpec(name="bench-printer", launcher=Launcher.plain, resources=Resources(gpus_per_node=0), source=source)


def wait_phase(client: Client, jobs: list[JobView], phase: Phase, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    for job in jobs:
        while (view := client.get(job.id)).phase is not phase:
            if view.phase.terminal or time.monotonic() > deadline:
                raise RuntimeError(f"job {job.id} is {view.phase.value} ({view.reason}), not {phase.value}")
            time.sleep(0.2)


def cpu_pct(pid: int, seconds: float) -> float:
    """The process's CPU over the next `seconds`, in % of one core."""
    c0, w0 = cpu_ticks(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_ticks(pid) - c0) / HZ / (time.monotonic() - w0)


# -- idle ------------------------------------------------------------------------------------
def idle_part(env: dict, args) -> dict:
    admission_off = "--ControlPlane.admission_interval=3600"
    with control_plane("--gpus", "1", admission_off, env=env) as cp:
        client = Client(cp.url, cp.token)
        running = [client.submit(quiet(0)) for _ in range(args.idle_jobs)]
        blocker = client.submit(quiet(1))
        pending = [client.submit(quiet(1)) for _ in range(args.idle_followers)]
        wait_phase(client, [*running, blocker], Phase.RUNNING)
        time.sleep(SETTLE_S)
        out = {"none": {"cpu_pct": cpu_pct(cp.pid, args.window), "followers": 0}}
        print(f"  no follower: {out['none']['cpu_pct']:.2f}% of a core")
        for case, jobs in (("running", running), ("pending", pending)):
            urls = [logs_url(cp.url, jobs[i % len(jobs)].id) for i in range(args.idle_followers)]
            out[case] = idle_case(cp, urls, args.window)
            print(f"  {len(urls)} followers of {len(jobs)} {case} jobs: {out[case]['cpu_pct']:.2f}% of a core")
        if any(client.get(job.id).phase is not Phase.PENDING for job in pending[:5]):
            raise RuntimeError("a pending job left the queue: the idle windows were not idle")
        client.close()
    return out


def idle_case(cp: ControlPlane, urls: list[str], window: float) -> dict:
    with Followers(urls, cp.token) as followers:
        if not followers.wait(lambda f: f.connected == len(urls), timeout=60):
            raise RuntimeError(f"only {followers.connected} of {len(urls)} followers connected: {followers.errors[:3]}")
        time.sleep(SETTLE_S)
        cpu = cpu_pct(cp.pid, window)
        if followers.errors:
            raise RuntimeError(f"followers failed: {followers.errors[:3]}")
        return {"cpu_pct": cpu, "followers": len(urls), "jobs": len(set(urls))}


# -- through the hub -------------------------------------------------------------------------
class Hub:
    def __init__(self, url: str, service_url: str, state: Path, admin_token: str):
        self.url, self.service_url, self.state = url, service_url, state
        self.admin = httpx.Client(base_url=f"{url}/hub/api/", headers={"Authorization": f"token {admin_token}"})

    def token(self, user: str) -> str:
        response = self.admin.post(f"users/{user}/tokens", json={"scopes": USER_SCOPES, "note": "benchmark"})
        return response.raise_for_status().json()["token"]

    def control_plane(self) -> ControlPlane:
        data_dir = self.state / "cellscale"
        return ControlPlane(self.service_url, "", int((data_dir / "control-plane.pid").read_text()), data_dir)


HUB_CONFIG = """\
load_subconfig({base!r})
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.services.append({{"name": "bench-admin", "api_token": {token!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "bench-admin", "services": ["bench-admin"], "scopes": ["admin:users", "tokens"]}}
)
"""


@contextlib.contextmanager
def running_hub(env: dict, proxy: Path):
    """The demo hub on free ports in a fresh state folder, with an admin service for tokens
    (as tests/integration start it); stopped with SIGTERM, with any job left behind."""
    state = Path(tempfile.mkdtemp(prefix="cellscale-bench-hub-"))
    state.chmod(0o711)  # the jobs, run as their owners, reach their own job directories
    ports = {name: _free_port() for name in ("hub", "api", "proxy", "service")}
    admin_token = secrets.token_hex(16)
    config = state / "jupyterhub_config.py"
    base = REPO / "config" / "jupyterhub_config.py"
    config.write_text(HUB_CONFIG.format(base=str(base), proxy=str(proxy), token=admin_token))
    env = dict(
        env,
        CELLSCALE_STATE_DIR=str(state),
        CELLSCALE_HUB_URL=f"http://127.0.0.1:{ports['hub']}",
        CELLSCALE_HUB_API_URL=f"http://127.0.0.1:{ports['api']}",
        CELLSCALE_PROXY_API_URL=f"http://127.0.0.1:{ports['proxy']}",
        CELLSCALE_SERVICE_PORT=str(ports["service"]),
        CELLSCALE_LOCAL_GPUS="4",
    )
    url = f"http://127.0.0.1:{ports['hub']}"
    hub = Hub(url, f"http://127.0.0.1:{ports['service']}/services/cellscale/", state, admin_token)
    with open(state / "jupyterhub.log", "wb") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("jupyterhub")), "-f", str(config)],
            cwd=state,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_up(f"{url}/hub/api/", proc, state)
        _wait_up(f"{hub.service_url}api/health", proc, state)
        yield hub
    finally:
        service = _service(hub)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if service:
            stop_control_plane(service)  # the hub stopped it; this stops the job supervisors it left
        hub.admin.close()
        shutil.rmtree(state, ignore_errors=True)


def _service(hub: Hub) -> ControlPlane | None:
    try:
        return hub.control_plane()
    except (FileNotFoundError, ValueError):  # it never started
        return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, state: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    tail = (state / "jupyterhub.log").read_text(errors="replace")[-3000:]
    raise RuntimeError(f"{url} did not come up; the hub's log ends:\n{tail}")


def hub_part(env: dict, args) -> dict:
    with running_hub(env, args.proxy) as hub:
        token = hub.token("alice")
        pid = hub.control_plane().pid
        out = {}
        for route, base in (("direct", hub.service_url), ("proxy", f"{hub.url}/services/cellscale/")):
            out[route] = lag_run(base, token, pid, args)
            s = out[route]
            print(
                f"  {route}: {s['lines']}/{s['expected_lines']} lines, p50 {s['p50']:.3f} s, "
                f"p99 {s['p99']:.3f} s, max {s['max']:.3f} s; control plane {s['cpu_pct']:.0f}% of a core"
            )
    return out


def lag_run(base: str, token: str, pid: int, args) -> dict:
    client = Client(base, token)
    start_at = time.time() + LEAD_S
    jobs = [client.submit(printer(args.rate, args.seconds, start_at)) for _ in range(args.jobs)]
    urls = [logs_url(base, jobs[i % len(jobs)].id) for i in range(args.followers)]
    c0, w0 = cpu_ticks(pid), time.monotonic()
    with Followers(urls, token) as followers:
        connected = followers.wait(lambda f: f.connected == len(urls), timeout=LEAD_S)
        if not connected:
            print(f"  warning: {followers.connected} of {len(urls)} followers connected before the first line")
        followers.wait(lambda f: f.ended == len(urls), timeout=LEAD_S + args.seconds + 120)
    cpu = 100 * (cpu_ticks(pid) - c0) / HZ / (time.monotonic() - w0)
    for job in jobs:
        if (view := client.get(job.id)).phase is not Phase.SUCCEEDED:
            raise RuntimeError(f"job {job.id} ended {view.phase.value}: {view.reason}")
    client.close()
    if followers.errors:
        raise RuntimeError(f"followers failed: {followers.errors[:3]}")
    return {
        "followers": len(urls),
        "jobs": len(jobs),
        "expected_lines": len(urls) * int(args.rate * args.seconds),
        "ended": followers.ended,
        "connected_before_first_line": connected,
        "cpu_pct": cpu,
        **stats(followers.lags),
    }


def stats(values: list[float]) -> dict:
    return {
        "lines": len(values),
        "mean": sum(values) / len(values) if values else float("nan"),
        **{f"p{p}": percentile(values, p) for p in (50, 95, 99)},
        "max": max(values, default=float("nan")),
    }


# -- main ------------------------------------------------------------------------------------
def print_summary(results: dict) -> None:
    trees = list(results)
    if any("idle" in results[t] for t in trees):
        print("\nControl plane CPU, % of one core (idle followers get only keepalives)")
        rows = []
        for case in ("none", "running", "pending"):
            cpus = [results[t]["idle"][case]["cpu_pct"] for t in trees if "idle" in results[t]]
            rows.append([case, *cpus, *([ratio(cpus[0], cpus[1])] if len(cpus) == 2 else [])])
        print_table(["followers of", *trees, *([" / ".join(trees)] if len(trees) == 2 else [])], rows)
    if any("hub" in results[t] for t in trees):
        print("\nLog line lag, seconds, every line at every follower")
        rows = []
        for tree in trees:
            for route, s in results[tree].get("hub", {}).items():
                rows.append([f"{tree} {route}", s["lines"], s["p50"], s["p95"], s["p99"], s["max"], s["cpu_pct"]])
        print_table(["code, route", "lines", "p50", "p95", "p99", "max", "CP CPU %"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="idle,hub", help="idle, hub or both (default)")
    parser.add_argument("--compare", metavar="REV", help="also run each part on the code of git revision REV")
    parser.add_argument("--quick", action="store_true", help="5 s windows and 5 s of printing")
    parser.add_argument("--idle-followers", type=int, default=300)
    parser.add_argument("--idle-jobs", type=int, default=10, help="running quiet jobs the idle followers share")
    parser.add_argument("--window", type=float, help="seconds of each idle CPU window (15; --quick 5)")
    parser.add_argument("--followers", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=4, help="printing jobs the followers share")
    parser.add_argument("--rate", type=float, default=20.0, help="lines per second per job")
    parser.add_argument("--seconds", type=float, help="seconds each job prints (10; --quick 5)")
    parser.add_argument("--proxy", type=Path, default=PROXY, help="configurable-http-proxy (default: .tools/)")
    args = parser.parse_args()
    args.window = args.window or (5.0 if args.quick else 15.0)
    args.seconds = args.seconds or (5.0 if args.quick else 10.0)
    parts = args.parts.split(",")
    if "hub" in parts and not args.proxy.exists():
        parser.error(f"no configurable-http-proxy at {args.proxy}: run scripts/install, or pass --proxy PATH")

    trees: dict[str, Path | None] = {"this tree": None}
    if args.compare:
        trees = {f"rev {args.compare}": checkout(args.compare), **trees}
    results: dict[str, dict] = {}
    try:
        for name, tree in trees.items():
            results[name] = {}
            for part, run in (("idle", idle_part), ("hub", hub_part)):
                if part in parts:
                    print(f"{part} on {name}")
                    results[name][part] = run(child_env(tree), args)
    finally:
        for tree in trees.values():
            if tree is not None:
                shutil.rmtree(tree, ignore_errors=True)
    print_summary(results)
    settings = {k: v for k, v in vars(args).items() if k not in ("proxy", "parts")}
    write_results("log_followers", args.quick, {"settings": {**settings, "parts": parts}, "results": results})


if __name__ == "__main__":
    main()
