"""Admission over GPUs, CPUs and memory: all or nothing across every resource, quotas per
resource, CPU pools beside GPU flavors, and reasons that name the missing resource."""

from __future__ import annotations

from cellscale.vocabulary import PendingCode, Resource
from cellscale_hub.scheduling.admission import Holder, Snapshot, Workload, schedule
from cellscale_hub.scheduling.resources import UNLIMITED, Amounts
from cellscale_hub.tenancy import Tenancy

DESKS = Tenancy.model_validate(
    {
        "flavors": {"gpu": {"backend": "local"}, "cpu-pool": {"backend": "local", "cpu_only": True}},
        "cohorts": {"firm": {}},
        "cluster_queues": {
            "a": {
                "cohort": "firm",
                "quotas": {
                    "gpu": {"nominal": 4, "cpu": {"nominal": 16}},
                    "cpu-pool": {"nominal": 0, "cpu": {"nominal": 128}, "memory": {"nominal": "256G"}},
                },
            },
            "b": {
                "cohort": "firm",
                "quotas": {
                    "gpu": {"nominal": 4, "cpu": {"nominal": 16}},
                    "cpu-pool": {
                        "nominal": 0,
                        "cpu": {"nominal": 128, "lending_limit": 0},
                        "memory": {"nominal": "256G"},
                    },
                },
            },
        },
        "tenants": {q: {"queues": {"default": {"cluster_queue": q}}} for q in ("a", "b")},
    }
)
CAPACITY = {"gpu": Amounts(8, 32, UNLIMITED), "cpu-pool": Amounts(0, 256, 512 * 1024)}


def job(job_id, cq, gpus=0, cpus=1, memory=0, at=0.0, flavors=None):
    return Workload(job_id, cq, gpus, 0, at, flavors, cpus=cpus, memory=memory)


def held(job_id, cq, flavor, gpus=0, cpus=1, memory=0, ends_by=None):
    return Holder(job_id, cq, flavor, gpus, 0, 0.0, None, ends_by, cpus=cpus, memory=memory)


def run(pending=(), holders=(), capacity=CAPACITY):
    return schedule(Snapshot(DESKS, capacity, tuple(holders), tuple(pending), {}, 100.0))


def test_a_cpu_job_takes_the_cpu_pool_and_counts_its_cores():
    decision = run([job("bt", "a", cpus=64, memory=4096)])
    assert [(a.job_id, a.flavor) for a in decision.admit] == [("bt", "cpu-pool")]


def test_a_desk_at_its_cpu_quota_waits_with_the_numbers():
    # a's own 128 cores are in use and b lends none of its pool: 64 more cannot be had
    decision = run([job("more", "a", cpus=64, flavors=("cpu-pool",))], [held("big", "a", "cpu-pool", cpus=128)])
    reason = decision.pending["more"]
    assert reason.resource is Resource.cpu and (reason.needs, reason.available) == (64, 0)
    assert reason.code is PendingCode.PoolLent
    assert reason.message.startswith("needs 64 CPUs on") and "0 CPUs free to it" in reason.message
    assert "big (a, 128 CPUs" in reason.message  # who holds them, in cores


def test_all_or_nothing_across_resources():
    # the GPU nodes have the GPUs but not the cores: the job waits, nothing partial
    capacity = {"gpu": Amounts(8, 24, UNLIMITED), "cpu-pool": Amounts(0, 256, 512 * 1024)}
    decision = run(
        [job("g", "a", gpus=2, cpus=12, flavors=("gpu",))], [held("h", "b", "gpu", gpus=1, cpus=14)], capacity
    )
    assert decision.admit == []
    reason = decision.pending["g"]
    assert reason.resource is Resource.cpu and reason.flavor == "gpu" and reason.needs == 12
    assert reason.available == 10 and reason.code is PendingCode.CapacityFull
    assert "all 24 CPUs (gpu) are in use" in reason.message


def test_cpus_are_borrowed_from_the_cohort_and_reclaimed():
    # a borrows b's idle GPU-node cores; when b needs them within its nominal, a's borrower is preempted
    first = run([job("a-wide", "a", gpus=1, cpus=24, flavors=("gpu",))])
    assert [a.job_id for a in first.admit] == ["a-wide"]
    second = run(
        [job("b-job", "b", gpus=1, cpus=16, flavors=("gpu",))],
        [held("a-wide", "a", "gpu", gpus=1, cpus=24)],
    )
    assert [p.job_id for p in second.preempt] == ["a-wide"]
    assert "was borrowing 8 CPUs (gpu)" in second.preempt[0].reason


def test_memory_beyond_every_ceiling_never_fits():
    decision = run([job("huge", "a", memory=600 * 1024, flavors=("cpu-pool",))])
    reason = decision.pending["huge"]
    assert reason.code is PendingCode.NeverFits and reason.resource is Resource.memory
    assert "needs 600 GiB of memory" in reason.message and "at most 512 GiB of memory" in reason.message


def test_gpu_only_jobs_decide_as_before_when_nothing_counts_cores():
    bare = {"gpu": 8, "cpu-pool": 0}  # capacities as plain GPU counts: cores and memory unbounded
    decision = run([job("g1", "a", gpus=4, cpus=0), job("g2", "a", gpus=4, cpus=0, at=1)], capacity=bare)
    assert [a.job_id for a in decision.admit] == ["g1", "g2"]
    assert decision.admit[1].borrowed == 4


def test_cores_weigh_in_fair_share():
    # a already holds 64 pool cores (4 GPU-equivalents at 1/16), b nothing: b's job goes first
    decision = run(
        [job("a2", "a", gpus=2, cpus=2, flavors=("gpu",)), job("b2", "b", gpus=2, cpus=2, at=1, flavors=("gpu",))],
        [held("a-pool", "a", "cpu-pool", cpus=64)],
    )
    assert [a.job_id for a in decision.admit] == ["b2", "a2"]


def test_a_cpu_job_is_kept_off_gpu_nodes_when_its_queue_has_a_cpu_pool():
    # the pool is full; the GPU flavor has idle cores, but they are for GPU jobs
    decision = run(
        [job("bt", "a", cpus=8)], [held("big", "a", "cpu-pool", cpus=128), held("b", "b", "cpu-pool", cpus=128)]
    )
    assert decision.admit == [] and decision.pending["bt"].flavor == "cpu-pool"
