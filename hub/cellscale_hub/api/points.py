"""A sweep's points: their status page by page (what changed since a stamp), each point's
outputs (opaque bytes with the job's signature) and each point's own log."""

from __future__ import annotations

import base64
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, Response
from sqlalchemy import select

from cellscale.spec import (
    MAX_RESULTS_PER_CALL,
    MAX_SAFE_INT,
    RESULT_TAG_HEADER,
    LogChunk,
    PointPage,
    PointResult,
    PointResults,
)
from cellscale.vocabulary import PointStatus
from cellscale_hub.api.context import Context, Ctx, Reader
from cellscale_hub.api.errors import refusals
from cellscale_hub.api.jobs import visible_job
from cellscale_hub.auth import Principal
from cellscale_hub.store.models import Job, SweepPoint
from cellscale_hub.store.points import point_view

Index = Annotated[int, PathParam(ge=0, le=MAX_SAFE_INT)]
MAX_POINT_LOG_BYTES = 4 * 2**20
RESULTS_BYTES = 32 * 2**20  # one bulk answer stops adding outputs past this


def outputs_file(ctx: Context, row: SweepPoint | None, source: Job | None):
    """(path, tag) of a point's outputs in the directory of the job that wrote them, or None."""
    driver = ctx.drivers.get(source.backend) if row is not None and source is not None else None
    if driver is None:
        return None
    return driver.files.point_result_file(ctx.jobs_root / source.id, row.result_point, row.result_array)


router = APIRouter()


def sweep_of(session, job_id: str, who: Principal) -> Job:
    job = visible_job(session, job_id, who)
    if not job.spec.sweep:
        raise HTTPException(404, f"job {job_id} is not a sweep: it has no points (see /api/jobs/{job_id}/result)")
    return job


@router.get("/jobs/{job_id}/points", response_model=PointPage, responses=refusals(401, 403, 404, 422))
def points(
    job_id: str,
    who: Reader,
    ctx: Ctx,
    since: Annotated[int, Query(ge=0, le=MAX_SAFE_INT)] = 0,
    status: PointStatus | None = None,
    offset: Annotated[int, Query(ge=0, le=MAX_SAFE_INT)] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> Response:
    """A sweep's points in index order, from `offset`: only those that changed after stamp
    `since` (pass a page's `stamp` next time), or only those with `status`."""
    with ctx.store.session() as session:
        sweep_of(session, job_id, who)
        query = select(SweepPoint).where(SweepPoint.job_id == job_id, SweepPoint.stamp > since)
        if status is not None:
            query = query.where(SweepPoint.status == status)
        rows = list(session.scalars(query.order_by(SweepPoint.index).offset(offset).limit(limit)))
        page = PointPage(items=[point_view(r) for r in rows], stamp=max((r.stamp for r in rows), default=since))
    return Response(page.model_dump_json(), media_type="application/json")


@router.get("/jobs/{job_id}/points/results", response_model=PointResults, responses=refusals(401, 403, 404, 422))
def point_results(
    job_id: str,
    who: Reader,
    ctx: Ctx,
    indices: Annotated[str, Query(max_length=MAX_RESULTS_PER_CALL * 8, pattern=r"^\d{1,9}(,\d{1,9})*$")],
) -> Response:
    """The outputs of several points (at most MAX_RESULTS_PER_CALL, about RESULTS_BYTES in
    all): each pickled by its task, base64, with its signature; those without outputs (yet)
    are `missing`, those past the size `later` (ask again)."""
    wanted = list(dict.fromkeys(int(i) for i in indices.split(",")))
    if len(wanted) > MAX_RESULTS_PER_CALL:
        raise HTTPException(422, f"ask for at most {MAX_RESULTS_PER_CALL} points at once")
    with ctx.store.session() as session:
        job = sweep_of(session, job_id, who)
        query = select(SweepPoint).where(SweepPoint.job_id == job_id, SweepPoint.index.in_(wanted))
        found = {r.index: r for r in session.scalars(query) if r.result_job}
        jobs = select(Job).where(Job.id.in_({r.result_job for r in found.values()}), Job.owner == job.owner)
        sources = {j.id: j for j in session.scalars(jobs)}
    items, missing, later, size = [], [], [], 0
    for index in wanted:
        row = found.get(index)
        file = outputs_file(ctx, row, sources.get(row.result_job) if row else None)
        if file is None or size >= RESULTS_BYTES:
            (missing if file is None else later).append(index)
            continue
        data = file[0].read_bytes()
        size += len(data)
        text = base64.b64encode(data).decode()
        items.append(PointResult(index=index, result_job=row.result_job, data=text, tag=file[1]))
    page = PointResults(items=items, missing=missing, later=later)
    return Response(page.model_dump_json(), media_type="application/json")


@router.get(
    "/jobs/{job_id}/points/{index}/result",
    responses={
        200: {
            "content": {"application/octet-stream": {}},
            "headers": {RESULT_TAG_HEADER: {"description": "HMAC-SHA256 under the key of PointView.result_job"}},
        },
        **refusals(401, 403, 404, 422, 503),
    },
)
def point_result(job_id: str, index: Index, who: Reader, ctx: Ctx) -> Response:
    """One point's outputs, pickled by its task, signed with the key of the job whose task
    wrote them (this sweep, or the earlier one a cached point comes from)."""
    with ctx.store.session() as session:
        job = sweep_of(session, job_id, who)
        row = session.get(SweepPoint, (job_id, index))
        source = session.get(Job, row.result_job) if row is not None and row.result_job else None
        if row is None or source is None or source.owner != job.owner:
            state = row.status.value if row is not None else "no such point"
            raise HTTPException(404, f"point {index} of {job_id} has no outputs ({state})")
        driver = ctx.drivers.get(source.backend)
        found = (
            driver.files.point_result_file(ctx.jobs_root / source.id, row.result_point, row.result_array)
            if driver
            else None
        )
    if found is None:
        raise HTTPException(404, f"the outputs of point {index} of {job_id} are gone from {source.id}'s directory")
    path, tag = found
    headers = {RESULT_TAG_HEADER: tag} if tag else None
    return FileResponse(path, media_type="application/octet-stream", headers=headers)


@router.get("/jobs/{job_id}/points/{index}/logs", response_model=LogChunk, responses=refusals(401, 403, 404, 422))
def point_logs(
    job_id: str,
    index: Index,
    who: Reader,
    ctx: Ctx,
    offset: Annotated[int, Query(ge=0, le=MAX_SAFE_INT)] = 0,
    max_bytes: Annotated[int, Query(ge=1, le=MAX_POINT_LOG_BYTES)] = 2**20,
) -> LogChunk:
    """One point's own log: what the cell printed on that point, every try."""
    with ctx.store.session() as session:
        job = sweep_of(session, job_id, who)
        row = session.get(SweepPoint, (job_id, index))
        if row is None:
            raise HTTPException(404, f"{job_id} has no point {index}")
        driver = ctx.drivers.get(job.backend)
        settled = job.phase.terminal
    if driver is None:
        raise HTTPException(503, f"backend {job.backend!r} is not configured on this control plane any more")
    data, size = driver.files.read_point_log(ctx.jobs_root / job_id, index, offset, max_bytes)
    end = offset + len(data)
    text = data.decode(errors="replace")
    return LogChunk(offset=offset, next_offset=end, text=text, complete=settled and end >= size)
