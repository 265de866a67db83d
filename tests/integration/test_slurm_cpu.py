"""CPUs and memory on the REAL Slurm dev cluster, through cellscale's control plane: its cpu
partition as a second Slurm backend (`slurm-cpu`) beside the gpu partition (`slurm`), a CPU
cell's cores and memory, and the desks' cpu quotas mirrored into Slurm's own accounts."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import cloudpickle
import pytest

from cellscale_hub.app import ControlPlane
from cellscale_hub.drivers.slurm import SlurmDriver
from cellscale_hub.store import Store
from cellscale_hub.tenancy import Tenancy
from tests.controlplane.conftest import Plane
from tests.integration.test_slurm_backend import TERMINAL, logs

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[2] / "config"
DESKS = ("desk-a", "desk-b")
# desk-b may hold 8 + 8 cores on the cluster at most (no borrowing): Slurm gets cpu=16
TENANCY = Tenancy.model_validate(
    {
        "flavors": {"slurm": {"backend": "slurm"}, "slurm-cpu": {"backend": "slurm-cpu"}},
        "cohorts": {"firm": {}},
        "cluster_queues": {
            "desk-a": {
                "cohort": "firm",
                "quotas": {
                    "slurm": {"nominal": 16, "cpu": {"nominal": 64}},
                    "slurm-cpu": {"cpu": {"nominal": 40}, "memory": {"nominal": "80G"}},
                },
            },
            "desk-b": {
                "cohort": "firm",
                "quotas": {
                    "slurm": {"nominal": 16, "cpu": {"nominal": 8, "borrowing_limit": 0}},
                    "slurm-cpu": {"cpu": {"nominal": 8, "borrowing_limit": 0}, "memory": {"nominal": "16G"}},
                },
            },
        },
        "tenants": {desk: {"queues": {"default": {"cluster_queue": desk}}} for desk in DESKS},
    }
)

BACKTEST = """
import os
seen = {key: os.environ.get(key) for key in ("SLURM_JOB_PARTITION", "SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_NODE")}
print("backtest on", seen, flush=True)
"""


@pytest.fixture
def accounts(slurm_cluster):
    """The desks' Slurm limits as they were, put back after the test (other tests share them)."""
    saved = {desk: _assoc(slurm_cluster, desk) for desk in DESKS}
    yield
    for desk, (tres, shares) in saved.items():
        sets = ["GrpTRES=cpu=-1,mem=-1,gres/gpu=-1", *([f"GrpTRES={tres}"] if tres else []), f"Fairshare={shares}"]
        for setting in sets:
            slurm_cluster.run(["sacctmgr", "-i", "modify", "account", "where", f"name={desk}", "set", setting])


@pytest.fixture
def cpu_plane(tmp_path, slurm_cluster, accounts):
    """A control plane with both partitions of the dev cluster as backends, each naming the other."""
    common = {"slurm_conf": slurm_cluster.env["SLURM_CONF"], "master_addr": "127.0.0.1"}
    drivers = {
        "slurm": SlurmDriver(name="slurm", partition="gpu", shares_accounts_with=["slurm-cpu"], **common),
        "slurm-cpu": SlurmDriver(name="slurm-cpu", partition="cpu", shares_accounts_with=["slurm"], **common),
    }
    return _plane(tmp_path, slurm_cluster, drivers, TENANCY)


def _plane(tmp_path, cluster, drivers, tenancy) -> Plane:
    store = Store(f"sqlite:///{tmp_path / 'cellscale.sqlite'}")
    store.migrate()
    jobs_root = Path(tempfile.mkdtemp(prefix="cellscale-", dir=cluster.jobs_dir))
    jobs_root.chmod(0o711)  # the researchers' jobs reach their own job dirs, nothing else
    return Plane(tmp_path, store, drivers=drivers, tenancy=tenancy, jobs_root=jobs_root)


def test_each_partition_reports_the_cores_its_jobs_may_use(cpu_plane):
    gpu, cpu = (cpu_plane.drivers[name].capacity() for name in ("slurm", "slurm-cpu"))
    assert (gpu.capacity_gpus, gpu.max_nodes, gpu.capacity_cpus, gpu.cpus_per_node) == (32, 4, 128, 32)
    assert (gpu.capacity_memory_mb, gpu.memory_mb_per_node) == (4 * 128000, 128000)
    # 2 CPU nodes x 8 cores, and 16 of each GPU node's 32; its QOS allows no GPU
    assert (cpu.capacity_gpus, cpu.max_nodes, cpu.capacity_cpus, cpu.cpus_per_node) == (0, 6, 80, 16)
    assert (cpu.capacity_memory_mb, cpu.memory_mb_per_node) == (2 * 32000 + 4 * 128000, 128000)


