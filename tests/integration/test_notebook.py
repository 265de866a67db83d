"""A researcher's notebook through the real hub, their real server and kernel: %%cluster
runs torchrun DDP and Ray on the local backend; logs stream while the job runs; outputs
land in the kernel; desks are isolated; the control plane survives kill -9 mid-job."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.conftest import api

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_cell() -> str:
    """The README's example cell, as a reader pastes it into a notebook."""
    block = README.read_text().split("```python\n%%cluster --gpus 2 --launcher torchrun", 1)[1]
    return "%%cluster --gpus 2 --launcher torchrun" + block.split("```", 1)[0]


RAY_CELL = """%%cluster --gpus 2 --launcher ray --outputs seen --name raycell
import os, ray
ray.init()
@ray.remote(num_gpus=1)
def which_gpu(i):
    import time; time.sleep(1)
    return os.environ["CUDA_VISIBLE_DEVICES"]
seen = sorted(ray.get([which_gpu.remote(i) for i in range(2)]))
print("gpus seen by tasks:", seen)
"""

SLURM_CELL = """%%cluster --gpus 16 --launcher torchrun --backend slurm --outputs world,total
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
world, total = dist.get_world_size(), t.item()
print(f"rank {dist.get_rank()} of {world} on node {__import__('os').environ['CELLSCALE_NODE']}", flush=True)
dist.destroy_process_group()
"""

COUNTING_CELL = """%%cluster --gpus 1 --launcher plain --outputs total --name counter
import time
for i in range({n}):
    print(f"tick {{i}}", flush=True)
    time.sleep(1)
total = {n}
"""


def latest_job(hub, token, user):
    return api(hub, token(user)).get("jobs", params={"limit": 1}).json()["items"][0]


def test_the_readme_cell_streams_logs_is_named_by_its_notebook_and_returns_its_output(hub, token, kernel):
    k = kernel("alice", notebook="work/train.ipynb")  # as JupyterLab starts it: JPY_SESSION_NAME
    run = k.execute(readme_cell(), timeout=300)
    assert run.reply["status"] == "ok", run.text
    job = latest_job(hub, token, "alice")
    assert job["phase"] == "SUCCEEDED"
    count = run.reply["execution_count"]  # what the notebook shows beside the cell: In [count]
    assert (job["title"], job["name"]) == (f"train.ipynb [{count}]", f"train.ipynb-{count}")
    finished = datetime.fromisoformat(job["finished_at"]).timestamp()
    first_line = run.first_arrival("[rank 0] step 0 loss")
    assert first_line is not None, run.text
    assert first_line < finished - 2, "rank lines must arrive while the job runs, not at the end"
    assert "[rank 1] step 9 loss" in run.text
    value = k.execute("print(repr(loss))")
    assert float(value.text.strip()) >= 0
    listed = k.execute("%cluster list").text.splitlines()
    assert any(re.match(rf"^{job['id']}  train\.ipynb \[{count}\] +SUCCEEDED · ", line) for line in listed), listed

    # visible to its owner and desk, invisible to another desk
    assert api(hub, token("carol")).get(f"jobs/{job['id']}").status_code == 200
    assert api(hub, token("bob")).get(f"jobs/{job['id']}").status_code == 404
    assert job["id"] not in [
        j["id"] for j in api(hub, token("bob")).get("jobs", params={"scope": "tenant"}).json()["items"]
    ]


def test_ray_cell_gets_its_gpus(hub, token, kernel):
    k = kernel("bob")
    run = k.execute(RAY_CELL, timeout=300)
    assert run.reply["status"] == "ok", run.text
    seen = k.execute("print(seen)").text
    gpus = eval(seen)  # noqa: S307 - our own test output
    assert len(gpus) == 2 and len(set(gpus)) == 2, seen
    assert "ray cluster ready: 1 node(s), 2 GPUs" in run.text
    assert latest_job(hub, token, "bob")["phase"] == "SUCCEEDED"


