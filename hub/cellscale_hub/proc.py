"""The one place the control plane starts processes: argv lists only, never a shell."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

UNIX_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # a user name a job may run as
SAFE_ENV_KEYS = ("HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER", "LOGNAME")


def job_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment for job processes: none of the control plane's secrets."""
    env = {key: os.environ[key] for key in SAFE_ENV_KEYS if key in os.environ}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "/usr/bin:/bin")])
    env.update(extra or {})
    return env


def spawn_detached(argv: Sequence[str], *, cwd: Path, log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start a process in its own session, so it outlives the control plane."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run(
    argv: Sequence[str], *, timeout: float = 30, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion and capture its output (for scheduler CLIs)."""
    if not shutil.which(argv[0]) and not Path(argv[0]).exists():
        raise FileNotFoundError(f"{argv[0]} is not installed or not on PATH")
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, env=None if env is None else dict(env), check=False
    )
