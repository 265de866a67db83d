"""The multi-site topology on real Slurm daemons (`dev.slurm up --sites`, the session fixture):
clusters dca and dcb behind one slurmdbd, dca's burst partition of CLOUD nodes powered up and
down by Slurm's own power saving through the cloud simulation, and the Slurm driver against
each site. Every test leaves the cloud in mode ok and cancels its jobs."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cellscale.spec import JobSpec
from cellscale.vocabulary import AttemptState, Fault
from cellscale_hub.dev import slurm as dev_slurm
from cellscale_hub.drivers.slurm import SlurmDriver
from cellscale_hub.drivers.types import AttemptRef, BackendUnreachable
from cellscale_hub.tenancy import Tenancy
from tests.integration.slurm_fixtures import slurm_cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

BURST = dev_slurm.BURST_PARTITION
# a node goes idle% SuspendTime (+1 s power-save loop) after its job, idle~ SuspendTimeout (+1 s) later
POWER_DOWN_S = dev_slurm.SUSPEND_TIME + dev_slurm.SUSPEND_TIMEOUT + 2
SLACK_S = 6  # a 2-core machine under load


def short_states(cluster, nodes) -> dict[str, tuple[str, str]]:
    """node -> (sinfo %t, reason)."""
    out = cluster.run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%t|%E"]).stdout
    return {name: (state, reason) for name, state, reason in (line.split("|", 2) for line in out.splitlines())}


def wait_powered_down(cluster, nodes, timeout: float) -> float:
    """Seconds until every node is powered-down idle (idle~); fails on timeout."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if all(state == "idle~" for state, _ in short_states(cluster, nodes).values()):
            return time.monotonic() - began
        time.sleep(0.25)
    raise AssertionError(f"{nodes} not idle~ within {timeout} s: {short_states(cluster, nodes)}")


def all_cloud_nodes_down(cluster):
    wait_powered_down(cluster, cluster.sites.cloud_nodes, POWER_DOWN_S + SLACK_S + 10)


def driver_for(cluster, *, name: str, partition: str, conf: dict[str, str]) -> SlurmDriver:
    return SlurmDriver(name=name, partition=partition, slurm_conf=conf["SLURM_CONF"], master_addr="127.0.0.1")


def attempt(tmp_path: Path, backend_ref: str, nodes: int = 1) -> AttemptRef:
    return AttemptRef(
        job_id="sites",
        number=1,
        job_dir=tmp_path,
        spec=JobSpec(source="x", resources={"nodes": nodes, "gpus_per_node": 8}),
        backend_ref=backend_ref,
        owner="alice",
        tenant="desk-a",
    )


@pytest.fixture
def cloud(slurm_cluster):
    if slurm_cluster.sites is None:
        pytest.skip("the session's Slurm topology has no sites")
    client = slurm_cluster.cloud
    client.mode("ok", delay=dev_slurm.BOOT_DELAY)
    yield client
    client.mode("ok", delay=dev_slurm.BOOT_DELAY)


def test_both_clusters_share_one_slurmdbd_and_the_burst_nodes_are_powered_down(slurm_cluster, cloud):
    clusters = slurm_cluster.run(["sacctmgr", "-n", "-P", "show", "clusters", "format=cluster"]).stdout.split()
    assert {"dca", "dcb"} <= set(clusters)
    out = slurm_cluster.run(["sinfo", "-M", "dca,dcb", "-h", "-N", "-o", "%N|%P|%t"]).stdout
    rows = [line.split("|") for line in out.splitlines() if "|" in line]
    assert {(n, p) for n, p, _ in rows if n in ("b1", "b2")} == {("b1", "gpu*"), ("b2", "gpu*")}
    all_cloud_nodes_down(slurm_cluster)
    burst = {n: s for n, p, s in rows if p == BURST}
    assert set(burst) == set(slurm_cluster.sites.cloud_nodes)


