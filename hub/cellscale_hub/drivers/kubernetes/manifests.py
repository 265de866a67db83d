"""One attempt as the Kubernetes object that runs it: a JobSet (torchrun, plain, jax) or a
RayJob (ray), submitted suspended through Kueue.

A pure function of the attempt and the driver's settings (the public dry run prints exactly
this). The gang is all or nothing: a JobSet holds ONE replicated Job, Indexed, with
`parallelism = completions = nodes`, and Kueue admits the JobSet as one Workload (its pods are
one pod set); a RayJob's head and workers are likewise one Workload. Each pod runs the same
per-node supervisor the Slurm script runs (`python -m cellscale.runtime.supervisor JOB_DIR N`,
the node index being the Indexed Job's JOB_COMPLETION_INDEX), as the job's owner (uid and gid
of their Unix account, never root, no privilege escalation, no capabilities), with the jobs
root on a shared volume (a PersistentVolumeClaim) mounted at the path the control plane uses,
so the job directory (plan, logs, heartbeats, exit records, outputs) is the one the control
plane reads, as on Slurm.

Nothing user-supplied is written into a manifest unchecked: names and label values pass
`dns_label` or the Unix user pattern, and the cell, its environment and its inputs stay in the
job directory (plan.json), never in the manifest.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from cellscale.spec import JobSpec, Launcher
from cellscale_hub.drivers.kubernetes.names import (
    ATTEMPT_LABEL,
    JOB_LABEL,
    MANAGED_BY,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    TENANT_LABEL,
    USER_LABEL,
    dns_label,
    namespace,
    workload_name,
)
from cellscale_hub.proc import UNIX_USER  # the same rule as the Slurm and local backends

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
RAYJOB_API = "ray.io/v1"
REPLICATED_JOB = "node"  # the JobSet's one replicated Job: pods <name>-node-0-<index>
RAY_WORKERS = "workers"
GPU = "nvidia.com/gpu"
# Kueue's Topology Aware Scheduling: the pod set must (or should) fit in one domain of this level
TAS_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
TAS_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
JOBS_VOLUME = "jobs"
TMP_VOLUME = "tmp"
DEADLINE_GRACE_S = 120
LABEL_VALUE = re.compile(
    r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$"
)  # Kubernetes' rule for label values  # the supervisor enforces --time itself; Kubernetes' deadline is the backstop


@dataclass(frozen=True)
class KubeSettings:
    """What the driver's configuration contributes to every manifest."""

    image: str  # has cellscale (and torch, ray, jax as the site needs) installed
    python: str  # the Python in the image that runs the supervisor
    jobs_claim: str  # the PersistentVolumeClaim (in every desk's namespace) holding the jobs root
    jobs_root: str  # where the control plane has the jobs root: mounted at the same path in the pods
    namespace_prefix: str = ""
    service_account: str = "cellscale-jobs"  # the desk's ServiceAccount for its jobs (no API rights)
    topology_level: str = ""  # the node label of one leaf switch's domain (Kueue Topology level); "": none
    master_port: int = 29500  # each pod has its own network namespace: one fixed rendezvous port
    image_pull_policy: str = "IfNotPresent"


@dataclass(frozen=True)
class Attempt:
    """The attempt's facts a manifest needs (from the driver's AttemptRef)."""

    job_id: str
    number: int
    job_dir: Path
    spec: JobSpec
    owner: str
    tenant: str
    queue: str
    uid: int
    gid: int


def kind_of(spec: JobSpec) -> str:
    return "RayJob" if spec.launcher is Launcher.ray else "JobSet"


def master_host(attempt: Attempt) -> str:
    """Node 0's DNS name inside the JobSet (its headless service: `<name>-node-0-0.<name>`)."""
    name = workload_name(attempt.job_id, attempt.number)
    return f"{name}-{REPLICATED_JOB}-0-0.{name}"


