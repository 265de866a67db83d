"""From a stored job and attempt to the `AttemptRef` a driver works on (the controller
launches and polls with it; the API renders a job's script with it)."""

from __future__ import annotations

from pathlib import Path

from cellscale_hub.drivers import AttemptRef
from cellscale_hub.store.models import Attempt, Job


def attempt_ref(jobs_root: Path, job: Job, attempt: Attempt) -> AttemptRef:
    return AttemptRef(
        job_id=job.id,
        number=attempt.number,
        job_dir=jobs_root / job.id,
        spec=job.spec,
        gpu_ids=tuple(attempt.gpu_ids or ()),
        backend_ref=attempt.backend_ref,
        submitted_at=attempt.submitted_at,
        owner=job.owner,
        tenant=job.tenant,
        queue=job.queue,
        excluded_nodes=tuple(job.excluded_nodes or ()),
        result_key=job.result_key,
    )