def test_control_plane_killed_mid_job_then_the_job_completes_with_intact_logs(hub, token, kernel):
    n = 40
    k = kernel("carol")
    killed = threading.Event()
    first_pid = hub.control_plane_pid()

    def kill_when_running():
        client = api(hub, token("carol"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            items = client.get("jobs", params={"limit": 1, "phase": "RUNNING"}).json()["items"]
            if items and items[0]["name"] == "counter":
                time.sleep(3)
                os.kill(first_pid, signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    run = k.execute(COUNTING_CELL.format(n=n), timeout=400)
    killer.join()
    assert killed.is_set()
    assert run.reply["status"] == "ok", run.text
    hub.wait_for_service()
    assert hub.control_plane_pid() != first_pid  # the hub restarted it
    job = latest_job(hub, token, "carol")
    assert job["phase"] == "SUCCEEDED" and len(job["attempts"]) == 1  # picked up, not run again
    log = api(hub, token("carol")).get(f"jobs/{job['id']}/logs").json()["text"]
    ticks = [line for line in log.splitlines() if line.startswith("[rank 0] tick")]
    assert ticks == [f"[rank 0] tick {i}" for i in range(n)]
    cell_ticks = {line for line in run.text.splitlines() if line.startswith("[rank 0] tick")}
    assert cell_ticks == set(ticks)  # the notebook saw every line despite the restart
    assert k.execute("print(total)").text.strip() == str(n)


def test_sixteen_gpu_ddp_cell_on_two_slurm_nodes(hub, token, kernel, slurm_cluster):
    k = kernel("alice")
    run = k.execute(SLURM_CELL, timeout=400)
    assert run.reply["status"] == "ok", run.text
    assert k.execute("print(world, int(total))").text.split() == ["16", str(sum(range(16)))]
    job = latest_job(hub, token, "alice")
    assert job["backend"] == "slurm" and job["spec"]["resources"]["nodes"] == 2  # 16 GPUs = 2 whole nodes
    assert "[rank 15] rank 15 of 16 on node 1" in run.text and "[rank 0] rank 0 of 16 on node 0" in run.text
    record = slurm_cluster.wait_done(int(job["attempts"][0]["backend_ref"]))
    assert (record["account"], record["user"]) == ("desk-a", "alice")


RAY_SLURM_CELL = """%%cluster --launcher ray --backend slurm --nodes 2 --gpus-per-node 1 --outputs hosts
import ray
ray.init()
print("nodes", len([n for n in ray.nodes() if n["Alive"]]), "gpus", int(ray.cluster_resources()["GPU"]))
@ray.remote(num_gpus=1)
def where():
    return ray.get_runtime_context().get_node_id()
hosts = len(set(ray.get([where.remote() for _ in range(2)])))
"""


def test_ray_cell_across_two_slurm_nodes(hub, token, kernel):
    k = kernel("bob")
    run = k.execute(RAY_SLURM_CELL, timeout=400)
    assert run.reply["status"] == "ok", run.text
    assert "[rank 0] nodes 2 gpus 2" in run.text
    assert k.execute("print(hosts)").text.strip() == "2"  # one task on each node
    assert latest_job(hub, token, "bob")["backend"] == "slurm"


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("--gpus 999 --dry-run", "--gpus 999 is more than queue default can ever get; ask for at most --gpus 4"),
        (
            "--gpus 999 --backend slurm --dry-run",
            "--gpus 999 is more than queue default can ever get; ask for at most --gpus 32",
        ),
        ("--gpu 2", "unknown option --gpu (did you mean --gpus?)"),
    ],
)
def test_a_refusal_names_the_flag_as_typed(hub, token, kernel, line, words):
    """The words come from the real control plane (what alice's desk can ever get), through her kernel."""
    run = kernel("alice").execute(f"%%cluster {line}\nprint('never')\n")
    assert run.reply["status"] == "error" and run.reply["ename"] == "UsageError"
    assert run.reply["evalue"] == words
