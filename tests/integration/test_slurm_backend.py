"""cellscale's control plane driving the REAL multi-node Slurm dev cluster (4 nodes x 8
emulated GPUs, two leaf switches, accounting): jobs submitted as the researcher, charged to
the desk's account, multi-node torchrun, topology, a node failure recorded. (Ray across two
nodes and the 16-GPU gang run from a notebook: tests/integration/test_notebook.py.)"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import cloudpickle
import pytest

from cellscale.spec import Phase
from cellscale_hub.drivers.slurm import SlurmDriver
from cellscale_hub.store import Store
from tests.controlplane.conftest import Plane, two_desks
from tests.controlplane.test_faults import EXPECTED as TRAIN_TOTAL
from tests.controlplane.test_faults import TRAIN, cell_pids

pytestmark = pytest.mark.integration

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}
TENANCY = two_desks({"slurm": 16})
# CI runs a multi-node shape every time; CELLSCALE_TEST_GPUS=16 runs the full 2 x 8 gang.
GPUS = int(os.environ.get("CELLSCALE_TEST_GPUS", "4"))

DDP = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
print(f"rank={rank} world={world} node={os.environ['CELLSCALE_NODE']} local={os.environ['LOCAL_RANK']} "
      f"gpu={os.environ['CUDA_VISIBLE_DEVICES']} sum={t.item():.0f}", flush=True)
total = t.item()
dist.destroy_process_group()
"""


@pytest.fixture
def slurm_plane(tmp_path, slurm_cluster):
    store = Store(f"sqlite:///{tmp_path / 'cellscale.sqlite'}")  # the store's own tests cover PostgreSQL
    store.migrate()
    jobs_root = Path(tempfile.mkdtemp(prefix="cellscale-", dir=slurm_cluster.jobs_dir))
    jobs_root.chmod(0o711)  # the researchers' jobs reach their own job dirs, nothing else
    driver = SlurmDriver(name="slurm", slurm_conf=slurm_cluster.env["SLURM_CONF"], master_addr="127.0.0.1")
    return Plane(tmp_path, store, drivers={"slurm": driver}, tenancy=TENANCY, jobs_root=jobs_root)


def sacct(cluster, job_id: str) -> dict:
    """The job's accounting record once slurmdbd has settled it (it writes asynchronously)."""
    return cluster.wait_done(int(job_id))


def logs(plane, job_id):
    return plane.http.get(f"/api/jobs/{job_id}/logs", headers=plane.as_("admin")).json()["text"]


