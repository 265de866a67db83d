"""The Slurm driver's pure parts: the batch script (golden files), shapes, state parsing.
Its behaviour against a real cluster is in tests/integration/test_slurm_backend.py."""

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from cellscale.runtime.records import StagePlan
from cellscale.spec import BackendView, JobSpec, Launcher, Sweep
from cellscale.vocabulary import AttemptState, Fault
from cellscale_hub.drivers.capabilities import ArrayPlan, ArrayRef
from cellscale_hub.drivers.slurm import SlurmDriver
from cellscale_hub.drivers.slurm.accounts import AccountLimits, account_limits
from cellscale_hub.drivers.slurm.driver import master_port
from cellscale_hub.drivers.slurm.parse import (
    command_error,
    expand_hostlist,
    gpus_of,
    job_state,
    json_answer,
    parse_estimate,
    parse_estimate_nodes,
    slurm_minutes,
)
from cellscale_hub.drivers.slurm.script import sbatch_quote
from cellscale_hub.drivers.types import AttemptRef, BackendUnreachable, SpecRejected
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.tenancy import Cohort, Tenancy

GOLDEN = Path(__file__).parent.parent / "golden"


class FixedSlurm(SlurmDriver):
    """Capacity as a 4 x 8-GPU partition, without asking sinfo (for shape and validate;
    render needs no capacity)."""

    def capacity(self) -> BackendView:
        return BackendView(
            name=self.name, kind="slurm", capacity_gpus=32, max_nodes=4, gpus_per_node=8, launchers=list(Launcher)
        )


def ref(spec: JobSpec, tenant="desk-a") -> AttemptRef:
    return AttemptRef(
        job_id="cs-0123456789ab",
        number=2,
        job_dir=Path("/shared/cellscale/jobs/cs-0123456789ab"),
        spec=spec,
        owner="alice",
        tenant=tenant,
    )


SITE = {
    "extra_directives": ["--constraint=a100&nvlink", "--qos=normal", "--mail-type=FAIL", "--exclusive"],
    "prologue": ["module load cuda/12.4", "export NCCL_DEBUG=WARN"],
}


