"""cellscale as a user gets it: a wheel, installed into a fresh virtual environment.

`cellscale dev slurm up` from that environment, run outside the repository, must find its
config templates in the installed package (they used to be read from the repository's
config/slurm, so the command failed from a wheel). It runs against the session's shared dev
cluster (the `slurm_cluster` fixture), where `up` only checks: the configs it renders from
the packaged templates must equal the running cluster's byte for byte, so nothing is
rewritten and nothing restarts.

The wheel is built with `pip wheel . --no-deps` (the labextension build hook is skipped when
scripts/install has built the panel). Hatch writes reproducible wheels, so the environment is
kept under .tools/wheel-venv/<the wheel's sha256> and reused while the wheel is the same.
Measured on 2 cores: build ~3 s, fresh environment with the wheel's dependencies ~5 s,
`up` on the running cluster ~1 s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cellscale_hub.dev import slurm as dev_slurm

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".tools" / "wheel-venv"
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def _clean_env() -> dict[str, str]:
    """This environment without anything that would let the repository's code leak in."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    return {key: value for key, value in os.environ.items() if key not in drop and not key.startswith("SLURM_")}


def _run(argv: list[str], *, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, cwd=cwd, env={**_clean_env(), **PIP_ENV}, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, (
        f"{argv} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with the repository's wheel and its dependencies (no extras:
    `cellscale dev slurm` needs nothing more), cached per wheel."""
    began = time.monotonic()
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", str(out)], cwd=ROOT)
    (wheel,) = out.glob("cellscale-*.whl")
    built = time.monotonic()
    key = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    venv = CACHE / key
    stamp = venv / ".installed"
    cached = stamp.exists()
    if not cached:
        if CACHE.exists():
            for stale in CACHE.iterdir():  # one environment at a time: an older wheel's is dropped
                shutil.rmtree(stale, ignore_errors=True)
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=out)
        # this environment's pip installs into the new one (no pip inside it: ~3 s saved)
        _run(
            [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", str(wheel)],
            cwd=out,
        )
        stamp.write_text(f"{wheel.name}\n")
    print(
        f"[wheel] built in {built - began:.1f} s; environment {'reused' if cached else 'made'} "
        f"in {time.monotonic() - built:.1f} s: {venv}"
    )
    return venv


def test_dev_slurm_up_from_an_installed_wheel(wheel_venv, slurm_cluster, tmp_path):
    outside = tmp_path / "elsewhere"  # not the repository: nothing there to find templates in
    outside.mkdir()
    assert ROOT not in outside.parents

    # the installed package reads its own templates, not the repository's
    where = _run(
        [
            str(wheel_venv / "bin" / "python"),
            "-c",
            "import cellscale_hub.dev.slurm as s; print(s.TEMPLATE_DIR); print(s.__file__)",
        ],
        cwd=outside,
    )
    templates, module = where.stdout.split()
    assert Path(templates).is_relative_to(wheel_venv) and Path(module).is_relative_to(wheel_venv), where.stdout
    assert sorted(p.name for p in Path(templates).glob("*.in")) == sorted(
        f"{t}.in" for t in [*dev_slurm.TEMPLATES, *dev_slurm.DCB_TEMPLATES]
    )

    etc = slurm_cluster.state_dir / "etc"
    before = {path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in etc.rglob("*") if path.is_file()}
    daemons = {
        name: dev_slurm.pid_of(dev_slurm.Layout(slurm_cluster.state_dir), name) for name in dev_slurm.daemon_names()
    }

    began = time.monotonic()
    up = _run(
        [str(wheel_venv / "bin" / "cellscale"), "dev", "slurm", "up", "--state-dir", str(slurm_cluster.state_dir)],
        cwd=outside,
        timeout=120,
    )
    print(f"[wheel] `cellscale dev slurm up` on the running cluster: {time.monotonic() - began:.1f} s")
    assert "cluster already running" in up.stdout, up.stdout
    assert "wrote " not in up.stdout and "config changed" not in up.stdout, up.stdout  # same configs
    assert {
        path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in etc.rglob("*") if path.is_file()
    } == before
    assert {
        name: dev_slurm.pid_of(dev_slurm.Layout(slurm_cluster.state_dir), name) for name in dev_slurm.daemon_names()
    } == daemons  # nothing restarted
    assert "PARTITION" in up.stdout and "node[1-4]" in up.stdout, up.stdout  # its status shows sinfo

    # and the cluster answers
    nodes = slurm_cluster.node_states()
    assert sorted(nodes) == ["cpu1", "cpu2", "node1", "node2", "node3", "node4"]  # CPU nodes beside the GPU ones
