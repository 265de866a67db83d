"""The tenancy mirror and the hub's RBAC against a real kube-apiserver (1.20, dev/kube.py): the
objects `kube.tenancy` renders are applied (server-side, idempotent), the hub's own identity (a
ServiceAccount token from the TokenRequest API) may create JobSets, RayJobs and pods only in the
desks' namespaces and nothing cluster-wide, and a desk's ResourceQuota is enforced at admission;
with a backend's topology traits the mirror's Kueue Topology and flavors naming it are accepted, and
a `--switches` JobSet held by flavors without one is admitted once they name it.

Not proven here (no controller runs; docs/kubernetes.md): Kueue admitting against the
ClusterQueues, and the resourcequota controller's own accounting (a test-only stand-in writes
the quota's first status, `seed_quota_status`), and Kueue's Topology Aware Scheduling (the
stand-in's SIMULATION checks only that the flavor names a Topology with the requested level)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from cellscale.spec import JobSpec
from cellscale_hub.drivers.kubernetes import manifests
from cellscale_hub.drivers.kubernetes import tenancy as kube_tenancy
from cellscale_hub.drivers.kubernetes.tenancy import HubIdentity, render_tenancy
from cellscale_hub.tenancy import Tenancy
from tests.integration.kube_fixtures import DESKS_TENANCY, apply_as_admin, seed_quota_status
from tests.integration.kube_standin import KueueStandIn

pytestmark = pytest.mark.integration


def jobset(name: str) -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "default"}},
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
                            }
                        }
                    },
                }
            ],
        },
    }


def rayjob(name: str) -> dict:
    head = {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "head", "image": "rayproject/ray"}]}}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "default"}},
        "spec": {"entrypoint": "python -c pass", "suspend": True, "rayClusterSpec": {"headGroupSpec": head}},
    }


def pod(name: str, gpus: int = 1) -> dict:
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}
    container = {"name": "main", "image": "busybox", "resources": resources}
    spec = {"serviceAccountName": "cellscale-jobs", "automountServiceAccountToken": False, "containers": [container]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def enforced_after(client: httpx.Client, pods: str, too_big: dict, within_s: float = 30.0) -> None:
    """Wait until the apiserver's ResourceQuota plugin enforces the status just written: it reads
    quotas from its informer's cache, which sees the write a moment later (a pod created before
    that is admitted unchecked). Asked with dry runs, which the plugin checks but never stores."""
    deadline = time.monotonic() + within_s
    while True:
        answer = client.post(pods, params={"dryRun": "All"}, json=too_big)
        if answer.status_code == 403:
            return
        assert answer.status_code == 201, answer.text
        assert time.monotonic() < deadline, f"the quota was still not enforced {within_s:.0f} s after its status"
        time.sleep(0.05)  # the next look at the condition


def test_the_mirror_is_applied_and_applying_it_again_changes_nothing(kube_api, kube_desks):
    paths = [kube_tenancy.object_path(obj) for obj in kube_desks.objects]
    with kube_api.admin() as admin:
        before = {path: admin.get(path).json() for path in paths}
        apply_as_admin(kube_api, kube_desks.objects)
        after = {path: admin.get(path).json() for path in paths}
        namespaces = {ns["metadata"]["name"] for ns in admin.get("/api/v1/namespaces").json()["items"]}
    assert {path: obj["metadata"]["resourceVersion"] for path, obj in after.items()} == {
        path: obj["metadata"]["resourceVersion"] for path, obj in before.items()
    }
    cq = after[f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{kube_desks.prefix}desk-a"]
    assert cq["spec"]["cohortName"] == f"{kube_desks.prefix}trading"
    assert cq["spec"]["resourceGroups"] == [
        {
            "coveredResources": ["nvidia.com/gpu", "cpu", "memory"],
            "flavors": [
                {
                    "name": f"{kube_desks.prefix}a100",
                    "resources": [
                        {"name": "nvidia.com/gpu", "nominalQuota": "8", "borrowingLimit": "4"},
                        {"name": "cpu", "nominalQuota": "64"},
                        {"name": "memory", "nominalQuota": "256Gi"},
                    ],
                }
            ],
        }
    ]
    cohort = after[f"/apis/kueue.x-k8s.io/v1beta2/cohorts/{kube_desks.prefix}trading"]
    assert cohort["spec"] == {"parentName": f"{kube_desks.prefix}firm", "fairSharing": {"weight": "2"}}
    local = after[f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{kube_desks.namespace('desk-b')}/localqueues/default"]
    assert local["spec"]["clusterQueue"] == f"{kube_desks.prefix}desk-b"
    quota = after[f"/api/v1/namespaces/{kube_desks.namespace('desk-a')}/resourcequotas/cellscale"]
    # desk-a: 8 GPUs + 4 borrowed, 64 cores + desk-b's 64 lendable, 256 GiB + 256 GiB
    assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu": "12", "requests.cpu": "128", "requests.memory": "512Gi"}
    assert kube_desks.namespace("desk-c") not in namespaces  # desk-c has no queue on the k8s backend


def test_the_hub_acts_in_its_desks_namespaces_and_nowhere_else(kube_api, kube_desks):
    desk_a = kube_desks.namespace("desk-a")
    seed_quota_status(kube_api, desk_a)
    other = kube_api.unique("no-hub")
    with kube_api.admin() as admin:
        assert admin.post("/api/v1/namespaces", json={"metadata": {"name": other}}).status_code == 201
        bindings = admin.get("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings").json()["items"]
    hub_subject = kube_desks.hub.subject
    assert not [b["metadata"]["name"] for b in bindings if hub_subject in (b.get("subjects") or [])]
    hub_user = f"system:serviceaccount:{kube_desks.hub.namespace}:{kube_desks.hub.name}"

    with kube_api.client(kube_desks.hub_token) as hub:
        created = {
            "JobSet": hub.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{desk_a}/jobsets", json=jobset("j1")),
            "RayJob": hub.post(f"/apis/ray.io/v1/namespaces/{desk_a}/rayjobs", json=rayjob("r1")),
            "Pod": hub.post(f"/api/v1/namespaces/{desk_a}/pods", json=pod("p1")),
        }
        assert {kind: r.status_code for kind, r in created.items()} == {"JobSet": 201, "RayJob": 201, "Pod": 201}, {
            kind: r.text for kind, r in created.items()
        }
        watch = hub.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{desk_a}/workloads")
        assert watch.status_code == 200, watch.text

        refused = {
            "a JobSet elsewhere": hub.post(
                f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{other}/jobsets", json=jobset("j")
            ),
            "a pod elsewhere": hub.post(f"/api/v1/namespaces/{other}/pods", json=pod("p")),
            "pods cluster-wide": hub.get("/api/v1/pods"),
            "ClusterQueues": hub.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues"),
            "a namespace": hub.post("/api/v1/namespaces", json={"metadata": {"name": kube_api.unique("mine")}}),
            "a RoleBinding in its desk": hub.post(
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{desk_a}/rolebindings",
                json={
                    "metadata": {"name": "more"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
                    "subjects": [hub_subject],
                },
            ),
        }
    assert {what: r.status_code for what, r in refused.items()} == dict.fromkeys(refused, 403)
    assert refused["a JobSet elsewhere"].json()["message"] == (
        f'jobsets.jobset.x-k8s.io is forbidden: User "{hub_user}" cannot create resource "jobsets" '
        f'in API group "jobset.x-k8s.io" in the namespace "{other}"'
    )
    assert refused["pods cluster-wide"].json()["message"] == (
        f'pods is forbidden: User "{hub_user}" cannot list resource "pods" in API group "" at the cluster scope'
    )


def test_a_desks_resource_quota_is_enforced_when_pods_are_admitted(kube_api, kube_desks):
    desk_b = kube_desks.namespace("desk-b")
    pods = f"/api/v1/namespaces/{desk_b}/pods"
    with kube_api.client(kube_desks.hub_token) as hub:
        # a quota without status is not enforced: the admission plugin checks only the resources in
        # status.hard, which the resourcequota controller (not running here) writes
        unenforced = hub.post(pods, json=pod("before-status", gpus=17))
        assert unenforced.status_code == 201, unenforced.text

        seed_quota_status(kube_api, desk_b)  # what the resourcequota controller would write first
        enforced_after(hub, pods, pod("too-big", gpus=17))
        # desk-b: 8 GPUs and no borrowing limit, and desk-a lends all its 8: at most 16
        too_big = hub.post(pods, json=pod("too-big", gpus=17))
        fits = hub.post(pods, json=pod("fits", gpus=2))
    assert too_big.status_code == 403
    assert too_big.json()["message"] == (
        'pods "too-big" is forbidden: exceeded quota: cellscale, requested: requests.nvidia.com/gpu=17, '
        "used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=16"
    )
    assert fits.status_code == 201, fits.text
    with kube_api.admin() as admin:
        used = admin.get(f"/api/v1/namespaces/{desk_b}/resourcequotas/cellscale").json()["status"]["used"]
    # counted by the admission plugin itself (the controller would also recount the pod admitted before)
    assert used["requests.nvidia.com/gpu"] == "2"


KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
BLOCK, RACK, HOST = "cloud.provider.com/topology-block", "cloud.provider.com/topology-rack", "kubernetes.io/hostname"


def switches_jobset(prefix: str) -> dict:
    """The JobSet the kubernetes driver renders for `--nodes 2 --switches 1` (TAS: required rack)."""
    spec = JobSpec(source="x = 1", resources={"nodes": 2, "gpus_per_node": 2, "switches": 1})
    attempt = manifests.Attempt(
        job_id="cs-5a5a5a5a5a5a", number=1, job_dir=Path("/shared/jobs/cs-5a5a5a5a5a5a"), spec=spec,
        owner="alice", tenant="desk-a", queue="default", uid=1001, gid=1001,
    )  # fmt: skip
    settings = manifests.KubeSettings(
        image="cellscale:test", python="python3", jobs_claim="cellscale-jobs", jobs_root="/shared/jobs",
        namespace_prefix=prefix, topology_level=RACK,
    )  # fmt: skip
    return manifests.render(attempt, settings)


def mirror(prefix: str, **topology) -> list[dict]:
    hub = HubIdentity(name="cellscale-hub", namespace=f"{prefix}cellscale")
    return render_tenancy(Tenancy.from_yaml(DESKS_TENANCY), "k8s", prefix, hub=hub, **topology)


def workload_until(admin: httpx.Client, ns: str, done: Callable[[dict], bool], within_s: float = 30.0) -> dict:
    """The namespace's one Workload once `done` says so (the stand-in writes it)."""
    deadline = time.monotonic() + within_s
    while True:
        items = admin.get(f"{KUEUE}/namespaces/{ns}/workloads").json()["items"]
        if items and done(items[0]):
            return items[0]
        assert time.monotonic() < deadline, f"no such Workload in {ns} after {within_s:.0f} s: {items}"
        time.sleep(0.1)


