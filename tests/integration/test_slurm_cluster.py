"""The Slurm dev cluster is real: 4 GPU nodes x 8 GPUs and 2 CPU nodes, jobs under each
researcher's own identity, charged to the researcher's desk, topology, preemption by QOS, cores
on the GPU nodes kept for GPU jobs. One cluster for the session (fixture `slurm_cluster`,
tests/integration/slurm_fixtures.py); each test takes seconds."""

from __future__ import annotations

import pytest

from cellscale_hub.dev import slurm as dev_slurm

pytestmark = pytest.mark.integration

GPU_NODES = ["node1", "node2", "node3", "node4"]
CPU_NODES = ["cpu1", "cpu2"]
LEAVES = [{"node1", "node2"}, {"node3", "node4"}]
# One line per task, written by the job itself.
REPORT = (
    "srun bash -c 'echo \"node=$SLURMD_NODENAME rank=$SLURM_PROCID user=$(id -un) "
    "job_gpus=$SLURM_JOB_GPUS cuda=$CUDA_VISIBLE_DEVICES\"'"
)


def allocated_gpus(record: dict) -> int:
    return sum(t["count"] for t in record["tres"]["allocated"] if t["type"] == "gres" and t["name"] == "gpu")


def allocated(record: dict, tres: str) -> int:
    """A job's allocated cpu or mem (MiB) from its accounting record."""
    return sum(t["count"] for t in record["tres"]["allocated"] if t["type"] == tres)


def report_lines(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("node=")]
    return [dict(field.split("=", 1) for field in line.split()) for line in lines]


def test_four_gpu_nodes_with_eight_gpus_each_and_two_cpu_nodes(slurm_cluster):
    assert slurm_cluster.env == {"SLURM_CONF": str(slurm_cluster.state_dir / "etc" / "slurm.conf")}
    nodes = slurm_cluster.wait_idle()
    assert sorted(nodes) == sorted(GPU_NODES + CPU_NODES)
    for node in nodes.values():
        assert node["state"] == "idle", node["name"]
    for name in GPU_NODES:
        assert (nodes[name]["gres"], nodes[name]["cpus"], nodes[name]["real_memory"]) == ("gpu:8", 32, 128000)
        assert sorted(nodes[name]["partitions"]) == ["cpu", "gpu"]  # CPU work may use some of their cores
    for name in CPU_NODES:
        assert (nodes[name]["gres"], nodes[name]["cpus"], nodes[name]["real_memory"]) == ("", 8, 32000)
        assert nodes[name]["partitions"] == ["cpu"]


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


def test_cpu_work_cannot_starve_gpu_jobs_of_cores(slurm_cluster):
    """The cpu partition may use the GPU nodes, but its jobs together hold at most 16 of a GPU
    node's 32 cores (MaxCPUsPerNode). With the cpu partition full and a CPU job still waiting,
    a GPU job with 16 cores on each of the four GPU nodes starts at once."""
    slurm_cluster.wait_idle()
    cpu_job = ("-p", "cpu", "-A", "desk-a", "--cpus-per-task=8", "--time=5", "--wrap", "sleep 300")
    filling = [slurm_cluster.sbatch(*cpu_job, user="alice") for _ in range(10)]  # 2 x 8 + 4 x 16 cores
    waiting = slurm_cluster.sbatch(*cpu_job, user="alice")
    try:
        for job in filling:
            slurm_cluster.wait_state(job, "RUNNING")
        assert slurm_cluster.wait_reason(waiting) == "Resources"  # the cpu partition is full
        nodes = slurm_cluster.node_states()
        assert [nodes[name]["alloc_cpus"] for name in CPU_NODES + GPU_NODES] == [8, 8, 16, 16, 16, 16]

        gpu_job = slurm_cluster.sbatch(
            "-p", "gpu", "-A", "desk-b", "--nodes=4", "--gres=gpu:8", "--cpus-per-task=16", "--time=2",
            "--wrap", "srun true", user="bob",
        )  # fmt: skip
        record = slurm_cluster.wait_done(gpu_job)
        assert record["state"]["current"] == "COMPLETED", record["state"]
        assert allocated(record, "cpu") == 64 and allocated_gpus(record) == 32
        assert slurm_cluster.state(waiting) == "PENDING"  # it started beside CPU work, not after it
    finally:
        slurm_cluster.cancel(*filling, waiting)


def test_the_cpu_partition_gives_no_gpus(slurm_cluster):
    """The GPU nodes' GPUs are the gpu partition's: its QOS refuses a GPU at submit."""
    result = slurm_cluster.run(
        ["sbatch", "-p", "cpu", "-A", "desk-a", "--gres=gpu:1", "--wrap", "true"], user="alice", check=False
    )
    assert result.returncode != 0 and "QOSMaxGRESPerJob" in result.stderr, result.stderr


def test_memory_is_a_consumable(slurm_cluster):
    """--mem is held on the node: two jobs of 20000M do not share a 32000M node, free cores or not."""
    slurm_cluster.wait_idle()
    job = ("-p", "cpu", "-A", "desk-a", "--nodelist=cpu1", "--cpus-per-task=1", "--mem=20000M", "--time=5")
    first = slurm_cluster.sbatch(*job, "--wrap", "sleep 300", user="alice")
    second = slurm_cluster.sbatch(*job, "--wrap", "true", user="alice")
    try:
        slurm_cluster.wait_state(first, "RUNNING")
        assert slurm_cluster.wait_reason(second) == "Resources"
        assert slurm_cluster.node_states()["cpu1"]["alloc_cpus"] == 1  # 7 cores free, memory not
        slurm_cluster.cancel(first)
        assert slurm_cluster.wait_done(second)["state"]["current"] == "COMPLETED"
    finally:
        slurm_cluster.cancel(first, second)


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
