"""Helpers shared by the benchmarks: a throwaway personal control plane, percentiles, output.

Every benchmark starts its own control plane in a temporary CELLSCALE_HOME and stops it
(and any job supervisor it left behind) before exiting, so nothing keeps running.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PYTHON = sys.executable


@dataclass
class ControlPlane:
    url: str
    token: str
    pid: int
    data_dir: Path


def _health(url: str) -> bool:
    try:
        return httpx.get(url.rstrip("/") + "/api/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _start_direct(home: Path, args: list[str], env: dict[str, str] | None = None) -> ControlPlane:
    """`python -m cellscale_hub --personal --data-dir HOME/personal ARGS...` (for --db-url, --gpus),
    in `env` (this process's environment by default)."""
    data_dir = home / "personal"
    data_dir.mkdir(parents=True, mode=0o700)
    with open(data_dir / "control-plane.log", "ab") as log:
        child = subprocess.Popen(
            [PYTHON, "-m", "cellscale_hub", "--personal", "--data-dir", str(data_dir), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            info = json.loads((data_dir / "server.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            info = None
        if info and info.get("pid") == child.pid and _health(info["url"]):
            return ControlPlane(info["url"], info["token"], child.pid, data_dir)
        if child.poll() is not None:
            break
        time.sleep(0.2)
    _stop_pid(child.pid)
    raise RuntimeError(f"control plane did not start; see {data_dir / 'control-plane.log'}")


@contextmanager
def control_plane(*args: str, env: dict[str, str] | None = None):
    """A personal control plane in a fresh CELLSCALE_HOME, stopped (SIGTERM, wait) on exit.

    Without arguments it is started the way users get it, by `cellscale.personal.ensure()`;
    with arguments (`--db-url`, `--gpus`, ...) by running `python -m cellscale_hub` directly,
    in `env` when given (e.g. another revision's code first on PYTHONPATH).
    """
    home = Path(tempfile.mkdtemp(prefix="cellscale-bench-"))
    old_home = os.environ.get("CELLSCALE_HOME")
    os.environ["CELLSCALE_HOME"] = str(home)
    cp = None
    try:
        if args:
            cp = _start_direct(home, list(args), env)
        else:
            from cellscale import personal

            url, token = personal.ensure()
            info = json.loads((personal.home() / "server.json").read_text())
            cp = ControlPlane(url, token, int(info["pid"]), personal.home())
        yield cp
    finally:
        if cp is not None:
            stop_control_plane(cp)
        if old_home is None:
            os.environ.pop("CELLSCALE_HOME", None)
        else:
            os.environ["CELLSCALE_HOME"] = old_home
        shutil.rmtree(home, ignore_errors=True)


def stop_control_plane(cp: ControlPlane) -> None:
    """SIGTERM the control plane by the pid in server.json and wait; then stop any job
    supervisor it left running (they are detached on purpose, so they outlive it)."""
    _stop_pid(cp.pid)
    jobs = cp.data_dir / "jobs"  # node<k>/started in the current job directory layout; started before it
    for started in [*jobs.glob("*/attempts/*/node*/started"), *jobs.glob("*/attempts/*/started")]:
        try:
            pid = int(json.loads(started.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            continue
        if _alive(pid) and _is_supervisor(pid):
            print(f"[bench] stopping leftover job supervisor {pid} ({started.parent})", file=sys.stderr)
            _stop_pid(pid)


def _is_supervisor(pid: int) -> bool:
    try:
        return b"cellscale.runtime.supervisor" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:  # not our child (or already reaped): just check it is gone
        return not _alive(pid)


def _stop_pid(pid: int, grace: float = 15.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        _reaped(pid)
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if _reaped(pid):
            return
        time.sleep(0.1)
    print(f"[bench] pid {pid} ignored SIGTERM for {grace:.0f}s; killing it", file=sys.stderr)
    os.kill(pid, signal.SIGKILL)
    while not _reaped(pid):
        time.sleep(0.1)


# -- statistics and output -----------------------------------------------------------------
def percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100), like numpy's default."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return percentile(values, 50)


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    cells = [[_fmt(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def scheduling_digest() -> dict[str, str]:
    """The scheduling code a benchmark measured (it may be uncommitted): the first 12 hex
    digits of each file's sha256 (every module of `scheduling/`, and `tenancy.py`)."""
    here = REPO / "hub" / "cellscale_hub"
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:12]
        for p in (*sorted((here / "scheduling").glob("*.py")), here / "tenancy.py")
    }


def write_results(name: str, quick: bool, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    meta = {
        "benchmark": name,
        "quick": quick,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "commit": _git_commit(),
    }
    path.write_text(json.dumps({**meta, **data}, indent=2) + "\n")
    print(f"\nwrote {path.relative_to(REPO)}")
    return path


def _git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def timing(obj: object, method: str) -> list[float]:
    """Record how long each call of obj.method takes, from now on."""
    original, seconds = getattr(obj, method), []

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - t0)

    setattr(obj, method, timed)
    return seconds
