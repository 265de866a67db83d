"""The Kubernetes driver's own logic without an API server: what `poll` answers from its watch
cache (and the job directory), the dry run, the launch plan. Against a real kube-apiserver:
tests/integration/test_kube_driver.py."""

import dataclasses
import time
from pathlib import Path

import pytest
import yaml
from traitlets import TraitError

from cellscale.runtime.records import ExitRecord, Started
from cellscale.spec import JobSpec
from cellscale.vocabulary import AttemptState, ExitReason, Fault
from cellscale_hub.drivers.kubernetes import KubernetesDriver
from cellscale_hub.drivers.kubernetes.watch import JOBSET, RAYJOB, WATCHED, WORKLOAD, Stream
from cellscale_hub.drivers.types import AttemptRef, SpecRejected

NS = "desk-a"
NAME = "cs-0123456789ab-a1"


@pytest.fixture
def driver():
    d = KubernetesDriver(name="k8s", image="cellscale:test", python="/opt/venv/bin/python", stale_after_s=30)
    for kind in WATCHED:  # a cache as a synced watch leaves it: no API server is asked
        d._streams[(kind.plural, NS)] = Stream(kind, NS, synced=True, connected=True, resource_version="1")
    yield d
    d.close()


def ref(tmp_path: Path, launcher="torchrun", nodes=2, backend_ref=f"{NS}/{NAME}") -> AttemptRef:
    spec = JobSpec(source="x = 1", launcher=launcher, resources={"nodes": nodes, "gpus_per_node": 1})
    return AttemptRef(
        job_id="cs-0123456789ab",
        number=1,
        job_dir=tmp_path / "cs-0123456789ab",
        spec=spec,
        owner="alice",
        tenant="desk-a",
        queue="default",
        backend_ref=backend_ref,
    )


def put(driver, kind, obj):
    driver._streams[(kind.plural, NS)].objects[obj["metadata"]["name"]] = obj


def jobset(suspend=False, conditions=()):
    meta = {"name": NAME, "namespace": NS}
    return {
        "kind": "JobSet",
        "metadata": meta,
        "spec": {"suspend": suspend},
        "status": {"conditions": list(conditions)},
    }


def workload(*conditions, owner_kind="JobSet"):
    meta = {"name": f"jobset-{NAME}-1", "ownerReferences": [{"kind": owner_kind, "name": NAME}]}
    return {"kind": "Workload", "metadata": meta, "status": {"conditions": list(conditions)}}


ADMITTED = workload(
    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
    {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""},
)


def test_kueues_reason_is_why_it_waits(driver, tmp_path):
    put(driver, JOBSET, jobset(suspend=True))
    message = "ClusterQueue desk-a is stopped"
    put(
        driver,
        WORKLOAD,
        workload({"type": "QuotaReserved", "status": "False", "reason": "Inadmissible", "message": message}),
    )
    obs = driver.poll([ref(tmp_path)])[("cs-0123456789ab", 1)]
    assert (obs.state, obs.reason) == (AttemptState.STARTING, f"Kueue cannot admit it (inadmissible): {message}")


def test_admitted_is_running_once_every_rank_started(driver, tmp_path):
    attempt = ref(tmp_path)
    put(driver, JOBSET, jobset())
    put(driver, WORKLOAD, ADMITTED)
    assert driver.poll([attempt])[attempt.key].state is AttemptState.STARTING
    for rank in range(2):
        (attempt.dir.attempt_dir(1) / "ranks").mkdir(parents=True, exist_ok=True)
        (attempt.dir.attempt_dir(1) / "ranks" / str(rank)).touch()
    assert driver.poll([attempt])[attempt.key].state is AttemptState.RUNNING


def test_an_eviction_after_the_ranks_started_ends_the_attempt_as_preempted(driver, tmp_path):
    """Kueue would requeue it, but the supervisors took this attempt: cellscale's next attempt resumes it."""
    attempt = ref(tmp_path)
    attempt.dir.node_dir(1, 0).mkdir(parents=True)
    attempt.dir.write_started(1, 0, Started(pid=1, host="pod-0"))
    put(driver, JOBSET, jobset(suspend=True))
    evicted = {
        "type": "Evicted",
        "status": "True",
        "reason": "Preempted",
        "message": "Preempted to accommodate a workload",
    }
    put(driver, WORKLOAD, workload(evicted))
    obs = driver.poll([attempt])[attempt.key]
    assert (obs.state, obs.fault, obs.reason) == (
        AttemptState.FAILED,
        Fault.PREEMPTION,
        "evicted by Kueue (Preempted): Preempted to accommodate a workload",
    )


