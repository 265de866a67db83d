"""The Kubernetes manifests of one attempt (golden files): a torchrun JobSet of 2 x 8 GPUs, a
Ray job's RayJob, a plain CPU JobSet; and what they refuse to render."""

import os
from pathlib import Path

import pytest
import yaml

from cellscale.spec import JobSpec
from cellscale_hub.drivers.kubernetes import manifests
from cellscale_hub.drivers.kubernetes.names import NotAKubernetesName

GOLDEN = Path(__file__).parent.parent / "golden"
SETTINGS = manifests.KubeSettings(
    image="registry.example.com/cellscale:0.1.0",
    python="/opt/venv/bin/python",
    jobs_claim="cellscale-jobs",
    jobs_root="/shared/cellscale/jobs",
    namespace_prefix="cs-",
    topology_level="cloud.provider.com/topology-block",
)


def attempt(spec: JobSpec, **changes) -> manifests.Attempt:
    facts = {
        "job_id": "cs-0123456789ab",
        "number": 2,
        "job_dir": Path("/shared/cellscale/jobs/cs-0123456789ab"),
        "spec": spec,
        "owner": "alice",
        "tenant": "desk-a",
        "queue": "default",
        "uid": 1001,
        "gid": 1001,
    }
    return manifests.Attempt(**{**facts, **changes})


@pytest.mark.parametrize(
    ("case", "spec"),
    [
        # torchrun over 2 nodes x 8 GPUs, under one leaf switch, high priority
        (
            "k8s-torchrun-2x8",
            {
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
            },
        ),
        ("k8s-ray-2x4", {"launcher": "ray", "resources": {"nodes": 2, "gpus_per_node": 4, "cpus_per_task": 8}}),
        ("k8s-plain-cpu", {"launcher": "plain", "resources": {"cpus_per_task": 8, "memory_mb_per_node": "4G"}}),
    ],
)
def test_render_matches_golden(case, spec):
    text = manifests.to_yaml(manifests.render(attempt(JobSpec(source="x = 1", **spec)), SETTINGS))
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("CELLSCALE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_the_gang_is_one_indexed_job_of_every_node():
    """Kueue admits a JobSet as one Workload: one replicated Job, all its pods at once."""
    spec = JobSpec(source="x", resources={"nodes": 4, "gpus_per_node": 8})
    jobset = manifests.render(attempt(spec), SETTINGS)
    (replicated,) = jobset["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    assert (replicated["replicas"], job["completionMode"], job["parallelism"], job["completions"]) == (
        1,
        "Indexed",
        4,
        4,
    )
    assert jobset["spec"]["suspend"] is True
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    pod = job["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 1001 and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}


def test_more_switches_prefer_one_domain():
    spec = JobSpec(source="x", resources={"nodes": 4, "gpus_per_node": 8, "switches": 2})
    pod = manifests.render(attempt(spec), SETTINGS)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-preferred-topology": "cloud.provider.com/topology-block"
    }


def test_a_one_node_ray_job_has_no_worker_group():
    rayjob = manifests.render(attempt(JobSpec(source="x", launcher="ray", resources={"gpus_per_node": 2})), SETTINGS)
    assert "workerGroupSpecs" not in rayjob["spec"]["rayClusterSpec"]
    assert rayjob["spec"]["entrypoint"] == (
        "/opt/venv/bin/python -m cellscale.runtime.supervisor /shared/cellscale/jobs/cs-0123456789ab 2"
    )


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"owner": "Alice;rm"}, "user name 'Alice;rm' is not a valid Unix user name; jobs run as their owner"),
        (
            {"owner": "_svc"},
            "user name '_svc' cannot be a Kubernetes label value (it must start and end with a letter or digit): "
            "the Kubernetes backend labels each job with its owner; run it on another backend",
        ),
        ({"uid": 0}, "user 'alice' maps to uid/gid 0: jobs never run as root"),
        (
            {"queue": "Default Queue"},
            "queue 'Default Queue' cannot name a Kubernetes object: use lowercase letters, digits and '-' "
            "(at most 63, starting and ending with a letter or digit)",
        ),
        (
            {"tenant": "desk_a"},
            "desk 'cs-desk_a' cannot name a Kubernetes object: use lowercase letters, digits and '-' "
            "(at most 63, starting and ending with a letter or digit)",
        ),
    ],
)
def test_what_cannot_be_rendered_is_refused_in_words(changes, words):
    with pytest.raises((ValueError, NotAKubernetesName)) as refused:
        manifests.render(attempt(JobSpec(source="x"), **changes), SETTINGS)
    assert str(refused.value) == words


def test_nothing_of_the_cell_is_in_the_manifest():
    """The cell, its environment and inputs stay in the job directory (plan.json)."""
    spec = JobSpec(source="SECRET_SOURCE = 1", env={"TOKEN": "SECRET_VALUE"}, outputs=["SECRET_OUT"])
    text = manifests.to_yaml(manifests.render(attempt(spec), SETTINGS))
    assert "SECRET" not in text
    assert yaml.safe_load(text)["kind"] == "JobSet"
