"""On a Slurm login node (SLURM_CONF set, or `sinfo` answers), a plain IPython's %%cluster starts a
personal control plane whose default backend is Slurm: a researcher's 16-GPU torchrun cell runs
across two nodes, submitted as them, charged to their default Slurm account, with no setup but
~/.cellscale/config.py (here: the dev cluster's rendezvous address)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TOKEN = "lab-token"
RESEARCHER = "alice"  # in Slurm account desk-a (her DefaultAccount), like every dev researcher
CELL = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
world, total = dist.get_world_size(), t.item()
print(f"rank {dist.get_rank()} of {world} on node {os.environ['CELLSCALE_NODE']}", flush=True)
dist.destroy_process_group()
"""
SESSION = f"""
ip = get_ipython()
ip.run_line_magic("load_ext", "cellscale")
ip.run_cell_magic("cluster", "--gpus 16 --launcher torchrun --outputs world,total", {CELL!r})
print("RESULT", world, int(total))
ip.run_cell_magic("cluster", "--backend local --gpus 1 --launcher plain --outputs here", "here = 'this machine'")
print("LOCAL", here)
"""
USER_CONFIG = """c = get_config()  # noqa: F821
# the dev cluster's nodes are names for this one host: ranks meet at 127.0.0.1
c.SlurmDriver.master_addr = "127.0.0.1"
"""


def test_a_personal_control_plane_on_a_slurm_login_node_runs_on_slurm(slurm_cluster):
    home = Path(tempfile.mkdtemp(prefix="personal-", dir=slurm_cluster.jobs_dir))  # the nodes see it
    (home / "config.py").write_text(USER_CONFIG)
    (home / "session.ipy").write_text(SESSION)
    for path in [home, *home.rglob("*")]:
        shutil.chown(path, RESEARCHER, RESEARCHER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCALE_", "JUPYTERHUB_"))}
    env |= {
        **slurm_cluster.env,  # SLURM_CONF: all a login node has
        "CELLSCALE_HOME": str(home),
        "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("kernels", "hub", "extension")),
    }
    identity = [f"HOME={home}", f"USER={RESEARCHER}", f"LOGNAME={RESEARCHER}"]
    argv = [str(BIN / "ipython"), "--no-banner", "--colors=NoColor", str(home / "session.ipy")]
    server = home / "personal" / "server.json"
    lab_server = jupyter_server(home, env, identity)  # the same researcher's local JupyterLab
    lab = lab_server.__enter__()
    try:
        before = lab.get("cellscale/api/jobs")
        assert (before.status_code, before.json()["message"]) == (
            503,
            "no control plane yet: run a cell with the cluster magic (it starts your personal control plane), "
            "or set CELLSCALE_URL",
        )
        run = subprocess.run(
            ["runuser", "-u", RESEARCHER, "--", "env", *identity, *argv],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=400,
            stdin=subprocess.DEVNULL,
        )
        out = run.stdout + run.stderr
        assert "RESULT 16 120" in out, out + _log(home)
        assert "[rank 0] rank 0 of 16 on node 0" in out and "[rank 15] rank 15 of 16 on node 1" in out
        assert "LOCAL this machine" in out, out  # --backend local: still there
        info = json.loads(server.read_text())
        api = httpx.Client(base_url=info["url"], headers={"Authorization": f"token {info['token']}"}, timeout=30)
        local, job = api.get("api/jobs").json()["items"]  # newest first
        assert local["backend"] == "local"
        assert job["backend"] == "slurm" and job["spec"]["resources"]["nodes"] == 2  # the default backend
        record = slurm_cluster.wait_done(int(job["attempts"][0]["backend_ref"]))
        assert (record["account"], record["user"]) == ("desk-a", RESEARCHER)
        assert sorted(api.get("api/backends").json(), key=lambda b: b["name"])[1]["capacity_gpus"] == 32
        # the open JupyterLab's side panel now relays to that same control plane
        jobs = lab.get("cellscale/api/jobs").json()["items"]
        assert [(j["id"], j["backend"]) for j in jobs] == [(local["id"], "local"), (job["id"], "slurm")]
    finally:
        lab_server.__exit__(None, None, None)
        if server.exists():
            os.kill(json.loads(server.read_text())["pid"], signal.SIGTERM)


def _log(home: Path) -> str:
    log = home / "personal" / "control-plane.log"
    return log.read_text()[-3000:] if log.exists() else ""


@contextlib.contextmanager
def jupyter_server(home: Path, env: dict[str, str], identity: list[str]):
    """A Jupyter server with the cellscale extension, run by the researcher, with no CELLSCALE_URL."""
    config = home / "jupyter-config"
    config.mkdir()
    settings = {"ServerApp": {"jpserver_extensions": {"cellscale_server": True}}, "IdentityProvider": {"token": TOKEN}}
    (config / "jupyter_server_config.json").write_text(json.dumps(settings))
    shutil.chown(config, RESEARCHER, RESEARCHER)
    shutil.chown(config / "jupyter_server_config.json", RESEARCHER, RESEARCHER)
    port = free_port()
    dirs = [
        f"JUPYTER_CONFIG_DIR={config}",
        f"JUPYTER_RUNTIME_DIR={home / 'runtime'}",
        f"JUPYTER_DATA_DIR={home / 'data'}",
    ]
    argv = [
        str(BIN / "jupyter"),
        "server",
        "--no-browser",
        f"--port={port}",
        "--ip=127.0.0.1",
        f"--ServerApp.root_dir={home}",
    ]
    log = open(home / "jupyter.log", "wb")
    server = subprocess.Popen(
        ["runuser", "-u", RESEARCHER, "--", "env", *identity, *dirs, *argv],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    lab = httpx.Client(base_url=f"http://127.0.0.1:{port}/", headers={"Authorization": f"token {TOKEN}"}, timeout=20)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if lab.get("api/status").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (home / "jupyter.log").read_text()[-3000:]
            time.sleep(0.2)
        yield lab
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
