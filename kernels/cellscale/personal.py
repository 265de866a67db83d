"""Start or reuse this user's personal control plane (no hub needed), like `ray.init()`.

It runs `python -m cellscale_hub --personal` detached, so jobs outlive the kernel; its URL
and token are in ~/.cellscale/personal/server.json (mode 0600). A restart keeps both (the
token is kept in `token`, the port of the last run is taken again when free); a client whose
call finds the plane gone or its token refused calls `ensure()` again (`Client.from_env`).
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

START_TIMEOUT_SECONDS = 60


def home() -> Path:
    return Path(os.environ.get("CELLSCALE_HOME", Path.home() / ".cellscale")) / "personal"


def _running(info: dict) -> bool:
    try:
        os.kill(int(info["pid"]), 0)
        return httpx.get(info["url"].rstrip("/") + "/api/health", timeout=2).status_code == 200
    except (OSError, KeyError, ValueError, httpx.HTTPError):
        return False


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def current() -> tuple[str, str] | None:
    """(url, token) of this user's personal control plane as it last wrote them, without
    checking or starting it (the Jupyter server extension's view of it)."""
    info = _read(home() / "server.json")
    return (info["url"], info["token"]) if info and "url" in info and "token" in info else None


def ensure() -> tuple[str, str]:
    """(url, token) of a running personal control plane, starting one if needed."""
    root = home()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    server = root / "server.json"
    with open(root / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one kernel starts it; the others wait and reuse
        info = _read(server)
        if info and _running(info):
            return info["url"], info["token"]
        if importlib.util.find_spec("cellscale_hub") is None:
            raise RuntimeError(
                "no control plane configured (CELLSCALE_URL) and none installed here: "
                "pip install 'cellscale[hub]' to run one on this machine"
            )
        with open(root / "control-plane.log", "ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "cellscale_hub", "--personal"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            info = _read(server)
            if info and info.get("pid") == child.pid and _running(info):
                return info["url"], info["token"]
            if child.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the personal control plane did not start; see {root / 'control-plane.log'}")