def test_a_burst_job_boots_cloud_nodes_runs_on_them_and_they_power_down_and_are_billed(slurm_cluster, cloud):
    all_cloud_nodes_down(slurm_cluster)
    before = len(cloud.ledger()["instances"])
    submitted, wall = time.monotonic(), time.time()
    job = slurm_cluster.sbatch(
        "-M",
        "dca",
        "-p",
        BURST,
        "-N2",
        "--ntasks-per-node=1",
        "--gres=gpu:8",
        "-A",
        "desk-a",
        "--time=5",
        "--wrap",
        "echo START $(date +%s.%N); "
        'srun -l bash -c "echo rank=\\$SLURM_PROCID node=\\$SLURMD_NODENAME gpus=\\$CUDA_VISIBLE_DEVICES"; sleep 2',
        user="alice",
    )
    # every cloud node was powered down (idle~) when it was submitted; a sample catches the moment
    # between its allocation and the power-up only by luck (Slurm starts the resume at once)
    seen: list[str] = ["idle~"]
    try:
        while time.monotonic() - submitted < 60:
            state = slurm_cluster.state(job)
            nodes = slurm_cluster.run(["squeue", "-h", "-j", str(job), "-o", "%N"], check=False).stdout.strip()
            if nodes and nodes != "(null)":
                for s, _ in short_states(slurm_cluster, [nodes]).values():
                    if not seen or seen[-1] != s:
                        seen.append(s)
            if state in ("", "COMPLETING", "COMPLETED"):
                break
            time.sleep(0.2)
        record = slurm_cluster.wait_done(job)
    finally:
        slurm_cluster.cancel(job)
    ended = time.monotonic()
    assert record["state"]["current"] == "COMPLETED", record["state"]
    output = slurm_cluster.output(job)
    started = float(next(line.split()[1] for line in output.splitlines() if line.startswith("START"))) - wall
    assert started < dev_slurm.BOOT_DELAY + 35, started
    # powered down -> powering up -> allocated (mixed: the job holds 1 of 32 cores per node)
    assert any(s.endswith("~") for s in seen) and any(s.endswith("#") for s in seen), seen
    assert any(s in ("mix", "alloc") for s in seen), seen
    ranks = sorted(line.split(": ", 1)[1] for line in output.splitlines() if "rank=" in line)
    used = [dict(f.split("=", 1) for f in r.split())["node"] for r in ranks]
    assert len(set(used)) == 2 and set(used) <= set(slurm_cluster.sites.cloud_nodes), ranks
    assert all("gpus=0,1,2,3,4,5,6,7" in r for r in ranks), ranks
    # after the job the nodes power down again
    wait_powered_down(slurm_cluster, used, POWER_DOWN_S + SLACK_S)
    print(f"burst: batch script started {started:.1f} s after sbatch; idle~ {time.monotonic() - ended:.1f} s after")
    ledger = cloud.ledger()
    new = [i for i in ledger["instances"][before:] if i["node"] in used]
    assert sorted(i["node"] for i in new) == sorted(used)
    for instance in new:
        assert instance["stopped"] is not None and instance["end"] == "suspended"
        wall = instance["stopped"] - instance["requested"]
        assert abs(instance["billed_s"] - wall) <= 1
        assert instance["dollars"] == pytest.approx(instance["billed_s"] / 3600 * 2.50 * 8, abs=1e-5)


