"""A TEST-ONLY STAND-IN for the Kueue, JobSet and KubeRay controllers, which cannot run on the
dev kube-apiserver (Kubernetes 1.20: no Job suspend, no CEL, no webhooks; no controller-manager,
scheduler or kubelet, so no pod ever runs).

It writes, through the real API, the objects and status transitions those controllers would:

- Kueue: for each JobSet or RayJob with a queue-name label in its namespaces, a Workload
  (owned by it, one pod set of its pods); then, as Kueue's workload controller and scheduler
  decide, QuotaReserved False with reason Inadmissible (LocalQueue missing or stopped,
  ClusterQueue missing or stopped, in Kueue's words), QuotaReserved False with reason Pending
  when the ClusterQueue's nominal GPU quota is used up by the Workloads it admitted (Kueue's
  "couldn't assign flavors ... insufficient unused quota" message), or QuotaReserved and
  Admitted True with the admission, and the job unsuspended;
- a SIMULATION of Kueue's Topology Aware Scheduling flavor check: a pod set with a
  `kueue.x-k8s.io/podset-required-topology` (or `-preferred-`) annotation becomes the Workload's
  `topologyRequest`, and it fits only a flavor whose `topologyName` names a Topology having that
  level (else QuotaReserved False, Pending, with Kueue's "Flavor ... does not support
  TopologyAwareScheduling" / "does not contain the requested level"). Not simulated: the nodes,
  their labels and capacity per domain, i.e. whether and where TAS would place the pods;
- JobSet / KubeRay: `complete(...)` and `fail(...)` write the Completed / Failed condition (a
  RayJob's jobDeploymentStatus and jobStatus) and Kueue's Finished condition.

What it leaves unproven (docs/kubernetes.md): that real Kueue admits, orders, preempts and
words things this way (only its condition types, reasons and message shapes are copied), that
the JobSet and KubeRay controllers create the pods the manifests describe, and anything a pod
does. Deliberately small: first-come quota per ClusterQueue, one flavor, GPUs only.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time

import httpx

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
KINDS = {"JobSet": "/apis/jobset.x-k8s.io/v1alpha2", "RayJob": "/apis/ray.io/v1"}
PLURAL = {"JobSet": "jobsets", "RayJob": "rayjobs"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MERGE = {"Content-Type": "application/merge-patch+json"}
GPU = "nvidia.com/gpu"
TAS = {"required": "kueue.x-k8s.io/podset-required-topology", "preferred": "kueue.x-k8s.io/podset-preferred-topology"}


def _cond(kind: str, status: str, reason: str, message: str) -> dict:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


class KueueStandIn:
    """Run `start()`d in a thread over `namespaces`; `hold = True` stops it from considering
    new Workloads (a test then changes the queues before Kueue would look)."""

    def __init__(self, client: httpx.Client, namespaces: list[str], interval: float = 0.1):
        self.client = client
        self.namespaces = list(namespaces)
        self.interval = interval
        self.hold = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kueue-standin", daemon=True)

    def __enter__(self) -> KueueStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            for ns in self.namespaces:
                try:
                    self.reconcile(ns)
                except httpx.HTTPError:
                    pass  # the API cut off (a test may do that): next round

    # -- Kueue ----------------------------------------------------------------------------------
    def reconcile(self, ns: str) -> None:
        workloads = self._items(f"{KUEUE}/namespaces/{ns}/workloads")
        owned = {(o["kind"], o["name"]): w for w in workloads for o in w["metadata"].get("ownerReferences", [])}
        for kind, api in KINDS.items():
            for job in self._items(f"{api}/namespaces/{ns}/{PLURAL[kind]}"):
                queue = job["metadata"].get("labels", {}).get(QUEUE_LABEL)
                if not queue or job["metadata"].get("deletionTimestamp"):
                    continue
                workload = owned.get((kind, job["metadata"]["name"]))
                if workload is None:
                    self._create_workload(ns, kind, job, queue)
                elif not self.hold and not _has(workload, "Admitted") and not _has(workload, "Finished"):
                    self._consider(ns, kind, job, workload)

    def _items(self, path: str) -> list[dict]:
        answer = self.client.get(path)
        answer.raise_for_status()
        return answer.json()["items"]

    def _create_workload(self, ns: str, kind: str, job: dict, queue: str) -> None:
        name = job["metadata"]["name"]
        digest = hashlib.sha256(job["metadata"]["uid"].encode()).hexdigest()[:5]
        workload = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": f"{kind.lower()}-{name}-{digest}",
                "namespace": ns,
                "ownerReferences": [
                    {
                        "apiVersion": job["apiVersion"],
                        "kind": kind,
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"queueName": queue, "podSets": [_pod_set(kind, job)]},
        }
        answer = self.client.post(f"{KUEUE}/namespaces/{ns}/workloads", json=workload)
        if answer.status_code != 409:
            answer.raise_for_status()

    def _consider(self, ns: str, kind: str, job: dict, workload: dict) -> None:
        queue = workload["spec"]["queueName"]
        local = self.client.get(f"{KUEUE}/namespaces/{ns}/localqueues/{queue}")
        if local.status_code == 404:
            return self._inadmissible(ns, workload, f"LocalQueue {queue} doesn't exist")
        local.raise_for_status()
        if (local.json()["spec"].get("stopPolicy") or "None") != "None":
            return self._inadmissible(ns, workload, f"LocalQueue {queue} is stopped")
        cq_name = local.json()["spec"]["clusterQueue"]
        cq = self.client.get(f"{KUEUE}/clusterqueues/{cq_name}")
        if cq.status_code == 404:
            return self._inadmissible(ns, workload, f"ClusterQueue {cq_name} doesn't exist")
        cq.raise_for_status()
        if (cq.json()["spec"].get("stopPolicy") or "None") != "None":
            return self._inadmissible(ns, workload, f"ClusterQueue {cq_name} is stopped")
        flavor, nominal = _gpu_quota(cq.json())
        if unfit := self._topology_unfit(workload, flavor):
            return self._status(ns, workload, [_cond("QuotaReserved", "False", "Pending", unfit)])
        wanted = _gpus(workload)
        used = self._admitted_gpus(cq_name)
        if wanted > nominal - used:
            pod_set = workload["spec"]["podSets"][0]["name"]
            message = (
                f"couldn't assign flavors to pod set {pod_set}: insufficient unused quota for {GPU} in flavor "
                f"{flavor}, {wanted - max(0, nominal - used)} more needed"
            )
            return self._status(ns, workload, [_cond("QuotaReserved", "False", "Pending", message)])
        self._admit(ns, kind, job, workload, cq_name, flavor)

    def _topology_unfit(self, workload: dict, flavor: str) -> str | None:
        """SIMULATION of Kueue's TAS check of a flavor (checkPodSetAndFlavorMatchForTAS): why the pod
        set's topology request does not fit `flavor`; None when it asks for none or fits."""
        pod_set = workload["spec"]["podSets"][0]
        request = pod_set.get("topologyRequest") or {}
        level = request.get("required") or request.get("preferred")
        if not level:
            return None
        answer = self.client.get(f"{KUEUE}/resourceflavors/{flavor}")
        answer.raise_for_status()
        topology = answer.json()["spec"].get("topologyName")
        if topology is None:
            why = f'Flavor "{flavor}" does not support TopologyAwareScheduling'
        else:
            answer = self.client.get(f"{KUEUE}/topologies/{topology}")
            if answer.status_code == 404:
                why = f'Flavor "{flavor}" information missing in TAS cache'
            elif level not in {entry["nodeLabel"] for entry in answer.raise_for_status().json()["spec"]["levels"]}:
                why = f'Flavor "{flavor}" does not contain the requested level'
            else:
                return None
        return f"couldn't assign flavors to pod set {pod_set['name']}: {why}"

    def _admitted_gpus(self, cluster_queue: str) -> int:
        """GPUs held by the Workloads admitted to the ClusterQueue and not finished, in every namespace watched."""
        held = 0
        for ns in self.namespaces:
            for workload in self._items(f"{KUEUE}/namespaces/{ns}/workloads"):
                admission = (workload.get("status") or {}).get("admission") or {}
                if admission.get("clusterQueue") == cluster_queue and not _has(workload, "Finished"):
                    held += _gpus(workload)
        return held

    def _inadmissible(self, ns: str, workload: dict, message: str) -> None:
        self._status(ns, workload, [_cond("QuotaReserved", "False", "Inadmissible", message)])

    def _admit(self, ns: str, kind: str, job: dict, workload: dict, cluster_queue: str, flavor: str) -> None:
        pod_set = workload["spec"]["podSets"][0]
        admission = {
            "clusterQueue": cluster_queue,
            "podSetAssignments": [
                {
                    "name": pod_set["name"],
                    "flavors": {GPU: flavor},
                    "resourceUsage": {GPU: str(_gpus(workload))},
                    "count": pod_set["count"],
                }
            ],
        }
        conditions = [
            _cond("QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cluster_queue}"),
            _cond("Admitted", "True", "Admitted", "The workload is admitted"),
        ]
        self._status(ns, workload, conditions, admission=admission)
        path = f"{KINDS[kind]}/namespaces/{ns}/{PLURAL[kind]}/{job['metadata']['name']}"
        self.client.patch(path, content=b'{"spec": {"suspend": false}}', headers=MERGE).raise_for_status()

    def _status(self, ns: str, workload: dict, conditions: list[dict], admission: dict | None = None) -> None:
        status: dict = {"conditions": conditions}
        if admission is not None:
            status["admission"] = admission
        path = f"{KUEUE}/namespaces/{ns}/workloads/{workload['metadata']['name']}/status"
        self.client.patch(path, content=json.dumps({"status": status}).encode(), headers=MERGE).raise_for_status()

    # -- the JobSet and KubeRay controllers ----------------------------------------------------------
    def complete(self, ns: str, kind: str, name: str) -> None:
        self._end(ns, kind, name, succeeded=True, message="")

    def fail(self, ns: str, kind: str, name: str, message: str) -> None:
        self._end(ns, kind, name, succeeded=False, message=message)

    def _end(self, ns: str, kind: str, name: str, succeeded: bool, message: str) -> None:
        path = f"{KINDS[kind]}/namespaces/{ns}/{PLURAL[kind]}/{name}/status"
        if kind == "JobSet":
            condition = (
                _cond("Completed", "True", "AllJobsCompleted", "jobset completed successfully")
                if succeeded
                else _cond("Failed", "True", "FailedJobs", message)
            )
            status = {"conditions": [condition]}
        else:
            status = {
                "jobDeploymentStatus": "Complete" if succeeded else "Failed",
                "jobStatus": "SUCCEEDED" if succeeded else "FAILED",
                **({"message": message} if message else {}),
            }
        body = json.dumps({"status": status}).encode()
        self.client.patch(path, content=body, headers=MERGE).raise_for_status()
        for workload in self._items(f"{KUEUE}/namespaces/{ns}/workloads"):
            if any(o["name"] == name and o["kind"] == kind for o in workload["metadata"].get("ownerReferences", [])):
                conditions = [*workload["status"]["conditions"], _finished(succeeded, message)]
                self._status(ns, workload, conditions, admission=workload["status"].get("admission"))