def render(attempt: Attempt, settings: KubeSettings) -> dict:
    """The JobSet or RayJob of the attempt, as a plain object (see `to_yaml`)."""
    _check(attempt)
    if attempt.spec.launcher is Launcher.ray:
        return _rayjob(attempt, settings)
    return _jobset(attempt, settings)


def to_yaml(manifest: dict) -> str:
    """The manifest as YAML, keys in the order written (what `--dry-run` prints)."""
    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False, width=120)


def _check(attempt: Attempt) -> None:
    if not UNIX_USER.match(attempt.owner):
        raise ValueError(f"user name {attempt.owner!r} is not a valid Unix user name; jobs run as their owner")
    if not LABEL_VALUE.match(attempt.owner):
        raise ValueError(
            f"user name {attempt.owner!r} cannot be a Kubernetes label value (it must start and end with a "
            "letter or digit): the Kubernetes backend labels each job with its owner; run it on another backend"
        )
    if attempt.uid == 0 or attempt.gid == 0:
        raise ValueError(f"user {attempt.owner!r} maps to uid/gid 0: jobs never run as root")
    dns_label(attempt.queue, "queue")
    if attempt.spec.priority is not None:
        dns_label(attempt.spec.priority, "priority class")


def _labels(attempt: Attempt) -> dict[str, str]:
    return {
        **MANAGED_BY,
        TENANT_LABEL: attempt.tenant,
        JOB_LABEL: attempt.job_id,
        ATTEMPT_LABEL: str(attempt.number),
        USER_LABEL: attempt.owner,
    }


def _metadata(attempt: Attempt, settings: KubeSettings) -> dict:
    labels = {QUEUE_LABEL: attempt.queue}
    if attempt.spec.priority is not None:
        labels[PRIORITY_LABEL] = attempt.spec.priority
    return {
        "name": workload_name(attempt.job_id, attempt.number),
        "namespace": namespace(attempt.tenant, settings.namespace_prefix),
        "labels": {**labels, **_labels(attempt)},
    }


def _resources(spec: JobSpec) -> dict:
    """Requests: the node's cores and memory, as cellscale's admission counts them; GPUs as
    `nvidia.com/gpu` limits (an extended resource's request equals its limit); memory is also
    the limit (a pod that outgrows it is OOM-killed, as Slurm's cgroup would)."""
    res = spec.resources
    requests: dict[str, str] = {"cpu": str(res.cpus_per_node)}
    limits: dict[str, str] = {}
    if res.memory_mb_per_node:
        requests["memory"] = limits["memory"] = f"{res.memory_mb_per_node}Mi"
    if res.gpus_per_node:
        limits[GPU] = str(res.gpus_per_node)
    return {"requests": requests, "limits": limits} if limits else {"requests": requests}


def _topology(spec: JobSpec, settings: KubeSettings) -> dict[str, str]:
    """Kueue TAS: `--switches 1` requires the whole gang under one leaf switch; more switches
    prefer as few as possible (Kueue cannot bound the count: it packs as tightly as it can)."""
    switches = spec.resources.switches
    if not switches or not settings.topology_level:
        return {}
    return {(TAS_REQUIRED if switches == 1 else TAS_PREFERRED): settings.topology_level}


def _container(name: str, attempt: Attempt, settings: KubeSettings, command: list[str] | None) -> dict:
    container: dict = {"name": name, "image": settings.image, "imagePullPolicy": settings.image_pull_policy}
    if command is not None:
        container["command"] = command
        container["workingDir"] = str(attempt.job_dir)
    container["env"] = [{"name": "HOME", "value": "/tmp"}]
    container["resources"] = _resources(attempt.spec)
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    container["volumeMounts"] = [
        {"name": JOBS_VOLUME, "mountPath": settings.jobs_root},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
    ]
    return container