@pytest.mark.parametrize(
    ("case", "resources", "traits", "excluded"),
    [
        ("slurm-torchrun-2x8", {"nodes": 2, "gpus_per_node": 8, "timeout_min": 90}, {}, ()),
        ("slurm-switches-1x4", {"nodes": 1, "gpus_per_node": 4, "switches": 1}, {}, ()),
        ("slurm-cpu", {}, {}, ()),
        # a CPU backtest cell: --cpus 8 --mem 4G on the CPU partition
        ("slurm-cpu-8c-4g", {"cpus_per_task": 8, "memory_mb_per_node": "4G"}, {"partition": "cpu"}, ()),
        # torchrun's 4 ranks per node share the node's one task: 4 x 3 cores
        ("slurm-torchrun-4x3c", {"gpus_per_node": 4, "cpus_per_task": 3, "memory_mb_per_node": 65536}, {}, ()),
        # a site's directives and setup lines; nodes that failed the job before are avoided
        ("slurm-site-2x8", {"nodes": 2, "gpus_per_node": 8}, SITE, ("node7", "node3", "bad;node")),
    ],
)
def test_render_matches_golden(case, resources, traits, excluded):
    driver = SlurmDriver(name="slurm", python="/opt/venv/bin/python", **{"partition": "gpu", **traits})
    attempt = dataclasses.replace(ref(JobSpec(source="x = 1", resources=resources)), excluded_nodes=excluded)
    script = driver.render(attempt)
    path = GOLDEN / f"{case}.sh"
    if os.environ.get("CELLSCALE_UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text()


SWEEP = {"points": 250, "points_sha256": "0" * 64, "max_parallel": 8}


@pytest.mark.parametrize(
    ("case", "number", "offset", "tasks", "throttle", "excluded"),
    [
        # the second chunk of a 250-task sweep at MaxArraySize 101, submitted as 3 of its 8 slots passed to it
        ("slurm-sweep-chunk", 2, 101, [[p] for p in range(101, 202)], 3, []),
        # a retry of two points whose node failed, packed 2 per task, avoiding that node
        ("slurm-sweep-retry", 4, 0, [[42, 43]], 1, ["node3"]),
    ],
)
def test_sweep_arrays_match_golden(case, number, offset, tasks, throttle, excluded):
    driver = SlurmDriver(name="slurm", python="/opt/venv/bin/python", partition="gpu")
    spec = JobSpec(
        source="y = x", launcher="plain", resources={"gpus_per_node": 1, "cpus_per_task": 4, "timeout_min": 20}
    )
    spec = spec.model_copy(update={"sweep": Sweep(**SWEEP, per_task=len(tasks[0]))})
    plan = ArrayPlan(
        number=number,
        attempt=1,
        offset=offset,
        tasks=tasks,
        throttle=throttle,
        timeout_s=20 * 60.0 * len(tasks[0]),
        excluded_nodes=excluded,
    )
    script = driver.render_array(ArrayRef(ref(spec), plan))
    path = GOLDEN / f"{case}.sh"
    if os.environ.get("CELLSCALE_UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text()


def test_render_runs_no_slurm_command(monkeypatch, tmp_path):
    """The dry run works where no Slurm client is installed, even for an attempt that avoids nodes."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no sinfo, no squeue
    driver = SlurmDriver(name="slurm", python="/opt/venv/bin/python")
    attempt = dataclasses.replace(ref(JobSpec(source="x", resources={"nodes": 2})), excluded_nodes=("node2", "node1"))
    assert "#SBATCH --exclude=node1,node2\n" in driver.render(attempt)
    sweep = JobSpec(source="y = x", launcher="plain", sweep=SWEEP)
    assert "#SBATCH --array=0-249%8\n" in driver.render(ref(sweep))  # a sweep's first array


@pytest.mark.parametrize(
    ("excluded", "kept"), [(("node1", "node2"), ("node1", "node2")), (("node1", "node2", "node3"), ())]
)
def test_submit_avoids_failed_nodes_while_enough_others_remain(excluded, kept):
    """Of 4 nodes, a 2-node gang can avoid 2 failed ones, not 3 (it would wait forever)."""
    attempt = dataclasses.replace(ref(JobSpec(source="x", resources={"nodes": 2})), excluded_nodes=excluded)
    assert FixedSlurm(name="slurm")._avoiding(attempt).excluded_nodes == kept


@pytest.mark.parametrize(
    ("directive", "error"),
    [
        ("--constraint=a100\n#SBATCH --account=desk-b", "newline"),
        ("--constraint=a100\0", "control character"),
        ("constraint=a100", "not a long sbatch option"),
        ("-C a100", "not a long sbatch option"),
        ("--constraint a100", "not a long sbatch option"),
        ("--account=desk-b", "--account is set by cellscale"),
        ("--job-name=x", "--job-name is set by cellscale"),
        # the job's cores and memory are what admission counted: a site cannot change them
        ("--mem=0", "--mem is set by cellscale"),
        ("--cpus-per-task=4", "--cpus-per-task is set by cellscale"),
        ("--mem-per-cpu=4G", "--mem-per-cpu is set by cellscale"),
    ],
)
def test_a_bad_extra_directive_is_refused_at_config_time(directive, error):
    with pytest.raises(TraitError, match=error):
        SlurmDriver(name="slurm", extra_directives=["--qos=normal", directive])
    config = Config()
    config.SlurmDriver.extra_directives = [directive]
    with pytest.raises(TraitError, match=error):
        SlurmDriver(name="slurm", config=config)


@pytest.mark.parametrize(
    ("line", "error"),
    [("module load cuda\nsbatch evil", "newline"), ("  #SBATCH --qos=high", "extra_directives")],
)
def test_a_bad_prologue_line_is_refused(line, error):
    with pytest.raises(TraitError, match=error):
        SlurmDriver(name="slurm", prologue=[line])


def test_a_custom_batch_template_renders():
    template = (
        "#!/bin/bash -l\n"
        "{header}\n"
        "{directives}\n"
        "{prologue}\n"
        'echo "job ${{SLURM_JOB_ID}}: {job_name} of {owner} ({tenant}), {nodes}x{gpus_per_node} GPUs, {launcher}"\n'
        "cd {job_dir}\n"
        "srun --mpi=none --ntasks-per-node=1 --cpus-per-task={cpus_per_node} {supervisor}\n"
    )
    driver = SlurmDriver(
        name="slurm", python="/opt/my venv/bin/python", batch_template=template, extra_directives=["--qos=normal"]
    )
    script = driver.render(ref(JobSpec(source="x", resources={"nodes": 2, "gpus_per_node": 8})))
    assert script == (
        "#!/bin/bash -l\n"
        "# cellscale job cs-0123456789ab, attempt 2, owner alice: 2 node(s) x 8 GPU(s), 8 CPU(s), launcher torchrun\n"
        "#SBATCH --job-name=cs-0123456789ab-a2\n"
        "#SBATCH --account=desk-a\n"
        "#SBATCH --partition=gpu\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --cpus-per-task=8\n"
        "#SBATCH --gres=gpu:8\n"
        "#SBATCH --time=60\n"
        "#SBATCH --chdir=/shared/cellscale/jobs/cs-0123456789ab\n"
        "#SBATCH --output=/shared/cellscale/jobs/cs-0123456789ab/attempts/2/slurm-%j.out\n"
        "#SBATCH --no-requeue\n"
        "#SBATCH --comment=cellscale\n"
        "#SBATCH --qos=normal\n"
        'echo "job ${SLURM_JOB_ID}: cs-0123456789ab-a2 of alice (desk-a), 2x8 GPUs, torchrun"\n'
        "cd /shared/cellscale/jobs/cs-0123456789ab\n"
        "srun --mpi=none --ntasks-per-node=1 --cpus-per-task=8 '/opt/my venv/bin/python' "
        "-m cellscale.runtime.supervisor /shared/cellscale/jobs/cs-0123456789ab 2\n"
    )


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{directives}\n{command}\n", "must start with an interpreter line"),
        ("#!/bin/bash\n{directives}\necho ${SLURM_JOB_ID}\n{command}\n", "unknown placeholder"),
        ("#!/bin/bash\n{directives}\n{command.__class__}\n", "unknown placeholder"),
        ("#!/bin/bash\n{directives}\n{command!r}\n", "unknown placeholder"),
        ("#!/bin/bash\n{directives}\n{command\n", "literal braces"),
        ("#!/bin/bash\n{command}\n", "must contain {directives}"),
        ("#!/bin/bash\n{directives}\nhostname\n", "must contain {command}"),
    ],
)
def test_a_bad_batch_template_is_refused_at_config_time(template, error):
    with pytest.raises(TraitError, match=error.replace("{", r"\{").replace("}", r"\}")):
        SlurmDriver(name="slurm", batch_template=template)


@pytest.mark.parametrize(
    ("option", "quoted"),
    [
        ("--output=/jobs/cs-1/attempts/2/slurm-%j.out", "--output=/jobs/cs-1/attempts/2/slurm-%j.out"),
        ("--chdir=/shared/my jobs/cs-1", '"--chdir=/shared/my jobs/cs-1"'),
        ('--comment=a "b" #c \\d', '"--comment=a \\"b\\" #c \\\\d"'),
        ("--comment=it's", '"--comment=it\'s"'),
    ],
)
def test_sbatch_quoting_keeps_one_option_one_argument(option, quoted):
    assert sbatch_quote(option) == quoted


def test_owner_and_job_id_cannot_break_out_of_the_header_comment():
    spec = JobSpec(source="x")
    with pytest.raises(SpecRejected, match="not a valid Unix user"):
        SlurmDriver(name="slurm").render(dataclasses.replace(ref(spec), owner="alice\nrm -rf ~"))
    with pytest.raises(SpecRejected, match="job id"):
        SlurmDriver(name="slurm").render(dataclasses.replace(ref(spec), job_id="cs-1\nrm -rf ~"))


def test_tenant_must_be_a_valid_account_name():
    with pytest.raises(SpecRejected, match="Slurm account"):
        SlurmDriver(name="slurm").render(ref(JobSpec(source="x"), tenant="Desk A;rm -rf"))


def test_user_names_are_validated_before_any_command():
    with pytest.raises(SpecRejected, match="not a valid Unix user"):
        FixedSlurm(name="slurm")._as_user("alice; rm -rf /")
    assert FixedSlurm(name="slurm", submit_as=["sudo", "-n", "-u", "{user}", "--"])._as_user("bob") == [
        "sudo",
        "-n",
        "-u",
        "bob",
        "--",
    ]


@pytest.mark.parametrize(
    ("gpus", "nodes", "per_node"),
    [(16, 2, 8), (8, 1, 8), (4, 1, 4), (12, 1, 12)],
)
def test_gpus_become_whole_nodes(gpus, nodes, per_node):
    spec = FixedSlurm(name="slurm").shape(JobSpec(source="x", resources={"gpus_per_node": gpus}))
    assert (spec.resources.nodes, spec.resources.gpus_per_node) == (nodes, per_node)


def test_a_request_no_partition_can_satisfy_is_refused():
    driver = FixedSlurm(name="slurm")
    with pytest.raises(SpecRejected, match="more than backend 'slurm' has"):
        driver.validate(driver.shape(JobSpec(source="x", resources={"gpus_per_node": 12})))
    with pytest.raises(SpecRejected, match="--nodes 5"):
        driver.validate(JobSpec(source="x", resources={"nodes": 5, "gpus_per_node": 8}))


@pytest.mark.parametrize(
    ("entry", "state"),
    [
        ({"job_state": "RUNNING"}, "RUNNING"),
        ({"job_state": ["PENDING"]}, "PENDING"),
        ({"state": {"current": "NODE_FAIL", "reason": "None"}}, "NODE_FAIL"),
        ({"state": {"current": ["CANCELLED"]}}, "CANCELLED"),
        ({"state": {"current": "CANCELLED by 0"}}, "CANCELLED"),
        ({}, ""),
    ],
)
def test_state_parsing(entry, state):
    assert job_state(entry) == state


@pytest.mark.parametrize(("gres", "gpus"), [("gpu:8", 8), ("gpu:a100:4(S:0-1)", 4), ("", 0), ("mps:100", 0)])
def test_gres_parsing(gres, gpus):
    assert gpus_of(gres) == gpus


def test_rendezvous_port_is_stable_per_attempt():
    spec = JobSpec(source="x")
    assert master_port(ref(spec)) == master_port(ref(spec))
    assert 20000 <= master_port(ref(spec)) < 40000


def test_an_unsettled_accounting_record_is_unknown_not_final(tmp_path):
    driver = FixedSlurm(name="slurm")
    attempt = AttemptRef(
        job_id="cs-0123456789ab",
        number=1,
        job_dir=tmp_path,
        spec=JobSpec(source="x"),
        backend_ref="42",
        owner="alice",
        tenant="desk-a",
    )
    early = {"state": {"current": "NODE_FAIL"}, "allocation_nodes": 0, "nodes": "node1"}
    assert driver._observe(attempt, early).state.value == "UNKNOWN"
    never_ran = {"state": {"current": "CANCELLED"}, "allocation_nodes": 0, "nodes": "None assigned"}
    assert driver._observe(attempt, never_ran).state.value == "CANCELLED"


def test_account_limits_mirror_quota_ceiling_and_entitled_share():
    tenancy = Tenancy.model_validate(
        {
            "flavors": {"slurm": {"backend": "slurm"}, "local": {"backend": "local"}},
            "cohorts": {"firm": {}, "trading": {"parent": "firm", "weight": 3}, "research": {"parent": "firm"}},
            "cluster_queues": {
                "desk-a": {"cohort": "trading", "quotas": {"slurm": {"nominal": 16, "borrowing_limit": 4}}},
                "desk-b": {"cohort": "trading", "quotas": {"slurm": {"nominal": 8}, "local": {"nominal": 2}}},
                "lab": {"cohort": "research", "quotas": {"slurm": {"nominal": 8, "lending_limit": 0}}},
                "laptop": {"quotas": {"local": {"nominal": 4}}},
            },
            "tenants": {
                "desk-a": {"queues": {"default": {"cluster_queue": "desk-a"}}},
                "desk-b": {"queues": {"default": {"cluster_queue": "desk-b"}}},
                "lab": {"queues": {"default": {"cluster_queue": "lab"}}},
                "Laptop": {"queues": {"default": {"cluster_queue": "laptop"}}},
            },
        }
    )
    # the root has two children (cohort firm, queue laptop): firm is entitled to 1/2, trading
    # to 3/4 of that, each desk to half of trading: 0.1875 of the fleet; lab 1/2 · 1/4
    # no queue quotas CPUs or memory: the accounts get no limit on them; firm's tree lends 10%
    # of its 32 nominal slurm GPUs to short work beyond any desk's quota: 3 more
    assert account_limits(tenancy, ["slurm"], Amounts(32, 128, 512000)) == {
        "desk-a": AccountLimits(23, None, None, 188),  # 16 + its borrowing limit 4 + the short-work share 3
        "desk-b": AccountLimits(27, None, None, 188),  # 8 + what desk-a may lend (16) + 3; lab lends nothing
        "lab": AccountLimits(32, None, None, 125),  # 8 + 16 + 8 = 32, the whole cluster
    }  # Laptop is no Slurm account name and has no Slurm quota
    without = tenancy.model_copy(update={"cohorts": {**tenancy.cohorts, "firm": Cohort(short_work_share=0)}})
    assert account_limits(without, ["slurm"], Amounts(32, 128, 512000))["desk-a"].gpus == 20


# Two partitions of one cluster as two backends: GPU nodes (slurm) and a CPU pool (slurm-cpu).
PARTITIONS = Tenancy.model_validate(
    {
        "flavors": {"gpu": {"backend": "slurm"}, "cpu": {"backend": "slurm-cpu"}},
        "cohorts": {"firm": {}},
        "cluster_queues": {
            "desk-a": {
                "cohort": "firm",
                "quotas": {
                    "gpu": {"nominal": 16, "cpu": {"nominal": 64, "borrowing_limit": 0}, "memory": {"nominal": "256G"}},
                    "cpu": {"cpu": {"nominal": 40, "borrowing_limit": 0}, "memory": {"nominal": "80G"}},
                },
            },
            "desk-b": {
                "cohort": "firm",
                "quotas": {
                    "gpu": {"nominal": 16, "cpu": {"nominal": 64}},  # memory not quota'd on the GPU nodes
                    "cpu": {"cpu": {"nominal": 40}, "memory": {"nominal": "80G"}},
                },
            },
        },
        "tenants": {desk: {"queues": {"default": {"cluster_queue": desk}}} for desk in ("desk-a", "desk-b")},
    }
)
CLUSTER = Amounts(32, 144, 576000)  # 4 GPU nodes (32 cores, 128000M) and 2 CPU nodes (8 cores, 32000M)


def test_account_limits_sum_every_partition_of_the_cluster():
    """An account's GrpTRES counts its jobs in every partition: the ceilings add up the desk's
    flavors on all the cluster's backends, at most the cluster; a resource one of them does
    not quota gets no limit."""
    limits = account_limits(PARTITIONS, ["slurm", "slurm-cpu"], CLUSTER)
    assert limits == {
        # GPUs 16 + 16 borrowable; cores 64 + 40 (no borrowing); memory 256G on the GPU flavor
        # (desk-b has none there to lend) + 80G and desk-b's 80G on the CPU flavor = 416G
        "desk-a": AccountLimits(32, 104, 425984, 500),
        # cores (64 + 64) + (40 + 40) = 208, at most the cluster's 144; memory: none on its GPU flavor
        "desk-b": AccountLimits(32, 144, None, 500),
    }
    assert limits["desk-a"].grp_tres == "GrpTRES=cpu=104,mem=425984M,gres/gpu=32"
    assert limits["desk-b"].grp_tres == "GrpTRES=cpu=144,mem=-1,gres/gpu=32"  # -1 clears an earlier limit
    # one backend alone would mirror only its own flavors' share of the account
    assert account_limits(PARTITIONS, ["slurm-cpu"], CLUSTER)["desk-a"] == AccountLimits(0, 40, 163840, 500)


class Scripted(SlurmDriver):
    """A Slurm whose commands answer from a script (argv prefix -> stdout); records what ran."""

    def __init__(self, answers: dict[tuple[str, ...], str], **traits):
        super().__init__(**traits)
        self.answers = answers
        self.ran: list[list[str]] = []

    def _run(self, argv: list[str]) -> str:
        self.ran.append(argv)
        for prefix, out in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return out
        raise AssertionError(f"unexpected command {argv}")


def node(name: str, cpus: int, memory: int, gres: str, partitions: list[str]) -> dict:
    return {"name": name, "cpus": cpus, "real_memory": memory, "gres": gres, "partitions": partitions}


SINFO = json.dumps(
    {
        "nodes": [
            node("node1", 32, 128000, "gpu:8", ["gpu", "cpu"]),
            node("node2", 32, 128000, "gpu:8", ["gpu", "cpu"]),
            node("cpu1", 8, 32000, "", ["cpu"]),
        ]
    }
)


def scripted(partition: str, max_cpus: str, qos: str, qos_limits: str = "", **traits) -> Scripted:
    line = f"PartitionName={partition} AllowQos=ALL QoS={qos} MaxCPUsPerNode={max_cpus} Nodes=whatever State=UP\n"
    return Scripted(
        {
            ("sinfo", "--json"): SINFO,
            ("scontrol", "-o", "show", "partition", partition): line,
            ("sacctmgr", "-n", "-P", "show", "qos", qos): qos_limits,
            ("sacctmgr", "-n", "-P", "show", "assoc", "where", "cluster=dca"): "desk-a\ndesk-a\ndesk-b\n",
            (
                "scontrol",
                "show",
                "config",
            ): "Configuration data as of 2026-12-03T15:30:00\nClusterName             = dca\n",
            ("sacctmgr", "-i", "modify", "account"): "",
        },
        **{"name": f"slurm-{partition}", "partition": partition, **traits},
    )


def test_capacity_counts_what_the_partition_lets_its_jobs_use():
    """The CPU partition spans the CPU node and the GPU nodes, but holds at most 16 of a GPU
    node's cores (MaxCPUsPerNode) and its QOS allows no GPU; the GPU partition has it all."""
    cpu = scripted("cpu", "16", "cpu-only", "gres/gpu=0|\n").capacity()
    assert (cpu.capacity_gpus, cpu.gpus_per_node, cpu.max_nodes) == (0, 0, 3)
    assert (cpu.capacity_cpus, cpu.cpus_per_node) == (8 + 16 + 16, 16)
    assert (cpu.capacity_memory_mb, cpu.memory_mb_per_node) == (288000, 128000)
    gpu_driver = scripted("gpu", "UNLIMITED", "N/A")
    gpu = gpu_driver.capacity()
    assert (gpu.capacity_gpus, gpu.gpus_per_node, gpu.max_nodes) == (16, 8, 2)
    assert (gpu.capacity_cpus, gpu.cpus_per_node, gpu.capacity_memory_mb) == (64, 32, 256000)
    assert not any(argv[0] == "sacctmgr" for argv in gpu_driver.ran)  # no partition QOS to read
    # a QOS limiting something else leaves the GPUs alone
    assert scripted("cpu", "16", "some-qos", "cpu=64|gres/gpu=2\n").capacity().capacity_gpus == 16
    # a partition no node is in has nothing (validate then says so), and nothing more to ask
    missing = scripted("missing", "UNLIMITED", "N/A")
    assert (missing.capacity().max_nodes, missing.capacity().capacity_cpus) == (0, 0)
    assert [argv[0] for argv in missing.ran] == ["sinfo"]


def test_a_cpu_job_wider_than_the_partition_allows_per_node_is_refused():
    driver = scripted("cpu", "16", "cpu-only", "gres/gpu=0|\n")
    driver.validate(JobSpec(source="x", resources={"cpus_per_task": 16, "memory_mb_per_node": "4G"}))
    with pytest.raises(SpecRejected, match=r"24 CPUs per node .* backend 'slurm-cpu' has \(16\)"):
        driver.validate(JobSpec(source="x", resources={"cpus_per_task": 24}))


def test_both_partitions_mirror_the_same_account_limits():
    """Each backend of the cluster names the other: both write the same GrpTRES, whichever
    applies the tenancy last."""
    gpu = scripted("gpu", "UNLIMITED", "N/A", name="slurm", shares_accounts_with=["slurm-cpu"])
    cpu = scripted("cpu", "16", "cpu-only", "gres/gpu=0|\n", name="slurm-cpu", shares_accounts_with=["slurm"])
    for driver in (gpu, cpu):
        driver.apply_tenancy(PARTITIONS)
    writes = [[argv for argv in d.ran if argv[:3] == ["sacctmgr", "-i", "modify"]] for d in (gpu, cpu)]
    assert writes[0] == writes[1]
    # the scripted cluster: 2 GPU nodes and a CPU node, 16 GPUs, 72 cores, 288000M
    # scoped to the backend's own cluster: another site's association of the desk is untouched
    assert [argv[5:] for argv in writes[0]] == [
        ["name=desk-a", "cluster=dca", "set", "GrpTRES=cpu=72,mem=288000M,gres/gpu=16", "Fairshare=500"],
        ["name=desk-b", "cluster=dca", "set", "GrpTRES=cpu=72,mem=-1,gres/gpu=16", "Fairshare=500"],
    ]


# -- sites: unreachable controllers, start estimates, notices, stockouts ---------------------------

UNREACHABLE_SAMPLES = [
    # measured on 22.05 with dcb's slurmctld killed (SIGKILL)
    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    "allocation failure: Unable to contact slurm controller (connect failure)",
    "slurm_load_partitions error: Unable to contact slurm controller (connect failure)",
    # slurmdbd down or cut off
    "sacct: error: Problem talking to the database: Connection refused",
    "sacctmgr: error: slurm_persist_conn_open_without_init: failed to open persistent connection",
    "squeue: error: Socket timed out on send/recv operation",
    "scancel: error: Zero Bytes were transmitted or received",
]


@pytest.mark.parametrize("stderr", UNREACHABLE_SAMPLES)
def test_a_controller_that_does_not_answer_is_unreachable(stderr):
    assert isinstance(command_error(["squeue"], 1, stderr), BackendUnreachable)


@pytest.mark.parametrize(
    "stderr",
    [
        "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
        "scancel: error: Kill job error on job id 12: Invalid job id specified",
        "sbatch: error: Batch job submission failed: Requested node configuration is not available",
    ],
)
def test_other_failures_stay_plain_errors(stderr):
    error = command_error(["sbatch"], 1, stderr)
    assert type(error) is RuntimeError and stderr[-40:] in str(error)


def test_an_errors_entry_in_json_is_unreachable_not_empty():
    """22.05's squeue --json exits 0 with no jobs and an `errors` entry when the controller is down."""
    answer = json.dumps(
        {
            "errors": [
                {"description": "Failed while looking for jobs", "error_number": -1, "source": "slurm_load_jobs"}
            ],
            "jobs": [],
        }
    )
    with pytest.raises(BackendUnreachable, match="Failed while looking for jobs"):
        json_answer(["squeue", "--json"], answer)
    assert json_answer(["squeue", "--json"], '{"errors": [], "jobs": []}') == {"errors": [], "jobs": []}
    nothing = {"errors": [{"error_number": 9003, "error": "Nothing found with query", "source": "slurmdb_jobs_get"}]}
    assert json_answer(["sacct", "--json"], json.dumps({**nothing, "jobs": []}))["jobs"] == []


def test_poll_of_an_unreachable_controller_raises():
    down = json.dumps({"errors": [{"error": "Unspecified error", "errno": -1}], "jobs": []})
    driver = Scripted({("squeue", "--json"): down}, name="dcb")
    attempt = dataclasses.replace(ref(JobSpec(source="x")), backend_ref="7")
    with pytest.raises(BackendUnreachable):
        driver.poll([attempt])


def test_start_estimate_parsing():
    line = "sbatch: Job 5 to start at 2026-12-06T20:09:10 using 2 processors on nodes b[1-2] in partition gpu"
    assert parse_estimate(line) == time.mktime((2026, 12, 6, 20, 9, 10, 0, 0, -1))
    assert parse_estimate("allocation failure: Requested node configuration is not available") is None


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("c[1-2]", ["c1", "c2"]),
        ("node[1,3-4],cpu1", ["node1", "node3", "node4", "cpu1"]),
        ("b1", ["b1"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("", []),
        ("None assigned", []),
    ],
)
def test_hostlists_expand(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize(
    ("value", "minutes"), [("7-00:00:00", 7 * 1440), ("60", 60), ("1:30:00", 90), ("UNLIMITED", float("inf"))]
)
def test_partition_max_time(value, minutes):
    assert slurm_minutes(value) == minutes


def sites_driver(idle: int, max_time: str = "7-00:00:00") -> Scripted:
    nodes = [
        {**node(f"c{i}", 32, 128000, "gpu:8", ["burst"]), "state": "idle" if i <= idle else "allocated"}
        for i in range(1, 5)
    ]
    return Scripted(
        {
            ("sinfo", "--json"): json.dumps({"nodes": nodes}),
            ("scontrol", "-o", "show", "partition", "burst"): f"PartitionName=burst MaxTime={max_time} QoS=N/A\n",
            ("scontrol", "show", "config"): "ClusterName = dca\n",
            ("sacctmgr", "-n", "-P", "show", "assoc"): "\nalice\ncarol\n",
        },
        name="burst",
        partition="burst",
        submit_as=[],
    )


def test_start_estimate_asks_sbatch_test_only_as_a_member_and_rejects_absurd_answers(monkeypatch):
    ran = []

    def fake(line):
        def run(argv, timeout, env):
            ran.append(argv)
            return subprocess.CompletedProcess(argv, 0, "", line)

        return run

    soon = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 60))
    far = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 3.5 * 86400))
    spec = JobSpec(source="x", resources={"nodes": 2, "gpus_per_node": 8})
    driver = sites_driver(idle=4)
    monkeypatch.setattr("cellscale_hub.proc.run", fake(f"sbatch: Job 9 to start at {soon} using 2 processors"))
    assert abs(driver.start_estimate(spec, "desk-a") - (time.time() + 60)) < 2
    argv = ran[-1]
    assert argv[:3] == ["sbatch", "--test-only", "--account=desk-a"] and "--partition=burst" in argv
    assert "--nodes=2" in argv and "--gres=gpu:8" in argv
    # cached per shape: a second ask runs nothing
    assert driver.start_estimate(spec, "desk-a") is not None and len(ran) == 1
    # now + 3.5 days while 4 idle nodes could take the 2-node gang: unknown
    driver = sites_driver(idle=4)
    monkeypatch.setattr("cellscale_hub.proc.run", fake(f"sbatch: Job 9 to start at {far} using 2 processors"))
    assert driver.start_estimate(spec, "desk-a") is None
    # the same answer with the nodes busy is believed
    driver = sites_driver(idle=1)
    assert driver.start_estimate(spec, "desk-a") > time.time() + 3 * 86400
    # Slurm refusing the job: no estimate
    driver = sites_driver(idle=4)
    monkeypatch.setattr(
        "cellscale_hub.proc.run",
        lambda argv, timeout, env: subprocess.CompletedProcess(
            argv, 1, "", "Requested node configuration is not available"
        ),
    )
    assert driver.start_estimate(spec, "desk-a") is None


