"""tests/kube_schema.py: good manifests of every kind pass (with the CRDs' defaults applied), each
bad one fails for its stated reason with its JSON path, and every CEL rule of the pinned CRDs
compiles and evaluates with cel-python."""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path

import pytest

from tests import kube_schema
from tests.kube_schema import ManifestInvalid, validate

DELETE = object()
GPU_POD_ANNOTATION = {"kueue.x-k8s.io/podset-required-topology": "topology.kubernetes.io/rack"}


def with_(obj: dict, path: str, value) -> dict:
    """A copy of `obj` with `path` set to `value`, or deleted.

    The path is dotted, list indexes as numbers, a key holding dots in brackets: `spec.hard[requests.cpu]`.
    """
    out = copy.deepcopy(obj)
    *parents, last = [a or b for a, b in re.findall(r"\[([^\]]+)\]|([^.\[\]]+)", path)]
    node = out
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is DELETE:
        del node[int(last) if isinstance(node, list) else last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


def jobset_torchrun() -> dict:
    """What a torchrun attempt on 2 nodes x 8 GPUs looks like: one Indexed Job, suspended, queued."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "cs-0123abcd4567-a1",
            "namespace": "desk-a",
            "labels": {
                "kueue.x-k8s.io/queue-name": "desk-a-gpu",
                "kueue.x-k8s.io/priority-class": "normal",
                "app.kubernetes.io/managed-by": "cellscale",
                "cellscale.io/job": "cs-0123abcd4567",
                "cellscale.io/attempt": "1",
            },
        },
        "spec": {
            "suspend": True,
            "failurePolicy": {"maxRestarts": 0},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                {
                    "name": "node",
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {
                                "metadata": {"annotations": GPU_POD_ANNOTATION},
                                "spec": {
                                    "restartPolicy": "Never",
                                    "serviceAccountName": "cellscale-jobs",
                                    "containers": [
                                        {
                                            "name": "node",
                                            "image": "ghcr.io/example/cellscale-node:0.1",
                                            "command": ["python", "-m", "cellscale.runtime.node"],
                                            "env": [{"name": "CELLSCALE_NNODES", "value": "2"}],
                                            "resources": {
                                                "limits": {"nvidia.com/gpu": 8, "memory": "512Gi"},
                                                "requests": {"nvidia.com/gpu": 8, "cpu": "64", "memory": "512Gi"},
                                            },
                                            "ports": [{"containerPort": 29500, "name": "c10d"}],
                                            "volumeMounts": [{"name": "jobs", "mountPath": "/srv/cellscale/jobs"}],
                                        }
                                    ],
                                    "volumes": [
                                        {"name": "jobs", "persistentVolumeClaim": {"claimName": "cellscale-jobs"}}
                                    ],
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


def rayjob() -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": "cs-89abcdef0123-a1",
            "namespace": "desk-a",
            "labels": {"kueue.x-k8s.io/queue-name": "desk-a-gpu"},
        },
        "spec": {
            "suspend": True,
            "shutdownAfterJobFinishes": True,
            "entrypoint": "python -m cellscale.runtime.ray_entry",
            "rayClusterSpec": {
                "rayVersion": "2.40.0",
                "headGroupSpec": {
                    "rayStartParams": {"dashboard-host": "0.0.0.0"},
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "ray-head",
                                    "image": "rayproject/ray:2.40.0",
                                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                                }
                            ]
                        }
                    },  # fmt: skip
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 2,
                        "rayStartParams": {},
                        "template": {
                            "spec": {
                                "containers": [
                                    {
                                        "name": "ray-worker",
                                        "image": "rayproject/ray:2.40.0",
                                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                                    }
                                ]
                            }
                        },  # fmt: skip
                    }
                ],
            },
        },
    }


def local_queue() -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "desk-a-gpu", "namespace": "desk-a"},
        "spec": {"clusterQueue": "desk-a"},
    }


def cluster_queue() -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "desk-a"},
        "spec": {
            "cohortName": "research",
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "desk-a"}},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu", "cpu", "memory"],
                    "flavors": [
                        {
                            "name": "h100",
                            "resources": [
                                {"name": "nvidia.com/gpu", "nominalQuota": 16, "borrowingLimit": 8, "lendingLimit": 4},
                                {"name": "cpu", "nominalQuota": "256"},
                                {"name": "memory", "nominalQuota": "2Ti", "lendingLimit": "1Ti"},
                            ],
                        }
                    ],
                }
            ],
        },
    }


def cohort() -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Cohort", "metadata": {"name": "research"},
            "spec": {"parentName": "firm"}}  # fmt: skip


def resource_flavor() -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"cloud.example.com/gpu": "h100"}, "topologyName": "default"}}  # fmt: skip


def priority_class() -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": "normal"},
            "value": 100, "description": "the default"}  # fmt: skip


def topology() -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": {"name": "default"},
            "spec": {"levels": [{"nodeLabel": "cloud.provider.com/topology-block"},
                                {"nodeLabel": "kubernetes.io/hostname"}]}}  # fmt: skip


def workload() -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "jobset-cs-0123abcd4567-a1-5d2f1", "namespace": "desk-a"},
        "spec": {
            "queueName": "desk-a-gpu",
            "priority": 100,
            "priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "normal"},
            "podSets": [
                {
                    "name": "node",
                    "count": 2,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {"name": "node", "image": "img", "resources": {"limits": {"nvidia.com/gpu": 8}}}
                            ],
                        }
                    },  # fmt: skip
                    "topologyRequest": {"required": "topology.kubernetes.io/rack"},
                }
            ],
        },
    }


def namespace() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "desk-a", "labels": {"cellscale.io/tenant": "desk-a"}},
    }


def service_account() -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "cellscale-jobs", "namespace": "desk-a"},
            "automountServiceAccountToken": False}  # fmt: skip


def role() -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "cellscale-hub", "namespace": "desk-a"},
        "rules": [
            {
                "apiGroups": ["jobset.x-k8s.io"],
                "resources": ["jobsets"],
                "verbs": ["get", "list", "watch", "create", "delete"],
            },
            {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]},
        ],
    }


def role_binding() -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "cellscale-hub", "namespace": "desk-a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cellscale-hub"},
        "subjects": [{"kind": "ServiceAccount", "name": "cellscale-hub", "namespace": "cellscale"}],
    }


def resource_quota() -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "desk-a", "namespace": "desk-a"},
            "spec": {"hard": {"requests[nvidia.com/gpu]": "16", "requests.cpu": "256", "requests.memory": "2Ti",
                                      "pods": 64}}}  # fmt: skip


GOOD = {
    "jobset-torchrun-2x8": jobset_torchrun,
    "rayjob": rayjob,
    "localqueue": local_queue,
    "clusterqueue": cluster_queue,
    "cohort": cohort,
    "resourceflavor": resource_flavor,
    "topology": topology,
    "workloadpriorityclass": priority_class,
    "workload": workload,
    "namespace": namespace,
    "serviceaccount": service_account,
    "role": role,
    "rolebinding": role_binding,
    "resourcequota": resource_quota,
}


@pytest.mark.parametrize("make", GOOD.values(), ids=GOOD.keys())
def test_good_manifest_validates(make):
    manifest = make()
    out = validate(manifest)
    assert manifest == make(), "validate() must not change its argument"
    assert out["metadata"] == manifest["metadata"]


def test_jobset_gets_its_crd_defaults():
    out = validate(jobset_torchrun())
    rjob = out["spec"]["replicatedJobs"][0]
    assert (rjob["replicas"], rjob["groupName"]) == (1, "default")
    assert out["spec"]["failurePolicy"] == {"maxRestarts": 0, "restartStrategy": "Recreate"}
    container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"containerPort": 29500, "name": "c10d", "protocol": "TCP"}]


def test_null_is_dropped_then_defaulted():
    out = validate(with_(jobset_torchrun(), "spec.replicatedJobs.0.replicas", None))
    assert out["spec"]["replicatedJobs"][0]["replicas"] == 1


def test_defaults_come_before_required():
    """minReplicas and maxReplicas are required, and defaulted: leaving them out is fine."""
    group = validate(rayjob())["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert (group["minReplicas"], group["maxReplicas"], group["numOfHosts"]) == (0, 2147483647, 1)
    assert validate(rayjob())["spec"]["submissionMode"] == "K8sJobMode"


def test_clusterqueue_defaults():
    spec = validate(cluster_queue())["spec"]
    assert spec["queueingStrategy"] == "BestEffortFIFO"
    assert spec["stopPolicy"] == "None"
    assert spec["flavorFungibility"] == {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}
    assert spec["preemption"] == {"borrowWithinCohort": {"policy": "Never"}, "reclaimWithinCohort": "Never",
                                  "withinClusterQueue": "Never"}  # fmt: skip


def test_workload_defaults():
    assert validate(workload())["spec"]["active"] is True


def test_builtins_come_back_unchanged():
    assert validate(role_binding()) == role_binding()


NOT_CHECKED = (
    "<root>: some validation rules were not checked because the object was invalid; correct the existing errors "
    "to complete validation"
)
RJ = "spec.replicatedJobs.0"
POD = f"{RJ}.template.spec.template.spec"
RG = "spec.resourceGroups.0"
RAY_WORKER = "spec.rayClusterSpec.workerGroupSpecs.0"

BAD = [
    # (id, manifest, [every error, exactly])
    ("unknown field", with_(jobset_torchrun(), f"{RJ}.templat", {}),
     ["spec.replicatedJobs[0].templat: unknown field (not in the schema)"]),
    ("unknown field in a pod", with_(jobset_torchrun(), f"{POD}.containers.0.gpus", 8),
     ["spec.replicatedJobs[0].template.spec.template.spec.containers[0].gpus: unknown field (not in the schema)"]),
    ("unknown field in metadata", with_(local_queue(), "metadata.label", {}),
     ["metadata.label: unknown field (not in ObjectMeta)"]),
    ("wrong type", with_(jobset_torchrun(), f"{RJ}.replicas", "2"),
     ['spec.replicatedJobs[0].replicas: Invalid value: "2": must be of type integer', NOT_CHECKED]),
    ("wrong type: a boolean", with_(jobset_torchrun(), "spec.suspend", "yes"),
     ['spec.suspend: Invalid value: "yes": must be of type boolean', NOT_CHECKED]),
    ("int-or-string", with_(jobset_torchrun(), f"{POD}.containers.0.resources.limits[nvidia.com/gpu]", 8.5),
     ["spec.replicatedJobs[0].template.spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]: "
      "Invalid value: 8.5: must be of type integer or string", NOT_CHECKED]),
    ("quantity pattern", with_(cluster_queue(), f"{RG}.flavors.0.resources.1.nominalQuota", "256 cores"),
     ['spec.resourceGroups[0].flavors[0].resources[1].nominalQuota: Invalid value: "256 cores": must match the '
      "pattern ^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)"
      "|(\\.[0-9]+))))?$"]),
    ("enum", with_(cluster_queue(), "spec.queueingStrategy", "FIFO"),
     ['spec.queueingStrategy: Unsupported value: "FIFO": supported values: "StrictFIFO", "BestEffortFIFO"']),
    ("name pattern", with_(local_queue(), "spec.clusterQueue", "Desk_A"),
     ['spec.clusterQueue: Invalid value: "Desk_A": must match the pattern '
      "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"]),
    ("minimum", with_(workload(), "spec.podSets.0.count", -1),
     ["spec.podSets[0].count: Invalid value: -1: must be >= 0"]),
    ("int32", with_(priority_class(), "value", 2**31),
     ["value: Invalid value: 2147483648: does not fit in int32"]),
    ("minItems", with_(cluster_queue(), f"{RG}.coveredResources", []),
     ["spec.resourceGroups[0].coveredResources: Invalid value: 0: must have at least 1 items",
      'spec.resourceGroups[0]: Invalid value: "object": flavors must have the same number of resources as the '
      "coveredResources"]),  # CEL rules run beside other errors (not beside a type error)
    ("maxProperties", with_(resource_flavor(), "spec.nodeLabels", {f"k{i}": "v" for i in range(9)}),
     ["spec.nodeLabels: Too many: 9: must have at most 8 items"]),
    ("maxLength", with_(priority_class(), "description", "x" * 2049),
     ["description: Too long: may not be more than 2048 characters"]),
    ("missing required: template", with_(workload(), "spec.podSets.0.template", DELETE),
     ["spec.podSets[0].template: Required value"]),
    ("missing required: nominalQuota", with_(cluster_queue(), f"{RG}.flavors.0.resources.0.nominalQuota", DELETE),
     ["spec.resourceGroups[0].flavors[0].resources[0].nominalQuota: Required value"]),
    ("missing required: value", with_(priority_class(), "value", DELETE), ["value: Required value"]),
    ("CEL: borrowingLimit without a cohort", with_(cluster_queue(), "spec.cohortName", DELETE),
     ['spec: Invalid value: "object": borrowingLimit must be nil when cohort is empty']),
    ("CEL: flavors cover every resource", with_(cluster_queue(), f"{RG}.flavors.0.resources.2", DELETE) ,
     ['spec.resourceGroups[0]: Invalid value: "object": flavors must have the same number of resources as the '
      "coveredResources"]),
    ("CEL: startupPolicy InOrder with dependsOn",
     with_(with_(jobset_torchrun(), "spec.startupPolicy", {"startupPolicyOrder": "InOrder"}),
           f"{RJ}.dependsOn", [{"name": "launcher", "status": "Ready"}]),
     ['spec: Invalid value: "object": StartupPolicy and DependsOn APIs are mutually exclusive']),
    ("CEL: minCount <= count", with_(workload(), "spec.podSets.0.minCount", 3),
     ['spec.podSets[0]: Invalid value: "object": minCount should be positive and less or equal to count']),
    ("CEL: priority with priorityClassRef", with_(workload(), "spec.priority", DELETE),
     ['spec: Invalid value: "object": priority should not be nil when priorityClassRef is set']),
    ("CEL: RayJob managedBy", with_(rayjob(), "spec.managedBy", "cellscale"),
     ['spec.managedBy: Invalid value: "string": the managedBy field value must be either '
      "'ray.io/kuberay-operator' or 'kueue.x-k8s.io/multikueue'"]),
    ("CEL: RayJob deletionStrategy", with_(rayjob(), "spec.deletionStrategy",
                                                {"onSuccess": {"policy": "DeleteCluster"}}),
     ['spec.deletionStrategy: Invalid value: "object": deletionStrategy requires either BOTH onSuccess and '
      "onFailure, OR the deletionRules field (cannot be empty)"]),
    ("CEL: taint effect", with_(resource_flavor(), "spec.nodeTaints", [{"key": "gpu", "effect": "Evict"}]),
     ['spec.nodeTaints: Invalid value: "array": supported taint effect values: \'NoSchedule\', \'PreferNoSchedule\', '
      "'NoExecute'"]),
    ("CEL: an error while evaluating is a refusal", with_(resource_flavor(), "spec.nodeLabels", DELETE),
     ['spec: Invalid value: "object": no such member in mapping: \'nodeLabels\' evaluating rule: at least one '
      "nodeLabel is required when topology is set"]),
    ("CEL: topology levels unique", with_(topology(), "spec.levels.0.nodeLabel", "kubernetes.io/hostname"),
     ['spec.levels: Invalid value: "array": must be unique']),
    ("CEL: hostname is the lowest level",
     with_(with_(topology(), "spec.levels.0.nodeLabel", "kubernetes.io/hostname"), "spec.levels.1.nodeLabel", "rack"),
     ['spec.levels: Invalid value: "array": the kubernetes.io/hostname label can only be used at the lowest level '
      "of topology"]),
    ("metadata: name", with_(cluster_queue(), "metadata.name", "Desk_A"),
     ['metadata.name: Invalid value: "Desk_A": must be a DNS-1123 subdomain (lowercase letters, digits, \'-\' and '
      "'.', alphanumeric at both ends)"]),
    ("metadata: namespace on a cluster-scoped kind", with_(cohort(), "metadata.namespace", "desk-a"),
     ["metadata.namespace: Forbidden: not allowed on this type"]),
    ("metadata: no namespace on a namespaced kind", with_(local_queue(), "metadata.namespace", DELETE),
     ["metadata.namespace: Required value: cellscale's manifests name their namespace"]),
    ("metadata: label value", with_(jobset_torchrun(), "metadata.labels[cellscale.io/attempt]", 1),
     ["metadata.labels: Invalid value: 1: a label value must be a string of at most 63 characters: alphanumerics, "
      "'-', '_' or '.', starting and ending with an alphanumeric"]),
    ("Pod: template label", with_(jobset_torchrun(), f"{RJ}.template.spec.template.metadata.labels", {"user": "bob_"}),
     ['spec.replicatedJobs[0].template.spec.template.metadata.labels: Invalid value: "bob_": a label value must be a '
      "string of at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"]),
    ("Job: parallelism", with_(jobset_torchrun(), f"{RJ}.template.spec.parallelism", -1),
     ["spec.replicatedJobs[0].template.spec.parallelism: Invalid value: -1: must be >= 0"]),
    ("Job: Indexed needs completions", with_(jobset_torchrun(), f"{RJ}.template.spec.completions", DELETE),
     ["spec.replicatedJobs[0].template.spec.completions: Required value: when completion mode is Indexed"]),
    ("Job: restartPolicy", with_(jobset_torchrun(), f"{POD}.restartPolicy", "Always"),
     ['spec.replicatedJobs[0].template.spec.template.spec.restartPolicy: Unsupported value: "Always": supported '
      'values: "Never", "OnFailure" (the pods of a Job)']),
    ("Pod: GPU request equals limit", with_(jobset_torchrun(),
                                                f"{POD}.containers.0.resources.requests[nvidia.com/gpu]", 4),
     ["spec.replicatedJobs[0].template.spec.template.spec.containers[0].resources.requests[nvidia.com/gpu]: "
      "Invalid value: 4: must be equal to nvidia.com/gpu limit of 8"]),
    ("Pod: request over limit", with_(jobset_torchrun(), f"{POD}.containers.0.resources.requests.memory", "1Ti"),
     ["spec.replicatedJobs[0].template.spec.template.spec.containers[0].resources.requests[memory]: "
      'Invalid value: "1Ti": must be less than or equal to memory limit of "512Gi"']),
    ("Pod: whole GPUs", with_(rayjob(),
                                  f"{RAY_WORKER}.template.spec.containers.0.resources.limits[nvidia.com/gpu]", "500m"),
     ["spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].resources.limits[nvidia.com/gpu]: "
      'Invalid value: "500m": must be an integer']),
    ("Pod: container name", with_(rayjob(), f"{RAY_WORKER}.template.spec.containers.0.name", "Ray_Worker"),
     ['spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].name: Invalid value: "Ray_Worker": '
      "must be a DNS-1123 label"]),
    ("Kueue webhook: lendingLimit without a cohort",
     with_(with_(cluster_queue(), "spec.cohortName", DELETE), f"{RG}.flavors.0.resources.0.borrowingLimit", DELETE),
     ['spec.resourceGroups[0].flavors[0].resources[0].lendingLimit: Invalid value: 4: must be nil when cohort is '
      "empty",
      'spec.resourceGroups[0].flavors[0].resources[2].lendingLimit: Invalid value: "1Ti": must be nil when cohort '
      "is empty"]),
    ("Kueue webhook: lendingLimit over nominal", with_(cluster_queue(), f"{RG}.flavors.0.resources.0.lendingLimit", 17),
     ["spec.resourceGroups[0].flavors[0].resources[0].lendingLimit: Invalid value: 17: must be less than or equal "
      "to the nominalQuota"]),
    ("Kueue webhook: resources in coveredResources' order",
     with_(cluster_queue(), f"{RG}.coveredResources", ["cpu", "nvidia.com/gpu", "memory"]),
     ['spec.resourceGroups[0].flavors[0].resources[0].name: Invalid value: "nvidia.com/gpu": must match the name in '
      "coveredResources",
      'spec.resourceGroups[0].flavors[0].resources[1].name: Invalid value: "cpu": must match the name in '
      "coveredResources"]),
    ("Kueue webhook: In needs values",
     with_(cluster_queue(), "spec.namespaceSelector", {"matchExpressions": [{"key": "cellscale.io/tenant",
                                                                              "operator": "In", "values": []}]}),
     ["spec.namespaceSelector.matchExpressions[0].values: Required value: must be specified when `operator` is "
      "'In' or 'NotIn'"]),
    ("deprecated version", {**local_queue(), "apiVersion": "kueue.x-k8s.io/v1beta1"},
     ["apiVersion: This version is deprecated. Use v1beta2 instead."]),
    ("unserved version", {**local_queue(), "apiVersion": "kueue.x-k8s.io/v1"},
     ["apiVersion: Unsupported value: 'kueue.x-k8s.io/v1': LocalQueue is served as ['v1beta1', 'v1beta2']"]),
    ("unknown kind", {**local_queue(), "apiVersion": "example.com/v1", "kind": "Queue"},
     ["apiVersion, kind: no pinned CRD and no Kubernetes 1.37 schema for this kind"]),
    ("builtin: unknown field", with_(namespace(), "spec.foo", 1),
     ["spec: Additional properties are not allowed ('foo' was unexpected)"]),
    ("builtin: wrong type", with_(role(), "rules.0.verbs", "get"),
     ["rules[0].verbs: 'get' is not of type 'array'"]),
    ("builtin: missing required", with_(role_binding(), "roleRef.name", DELETE),
     ["roleRef: 'name' is a required property"]),
    ("builtin: namespace name", with_(namespace(), "metadata.name", "desk.a"),
     ['metadata.name: Invalid value: "desk.a": must be a DNS-1123 label (at most 63 lowercase letters, digits and '
      "'-', alphanumeric at both ends)"]),
    ("builtin: quota quantity", with_(resource_quota(), "spec.hard[requests.cpu]", "lots"),
     ['spec.hard[requests.cpu]: Invalid value: "lots": must be a non-negative quantity']),
    ("builtin: roleRef", with_(role_binding(), "roleRef.apiGroup", "rbac"),
     ['roleRef.apiGroup: Unsupported value: "rbac": supported values: "rbac.authorization.k8s.io"']),
    ("builtin: ServiceAccount subject", with_(role_binding(), "subjects.0.apiGroup", "rbac.authorization.k8s.io"),
     ['subjects[0].apiGroup: Unsupported value: "rbac.authorization.k8s.io": supported values: ""']),
]  # fmt: skip


@pytest.mark.parametrize(("manifest", "errors"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_manifest_fails_for_its_reason(manifest, errors):
    with pytest.raises(ManifestInvalid) as refused:
        validate(manifest)
    assert refused.value.errors == errors


BUILTIN_GOOD = {name: GOOD[name] for name in ("namespace", "serviceaccount", "role", "rolebinding", "resourcequota")}


@pytest.mark.parametrize("make", BUILTIN_GOOD.values(), ids=BUILTIN_GOOD.keys())
def test_builtins_agree_with_kubernetes_validate(make):
    """The built-in kinds use kubernetes-validate's own strict schemas: its validate() agrees, on the
    good manifest and on one with an unknown field (which it reports first of all, as here)."""
    import kubernetes_validate

    kubernetes_validate.validate(make(), kube_schema.BUILTIN_VERSION, strict=True)
    bad = with_(make(), "metadata.nam", "x")
    with pytest.raises(kubernetes_validate.ValidationError) as theirs:
        kubernetes_validate.validate(bad, kube_schema.BUILTIN_VERSION, strict=True)
    with pytest.raises(ManifestInvalid) as ours:
        validate(bad)
    assert ours.value.errors == [f"metadata: {theirs.value.message}"]


def test_every_error_is_listed():
    manifest = with_(with_(jobset_torchrun(), "spec.foo", 1), f"{RJ}.template.spec.parallelism", -1)
    manifest = with_(manifest, "spec.network.subdomain", 7)
    with pytest.raises(ManifestInvalid) as refused:
        validate(manifest)
    assert str(refused.value) == (
        "JobSet/cs-0123abcd4567-a1 (jobset.x-k8s.io/v1alpha2) is invalid:\n"
        "- spec.foo: unknown field (not in the schema)\n"
        "- spec.network.subdomain: Invalid value: 7: must be of type string\n"
        f"- {NOT_CHECKED}\n"
        "- spec.replicatedJobs[0].template.spec.parallelism: Invalid value: -1: must be >= 0"
    )


def test_duplicate_list_map_key():
    manifest = jobset_torchrun()
    manifest["spec"]["replicatedJobs"].append(copy.deepcopy(manifest["spec"]["replicatedJobs"][0]))
    with pytest.raises(ManifestInvalid) as refused:
        validate(manifest)
    assert refused.value.errors == ['spec.replicatedJobs[1]: Duplicate value: {"name": "node"}']


WORKLOAD_STATUS = {
    "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved",
                    "lastTransitionTime": "2025-01-01T00:00:00Z"}],
    "admission": {"clusterQueue": "desk-a",
                  "podSetAssignments": [{"name": "node", "flavors": {"nvidia.com/gpu": "h100"}, "count": 2}]},
}  # fmt: skip


def test_status_is_dropped_on_create_and_checked_when_asked():
    manifest = {**workload(), "status": WORKLOAD_STATUS}
    assert "status" not in validate(manifest)
    assert validate(manifest, status=True)["status"]["admission"]["clusterQueue"] == "desk-a"
    two_assignments = copy.deepcopy(manifest)
    two_assignments["status"]["admission"]["podSetAssignments"].append({"name": "other", "count": 1})
    with pytest.raises(ManifestInvalid) as refused:
        validate(two_assignments, status=True)
    assert refused.value.errors == [
        '<root>: Invalid value: "object": podSetAssignments must have the same number of podSets as the spec'
    ]
    with pytest.raises(ManifestInvalid) as refused:  # unknown fields are refused before status is dropped
        validate(with_(manifest, "status.admited", True))
    assert refused.value.errors == ["status.admited: unknown field (not in the schema)"]


def test_deprecated_version_when_asked():
    assert validate({**local_queue(), "apiVersion": "kueue.x-k8s.io/v1beta1"}, allow_deprecated=True)


@pytest.mark.parametrize(
    ("amount", "value"),
    [("8", 8), (8, 8), ("500m", 0.5), ("256Gi", 256 * 2**30), ("1Ei", 2**60), ("1E", 1e18), ("1e3", 1000),
     ("2E6", 2e6), ("1.5k", 1500), ("-1", -1), ("lots", None), ("1 Gi", None), (True, None)],
)  # fmt: skip
def test_quantities(amount, value):
    assert kube_schema.parse_quantity(amount) == value


# ------------------------------------------------------------ schema markers the pinned CRDs do not use (yet)

SCHEMA = {
    "type": "object",
    "properties": {
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "embedded": {
            "type": "object",
            "x-kubernetes-embedded-resource": True,
            "properties": {"spec": {"type": "object"}},
        },
        "maybe": {"type": "string", "nullable": True},
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "at": {"type": "string", "format": "date-time"},
        "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
    },
}


def test_markers_apply_as_on_the_apiserver():
    value = {"free": {"anything": {"goes": 1}}, "maybe": None, "tags": ["a", "b"], "at": "2025-01-01T00:00:00Z",
             "embedded": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "spec": {}}}  # fmt: skip
    assert kube_schema.apply_schema(value, SCHEMA) == (value, [])


def test_markers_refuse_as_on_the_apiserver():
    value = {"tags": ["a", "a"], "at": "yesterday", "ratio": 0, "embedded": {"metadata": {"nam": "x"}, "spec": {}}}
    assert kube_schema.apply_schema(value, SCHEMA)[1] == [
        'tags[1]: Duplicate value: "a"',
        'at: Invalid value: "yesterday": must be an RFC 3339 date-time',
        "ratio: Invalid value: 0: must be > 0",
        "embedded.apiVersion: Required value: must not be empty",
        "embedded.kind: Required value: must not be empty",
        "embedded.metadata.nam: unknown field (not in ObjectMeta)",
    ]


# ------------------------------------------------------------ every CEL rule compiles and evaluates


def sample(schema: dict):
    """A value of `schema` with every property, one item per list and one entry per map set."""
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    if "enum" in schema:
        return schema["enum"][0]
    if schema.get("x-kubernetes-int-or-string"):
        return 1
    kind = schema.get("type")
    if kind == "object":
        value = {key: sample(sub) for key, sub in schema.get("properties", {}).items()}
        if isinstance(schema.get("additionalProperties"), dict):
            value["key"] = sample(schema["additionalProperties"])
        return value
    if kind == "array":
        return [sample(schema.get("items", {}))]
    if kind == "string":
        return "2025-01-01T00:00:00Z" if schema.get("format") == "date-time" else "a"
    return {"integer": 1, "number": 1.5, "boolean": True}.get(kind, "a")


RULES = kube_schema.rule_inventory()


def test_the_inventory_is_what_the_pinned_crds_hold():
    """95 rule sites in served versions: 62 checked on create, 33 transition rules (oldSelf) only on update."""
    assert len(RULES) == 95
    assert sum(not site.transition for site in RULES) == 62
    assert len({site.rule["rule"] for site in RULES if not site.transition}) == 33
    assert not [site for site in RULES if "messageExpression" in site.rule or "optionalOldSelf" in site.rule]


@pytest.mark.parametrize("site", RULES, ids=[f"{s.kind}.{s.version}{s.path}:{s.rule['rule'][:40]}" for s in RULES])
def test_every_rule_compiles_and_evaluates(site):
    """A full value of the node the rule sits on (and itself as oldSelf): cel-python gives a bool, no error."""
    import celpy

    value = celpy.json_to_cel(sample(site.schema))
    outcome = kube_schema.evaluate_rule(site.rule["rule"], {"self": value, "oldSelf": value})
    assert isinstance(outcome, bool), f"{site.rule['rule']}: {outcome}"


def test_the_crds_are_the_pinned_ones():
    crds = Path(kube_schema.CRD_DIR)
    provenance = (crds / "PROVENANCE.md").read_text()
    for path in sorted(crds.glob("*.yaml")):
        assert f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}" in provenance


def test_by_hand(tmp_path, capsys):
    import yaml

    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all([local_queue(), with_(cohort(), "spec.parent", "firm")]))
    assert kube_schema.main([str(path)]) == 1
    assert capsys.readouterr().out == (
        f"{path}: LocalQueue/desk-a-gpu is valid\n"
        f"{path}: Cohort/research (kueue.x-k8s.io/v1beta2) is invalid:\n"
        "- spec.parent: unknown field (not in the schema)\n"
    )