def test_multi_node_torchrun_has_world_size_and_global_ranks(slurm_plane, slurm_cluster):
    response = slurm_plane.submit(
        "alice",
        source=DDP,
        launcher="torchrun",
        outputs=["total"],
        resources={"gpus_per_node": GPUS} if GPUS > 8 else {"nodes": 2, "gpus_per_node": GPUS // 2},
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["spec"]["resources"]["nodes"] == 2  # whole nodes
    done = slurm_plane.run_until(job["id"], TERMINAL, timeout=300)
    text = logs(slurm_plane, job["id"])
    assert done["phase"] == "SUCCEEDED", text
    per_node = GPUS // 2
    expected_sum = sum(range(GPUS))
    for rank in range(GPUS):
        node, local = divmod(rank, per_node)
        assert f"[rank {rank}] rank={rank} world={GPUS} node={node} local={local}" in text
        assert f"sum={expected_sum}" in text
    record = sacct(slurm_cluster, done["attempts"][0]["backend_ref"])
    assert record["account"] == "desk-a" and record["user"] == "alice"  # the desk pays; alice ran it


def test_switches_keep_the_gang_under_one_leaf(slurm_plane, slurm_cluster):
    job = slurm_plane.submit(
        "carol", source="print('ok')", resources={"nodes": 2, "gpus_per_node": 1, "switches": 1}
    ).json()
    done = slurm_plane.run_until(job["id"], TERMINAL, timeout=180)
    assert done["phase"] == "SUCCEEDED"
    nodes = sacct(slurm_cluster, done["attempts"][0]["backend_ref"])["nodes"]
    assert nodes in ("node[1-2]", "node[3-4]"), nodes


def submit_training(plane, cluster) -> dict:
    """alice's 2-node torchrun training cell, checkpointing to a folder she can write."""
    ckpt = Path(tempfile.mkdtemp(prefix="ckpt-", dir=cluster.jobs_dir))
    ckpt.chmod(0o777)  # the job runs as alice
    return plane.submit(
        "alice",
        source=TRAIN,
        launcher="torchrun",
        outputs=["total"],
        resources={"nodes": 2, "gpus_per_node": 1},
        env={"CKPT_URL": str(ckpt)},
    ).json()


def test_a_node_downed_mid_run_is_excluded_and_the_job_resumes_to_the_same_result(slurm_plane, slurm_cluster):
    job = submit_training(slurm_plane, slurm_cluster)
    running = wait_for_step(slurm_plane, job["id"], 8)
    slurm_id = running["attempts"][0]["backend_ref"]
    node = subprocess.run(
        ["squeue", "-h", "-j", slurm_id, "-o", "%N"], env=slurm_cluster.env, capture_output=True, text=True, check=True
    ).stdout.strip()
    victim = subprocess.run(
        ["scontrol", "show", "hostnames", node], env=slurm_cluster.env, capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    subprocess.run(
        ["scontrol", "update", f"nodename={victim}", "state=down", "reason=cellscale-fault-test"],
        env=slurm_cluster.env,
        check=True,
    )
    try:
        done = slurm_plane.run_until(job["id"], TERMINAL, timeout=300)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={victim}", "state=resume"], env=slurm_cluster.env, check=True)
    text = logs(slurm_plane, job["id"])
    assert done["phase"] == "SUCCEEDED", text
    result = slurm_plane.http.get(f"/api/jobs/{job['id']}/result", headers=slurm_plane.as_("alice"))
    assert cloudpickle.loads(result.content) == {"total": TRAIN_TOTAL}  # as if the node never failed
    first, second = done["attempts"][:2]
    assert first["fault"] == "infrastructure" and first["failed_nodes"] == [victim]
    assert f"{victim} (cellscale-fault-test)" in first["end_reason"]
    assert done["excluded_nodes"] == [victim]
    script = (Path(slurm_plane.jobs_root) / job["id"] / "attempts" / str(second["number"]) / "job.sbatch").read_text()
    assert f"#SBATCH --exclude={victim}" in script
    assert victim not in sacct(slurm_cluster, second["backend_ref"])["nodes"]
    events = slurm_plane.http.get(f"/api/jobs/{job['id']}/events", headers=slurm_plane.as_("alice")).json()
    assert any(e["reason"] == "Retrying" and "infrastructure 1 of 3" in (e["message"] or "") for e in events)
    assert any(e["reason"] == "Resumed" for e in events)
    _wait_idle(slurm_cluster, victim)


def test_a_killed_rank_on_slurm_is_retried_and_resumes_to_the_same_result(slurm_plane, slurm_cluster):
    job = submit_training(slurm_plane, slurm_cluster)
    wait_for_step(slurm_plane, job["id"], 8)
    job_dir = Path(slurm_plane.jobs_root) / job["id"]
    subprocess.run(["kill", "-KILL", str(cell_pids(job_dir)[-1])], check=True)  # one rank of the gang dies
    done = slurm_plane.run_until(job["id"], TERMINAL, timeout=300)
    assert done["phase"] == "SUCCEEDED", logs(slurm_plane, job["id"])
    result = slurm_plane.http.get(f"/api/jobs/{job['id']}/result", headers=slurm_plane.as_("alice"))
    assert cloudpickle.loads(result.content) == {"total": TRAIN_TOTAL}
    assert [a["fault"] for a in done["attempts"]] == ["infrastructure", None], [
        (a["backend_ref"], a["state"], a["end_reason"]) for a in done["attempts"]
    ]
    assert done["excluded_nodes"] == []  # a dead process is not a dead node


def test_a_gang_no_partition_can_hold_is_refused_at_submit(slurm_plane):
    too_wide = slurm_plane.submit("alice", resources={"nodes": 5, "gpus_per_node": 8})
    assert too_wide.status_code == 422 and "use at most --nodes 4" in too_wide.text
    too_big = slurm_plane.submit("alice", resources={"gpus_per_node": 12})
    assert too_big.status_code == 422 and "12 GPUs per node is more than" in too_big.text


def test_cancel_reaches_slurm(slurm_plane, slurm_cluster):
    job = slurm_plane.submit("alice", source="import time\ntime.sleep(300)").json()
    running = slurm_plane.run_until(job["id"], {Phase.RUNNING}, timeout=180)
    slurm_plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=slurm_plane.as_("alice"))
    done = slurm_plane.run_until(job["id"], TERMINAL, timeout=120)
    assert done["phase"] == "CANCELLED"
    assert sacct(slurm_cluster, running["attempts"][0]["backend_ref"])["state"]["current"] in (
        "CANCELLED",
        ["CANCELLED"],
    )


def test_a_cancel_as_the_job_starts_ends_it_cancelled_on_slurm(slurm_plane, slurm_cluster):
    """A cancel the moment the job reaches STARTING (just submitted: Slurm may not have started it)
    ends it CANCELLED in the cycles after, its attempt CANCELLED, not LOST."""
    job = slurm_plane.submit("alice", source="import time\ntime.sleep(300)").json()
    starting = slurm_plane.run_until(job["id"], {Phase.STARTING}, timeout=60)  # the cycle that submitted it
    slurm_plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=slurm_plane.as_("alice"))
    done = slurm_plane.run_until(job["id"], TERMINAL, timeout=120)
    attempt = done["attempts"][-1]
    assert done["phase"] == "CANCELLED" and attempt["state"] == "CANCELLED" and attempt["fault"] is None, attempt
    assert sacct(slurm_cluster, starting["attempts"][0]["backend_ref"])["state"]["current"] in (
        "CANCELLED",
        ["CANCELLED"],
    )


def wait_for_step(plane, job_id, step, timeout=240):
    """Until rank 0 reports `step` (it rides the nodes' heartbeats)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        plane.controller.cycle()
        job = plane.http.get(f"/api/jobs/{job_id}", headers=plane.as_("admin")).json()
        if job["attempts"] and (job["attempts"][-1]["last_step"] or 0) >= step:
            return job
        time.sleep(0.5)
    raise AssertionError(f"{job_id} never reported step {step}")


def _wait_idle(cluster, node, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["sinfo", "-h", "-n", node, "-o", "%T"], env=cluster.env, capture_output=True, text=True
        ).stdout
        if state.strip() in ("idle", "mixed", "allocated"):
            return
        time.sleep(1)
