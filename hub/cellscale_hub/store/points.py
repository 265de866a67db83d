"""A sweep's points in the store: what the API and the controller read and write of them, apart
from the runner that runs them (control/sweeps.py, the controller's side):

- at submit, `create_points` stores one row per point and looks each up in the owner's
  result cache (same code, same point: its earlier result, nothing to run);
- when its attempt ends, `settle_points` cancels its unsettled points or queues them again;
- `counts` keeps the job's points by status in `jobs.sweep`, which `sweep_progress` reads back
  for the job's view, and `point_view` shows one point.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from cellscale.points import point_key
from cellscale.spec import JobSpec, PointView, SweepProgress
from cellscale.vocabulary import Fault, PointStatus
from cellscale_hub.store.models import Job, SweepPoint

CACHE_CHUNK = 500
"""Keys per cache lookup query (an IN list)."""

SETTLED = (PointStatus.done, PointStatus.failed, PointStatus.cached, PointStatus.cancelled)
CACHEABLE = (PointStatus.done, PointStatus.cached)
RETRIED = "retried"
"""The key of `jobs.sweep` that counts the points tried more than once."""


def stamp_now() -> int:
    return time.time_ns() // 1000


def counts(statuses: Iterable[PointStatus], retried: int = 0) -> dict[str, int]:
    found = Counter(statuses)
    return {status.value: found.get(status, 0) for status in PointStatus} | {RETRIED: retried}


def sweep_progress(job: Job) -> SweepProgress | None:
    """A sweep's points by status, as the controller keeps them in jobs.sweep (None: not a sweep)."""
    sweep = job.spec.sweep
    if sweep is None:
        return None
    kept = job.sweep or {}
    return SweepProgress(
        points=sweep.points,
        max_parallel=sweep.slots,
        **{status.value: kept.get(status.value, 0) for status in PointStatus},
        retried=kept.get(RETRIED, 0),
        arrays=kept.get("arrays", 0),
        eta_s=kept.get("eta_s"),
    )


def point_view(row: SweepPoint) -> PointView:
    return PointView(
        index=row.index,
        params=row.params,
        status=row.status,
        tries=row.tries,
        fault=Fault(row.faults[-1]) if row.faults and row.status is not PointStatus.done else None,
        node=row.node,
        wall_s=row.wall_s,
        error=row.error,
        traceback=row.traceback,
        result_job=row.result_job,
        stamp=row.stamp,
    )


# -- at submit ------------------------------------------------------------------------------------
def create_points(session: Session, job: Job, spec: JobSpec, points: list[dict]) -> int:
    """Store the sweep's points, each looked up in the owner's result cache (a point done
    before with the same code: its result, not run again); the number of points to run."""
    code = spec.code_key()
    keys = [point_key(code, p) for p in points]
    cached = _cached(session, job.owner, keys)
    stamp = stamp_now()
    rows = []
    for index, (params, key) in enumerate(zip(points, keys, strict=True)):
        hit = cached.get(key)
        rows.append(
            {
                "job_id": job.id,
                "index": index,
                "owner": job.owner,
                "key": key,
                "params": params,
                "status": PointStatus.cached if hit else PointStatus.queued,
                "tries": 0,
                "faults": [],
                "array": None,
                "node": hit.node if hit else None,
                "wall_s": hit.wall_s if hit else None,
                "error": None,
                "traceback": None,
                "result_job": hit.result_job if hit else None,
                "result_array": hit.result_array if hit else None,
                "result_point": hit.result_point if hit else None,
                "stamp": stamp,
            }
        )
    session.execute(insert(SweepPoint), rows)
    hits = sum(1 for key in keys if key in cached)
    job.sweep = counts([PointStatus.cached] * hits + [PointStatus.queued] * (len(points) - hits))
    return len(points) - hits


@dataclass(frozen=True)
class _Hit:
    result_job: str | None
    result_array: int | None
    result_point: int | None
    node: str | None
    wall_s: float | None


def _cached(session: Session, owner: str, keys: list[str]) -> dict[str, _Hit]:
    found: dict[str, _Hit] = {}
    unique = sorted(set(keys))
    for start in range(0, len(unique), CACHE_CHUNK):
        query = select(
            SweepPoint.key,
            SweepPoint.result_job,
            SweepPoint.result_array,
            SweepPoint.result_point,
            SweepPoint.node,
            SweepPoint.wall_s,
        ).where(
            SweepPoint.owner == owner,
            SweepPoint.key.in_(unique[start : start + CACHE_CHUNK]),
            SweepPoint.status.in_(CACHEABLE),
        )
        for key, job_id, array, point, node, wall in session.execute(query):
            found[key] = _Hit(job_id, array, point, node, wall)
    return found


# -- when its attempt ends --------------------------------------------------------------------------
def settle_points(session: Session, job: Job, cancelled: bool) -> None:
    """The sweep's attempt ended (or it was cancelled while it waited): its points still
    queued or running are cancelled (the job was) or queued again for its next attempt (it was
    preempted); its counts follow."""
    target = PointStatus.cancelled if cancelled else PointStatus.queued
    session.execute(
        update(SweepPoint)
        .where(SweepPoint.job_id == job.id, SweepPoint.status.not_in(SETTLED))
        .values(status=target, array=None, stamp=stamp_now())
    )
    statuses = list(session.scalars(select(SweepPoint.status).where(SweepPoint.job_id == job.id)))
    job.sweep = (job.sweep or {}) | counts(statuses, (job.sweep or {}).get(RETRIED, 0)) | {"eta_s": None}