def test_a_stockout_leaves_the_nodes_powered_down_and_the_driver_sees_a_capacity_fault(slurm_cluster, cloud, tmp_path):
    all_cloud_nodes_down(slurm_cluster)
    cloud.mode("stockout")
    job = slurm_cluster.sbatch(
        "-p", BURST, "-N2", "--gres=gpu:8", "-A", "desk-a", "--time=5", "--no-requeue", "--wrap", "true", user="alice"
    )
    try:
        record = slurm_cluster.wait_done(job, timeout=30)
    finally:
        slurm_cluster.cancel(job)
    # measured on 22.05: a --no-requeue job ends NODE_FAIL about 1 s after its nodes' resume failed
    assert record["state"]["current"] == "NODE_FAIL", record["state"]
    nodes = slurm_cluster.run(["scontrol", "show", "hostnames", record["nodes"]]).stdout.split()
    wait_powered_down(slurm_cluster, nodes, 20)  # idle~, never left DOWN
    assert all(reason.startswith("stockout") for _, reason in short_states(slurm_cluster, nodes).values())
    driver = driver_for(slurm_cluster, name="burst", partition=BURST, conf=slurm_cluster.env)
    seen = driver.poll([attempt(tmp_path, str(job), nodes=2)])[("sites", 1)]
    assert seen.state is AttemptState.FAILED and seen.fault is Fault.CAPACITY, seen
    assert seen.reason.startswith(f"the cloud had no capacity for {', '.join(nodes)} (stockout)"), seen.reason
    assert seen.nodes == tuple(nodes)


def test_a_spot_reclaim_shows_a_notice_then_powers_the_node_down(slurm_cluster, cloud, tmp_path):
    job = slurm_cluster.sbatch(
        *("-p", BURST, "-N1", "--gres=gpu:8", "-A", "desk-a", "--time=5", "--no-requeue"),
        *("--wrap", "sleep 300"),
        user="alice",
    )
    driver = driver_for(slurm_cluster, name="burst", partition=BURST, conf=slurm_cluster.env)
    try:
        slurm_cluster.wait_state(job, "RUNNING", timeout=60)
        node = slurm_cluster.run(["squeue", "-h", "-j", str(job), "-o", "%N"]).stdout.strip()
        running = driver.poll([attempt(tmp_path, str(job))])[("sites", 1)]
        assert running.nodes == (node,)
        cloud.reclaim(node, notice=4)
        state, reason = short_states(slurm_cluster, [node])[node]
        assert reason == "spot-reclaim: terminating in 4 s" and state.startswith("drng"), (state, reason)
        assert driver.node_notices() == {node: "spot-reclaim: terminating in 4 s"}
        record = slurm_cluster.wait_done(job, timeout=30)
        assert record["state"]["current"] == "NODE_FAIL"
        wait_powered_down(slurm_cluster, [node], POWER_DOWN_S + SLACK_S)  # idle~, not DOWN
        driver._node_info = None
        assert driver.node_notices() == {}  # powered down: the notice is over
        ledger = cloud.ledger()
        assert [i["end"] for i in ledger["instances"] if i["node"] == node][-1] == "reclaimed"
    finally:
        slurm_cluster.cancel(job)


SITES_TENANCY = Tenancy.model_validate(
    {
        "flavors": {"dcb-gpu": {"backend": "dcb"}},
        "cohorts": {"firm": {}},
        "cluster_queues": {
            desk: {"cohort": "firm", "quotas": {"dcb-gpu": {"nominal": 8, "borrowing_limit": 0}}}
            for desk in ("desk-a", "desk-b")
        },
        "tenants": {desk: {"queues": {"default": {"cluster_queue": desk}}} for desk in ("desk-a", "desk-b")},
    }
)


def grp_tres(cluster, account: str) -> dict[str, str]:
    query = ["sacctmgr", "-n", "-P", "show", "assoc", "cluster=dca,dcb", f"account={account}"]
    out = cluster.run([*query, "format=cluster,user,grptres"]).stdout
    return {c: tres for c, user, tres in (line.split("|") for line in out.splitlines()) if not user}


