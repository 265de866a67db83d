"""Every manifest cellscale renders for Kubernetes validates as a modern apiserver would on create
(tests/kube_schema.py: the pinned CRDs with unknown fields refused, defaults and CEL rules; built-in
kinds strictly): each kind the driver renders for an attempt (drivers/kubernetes/manifests.py) and each kind the
tenancy mirror renders (drivers/kubernetes/tenancy.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cellscale.spec import JobSpec
from cellscale_hub.drivers.kubernetes import manifests
from cellscale_hub.drivers.kubernetes.tenancy import HubIdentity, render_tenancy
from cellscale_hub.tenancy import Tenancy
from tests.kube_schema import ManifestInvalid, validate

SETTINGS = manifests.KubeSettings(
    image="registry.example.com/cellscale:0.1.0",
    python="/opt/venv/bin/python",
    jobs_claim="cellscale-jobs",
    jobs_root="/shared/cellscale/jobs",
    namespace_prefix="cs-",
    topology_level="cloud.provider.com/topology-block",
)

SPECS = {
    "torchrun 2x8, one switch, high priority": {
        "launcher": "torchrun",
        "priority": "high",
        "resources": {
            "nodes": 2,
            "gpus_per_node": 8,
            "cpus_per_task": 4,
            "memory_mb_per_node": "256G",
            "timeout_min": 90,
            "switches": 1,
        },
    },  # fmt: skip
    "torchrun 4x8, two switches": {
        "launcher": "torchrun",
        "resources": {"nodes": 4, "gpus_per_node": 8, "switches": 2},
    },
    "plain, one CPU node": {"launcher": "plain", "resources": {"cpus_per_task": 8, "memory_mb_per_node": "4G"}},
    "jax 2x4": {"launcher": "jax", "resources": {"nodes": 2, "gpus_per_node": 4}},
    "ray 2x4": {"launcher": "ray", "resources": {"nodes": 2, "gpus_per_node": 4, "cpus_per_task": 8}},
    "ray, one node, no GPU": {"launcher": "ray", "resources": {"cpus_per_task": 2}},
}


def attempt(spec: dict) -> manifests.Attempt:
    return manifests.Attempt(
        job_id="cs-0123456789ab",
        number=2,
        job_dir=Path("/shared/cellscale/jobs/cs-0123456789ab"),
        spec=JobSpec(source="x = 1", **spec),
        owner="alice",
        tenant="desk-a",
        queue="default",
        uid=1001,
        gid=1001,
    )


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_an_attempts_manifest_validates(spec):
    manifest = manifests.render(attempt(spec), SETTINGS)
    assert manifest["kind"] == ("RayJob" if spec["launcher"] == "ray" else "JobSet")
    validate(manifest)


@pytest.mark.parametrize("owner", ["alice", "_svc", "bob_", "build-", "a" * 32])
def test_any_unix_user_gets_a_valid_manifest_or_a_clear_refusal(owner):
    """Job owners are Unix user names (`proc.UNIX_USER`), which may start with '_' or end with
    '_' or '-': a label value may not. Rendering either refuses in words or gives a valid manifest,
    never one the apiserver would refuse at submit."""
    try:
        manifest = manifests.render(dataclasses.replace(attempt(SPECS["plain, one CPU node"]), owner=owner), SETTINGS)
    except ValueError as refused:
        assert owner in str(refused)
    else:
        validate(manifest)


def test_the_golden_manifests_validate():
    """What `--dry-run` prints (tests/golden/k8s-*.yaml) is what was validated above."""
    import yaml

    goldens = sorted((Path(__file__).parent.parent / "golden").glob("k8s-*.yaml"))
    assert goldens, "no tests/golden/k8s-*.yaml"
    for path in goldens:
        validate(yaml.safe_load(path.read_text()))


# A tenancy with Kubernetes flavors: one desk in a cohort with borrowing and lending limits on
# every resource, one desk outside any cohort (whose limits Kueue refuses: the mirror must drop
# them), and a desk whose queue is on another backend only.
TENANCY = """
flavors:
  h100: {backend: k8s}
  a100: {backend: k8s}
  slurm: {backend: slurm}
cohorts:
  firm: {}
  trading: {parent: firm, weight: 2}
cluster_queues:
  desk-a:
    cohort: trading
    weight: 1.5
    quotas:
      h100: {nominal: 16, borrowing_limit: 8, lending_limit: 4,
             cpu: {nominal: 256, borrowing_limit: 64, lending_limit: 128},
             memory: {nominal: 2T, borrowing_limit: 512G, lending_limit: 1T}}
      a100: {nominal: 8}
  desk-b:
    quotas:
      h100: {nominal: 8, borrowing_limit: 4, lending_limit: 2, cpu: {nominal: 64}}
  desk-c:
    quotas:
      slurm: {nominal: 8}
tenants:
  desk-a:
    queues:
      default: {cluster_queue: desk-a}
      batch: {cluster_queue: desk-a}
  desk-b:
    queues:
      default: {cluster_queue: desk-b}
  desk-c:
    queues:
      default: {cluster_queue: desk-c}
priority_classes: {low: -100, normal: 0, high: 100}
"""

HUBS = {"hub as a ServiceAccount": HubIdentity(), "hub as a user": HubIdentity(name="cellscale-hub", namespace=None)}
EXPECTED_KINDS = {
    "ResourceFlavor", "Cohort", "ClusterQueue", "WorkloadPriorityClass", "Namespace", "ServiceAccount",
    "LocalQueue", "ResourceQuota", "LimitRange", "Role", "RoleBinding",
}  # fmt: skip


TOPOLOGY = {"topology_level": "cloud.provider.com/topology-rack",
            "topology_levels": ["cloud.provider.com/topology-block", "cloud.provider.com/topology-rack",
                                "kubernetes.io/hostname"]}  # fmt: skip


@pytest.mark.parametrize("topology", [{}, TOPOLOGY], ids=["no topology", "a Kueue Topology"])
@pytest.mark.parametrize("hub", HUBS.values(), ids=HUBS.keys())
def test_every_tenancy_object_validates(hub, topology):
    """With a topology, Kueue's CEL rules on create hold too (a flavor naming a Topology needs a node label)."""
    objects = render_tenancy(Tenancy.from_yaml(TENANCY), "k8s", "cs-", hub=hub, **topology)
    assert {obj["kind"] for obj in objects} == EXPECTED_KINDS | ({"Topology"} if topology else set())
    failures = {}
    for obj in objects:
        try:
            validate(obj)
        except ManifestInvalid as refused:
            failures[f"{obj['kind']}/{obj['metadata']['name']}"] = str(refused)
    assert not failures, "\n".join(failures.values())


def test_the_shipped_tenancy_validates():
    """config/tenants.yaml mirrored as if each of its backends were a Kubernetes one (every shape of quota
    it holds: GPU pools, CPU pools, memory with units)."""
    tenancy = Tenancy.from_yaml((Path(__file__).parents[2] / "config" / "tenants.yaml").read_text())
    for backend in {flavor.backend for flavor in tenancy.flavors.values()}:
        for obj in render_tenancy(tenancy, backend):
            validate(obj)
