"""Admission over GPUs, CPUs and memory: all or nothing across every resource, quotas per
resource, CPU pools beside GPU flavors, and reasons that name the missing resource."""

from __future__ import annotations

from cellscale.vocabulary import PendingCode, Resource
from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.resources import UNLIMITED, Amounts
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.tenancy import Tenancy
from cellscale_hub.waiting import pending_view

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
    assert reason.message == (
        "waiting for 64 CPUs, 0 free to it: job big holds 128 of the desk's CPUs. Details: the rest of the "
        "cpu-pool cpu quota of firm's tree is in use; held by big (a, 128 CPUs, same queue)"
    )


def owned(job_id, cq, gpus=0, cpus=1, owner="", name=""):
    return Holder(job_id, cq, "gpu", gpus, 0, 0.0, None, None, tenant=cq, cpus=cpus, owner=owner, name=name)


def test_the_first_sentence_names_the_users_own_job_and_leaves_the_tree_to_the_details():
    holders = [
        owned("cs-1", "a", gpus=4, cpus=4, owner="alice", name="big1"),
        owned("cs-2", "b", gpus=4, cpus=4, owner="bob", name="b1"),
    ]
    reason = run([job("w", "a", gpus=4, cpus=4, flavors=("gpu",))], holders).pending["w"]
    said = (
        "waiting for 4 GPUs at once, 0 free to it: {} big1 holds 4 of the desk's GPUs (and 1 other job). "
        "Details: the rest of the gpu quota of firm's tree is in use; held by cs-1 (a, 4 GPUs, same queue), "
        "cs-2 (b, 4 GPUs, within its quota)"
    )
    assert pending_view(reason, "alice").message == said.format("your job")
    assert pending_view(reason, "carol").message == said.format("alice's job")  # a desk mate reads whose it is
    assert [(a.name, a.owner, a.holds) for a in pending_view(reason, "alice").ahead] == [
        ("big1", "alice", "4 GPUs"),
        ("b1", "bob", "4 GPUs"),
    ]


def test_a_cpu_only_job_in_the_way_holds_cpus_not_gpus():
    """A CPU job of a queue that borrows CPUs is in the way of cores, shown with its cores (it
    was listed as "0 GPUs, borrowing"); it is never in the way of GPUs."""
    holders = [
        owned("cs-g", "a", gpus=2, cpus=16, owner="alice", name="big1"),
        owned("cs-p", "b", cpus=16, owner="bob", name="prep"),
        owned("cs-q", "b", cpus=1, owner="bob", name="tiny"),
    ]
    cores = run([job("w", "a", gpus=1, cpus=4, flavors=("gpu",))], holders).pending["w"]
    assert [(a.job_id, a.holds, a.why) for a in cores.ahead] == [
        ("cs-p", "16 CPUs", "borrowing"),
        ("cs-q", "1 CPU", "borrowing"),
        ("cs-g", "16 CPUs", "same queue"),
    ]
    gpus = run([job("w", "a", gpus=4, cpus=1, flavors=("gpu",))], [*holders, owned("cs-b", "b", gpus=4)]).pending["w"]
    assert gpus.resource is Resource.gpu and [a.job_id for a in gpus.ahead] == ["cs-b", "cs-g"]
    assert "cs-p" not in gpus.message and "cs-q" not in gpus.message


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