def test_node_notices_are_spot_reclaim_reasons_of_the_partition():
    nodes = [
        {**node("c1", 32, 128000, "gpu:8", ["burst"]), "reason": "spot-reclaim: terminating in 30 s"},
        {**node("c2", 32, 128000, "gpu:8", ["burst"]), "reason": "stockout: no capacity"},
        {**node("node1", 32, 128000, "gpu:8", ["gpu"]), "reason": "spot-reclaim: elsewhere"},
    ]
    driver = Scripted({("sinfo", "--json"): json.dumps({"nodes": nodes})}, name="burst", partition="burst")
    assert driver.node_notices() == {"c1": "spot-reclaim: terminating in 30 s"}
    driver.node_notices()
    assert len(driver.ran) == 1  # one sinfo, reused


def test_a_node_fail_on_stocked_out_cloud_nodes_is_a_capacity_fault(tmp_path):
    """Measured on 22.05: a --no-requeue job whose resume got a stockout ends NODE_FAIL at once,
    its nodes powered-down idle (idle~) with the reason the resume script set."""
    reason = "stockout: InsufficientInstanceCapacity: no capacity"
    nodes = [{**node(f"c{i}", 32, 128000, "gpu:8", ["burst"]), "state": "idle", "reason": reason} for i in (1, 2)]
    driver = Scripted({("sinfo", "--json"): json.dumps({"nodes": nodes})}, name="burst", partition="burst")
    attempt = dataclasses.replace(ref(JobSpec(source="x", resources={"nodes": 2})), backend_ref="2")
    entry = {"job_id": 2, "state": {"current": "NODE_FAIL"}, "nodes": "c[1-2]", "allocation_nodes": 2}
    seen = driver._observe(attempt, entry)
    assert seen.fault is Fault.CAPACITY and seen.state is AttemptState.FAILED
    assert seen.reason.startswith("the cloud had no capacity for c1, c2 (stockout)")
    assert seen.nodes == ("c1", "c2") and seen.failed_nodes == ()


