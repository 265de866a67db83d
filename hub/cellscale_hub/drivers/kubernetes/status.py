"""What Kueue's Workload and the JobSet's or RayJob's status say about one attempt, in
cellscale's terms: a state and, while it waits, why in words (Kueue's own message included,
so a job Kueue holds never waits silently).

Pure functions over the objects as the API returns them (dicts); the driver adds what the job
directory says (whether the ranks started, the exit records' fault class).
"""

from __future__ import annotations

from dataclasses import dataclass

from cellscale.vocabulary import AttemptState

# Kueue's Workload condition types and reasons (kueue.x-k8s.io/v1beta2)
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
PODS_READY = "PodsReady"
INADMISSIBLE = "Inadmissible"  # QuotaReserved False: the LocalQueue or ClusterQueue cannot admit it
PENDING = "Pending"  # QuotaReserved False: it waits for quota (couldn't assign flavors ...)

# RayJob status.jobDeploymentStatus values (ray.io/v1) that mean it ended
RAY_COMPLETE = "Complete"
RAY_FAILED = {"Failed", "ValidationFailed"}


@dataclass(frozen=True)
class KubeView:
    """An attempt's state as its objects say. `started` is filled in by the caller from the job
    directory: whether the supervisors took the attempt (a Kueue eviction then ends it)."""

    state: AttemptState
    reason: str | None = None
    evicted: bool = False  # Kueue evicted it (its pods are gone): see `observe`


def condition(obj: dict | None, kind: str) -> dict | None:
    """The object's status condition of this type, if it has one."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def is_true(obj: dict | None, kind: str) -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def kueue_words(workload: dict | None, kind: str) -> tuple[AttemptState, str] | None:
    """Why Kueue holds the attempt (None: it does not, it was admitted or finished).

    - no Workload yet: Kueue has not seen the JobSet or RayJob (Kueue's webhook and job
      controller create one per job at once: a long wait here means Kueue is not running);
    - QuotaReserved False, reason Inadmissible: it can never be admitted as things are
      (LocalQueue missing or stopped, ClusterQueue inactive); Kueue's message says which;
    - QuotaReserved False, reason Pending: it waits for quota (Kueue's message names the
      resource, the flavor and how much more is needed);
    - QuotaReserved True, Admitted False: quota reserved, admission checks pending;
    - Evicted True (and not re-admitted): Kueue took its quota back (preempted, PodsReady
      timeout, a stopped queue) and requeued it.
    """
    if workload is None:
        return AttemptState.STARTING, f"waiting for Kueue to queue the {kind} (no Workload yet)"
    if is_true(workload, FINISHED):
        return None
    evicted = condition(workload, EVICTED)
    if evicted is not None and evicted.get("status") == "True" and not is_true(workload, ADMITTED):
        return AttemptState.STARTING, (
            f"evicted by Kueue ({evicted.get('reason') or 'Evicted'}): {evicted.get('message') or ''}; "
            "Kueue queues it again"
        ).replace(": ;", ";")
    if is_true(workload, ADMITTED):
        return None
    reserved = condition(workload, QUOTA_RESERVED)
    if reserved is not None and reserved.get("status") == "True":
        checks = ", ".join(
            f"{check.get('name')} {str(check.get('state', '')).lower()}"
            for check in (workload.get("status") or {}).get("admissionChecks") or []
            if check.get("state") != "Ready"
        )
        cq = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue") or "its ClusterQueue"
        return AttemptState.STARTING, f"Kueue reserved quota in {cq}; waiting for admission checks" + (
            f" ({checks})" if checks else ""
        )
    if reserved is not None and reserved.get("reason") == INADMISSIBLE:
        return AttemptState.STARTING, f"Kueue cannot admit it (inadmissible): {reserved.get('message') or ''}".rstrip(
            ": "
        )
    if reserved is not None and reserved.get("message"):
        return AttemptState.STARTING, f"Kueue queues it: {reserved['message']}"
    return AttemptState.STARTING, "queued in Kueue (not yet considered for admission)"


def jobset_end(jobset: dict) -> tuple[AttemptState, str] | None:
    """(SUCCEEDED or FAILED, JobSet's words) once the JobSet's Completed or Failed condition is True."""
    if is_true(jobset, "Completed"):
        return AttemptState.SUCCEEDED, "every node's Job completed"
    failed = condition(jobset, "Failed")
    if failed is not None and failed.get("status") == "True":
        words = failed.get("message") or failed.get("reason") or "failed"
        return AttemptState.FAILED, f"JobSet failed: {words}"
    return None


def rayjob_end(rayjob: dict) -> tuple[AttemptState, str] | None:
    """(SUCCEEDED or FAILED, KubeRay's words) once the RayJob's deployment ended."""
    status = rayjob.get("status") or {}
    deployment, job = status.get("jobDeploymentStatus"), status.get("jobStatus")
    if deployment == RAY_COMPLETE and job == "SUCCEEDED":
        return AttemptState.SUCCEEDED, "the Ray job succeeded"
    if deployment in RAY_FAILED or (deployment == RAY_COMPLETE and job in ("FAILED", "STOPPED")):
        words = status.get("message") or status.get("reason") or f"Ray job {str(job).lower()}"
        return AttemptState.FAILED, f"RayJob failed: {words}"
    return None


def observe(obj: dict, workload: dict | None) -> KubeView:
    """The attempt's state from its JobSet or RayJob and Kueue's Workload of it (the caller
    handles an object that is absent). RUNNING is not decided here: an admitted attempt is
    STARTING until the job directory shows its ranks started."""
    kind = obj.get("kind", "JobSet")
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return KubeView(AttemptState.CANCELLED, f"its {kind} is being deleted")
    ended = rayjob_end(obj) if kind == "RayJob" else jobset_end(obj)
    if ended is not None:
        return KubeView(*ended)
    held = kueue_words(workload, kind)
    if held is not None:
        evicted = is_true(workload, EVICTED)
        return KubeView(held[0], held[1], evicted=evicted)
    if (obj.get("spec") or {}).get("suspend"):
        cq = ((workload or {}).get("status") or {}).get("admission", {}).get("clusterQueue")
        return KubeView(AttemptState.STARTING, f"admitted by Kueue to {cq or 'its ClusterQueue'}; {kind} resuming")
    cq = (((workload or {}).get("status") or {}).get("admission") or {}).get("clusterQueue")
    where = f" to {cq}" if cq else ""
    return KubeView(AttemptState.STARTING, f"admitted by Kueue{where}; its pods are starting")
