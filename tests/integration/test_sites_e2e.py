"""Placement across sites through cellscale's control plane, on the REAL topology
(`dev.slurm up --sites`: clusters dca and dcb, dca's burst partition of cloud nodes powered up
by Slurm's own power saving through the cloud simulation). A desk fills dca; a cell whose data
is at dca goes to dcb, and says why; with both full and budget left it bursts (nodes boot, ranks
run there, nodes power down, the cloud's bill is attributed to it); with the budget spent it
waits and says what the burst would cost; a stockout sends it elsewhere; a spot reclaim
checkpoints and resumes it elsewhere to the same result; a dead dcb controller moves what had
not started there and nothing runs twice when it returns."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import cloudpickle
import pytest

from cellscale.spec import Phase
from cellscale_hub.dev import slurm as dev_slurm
from cellscale_hub.drivers.slurm import SlurmDriver
from cellscale_hub.store.db import Store
from cellscale_hub.tenancy import Tenancy
from tests.controlplane.conftest import Plane
from tests.integration.slurm_fixtures import slurm_cluster  # noqa: F401 - the fixture
from tests.integration.test_slurm_admission import submit_checkpointing
from tests.integration.test_slurm_backend import TERMINAL, logs
from tests.integration.test_slurm_sites import (
    POWER_DOWN_S,
    SLACK_S,
    resume_duplicate_jobid_drains,
    short_states,
    wait_powered_down,
)

pytestmark = pytest.mark.integration

SLEEP = "import time\ntime.sleep(float(__import__('os').environ.get('SLEEP_S', '600')))"
NODES = "import os, socket\nprint('on', os.environ.get('SLURMD_NODENAME'), os.environ.get('CELLSCALE_NODE'))"
STEPS = 40


def site_tenancy(budget: float | None = 50.0) -> Tenancy:
    desk_a = {"queues": {"default": {"cluster_queue": "desk-a"}}, "burst": "allow"}
    if budget is not None:
        desk_a["budget"] = {"usd": budget, "period": "week", "covers": "cloud"}
    quotas = {"dca": {"nominal": 16}, "dcb": {"nominal": 8}, "burst": {"nominal": 16}}
    return Tenancy.model_validate(
        {
            "sites": {
                "dca": {"gpu_hour_usd": 1.1, "egress_usd_per_gb": 0.02, "bandwidth_gb_s": 1.0},
                "dcb": {"gpu_hour_usd": 1.1, "egress_usd_per_gb": 0.02, "bandwidth_gb_s": 1.0},
                "burst": {"kind": "cloud", "gpu_hour_usd": 2.5, "boot_s": 5, "idle_tail_s": 11},
            },
            "flavors": {name: {"backend": name, "site": name} for name in ("dca", "dcb", "burst")},
            "datasets": {"bars": {"site": "dca", "size_gb": 60}},
            "cohorts": {"firm": {}},
            "cluster_queues": {d: {"cohort": "firm", "quotas": quotas} for d in ("desk-a", "desk-b")},
            "tenants": {"desk-a": desk_a, "desk-b": {"queues": {"default": {"cluster_queue": "desk-b"}}}},
        }
    )


@pytest.fixture
def plane(tmp_path, slurm_cluster):
    if slurm_cluster.sites is None:
        pytest.skip("the session's Slurm topology has no sites")
    cloud = slurm_cluster.cloud
    cloud.mode("ok", delay=dev_slurm.BOOT_DELAY)
    store = Store(f"sqlite:///{tmp_path / 'cellscale.sqlite'}")
    store.migrate()
    jobs_root = Path(tempfile.mkdtemp(prefix="sites-", dir=slurm_cluster.jobs_dir))
    jobs_root.chmod(0o711)
    dca_conf, dcb_conf = slurm_cluster.env["SLURM_CONF"], slurm_cluster.sites.dcb_env["SLURM_CONF"]
    config = dev_slurm_cloud_config(slurm_cluster)
    drivers = {
        "dca": SlurmDriver(name="dca", partition="gpu", slurm_conf=dca_conf, master_addr="127.0.0.1"),
        "dcb": SlurmDriver(name="dcb", partition="gpu", slurm_conf=dcb_conf, master_addr="127.0.0.1"),
        "burst": SlurmDriver(
            name="burst",
            partition=dev_slurm.BURST_PARTITION,
            slurm_conf=dca_conf,
            master_addr="127.0.0.1",
            shares_accounts_with=["dca"],
            cloud_ledger_url=f"http://127.0.0.1:{int(config['port'])}/ledger",
            cloud_ledger_token_file=str(config["token_file"]),
        ),
    }
    drivers["dca"].shares_accounts_with = ["burst"]
    the_plane = Plane(tmp_path, store, drivers=drivers, tenancy=site_tenancy(), jobs_root=jobs_root)
    the_plane.tune(cloud_bill_interval_s=0.0)
    yield the_plane
    for job in the_plane.http.get("/api/jobs?scope=all&limit=500", headers=the_plane.as_("admin")).json()["items"]:
        if Phase(job["phase"]) not in TERMINAL:
            the_plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=the_plane.as_("admin"))
    for _ in range(20):
        the_plane.controller.cycle()
        time.sleep(0.2)
    cloud.mode("ok", delay=dev_slurm.BOOT_DELAY)


def dev_slurm_cloud_config(cluster) -> dict:
    from cellscale_hub.dev import cloud as dev_cloud

    return dev_cloud.load_config(cluster.state_dir)


def fill(plane, site: str, nodes: int, seconds: float = 600, minutes: int = 60) -> str:
    """A desk-b job holding `nodes` whole nodes of a site, running (for `seconds`, within a
    time limit of `minutes`: what placement assumes)."""
    resources = {"nodes": nodes, "gpus_per_node": 8, "timeout_min": minutes}
    job = plane.submit("bob", source=SLEEP, site=site, resources=resources, env={"SLEEP_S": str(seconds)}).json()
    plane.run_until(job["id"], {Phase.RUNNING}, timeout=120)
    return job["id"]


def admitted_message(plane, job_id: str) -> str:
    events = plane.http.get(f"/api/jobs/{job_id}/events", headers=plane.as_("admin")).json()
    return next(e["message"] for e in events if e["reason"] == "QuotaReserved")


def job(plane, job_id: str) -> dict:
    return plane.http.get(f"/api/jobs/{job_id}", headers=plane.as_("admin")).json()


def test_data_at_a_full_site_goes_to_the_free_one_and_says_why(plane, slurm_cluster):
    fill(plane, "dca", 2)
    fill(plane, "dca", 2)  # dca: 32 of 32 GPUs held by desk-b for up to an hour
    cell = plane.submit("alice", source=NODES, datasets=["bars"], resources={"nodes": 2, "gpus_per_node": 8}).json()
    done = plane.run_until(cell["id"], TERMINAL, timeout=180)
    assert done["phase"] == "SUCCEEDED", logs(plane, cell["id"])
    assert done["backend"] == "dcb" and sorted(done["attempts"][0]["nodes"]) == ["b1", "b2"]
    message = admitted_message(plane, cell["id"])
    assert "placed at dcb: " in message and "dcb ≈1 min, moving 60 GB (≈$1.20 egress)" in message, message
    assert "dca ≈1 h" in message and "burst ≈1 min for ≈$" in message, message
    name = f"{cell['id']}-a1"
    on = {
        c: slurm_cluster.run(["sacct", "-M", c, "-X", "-n", "-P", f"--name={name}", "-o", "JobID"]).stdout.split()
        for c in ("dca", "dcb")
    }
    assert len(on["dcb"]) == 1 and on["dca"] == [], on


def test_both_sites_full_and_budget_left_bursts_billed_to_the_cent(plane, slurm_cluster):
    fill(plane, "dca", 2)
    fill(plane, "dca", 2)
    fill(plane, "dcb", 2)
    began = time.monotonic()
    cell = plane.submit(
        "alice", source=NODES + "\nimport time\ntime.sleep(8)", resources={"nodes": 2, "gpus_per_node": 8}
    ).json()
    seen: set[str] = set()
    running_after = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        plane.controller.cycle()
        seen |= {state for state, _ in short_states(slurm_cluster, slurm_cluster.sites.cloud_nodes).values()}
        view = job(plane, cell["id"])
        if running_after is None and view["phase"] == "RUNNING":
            running_after = time.monotonic() - began
        if Phase(view["phase"]) in TERMINAL:
            break
        time.sleep(0.25)
    assert view["phase"] == "SUCCEEDED", logs(plane, cell["id"])
    print(f"burst: submit -> all ranks running {running_after:.1f} s (boot delay {dev_slurm.BOOT_DELAY} s)")
    nodes = sorted(view["attempts"][0]["nodes"])
    assert view["backend"] == "burst" and len(nodes) == 2 and set(nodes) <= set(slurm_cluster.sites.cloud_nodes)
    message = admitted_message(plane, cell["id"])
    assert "placed at burst: burst starts now for ≈$40 (80% of desk-a's weekly budget); dca ≈1 h; dcb ≈1 h" in message
    assert "idle~" in seen and any(s.endswith("#") for s in seen), seen  # powered down, powering up
    assert seen & {"alloc", "mix"}, seen  # then allocated
    text = logs(plane, cell["id"])
    assert f"on {nodes[0]}" in text and f"on {nodes[1]}" in text, text
    wait_powered_down(slurm_cluster, nodes, POWER_DOWN_S + SLACK_S)
    ledger = slurm_cluster.cloud.ledger()
    submitted = view["attempts"][0]["submitted_at"]
    mine = [
        i
        for i in ledger["instances"]
        if i["node"] in nodes and i["stopped"] and i["requested"] >= _epoch(submitted) - 5
    ]
    assert len(mine) == 2, ledger["instances"]
    plane.controller.metering.bill_cloud("burst", plane.drivers["burst"])
    billed = job(plane, cell["id"])["attempts"][0]["cloud_usd"]
    cloud_usd = sum(i["dollars"] for i in mine)
    assert billed == pytest.approx(cloud_usd, rel=0.01), (billed, mine)


def test_budget_spent_waits_with_the_price_and_what_is_left(plane):
    tenancy = site_tenancy(budget=0.05)
    plane.tenancy.change("test", "set-budget", "tenants/desk-a", lambda doc: _replace(doc, tenancy))
    fill(plane, "dca", 2)
    fill(plane, "dca", 2)
    fill(plane, "dcb", 2)
    cell = plane.submit("alice", source=NODES, resources={"nodes": 2, "gpus_per_node": 8}).json()
    for _ in range(3):
        plane.controller.cycle()
    pending = job(plane, cell["id"])["pending"]
    assert "burst starts now for ≈$40 (" in pending["message"], pending
    assert "× desk-a's weekly budget): not allowed, would cost ≈$40" in pending["message"], pending
    assert "> $0.05 left of the weekly budget" in pending["message"], pending
    assert {s["site"] for s in pending["sites"]} == {"dca", "dcb", "burst"}


def test_a_stockout_powers_the_nodes_down_and_the_job_goes_elsewhere(plane, slurm_cluster):
    blockers = [fill(plane, "dca", 2, 45), fill(plane, "dca", 2, 45), fill(plane, "dcb", 2, 45)]
    slurm_cluster.cloud.mode("stockout")
    cell = plane.submit("alice", source=NODES, resources={"nodes": 2, "gpus_per_node": 8}).json()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        plane.controller.cycle()
        view = job(plane, cell["id"])
        if view["attempts"] and view["attempts"][0]["ended_at"]:
            break
        time.sleep(0.25)
    first = view["attempts"][0]
    assert first["backend"] == "burst" and first["fault"] == "capacity", first
    ended = time.monotonic()
    while time.monotonic() - ended < 10:
        plane.controller.cycle()
        pending = job(plane, cell["id"]).get("pending") or {}
        if "burst" in pending.get("message", "") and "it had no capacity" in pending["message"]:
            break
        time.sleep(0.25)
    print(f"re-placed {time.monotonic() - ended:.1f} s after the stockout ended the attempt")
    assert "it had no capacity" in pending["message"], pending  # waits for dca or dcb now, says why
    tried = first["nodes"] or ["c1", "c2"]
    wait_powered_down(slurm_cluster, tried, 30)  # powered-down idle, never left DOWN
    assert all(reason.startswith("stockout") for _, reason in short_states(slurm_cluster, tried).values())
    slurm_cluster.cloud.mode("ok", delay=dev_slurm.BOOT_DELAY)
    done = plane.run_until(cell["id"], TERMINAL, timeout=240)
    assert done["phase"] == "SUCCEEDED" and done["backend"] in ("dca", "dcb"), done
    assert len(done["attempts"]) == 2 and blockers


def test_a_spot_reclaim_checkpoints_and_resumes_elsewhere_to_the_same_result(plane, slurm_cluster):
    plane.tune(preemption_grace_s=20)
    fill(plane, "dca", 2, 40)
    fill(plane, "dca", 2, 40)
    fill(plane, "dcb", 2, 40)
    cell = submit_checkpointing(plane, slurm_cluster, nodes=2, steps=STEPS, step_s=0.5)
    running = plane.run_until(cell["id"], {Phase.RUNNING}, timeout=120)
    assert running["backend"] == "burst"
    time.sleep(3)
    node = sorted(running["attempts"][0]["nodes"])[0]
    slurm_cluster.cloud.reclaim(node, notice=15)
    done = plane.run_until(cell["id"], TERMINAL, timeout=300)
    text = logs(plane, cell["id"])
    assert done["phase"] == "SUCCEEDED", text
    assert done["attempts"][0]["end_reason"].startswith(f"preempted: {node} is being reclaimed (spot-reclaim"), done
    assert done["attempts"][-1]["backend"] in ("dca", "dcb")
    assert "checkpointed at step " in text, text
    result = plane.http.get(f"/api/jobs/{cell['id']}/result", headers=plane.as_("alice"))
    assert cloudpickle.loads(result.content) == {"total": sum(range(STEPS + 1))}  # as if never interrupted


def test_a_dead_dcb_controller_moves_what_had_not_started_and_nothing_runs_twice(plane, slurm_cluster):
    plane.tune(site_lost_timeout_s=5)
    plane.drivers["dcb"].command_timeout = 5  # a dead controller: give up on each query sooner
    dcb_env = os.environ | slurm_cluster.sites.dcb_env
    # a job outside cellscale holds b1, so Slurm keeps cellscale's dcb job waiting
    raw = (
        subprocess.run(
            [
                "runuser",
                "-u",
                "bob",
                "--",
                "sbatch",
                "--parsable",
                "--account=desk-b",
                "-N1",
                "-w",
                "b1",
                "--gres=gpu:8",
                "--output=/dev/null",
                "--wrap",
                "sleep 300",
            ],
            env=dcb_env,
            capture_output=True,
            text=True,
            check=True,
            cwd="/tmp",
        )
        .stdout.strip()
        .split(";")[0]
    )
    try:
        running = fill(plane, "dcb", 1)  # b2: a cellscale job that runs through the outage
        fill(plane, "dca", 2, 40, minutes=1)  # dca busy for a minute at most: dcb is the place for now
        fill(plane, "dca", 2, 40, minutes=1)
        waiting = plane.submit("alice", source=NODES, resources={"nodes": 1, "gpus_per_node": 8}).json()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            plane.controller.cycle()
            view = job(plane, waiting["id"])
            if view["attempts"] and view["attempts"][0]["backend_ref"]:
                break
            time.sleep(0.25)
        assert view["attempts"][0]["backend"] == "dcb", view  # accepted there; Slurm keeps it waiting for b1
        pid = int((slurm_cluster.state_dir / "run" / "slurmctld-dcb.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        try:
            done = plane.run_until(waiting["id"], TERMINAL, timeout=240)
            assert done["phase"] == "SUCCEEDED" and done["backend"] != "dcb", done
            assert "moved: dcb has not answered" in done["attempts"][0]["end_reason"], done["attempts"][0]
            assert job(plane, running)["attempts"][0]["state"] == "UNKNOWN"
        finally:
            dev_slurm.up(slurm_cluster.state_dir, sites=True, log=lambda line: print(f"[slurm up] {line}"))
        for _ in range(20):
            plane.controller.cycle()
            time.sleep(0.3)
        first = done["attempts"][0]["backend_ref"]
        record = subprocess.run(
            ["sacct", "-M", "dcb", "-X", "-n", "-P", "-j", first, "-o", "State"],
            env=dcb_env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        # cancelled at dcb once it answered, or gone with the controller's unsaved state: never ran
        print(f"dcb's record of the moved attempt after its return: {record or 'none'}")
        assert record == [] or record[0].startswith("CANCELLED"), record
        attempt_dir = plane.jobs_root / waiting["id"] / "attempts" / "1"
        assert (attempt_dir / "gate").read_text() == "fenced"
        assert not (attempt_dir / "node0" / "started").exists()
        # known again: what dcb's own accounting says (still running, or ended by Slurm: a SIGKILLed
        # slurmctld loses its unsaved state and hands out job ids again; when a new job gets the id
        # of the one still running on b2, b2's slurmd reports "Duplicate jobid": Slurm cancels it and
        # drains b2), never LOST by cellscale
        after = job(plane, running)["attempts"]
        print(f"the job running at dcb through the outage, after its return: {after[0]['state']}")
        assert after[0]["state"] != "LOST" and after[0]["state"] != "UNKNOWN", after[0]
    finally:
        subprocess.run(["scancel", raw], env=dcb_env, check=False)
        resume_duplicate_jobid_drains(dcb_env)


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def _replace(doc: dict, tenancy: Tenancy):
    before = doc["tenants"]["desk-a"].get("budget")
    doc["tenants"]["desk-a"] = tenancy.model_dump(mode="json")["tenants"]["desk-a"]
    return before, doc["tenants"]["desk-a"]["budget"]