def test_a_cpu_backtest_cell_runs_on_the_cpu_partition_with_its_cores_and_memory(cpu_plane, slurm_cluster):
    """`%%cluster --backend slurm-cpu --cpus 8 --mem 4G`."""
    job = cpu_plane.submit(
        "alice",
        source=BACKTEST,
        backend="slurm-cpu",
        outputs=["seen"],
        resources={"cpus_per_task": 8, "memory_mb_per_node": "4G"},
    ).json()
    done = cpu_plane.run_until(job["id"], TERMINAL, timeout=180)
    assert done["phase"] == "SUCCEEDED", logs(cpu_plane, job["id"])
    result = cpu_plane.http.get(f"/api/jobs/{job['id']}/result", headers=cpu_plane.as_("alice"))
    seen = cloudpickle.loads(result.content)["seen"]
    assert seen == {"SLURM_JOB_PARTITION": "cpu", "SLURM_CPUS_PER_TASK": "8", "SLURM_MEM_PER_NODE": "4096"}
    record = slurm_cluster.wait_done(int(done["attempts"][0]["backend_ref"]))
    assert (record["partition"], record["account"], record["user"]) == ("cpu", "desk-a", "alice")
    held = {t["type"]: t["count"] for t in record["tres"]["allocated"] if t["type"] in ("cpu", "mem")}
    assert held == {"cpu": 8, "mem": 4096}


def test_mirrored_cpu_quota_holds_back_a_raw_sbatch_over_it(cpu_plane, slurm_cluster):
    """desk-b's cores on both partitions together (8 + 8) become its account's GrpTRES cpu=16:
    jobs submitted around cellscale meet it in Slurm itself."""
    cpu_plane.controller.cycle()  # mirrors the tenancy into both partitions' accounts
    assert _assoc(slurm_cluster, "desk-b") == ("cpu=16,gres/gpu=35", "500")
    # desk-a: 64 + 8 borrowable on the GPU nodes, 40 + 8 on the cpu partition; no memory quota
    # on its GPU flavor, so no memory limit
    assert _assoc(slurm_cluster, "desk-a") == ("cpu=120,gres/gpu=35", "500")

    raw = ("-p", "cpu", "-A", "desk-b", "--time=5")
    holding = slurm_cluster.sbatch(*raw, "--cpus-per-task=8", "--wrap", "sleep 300", user="bob")
    over = slurm_cluster.sbatch(*raw, "--cpus-per-task=16", "--wrap", "true", user="bob")  # 8 + 16 > 16
    try:
        slurm_cluster.wait_state(holding, "RUNNING")
        assert _limit_reason(slurm_cluster, over) == "AssocGrpCpuLimit"
        # one job larger than the whole limit can never run: the cpu partition's QOS
        # (DenyOnLimit) has sbatch refuse it at once
        alone = slurm_cluster.run(["sbatch", *raw, "--cpus-per-task=24", "--wrap", "true"], user="bob", check=False)
        assert alone.returncode != 0 and "AssocGrpCpuLimit" in alone.stderr, alone.stderr
    finally:
        slurm_cluster.cancel(holding, over)


def test_the_demo_config_runs_a_cpu_cell_on_slurm_cpu(tmp_path, slurm_cluster, accounts, monkeypatch):
    """config/cellscale_config.py and config/tenants.yaml as the demo hub loads them: both
    partitions become backends, and `%%cluster --backend slurm-cpu --cpus 8 --mem 4G` (the
    magic's default launcher, torchrun) runs."""
    monkeypatch.setenv("CELLSCALE_SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    monkeypatch.setenv("CELLSCALE_STATE_DIR", str(tmp_path))
    app = ControlPlane()
    app.load_config_file(str(CONFIG / "cellscale_config.py"))
    drivers = app.make_drivers()
    assert {name: d.partition for name, d in drivers.items() if d.kind == "slurm"} == {
        "slurm": "gpu",
        "slurm-cpu": "cpu",
    }
    plane = _plane(tmp_path, slurm_cluster, drivers, Tenancy.from_yaml(Path(app.tenants_file).read_text()))
    plane.controller.cycle()
    # the desks' cores on both partitions (208) add up to more than dca's static nodes have (144),
    # but the cap is the whole cluster, the burst partition's 4 x 32 cloud cores included (272):
    # burst jobs are charged to the same accounts (the cap itself: tests/unit/test_slurm_driver.py)
    assert _assoc(slurm_cluster, "desk-a") == ("cpu=208,gres/gpu=35", "500")
    job = plane.submit(
        "alice",
        source=BACKTEST,
        backend="slurm-cpu",
        launcher="torchrun",
        outputs=["seen"],
        resources={"cpus_per_task": 8, "memory_mb_per_node": "4G"},
    ).json()
    done = plane.run_until(job["id"], TERMINAL, timeout=240)
    assert done["phase"] == "SUCCEEDED", logs(plane, job["id"])
    result = plane.http.get(f"/api/jobs/{job['id']}/result", headers=plane.as_("alice"))
    assert cloudpickle.loads(result.content)["seen"]["SLURM_JOB_PARTITION"] == "cpu"


def _assoc(cluster, account: str) -> tuple[str, str]:
    """(GrpTRES, Fairshare) of the account's own association."""
    query = ["sacctmgr", "-n", "-P", "show", "assoc", "cluster=dca", f"account={account}"]
    out = cluster.run([*query, "format=user,grptres,fairshare"])
    row = next(line.split("|") for line in out.stdout.splitlines() if line.startswith("|"))
    return row[1], row[2]


def _limit_reason(cluster, job_id: int, timeout: float = 30) -> str:
    """Why a pending job waits, once a scheduler pass has named a limit."""
    deadline = time.monotonic() + timeout
    reason = ""
    while time.monotonic() < deadline:
        reason = cluster.run(["squeue", "-h", "-j", str(job_id), "-o", "%r"], check=False).stdout.strip()
        if reason not in ("", "None", "Priority", "Resources"):
            break
        time.sleep(0.5)
    return reason
