"""The Slurm dev cluster is real: 4 nodes x 8 GPUs, jobs under each researcher's own identity,
charged to the researcher's desk, topology, preemption by QOS. One cluster for the session
(fixture `slurm_cluster`, tests/integration/slurm_fixtures.py); each test takes seconds."""

from __future__ import annotations

import pytest

from cellscale_hub.dev import slurm as dev_slurm

pytestmark = pytest.mark.integration

NODES = ["node1", "node2", "node3", "node4"]
LEAVES = [{"node1", "node2"}, {"node3", "node4"}]
# One line per task, written by the job itself.
REPORT = (
    "srun bash -c 'echo \"node=$SLURMD_NODENAME rank=$SLURM_PROCID user=$(id -un) "
    "job_gpus=$SLURM_JOB_GPUS cuda=$CUDA_VISIBLE_DEVICES\"'"
)


def allocated_gpus(record: dict) -> int:
    return sum(t["count"] for t in record["tres"]["allocated"] if t["type"] == "gres" and t["name"] == "gpu")


def report_lines(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("node=")]
    return [dict(field.split("=", 1) for field in line.split()) for line in lines]


def test_four_idle_nodes_with_eight_gpus_each(slurm_cluster):
    assert slurm_cluster.env == {"SLURM_CONF": str(slurm_cluster.state_dir / "etc" / "slurm.conf")}
    nodes = slurm_cluster.wait_idle()
    assert sorted(nodes) == NODES
    for node in nodes.values():
        assert node["state"] == "idle", node["name"]
        assert node["gres"] == "gpu:8", node["name"]
        assert node["partitions"] == ["gpu"]


def test_two_node_job_runs_as_alice_and_is_charged_to_desk_a(slurm_cluster):
    job = slurm_cluster.sbatch(
        "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:8", "-A", "desk-a", "--time=2", "--wrap", REPORT, user="alice"
    )
    record = slurm_cluster.wait_done(job)

    assert record["state"]["current"] == "COMPLETED", record["state"]
    assert (record["account"], record["user"], record["allocation_nodes"]) == ("desk-a", "alice", 2)
    assert allocated_gpus(record) == 16
    tasks = report_lines(slurm_cluster.output(job))
    assert sorted(task["rank"] for task in tasks) == ["0", "1"]
    assert len({task["node"] for task in tasks}) == 2  # one slurmd per emulated node
    for task in tasks:
        assert task["user"] == "alice"
        assert task["job_gpus"] == task["cuda"] == "0,1,2,3,4,5,6,7"


def test_switches_1_keeps_a_job_under_one_leaf_switch(slurm_cluster):
    slurm_cluster.wait_idle()
    # node2 (leaf s1) and node3 (leaf s2) busy: node1 and node4 are free but under different leaves.
    blocker = slurm_cluster.sbatch(
        "--nodes=2", "--nodelist=node[2-3]", "--exclusive", "--time=5", "--wrap", "sleep 300"
    )
    jobs = [blocker]
    try:
        slurm_cluster.wait_state(blocker, "RUNNING")
        one_leaf = slurm_cluster.sbatch(
            "--nodes=2", "--switches=1", "--gres=gpu:8", "-A", "desk-b", "--time=1", "--wrap", REPORT, user="bob"
        )
        jobs.append(one_leaf)
        assert slurm_cluster.wait_reason(one_leaf) == "Resources"  # a scheduler pass looked at it and waits
        nodes = slurm_cluster.node_states()
        assert nodes["node1"]["state"] == nodes["node4"]["state"] == "idle"  # although two nodes are free

        slurm_cluster.cancel(blocker)
        record = slurm_cluster.wait_done(one_leaf)
        assert record["state"]["current"] == "COMPLETED"
        assert record["account"] == "desk-b"
        assert {task["node"] for task in report_lines(slurm_cluster.output(one_leaf))} in LEAVES
    finally:
        slurm_cluster.cancel(*jobs)


def test_high_qos_preempts_and_requeues_normal(slurm_cluster):
    slurm_cluster.wait_idle()
    victim = slurm_cluster.sbatch(
        "--nodes=4", "--gres=gpu:8", "-A", "desk-a", "--time=5", "--wrap", "srun sleep 300", user="alice"
    )
    try:
        slurm_cluster.wait_state(victim, "RUNNING")
        urgent = slurm_cluster.sbatch(
            "--nodes=1", "--gres=gpu:8", "-A", "desk-b", "--qos=high", "--time=1", "--wrap", "true", user="bob"
        )
        assert slurm_cluster.wait_done(urgent)["state"]["current"] == "COMPLETED"
        shown = slurm_cluster.run(["scontrol", "show", "job", str(victim)]).stdout
        assert "Restarts=1" in shown  # requeued, not killed
    finally:
        slurm_cluster.cancel(victim)


def test_a_researcher_cannot_charge_another_desk(slurm_cluster):
    result = slurm_cluster.run(["sbatch", "-A", "desk-a", "--wrap", "true"], user="bob", check=False)
    assert result.returncode != 0
    assert "Invalid account" in result.stderr


def test_up_again_is_a_quick_no_op(slurm_cluster):
    layout = dev_slurm.Layout(slurm_cluster.state_dir)
    pids = {name: dev_slurm.pid_of(layout, name) for name in dev_slurm.daemon_names()}
    assert all(pids.values()), pids

    again = dev_slurm.up(slurm_cluster.state_dir, log=print)

    assert again.started == ()
    assert again.seconds < 10
    assert {name: dev_slurm.pid_of(layout, name) for name in dev_slurm.daemon_names()} == pids