def _finished(succeeded: bool, message: str) -> dict:
    return _cond("Finished", "True", "Succeeded" if succeeded else "Failed", message or "Job finished successfully")


def _has(workload: dict, kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True" for c in (workload.get("status") or {}).get("conditions") or []
    )


def _pod_set(kind: str, job: dict) -> dict:
    """The Workload's pod set as Kueue's job integrations make it: the JobSet's one replicated
    Job's pods (parallelism of them), or a RayJob's head and workers (one pod set here); the pod
    template's TAS annotation as its `topologyRequest`."""
    spec = job["spec"]
    if kind == "JobSet":
        replicated = spec["replicatedJobs"][0]
        job_spec = replicated["template"]["spec"]
        pod_set = {"name": replicated["name"], "count": job_spec["parallelism"], "template": job_spec["template"]}
    else:
        cluster = spec["rayClusterSpec"]
        workers = sum(group.get("replicas", 0) for group in cluster.get("workerGroupSpecs", []))
        pod_set = {"name": "head", "count": 1 + workers, "template": cluster["headGroupSpec"]["template"]}
    annotations = (pod_set["template"].get("metadata") or {}).get("annotations") or {}
    request = {field: annotations[key] for field, key in TAS.items() if key in annotations}
    return {**pod_set, "topologyRequest": request} if request else pod_set


def _gpus(workload: dict) -> int:
    total = 0
    for pod_set in workload["spec"]["podSets"]:
        for container in pod_set["template"]["spec"]["containers"]:
            total += int(container.get("resources", {}).get("limits", {}).get(GPU, 0)) * pod_set["count"]
    return total


def _gpu_quota(cluster_queue: dict) -> tuple[str, int]:
    """The first flavor of the ClusterQueue that quotas GPUs, and its nominal quota."""
    for group in cluster_queue["spec"].get("resourceGroups", []):
        for flavor in group["flavors"]:
            for resource in flavor["resources"]:
                if resource["name"] == GPU:
                    return flavor["name"], int(resource["nominalQuota"])
    return "none", 0