def resume_duplicate_jobid_drains(env: dict) -> None:
    """Return the dcb nodes Slurm drained for a "Duplicate jobid" to service: a SIGKILLed slurmctld
    (the dead-controller tests) loses its unsaved state and hands out job ids again, and a node
    still running a job with a reused id is drained. Tests after those find dcb whole."""
    out = subprocess.run(
        ["sinfo", "-M", "dcb", "-h", "-N", "-o", "%N|%t|%E"], env=env, capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if state.startswith("drain") or state.startswith("drng"):
            if "Duplicate jobid" in reason:
                print(f"resuming {name} (drained: {reason})")
                subprocess.run(["scontrol", "update", f"nodename={name}", "state=resume"], env=env, check=False)


def test_the_driver_against_dcb_estimates_and_scopes_account_limits_to_dcb(slurm_cluster, cloud, caplog):
    dcb = driver_for(slurm_cluster, name="dcb", partition="gpu", conf=slurm_cluster.sites.dcb_env)
    assert dcb.cluster_name() == "dcb"
    resume_duplicate_jobid_drains(os.environ | slurm_cluster.sites.dcb_env)
    deadline = time.monotonic() + 60  # earlier tests' jobs on dcb may still be completing
    while time.monotonic() < deadline:
        states = slurm_cluster.run(["sinfo", "-M", "dcb", "-h", "-N", "-o", "%t"]).stdout.split()
        if states and all(state == "idle" for state in states if not state.startswith("CLUSTER")):
            break
        time.sleep(0.5)
    spec = JobSpec(source="x", resources={"nodes": 2, "gpus_per_node": 8})
    at = dcb.start_estimate(spec, "desk-a")
    while at is None and time.monotonic() < deadline + 90:  # a restarted dcb (an earlier test) settles first
        time.sleep(2)
        dcb._estimates.clear()
        dcb._account_users.clear()
        at = dcb.start_estimate(spec, "desk-a")
    if at is None:  # say why: seen once in CI after the sites e2e tests, never alone
        dcb.log.setLevel(logging.DEBUG)
        dcb._estimates.clear()
        with caplog.at_level(logging.DEBUG):
            dcb.start_estimate(spec, "desk-a")
        nodes = slurm_cluster.run(["sinfo", "-M", "dcb", "-N", "-o", "%N %t %E"]).stdout
        queue = slurm_cluster.run(["squeue", "-M", "dcb", "-o", "%i %T %a %u %R"]).stdout
        pytest.fail(f"no estimate from dcb; driver said: {caplog.text}\n{nodes}\n{queue}")
    assert abs(at - time.time()) < 60, at
    before = grp_tres(slurm_cluster, "desk-b")
    try:
        dcb.apply_tenancy(SITES_TENANCY)
        after = grp_tres(slurm_cluster, "desk-b")
        assert "gres/gpu=9" in after["dcb"], after  # 8 nominal (no borrowing) + 1 of the short-work share
        assert after["dca"] == before["dca"], (before, after)  # the other site's association is untouched
    finally:
        for desk in ("desk-a", "desk-b"):
            where = ["where", f"name={desk}", "cluster=dcb"]
            unlimited = "GrpTRES=gres/gpu=-1,cpu=-1,mem=-1"
            slurm_cluster.run(["sacctmgr", "-i", "modify", "account", *where, "set", unlimited])


def test_a_dead_dcb_controller_is_unreachable_until_it_is_back(slurm_cluster, cloud, tmp_path):
    dcb = driver_for(slurm_cluster, name="dcb", partition="gpu", conf=slurm_cluster.sites.dcb_env)
    dcb.command_timeout = 20
    ref = attempt(tmp_path, "1")
    dcb.poll([ref])  # answers while dcb runs
    pid = int((slurm_cluster.state_dir / "run" / "slurmctld-dcb.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    try:
        began = time.monotonic()
        with pytest.raises(BackendUnreachable):
            dcb.poll([ref])
        print(f"unreachable after {time.monotonic() - began:.1f} s")
        dcb._node_info = dcb._capacity = None
        with pytest.raises(BackendUnreachable):
            dcb.capacity()
    finally:
        dev_slurm.up(slurm_cluster.state_dir, sites=True, log=lambda line: print(f"[slurm up] {line}"))
        resume_duplicate_jobid_drains(os.environ | slurm_cluster.sites.dcb_env)
    dcb._node_info = dcb._capacity = None
    assert dcb.capacity().capacity_gpus == 16
    assert ("sites", 1) in dcb.poll([ref])
