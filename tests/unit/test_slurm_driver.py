"""The Slurm driver's pure parts: the batch script (golden files), shapes, state parsing.
Its behaviour against a real cluster is in tests/integration/test_slurm_backend.py."""

import os
from pathlib import Path

import pytest

from cellscale.spec import BackendView, JobSpec, Launcher
from cellscale_hub.drivers.base import AttemptRef, SpecRejected
from cellscale_hub.drivers.slurm import SlurmDriver, _gpus_of, _state, master_port

GOLDEN = Path(__file__).parent.parent / "golden"


class FixedSlurm(SlurmDriver):
    """Capacity as a 4 x 8-GPU partition, without asking sinfo."""

    def capacity(self) -> BackendView:
        return BackendView(name=self.name, kind="slurm", capacity_gpus=32, max_nodes=4, gpus_per_node=8,
                           launchers=list(Launcher))


def ref(spec: JobSpec, tenant="desk-a") -> AttemptRef:
    return AttemptRef(job_id="cs-0123456789ab", number=2, job_dir=Path("/shared/cellscale/jobs/cs-0123456789ab"),
                      spec=spec, owner="alice", tenant=tenant)


@pytest.mark.parametrize(
    ("case", "resources"),
    [
        ("slurm-torchrun-2x8", {"nodes": 2, "gpus_per_node": 8, "timeout_min": 90}),
        ("slurm-switches-1x4", {"nodes": 1, "gpus_per_node": 4, "switches": 1}),
        ("slurm-cpu", {}),
    ],
)
def test_render_matches_golden(case, resources):
    driver = FixedSlurm(name="slurm", python="/opt/venv/bin/python", partition="gpu")
    script = driver.render(ref(JobSpec(source="x = 1", resources=resources)))
    path = GOLDEN / f"{case}.sh"
    if os.environ.get("CELLSCALE_UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text()


def test_tenant_must_be_a_valid_account_name():
    with pytest.raises(SpecRejected, match="Slurm account"):
        FixedSlurm(name="slurm").render(ref(JobSpec(source="x"), tenant="Desk A;rm -rf"))


def test_user_names_are_validated_before_any_command():
    with pytest.raises(SpecRejected, match="not a valid Unix user"):
        FixedSlurm(name="slurm")._as_user("alice; rm -rf /")
    assert FixedSlurm(name="slurm", submit_as=["sudo", "-n", "-u", "{user}", "--"])._as_user("bob") == [
        "sudo", "-n", "-u", "bob", "--"]


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
    assert _state(entry) == state


@pytest.mark.parametrize(("gres", "gpus"), [("gpu:8", 8), ("gpu:a100:4(S:0-1)", 4), ("", 0), ("mps:100", 0)])
def test_gres_parsing(gres, gpus):
    assert _gpus_of(gres) == gpus


def test_rendezvous_port_is_stable_per_attempt():
    spec = JobSpec(source="x")
    assert master_port(ref(spec)) == master_port(ref(spec))
    assert 20000 <= master_port(ref(spec)) < 40000


def test_an_unsettled_accounting_record_is_unknown_not_final(tmp_path):
    driver = FixedSlurm(name="slurm")
    attempt = AttemptRef(job_id="cs-0123456789ab", number=1, job_dir=tmp_path, spec=JobSpec(source="x"),
                         backend_ref="42", owner="alice", tenant="desk-a")
    early = {"state": {"current": "NODE_FAIL"}, "allocation_nodes": 0, "nodes": "node1"}
    assert driver._observe(attempt, early).state.value == "UNKNOWN"
    never_ran = {"state": {"current": "CANCELLED"}, "allocation_nodes": 0, "nodes": "None assigned"}
    assert driver._observe(attempt, never_ran).state.value == "CANCELLED"


def test_account_limits_mirror_quota_ceiling_and_entitled_share():
    from cellscale_hub.drivers.slurm import account_limits
    from cellscale_hub.tenancy import Tenancy

    tenancy = Tenancy.model_validate({
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
    })
    # the root has two children (cohort firm, queue laptop): firm is entitled to 1/2, trading
    # to 3/4 of that, each desk to half of trading: 0.1875 of the fleet; lab 1/2 · 1/4
    assert account_limits(tenancy, "slurm", cluster_gpus=32) == {
        "desk-a": (20, 188),  # 16 + its borrowing limit 4
        "desk-b": (24, 188),  # 8 + what desk-a may lend (16); lab lends nothing
        "lab": (32, 125),     # 8 + 16 + 8 = 32, the whole cluster
    }  # Laptop is no Slurm account name and has no Slurm quota