def test_start_estimate_names_its_nodes():
    line = "sbatch: Job 5 to start at 2026-12-06T20:09:10 using 2 processors on nodes node[1-2] in partition gpu"
    assert parse_estimate_nodes(line) == ["node1", "node2"]
    assert parse_estimate_nodes("allocation failure: Requested node configuration is not available") == []


DATA = ["bars=s3://md/bars/2024@v42"]


def test_staging_job_matches_golden():
    """One task per node the job will start on, beside what runs there, as the job's desk."""
    driver = SlurmDriver(name="slurm", python="/opt/venv/bin/python", partition="gpu", stage_partition="cpu")
    script = driver.render_staging(ref(JobSpec(source="x", datasets=DATA, resources={"nodes": 2})), ["node3", "node4"])
    path = GOLDEN / "slurm-stage-2-nodes.sh"
    if os.environ.get("CELLSCALE_UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text()


def test_staging_refuses_a_node_name_that_is_not_plain():
    driver = SlurmDriver(name="slurm", python="/opt/venv/bin/python")
    with pytest.raises(ValueError, match="not a plain name"):
        driver.render_staging(ref(JobSpec(source="x", datasets=DATA)), ["node1\n#SBATCH --account=desk-b"])


class Answering(FixedSlurm):
    """`sbatch --test-only` answered from a table: (nodelist asked) -> (seconds from now, nodes)."""

    answers: dict = {}

    def _test_only(self, spec, account, excluded=(), nodelist=()):
        found = self.answers.get(tuple(nodelist))
        if found is None:
            return None
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + found[0]))
        return f"sbatch: Job 9 to start at {at} using 2 processors on nodes {found[1]} in partition gpu"