def reserved(workload: dict) -> dict | None:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "QuotaReserved"), None)


def test_the_mirrors_topology_lets_kueue_admit_a_switches_job_that_flavors_without_one_held(kube_api):
    """Applied first as before (flavors without a Topology), a `--switches 1` JobSet waits with
    Kueue's words; applying the mirror with the backend's topology traits (a change Kueue's rules
    allow: a flavor may gain a topologyName, never lose or change it) creates the Topology and
    names it in the flavors, the apiserver accepting both, and the same JobSet is admitted."""
    prefix = kube_api.unique("tas") + "-"
    ns = f"{prefix}desk-a"
    apply_as_admin(kube_api, mirror(prefix))
    with kube_api.admin() as admin, KueueStandIn(admin, [ns]):
        answer = admin.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", json=switches_jobset(prefix))
        assert answer.status_code == 201, answer.text
        held = reserved(workload_until(admin, ns, reserved))
        assert (held["status"], held["reason"]) == ("False", "Pending")
        assert held["message"] == (
            f'couldn\'t assign flavors to pod set node: Flavor "{prefix}a100" does not support TopologyAwareScheduling'
        )
        with_topology = mirror(prefix, topology_level=RACK, topology_levels=[BLOCK, RACK, HOST])
        apply_as_admin(kube_api, with_topology)
        admitted = workload_until(admin, ns, lambda w: (reserved(w) or {}).get("status") == "True")
        topology = admin.get(f"{KUEUE}/topologies/{prefix}k8s").json()
        flavor = admin.get(f"{KUEUE}/resourceflavors/{prefix}a100").json()
        versions = [admin.get(kube_tenancy.object_path(o)).json()["metadata"]["resourceVersion"] for o in with_topology]
        apply_as_admin(kube_api, with_topology)
        again = [admin.get(kube_tenancy.object_path(o)).json()["metadata"]["resourceVersion"] for o in with_topology]
    assert admitted["spec"]["podSets"][0]["topologyRequest"] == {"required": RACK}
    assert topology["spec"] == {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]}
    assert flavor["spec"] == {"nodeLabels": {"cellscale.io/flavor": f"{prefix}a100"}, "topologyName": f"{prefix}k8s"}
    assert again == versions  # applying it again changes nothing


def test_a_topology_without_the_requested_level_still_holds_the_job(kube_api):
    """The mirror given other levels than the driver's (`--topology-level` is the admin's to pass):
    the flavor names a Topology, but not one with the rack level the JobSet asks for."""
    prefix = kube_api.unique("tas") + "-"
    ns = f"{prefix}desk-a"
    apply_as_admin(kube_api, mirror(prefix, topology_level=BLOCK))
    with kube_api.admin() as admin, KueueStandIn(admin, [ns]):
        answer = admin.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", json=switches_jobset(prefix))
        assert answer.status_code == 201, answer.text
        held = reserved(workload_until(admin, ns, reserved))
        levels = admin.get(f"{KUEUE}/topologies/{prefix}k8s").json()["spec"]["levels"]
    assert levels == [{"nodeLabel": BLOCK}, {"nodeLabel": HOST}]
    assert (held["status"], held["message"]) == (
        "False",
        f'couldn\'t assign flavors to pod set node: Flavor "{prefix}a100" does not contain the requested level',
    )
