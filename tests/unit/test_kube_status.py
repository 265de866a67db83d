"""Kueue's Workload conditions and the JobSet's or RayJob's status, as cellscale's attempt
states and "why pending" words (`kube.status`), with Kueue's own condition types, reasons and
messages (kueue.x-k8s.io/v1beta2, Kueue's workload controller and flavor assigner)."""

import pytest

from cellscale.vocabulary import AttemptState
from cellscale_hub.drivers.kubernetes.status import observe

S, F, C = AttemptState.STARTING, AttemptState.FAILED, AttemptState.CANCELLED


def cond(kind, status, reason="", message=""):
    return {"type": kind, "status": status, "reason": reason, "message": message}


def workload(*conditions, cluster_queue=None, checks=()):
    status = {"conditions": list(conditions)}
    if cluster_queue:
        status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": []}
    if checks:
        status["admissionChecks"] = list(checks)
    return {"kind": "Workload", "metadata": {"name": "jobset-x-1"}, "status": status}


def jobset(*conditions, suspend=True, deleting=False):
    meta = {"name": "cs-0123456789ab-a1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T20:00:00Z"
    return {
        "kind": "JobSet",
        "metadata": meta,
        "spec": {"suspend": suspend},
        "status": {"conditions": list(conditions)},
    }


def rayjob(deployment, job=None, message=None):
    status = {"jobDeploymentStatus": deployment}
    if job:
        status["jobStatus"] = job
    if message:
        status["message"] = message
    return {"kind": "RayJob", "metadata": {"name": "cs-0123456789ab-a1"}, "spec": {"suspend": False}, "status": status}


ADMITTED = workload(
    cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue desk-a"),
    cond("Admitted", "True", "Admitted", "The workload is admitted"),
    cluster_queue="desk-a",
)

CASES = [
    ("no Workload yet", jobset(), None, S, "waiting for Kueue to queue the JobSet (no Workload yet)"),
    (
        "waits for quota",
        jobset(),
        workload(
            cond(
                "QuotaReserved",
                "False",
                "Pending",
                "couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor "
                "k8s, 8 more needed",
            )
        ),
        S,
        "Kueue queues it: couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu "
        "in flavor k8s, 8 more needed",
    ),
    (
        "inadmissible: the ClusterQueue is stopped",
        jobset(),
        workload(cond("QuotaReserved", "False", "Inadmissible", "ClusterQueue desk-a is stopped")),
        S,
        "Kueue cannot admit it (inadmissible): ClusterQueue desk-a is stopped",
    ),
    (
        "inadmissible: the LocalQueue is missing",
        jobset(),
        workload(cond("QuotaReserved", "False", "Inadmissible", "LocalQueue default doesn't exist")),
        S,
        "Kueue cannot admit it (inadmissible): LocalQueue default doesn't exist",
    ),
    ("queued, not yet considered", jobset(), workload(), S, "queued in Kueue (not yet considered for admission)"),
    (
        "quota reserved, an admission check pending",
        jobset(),
        workload(
            cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue desk-a"),
            cond("Admitted", "False", "NoChecks", ""),
            cluster_queue="desk-a",
            checks=[{"name": "provisioning", "state": "Pending"}],
        ),
        S,
        "Kueue reserved quota in desk-a; waiting for admission checks (provisioning pending)",
    ),
    ("admitted, not yet resumed", jobset(), ADMITTED, S, "admitted by Kueue to desk-a; JobSet resuming"),
    ("admitted and resumed", jobset(suspend=False), ADMITTED, S, "admitted by Kueue to desk-a; its pods are starting"),
    (
        "evicted (preempted) and requeued",
        jobset(),
        workload(
            cond("QuotaReserved", "False", "Pending", ""),
            cond("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: 5) in the ClusterQueue"),
            cond("Admitted", "False", "NoReservation", "The workload has no reservation"),
        ),
        S,
        "evicted by Kueue (Preempted): Preempted to accommodate a workload (UID: 5) in the ClusterQueue; "
        "Kueue queues it again",
    ),
    (
        "the JobSet completed",
        jobset(cond("Completed", "True", "AllJobsCompleted", "jobset completed successfully"), suspend=False),
        ADMITTED,
        AttemptState.SUCCEEDED,
        "every node's Job completed",
    ),
    (
        "the JobSet failed",
        jobset(cond("Failed", "True", "FailedJobs", "jobset failed due to one or more job failures"), suspend=False),
        ADMITTED,
        F,
        "JobSet failed: jobset failed due to one or more job failures",
    ),
    ("being deleted", jobset(deleting=True), ADMITTED, C, "its JobSet is being deleted"),
    (
        "a RayJob running",
        rayjob("Running", "RUNNING"),
        ADMITTED,
        S,
        "admitted by Kueue to desk-a; its pods are starting",
    ),
    ("a RayJob succeeded", rayjob("Complete", "SUCCEEDED"), ADMITTED, AttemptState.SUCCEEDED, "the Ray job succeeded"),
    (
        "a RayJob failed",
        rayjob("Failed", "FAILED", "Job entrypoint command failed with exit code 1"),
        ADMITTED,
        F,
        "RayJob failed: Job entrypoint command failed with exit code 1",
    ),
]


@pytest.mark.parametrize(("case", "obj", "wl", "state", "words"), CASES, ids=[c[0] for c in CASES])
def test_kueue_and_jobset_status_in_words(case, obj, wl, state, words):
    view = observe(obj, wl)
    assert (view.state, view.reason) == (state, words)


def test_an_eviction_is_flagged_for_the_driver():
    """The driver ends an attempt whose ranks had started when Kueue evicts it (its pods are gone)."""
    evicted = workload(cond("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout ns/x"))
    assert observe(jobset(), evicted).evicted
    assert not observe(jobset(), ADMITTED).evicted