@pytest.mark.parametrize(
    ("answers", "targets"),
    [
        ({(): (0, "node[3-4]")}, ["node3", "node4"]),
        ({(): (7200, "node[1-2]")}, None),  # beyond the horizon: its nodes may change before it starts
        ({}, None),  # Slurm cannot say
    ],
)
def test_stage_targets_are_where_slurm_would_start_it(answers, targets):
    driver = Answering(name="slurm", stage_horizon_s=3600)
    driver.answers = answers
    assert driver.stage_targets(ref(JobSpec(source="x", datasets=DATA, resources={"nodes": 2}))) == targets


@pytest.mark.parametrize(
    ("answers", "pinned"),
    [
        ({("node3", "node4"): (0, "node[3-4]")}, ("node3", "node4")),  # its staged nodes are free: run there
        ({("node3", "node4"): (3600, "node[3-4]")}, ()),  # busy for an hour: never wait for the data's nodes
    ],
)
def test_a_job_runs_where_its_data_was_staged_when_those_nodes_are_free(tmp_path, answers, pinned):
    driver = Answering(name="slurm")
    driver.answers = answers
    attempt = dataclasses.replace(
        ref(JobSpec(source="x", datasets=DATA, resources={"nodes": 2})), job_dir=tmp_path / "job"
    )
    attempt.dir.write_stage_plan(
        StagePlan(datasets=attempt.spec.datasets, cache=driver.data_cache(), nodes=["node3", "node4"], at=0)
    )
    assert driver._on_staged_nodes(attempt).nodelist == pinned