def _pod_spec(attempt: Attempt, settings: KubeSettings, container: dict) -> dict:
    return {
        "restartPolicy": "Never",  # a failed node fails the attempt: cellscale retries the gang
        "serviceAccountName": settings.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsUser": attempt.uid,
            "runAsGroup": attempt.gid,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": JOBS_VOLUME, "persistentVolumeClaim": {"claimName": settings.jobs_claim}},
            {"name": TMP_VOLUME, "emptyDir": {}},
        ],
    }


def supervisor_command(attempt: Attempt, settings: KubeSettings) -> list[str]:
    return [settings.python, "-m", "cellscale.runtime.supervisor", str(attempt.job_dir), str(attempt.number)]


def _jobset(attempt: Attempt, settings: KubeSettings) -> dict:
    res = attempt.spec.resources
    metadata = _metadata(attempt, settings)
    container = _container("supervisor", attempt, settings, supervisor_command(attempt, settings))
    pod_metadata: dict = {"labels": _labels(attempt)}
    if annotations := _topology(attempt.spec, settings):
        pod_metadata["annotations"] = annotations
    job = {
        "completionMode": "Indexed",
        "parallelism": res.nodes,
        "completions": res.nodes,
        "backoffLimit": 0,  # a failed node fails the gang; cellscale's retries make the next attempt
        "activeDeadlineSeconds": res.timeout_min * 60 + DEADLINE_GRACE_S,
        "template": {"metadata": pod_metadata, "spec": _pod_spec(attempt, settings, container)},
    }
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "suspend": True,  # Kueue unsuspends it once admitted
            "network": {"enableDNSHostnames": True, "subdomain": metadata["name"]},
            "failurePolicy": {"maxRestarts": 0},
            "successPolicy": {"operator": "All"},
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": 1,
                    "template": {"metadata": {"labels": _labels(attempt)}, "spec": job},
                }
            ],
        },
    }


def _ray_group(attempt: Attempt, settings: KubeSettings, name: str) -> dict:
    """A Ray node's pod template: KubeRay runs `ray start` in the container; the cell's driver
    is the RayJob's entrypoint (node 0's supervisor), which finds the cluster through RAY_ADDRESS."""
    pod_metadata: dict = {"labels": _labels(attempt)}
    if annotations := _topology(attempt.spec, settings):
        pod_metadata["annotations"] = annotations
    container = _container(name, attempt, settings, None)
    return {"metadata": pod_metadata, "spec": _pod_spec(attempt, settings, container)}


def _ray_start(spec: JobSpec) -> dict[str, str]:
    res = spec.resources
    return {"num-cpus": str(res.cpus_per_node), "num-gpus": str(res.gpus_per_node)}


def _rayjob(attempt: Attempt, settings: KubeSettings) -> dict:
    res = attempt.spec.resources
    head = {
        "rayStartParams": {**_ray_start(attempt.spec), "dashboard-host": "0.0.0.0"},
        "template": _ray_group(attempt, settings, "ray-head"),
    }
    cluster: dict = {"headGroupSpec": head}
    if res.nodes > 1:
        workers = res.nodes - 1
        cluster["workerGroupSpecs"] = [
            {
                "groupName": RAY_WORKERS,
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": _ray_start(attempt.spec),
                "template": _ray_group(attempt, settings, "ray-worker"),
            }
        ]
    return {
        "apiVersion": RAYJOB_API,
        "kind": "RayJob",
        "metadata": _metadata(attempt, settings),
        "spec": {
            "suspend": True,  # Kueue unsuspends it once admitted
            "entrypoint": shlex.join(supervisor_command(attempt, settings)),
            # the operator submits the entrypoint to the head's job API itself: no submitter pod
            # that would run as another user than the job's owner
            "submissionMode": "HTTPMode",
            "shutdownAfterJobFinishes": True,
            "activeDeadlineSeconds": res.timeout_min * 60 + DEADLINE_GRACE_S,
            "backoffLimit": 0,
            "rayClusterSpec": cluster,
        },
    }