def test_a_cache_cut_off_too_long_says_unknown_never_gone(driver, tmp_path):
    stream = driver._streams[(JOBSET.plural, NS)]
    stream.connected, stream.lost_at, stream.error = False, time.monotonic() - 45, "ClientConnectorError: refused"
    obs = driver.poll([ref(tmp_path)])[("cs-0123456789ab", 1)]
    assert obs.state is AttemptState.UNKNOWN
    assert obs.reason.startswith("the watch of jobsets in desk-a has been cut off for 45 s (ClientConnectorError")


def test_gone_after_cancel_is_cancelled_and_gone_otherwise_is_lost(driver, tmp_path):
    attempt = ref(tmp_path)
    obs = driver.poll([attempt])[attempt.key]
    assert (obs.state, obs.reason) == (
        AttemptState.LOST,
        f"its JobSet {NS}/{NAME} was deleted outside cellscale",
    )
    driver._cancelled.add(attempt.key)
    assert driver.poll([attempt])[attempt.key].state is AttemptState.CANCELLED


def test_gone_with_every_exit_record_is_what_they_say(driver, tmp_path):
    attempt = ref(tmp_path)
    for node in range(2):
        attempt.dir.node_dir(1, node).mkdir(parents=True)
        attempt.dir.write_exit(1, node, ExitRecord(code=0, reason=ExitReason.SUCCEEDED))
    assert driver.poll([attempt])[attempt.key].state is AttemptState.SUCCEEDED


def test_a_rayjob_has_one_supervisor_and_kuberays_cluster(driver, tmp_path):
    attempt = ref(tmp_path, launcher="ray")
    plan = driver.launch_plan(attempt)
    assert (plan.ray_cluster, plan.expected_ranks) == ("backend", 1)
    rayjob = {"kind": "RayJob", "metadata": {"name": NAME}, "spec": {"suspend": False}, "status": {}}
    put(driver, RAYJOB, rayjob)
    put(driver, WORKLOAD, workload(*ADMITTED["status"]["conditions"], owner_kind="RayJob"))
    (attempt.dir.attempt_dir(1) / "ranks").mkdir(parents=True)
    (attempt.dir.attempt_dir(1) / "ranks" / "0").touch()
    assert driver.poll([attempt])[attempt.key].state is AttemptState.RUNNING


def test_torchrun_ranks_meet_at_node_0s_pod(driver, tmp_path):
    plan = driver.launch_plan(ref(tmp_path))
    assert (plan.master_addr, plan.master_port) == (f"{NAME}-node-0-0.{NAME}", 29500)


def test_the_dry_run_is_the_manifest_as_the_owner(driver, tmp_path):
    manifest = yaml.safe_load(driver.render(ref(tmp_path)))
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == __import__("pwd").getpwnam("alice").pw_uid
    assert pod["volumes"][0] == {"name": "jobs", "persistentVolumeClaim": {"claimName": "cellscale-jobs"}}
    assert pod["containers"][0]["volumeMounts"][0] == {"name": "jobs", "mountPath": str(tmp_path)}


def test_an_owner_without_an_account_is_refused(driver, tmp_path):
    with pytest.raises(SpecRejected, match="there is no Unix user 'nosuchuser9'"):
        driver.render(dataclasses.replace(ref(tmp_path), owner="nosuchuser9"))


def test_topology_levels_without_the_level_switches_ask_for_are_refused_when_configured():
    with pytest.raises(TraitError) as refused:
        KubernetesDriver(
            topology_level="example.com/rack", topology_levels=["example.com/block", "kubernetes.io/hostname"]
        )
    assert str(refused.value) == (
        "KubernetesDriver 'k8s': topology_level 'example.com/rack' is not one of topology_levels "
        "['example.com/block', 'kubernetes.io/hostname']: Kueue would never admit a --switches job asking for it; "
        "add it to the levels or choose one of them"
    )


def test_switches_without_a_topology_level_are_refused(driver):
    spec = JobSpec(source="x", resources={"nodes": 2, "gpus_per_node": 8, "switches": 1})
    with pytest.raises(SpecRejected) as refused:
        driver.validate(spec)
    assert str(refused.value) == "backend 'k8s' has no topology level configured for --switches; leave --switches out"
