"""Jobs: submit (or a dry run's render), list, look at one (events, logs, checkpoints, its
result, the script it ran) and cancel. Authorization rule: a user sees their tenants' jobs
and changes only their own (hub admins see and change all); any other job is reported as
not found."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Response
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel

from cellscale.points import GridError, read_manifest
from cellscale.spec import (
    MAX_SAFE_INT,
    RESULT_TAG_HEADER,
    CheckpointView,
    CostEstimate,
    EventView,
    JobPage,
    JobSpec,
    JobView,
    LogChunk,
    RenderView,
    SubmitRequest,
    exec_refusal,
)
from cellscale.vocabulary import EventKind, EventReason, Phase
from cellscale_hub.api import logs
from cellscale_hub.api.context import Context, Ctx, Reader, Submitter
from cellscale_hub.api.errors import refusals
from cellscale_hub.auth import Principal
from cellscale_hub.cost import costs
from cellscale_hub.drivers import AttemptRef, Driver
from cellscale_hub.drivers.capabilities import AssignsGpuIds
from cellscale_hub.refs import attempt_ref
from cellscale_hub.routing import NoTenant, Refused, Route, route
from cellscale_hub.store import jobs as q
from cellscale_hub.store import usage
from cellscale_hub.store.jobs import IdempotencyConflict
from cellscale_hub.store.models import Job, utcnow
from cellscale_hub.store.points import create_points, settle_points

JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
"""What a job id can look like; anything else is not looked up."""

router = APIRouter()


def _json(view: BaseModel) -> Response:
    """A view built and validated here, serialised once: FastAPI would validate it again
    against the route's response model (a third of a job list's time), which stays in the
    route for its schema."""
    return Response(view.model_dump_json(), media_type="application/json")


def visible_job(session, job_id: str, who: Principal) -> Job:
    job = session.get(Job, job_id) if JOB_ID.match(job_id) else None
    if job is None or not (who.admin or job.owner == who.user or job.tenant in who.tenants):
        raise HTTPException(404, f"no job {job_id} visible to you")
    return job


def owned_job(session, job_id: str, who: Principal) -> Job:
    job = visible_job(session, job_id, who)
    if not (who.admin or job.owner == who.user):
        raise HTTPException(403, f"job {job_id} belongs to {job.owner}; only its owner or an admin may change it")
    return job


@router.post(
    "/jobs",
    response_model=JobView,
    status_code=201,
    responses={
        200: {"model": JobView, "description": "an earlier submit with the same key"},
        **refusals(401, 403, 409, 413, 422),
    },
)
def submit(
    body: SubmitRequest,
    who: Submitter,
    ctx: Ctx,
    idempotency_key: Annotated[str | None, Header(max_length=128)] = None,
):
    where = _route(ctx, who, body.spec)
    spec = where.spec
    if spec.inputs_sha256 and ctx.bundles.path(who.user, spec.inputs_sha256) is None:
        raise HTTPException(
            422,
            f"inputs bundle {spec.inputs_sha256} was not uploaded by you (nor shared with you); "
            "POST it to /api/bundles first",
        )
    grid = _points(ctx, who, spec) if spec.sweep else None
    demand = spec.demand  # a sweep holds its slots at once
    job = Job(
        id=ctx.new_job_id(),
        idempotency_key=idempotency_key or ctx.new_job_id(),
        owner=who.user,
        tenant=where.tenant,
        queue=where.queue,
        cluster_queue=where.cluster_queue,
        backend=where.backend,
        placement=where.stored(),
        priority=where.priority,
        name=spec.name,
        spec=spec,
        inputs_sha256=spec.inputs_sha256,
        gpus=demand.gpus,
        cpus=demand.cpus,
        memory_mb=demand.memory_mb,
        phase=Phase.PENDING,
        reason=f"waiting for admission; {where.note}" if where.note else "waiting for admission",
        result_key=body.result_key,
        attempts=[],  # known to be none: the view does not ask the store
    )
    with ctx.store.session() as session:
        job.estimate = _estimate(session, ctx, who, where).model_dump(mode="json")
        try:
            job, created = q.insert_job(session, job)
        except IdempotencyConflict as exc:
            raise HTTPException(409, str(exc)) from exc
        if created and grid is not None and not create_points(session, job, spec, grid):
            job.result_available = bool(spec.outputs)
            q.transition(
                session,
                job,
                Phase.SUCCEEDED,
                EventReason.Finished,
                message=f"all {len(grid)} points' results are cached from earlier runs of this code: nothing ran",
            )
    ctx.wake()
    # viewed once committed: on SQLite the transaction holds the write lock the other submits wait for.
    # A new job has no reason yet (no cycle has seen it): asking would index the published lines
    pending = None if created else ctx.waiting.view(job.id, who.user)
    view = q.job_view(job, pending, ctx.tenancy.current.resource_weights)
    return Response(view.model_dump_json(), status_code=201 if created else 200, media_type="application/json")


@router.post("/render", response_model=RenderView, responses=refusals(401, 403, 413, 422))
def render(body: SubmitRequest, who: Submitter, ctx: Ctx) -> RenderView:
    """The dry run: the exact script the backend would run, without submitting."""
    where = _route(ctx, who, body.spec)
    driver, spec = ctx.drivers[where.backend], where.spec
    gpus = tuple(range(spec.resources.gpus_per_node)) if isinstance(driver, AssignsGpuIds) else ()
    ref = AttemptRef(
        job_id="cs-dryrun",
        number=1,
        job_dir=ctx.jobs_root / "cs-dryrun",
        spec=spec,
        gpu_ids=gpus,
        owner=who.user,
        tenant=where.tenant,
        queue=where.queue,
    )
    with ctx.store.session() as session:
        estimate = _estimate(session, ctx, who, where)
    return RenderView(backend=driver.name, script=driver.render(ref), estimate=estimate)


@router.get("/jobs", response_model=JobPage, responses=refusals(400, 401, 403, 422))
def list_jobs(
    who: Reader,
    ctx: Ctx,
    scope: Annotated[str, Query(pattern="^(mine|tenant|all)$")] = "mine",
    phase: Phase | None = None,
    name: Annotated[str | None, Query(max_length=200, pattern=r"^[^\x00-\x1f]*$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    key: Annotated[
        str | None,
        Query(max_length=128, description="Only the job you submitted with this Idempotency-Key (scope=mine)."),
    ] = None,
) -> Response:
    if key is not None and scope != "mine":
        raise HTTPException(400, "key= finds one of your own jobs: use it with scope=mine")
    if scope == "all" and not who.admin:
        raise HTTPException(403, "scope=all is for admins; use scope=mine or scope=tenant")
    owners = [who.user] if scope == "mine" else None
    tenants = list(who.tenants) if scope == "tenant" else None
    with ctx.store.session() as session:
        try:
            rows, next_cursor = q.list_jobs(
                session,
                owners=owners,
                tenants=tenants,
                phase=phase,
                name=name,
                limit=limit,
                cursor=cursor,
                key=key,
            )
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc
        weights = ctx.tenancy.current.resource_weights
        items = [q.job_view(job, ctx.waiting.view(job.id, who.user), weights) for job in rows]
        page = JobPage(items=items, next_cursor=next_cursor)
    return _json(page)


@router.get("/jobs/{job_id}", response_model=JobView, responses=refusals(401, 403, 404, 422))
def get_job(job_id: str, who: Reader, ctx: Ctx) -> Response:
    with ctx.store.session() as session:
        job = visible_job(session, job_id, who)
        return _json(q.job_view(job, ctx.waiting.view(job.id, who.user), ctx.tenancy.current.resource_weights))


@router.post("/jobs/{job_id}/cancel", response_model=JobView, responses=refusals(401, 403, 404, 422))
def cancel(job_id: str, who: Submitter, ctx: Ctx) -> JobView:
    with ctx.store.session() as session:
        job = owned_job(session, job_id, who)
        if not job.phase.terminal and not job.cancel_requested:
            job.cancel_requested = True
            q.add_event(session, job, kind=EventKind.CANCEL, reason=EventReason.CancelRequested, actor=who.user)
            if job.phase is Phase.PENDING:
                if job.spec.sweep:
                    settle_points(session, job, cancelled=True)
                q.transition(
                    session,
                    job,
                    Phase.CANCELLED,
                    EventReason.Cancelled,
                    actor=who.user,
                    message="cancelled before it was admitted",
                )
        view = q.job_view(job, ctx.waiting.view(job.id, who.user), ctx.tenancy.current.resource_weights)
    ctx.wake()
    return view


@router.get("/jobs/{job_id}/events", response_model=list[EventView], responses=refusals(401, 403, 404, 422))
def events(
    job_id: str, who: Reader, ctx: Ctx, after: Annotated[int, Query(ge=0, le=MAX_SAFE_INT)] = 0
) -> list[EventView]:
    with ctx.store.session() as session:
        visible_job(session, job_id, who)
        return [q.event_view(e) for e in q.events_of(session, job_id, after)]


@router.get(
    "/jobs/{job_id}/logs",
    response_model=LogChunk,
    responses={200: {"content": {"text/event-stream": {}}}, **refusals(401, 403, 404, 422, 503)},
)
def job_logs(
    job_id: str,
    who: Reader,
    ctx: Ctx,
    offset: Annotated[int, Query(ge=0, le=MAX_SAFE_INT)] = 0,
    follow: bool = False,
    max_bytes: Annotated[int, Query(ge=1, le=4 * 2**20)] = 2**20,
    last_event_id: Annotated[int | None, Header(ge=0, le=MAX_SAFE_INT)] = None,
):
    """The combined rank-prefixed log from a byte offset. `follow=true` streams server-sent
    events (each with its next offset as id; reconnect with Last-Event-ID to resume)."""
    with ctx.store.session() as session:
        driver = _driver(ctx, visible_job(session, job_id, who).backend)
    if not follow:
        return logs.read_chunk(ctx, driver, job_id, offset, max_bytes)
    return StreamingResponse(
        logs.follow(ctx, driver, job_id, offset if last_event_id is None else last_event_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get(
    "/jobs/{job_id}/checkpoints", response_model=list[CheckpointView], responses=refusals(401, 403, 404, 422, 503)
)
def checkpoints(job_id: str, who: Reader, ctx: Ctx) -> list[CheckpointView]:
    """Checkpoints the job committed, newest first, across its attempts."""
    with ctx.store.session() as session:
        job = visible_job(session, job_id, who)
        backend, numbers = job.backend, [a.number for a in job.attempts]
    return sorted(
        _driver(ctx, backend).files.checkpoints(ctx.jobs_root / job_id, numbers),
        key=lambda c: (c.committed_at, c.step),
        reverse=True,
    )


@router.get(
    "/jobs/{job_id}/result",
    responses={
        200: {
            "content": {"application/octet-stream": {}},
            "headers": {RESULT_TAG_HEADER: {"description": "HMAC-SHA256 of the bytes under the job's result key"}},
        },
        **refusals(401, 403, 404, 422, 503),
    },
)
def result(job_id: str, who: Reader, ctx: Ctx) -> Response:
    """Rank 0's outputs, pickled by the job, with the job's signature of them. Returned as
    bytes; only the submitting kernel, which holds the key, checks and unpickles them."""
    with ctx.store.session() as session:
        job = visible_job(session, job_id, who)
        files = _driver(ctx, job.backend).files
        found = files.result_file(ctx.jobs_root / job_id) if job.result_available else None
        if found is None:
            raise HTTPException(404, f"job {job_id} has no result ({job.phase.lower()}; outputs: {job.spec.outputs})")
    path, tag = found
    headers = {RESULT_TAG_HEADER: tag} if tag else None
    return FileResponse(path, media_type="application/octet-stream", headers=headers)


@router.get("/jobs/{job_id}/render", response_model=RenderView, responses=refusals(401, 403, 404, 409, 422, 503))
def render_job(job_id: str, who: Reader, ctx: Ctx) -> RenderView:
    with ctx.store.session() as session:
        job = visible_job(session, job_id, who)
        attempt = job.attempts[-1] if job.attempts else None
        ref = attempt_ref(ctx.jobs_root, job, attempt) if attempt else None
    driver = _driver(ctx, job.backend)
    if ref is None:
        raise HTTPException(409, f"job {job_id} has no attempt yet; POST /api/render for a dry run")
    return RenderView(backend=driver.name, script=driver.render(ref))


def _driver(ctx: Context, backend: str) -> Driver:
    """The driver of a stored job's backend (it alone reads the job's files)."""
    if backend not in ctx.drivers:
        raise HTTPException(
            503,
            f"backend {backend!r} is not configured on this control plane any more; "
            f"backends: {', '.join(sorted(ctx.drivers))}",
        )
    return ctx.drivers[backend]


def _route(ctx: Context, who: Principal, spec: JobSpec) -> Route:
    """Where the job goes (placement.place), its refusals as HTTP errors; an --env the OS would
    not start the job's processes with (E2BIG) is refused here, not found out by a failed attempt."""
    try:
        where = route(ctx.tenancy.current, ctx.drivers, who, spec)
    except NoTenant as exc:
        raise HTTPException(403, str(exc)) from exc
    except Refused as exc:
        raise HTTPException(422, str(exc)) from exc
    refusal = exec_refusal(where.spec.env)
    if refusal:
        raise HTTPException(422, refusal)
    return where


def _points(ctx: Context, who: Principal, spec: JobSpec) -> list[dict]:
    """The sweep's points from its uploaded manifest (JSON, checked as the kernel makes it)."""
    path = ctx.bundles.path(who.user, spec.sweep.points_sha256)
    if path is None:
        raise HTTPException(
            422, f"points manifest {spec.sweep.points_sha256} was not uploaded by you; POST it to /api/bundles first"
        )
    try:
        grid = read_manifest(path.read_bytes())
    except GridError as exc:
        raise HTTPException(422, str(exc)) from exc
    if len(grid) != spec.sweep.points:
        raise HTTPException(422, f"the sweep says {spec.sweep.points} points; its manifest has {len(grid)}")
    return grid


def _estimate(session, ctx: Context, who: Principal, where: Route) -> CostEstimate:
    """What the job would cost on its queue's first flavor there (dollars against its desk's budget)."""
    tenancy = ctx.tenancy.current
    flavors = tenancy.flavors_for(where.cluster_queue, where.backend) or tenancy.flavors_for(where.cluster_queue)
    spend = usage.budget_spend(session, tenancy, utcnow(), only={where.tenant}).get(where.tenant)
    spec = where.spec
    return costs.estimate(
        session, tenancy, who.user, spec, spec.demand.gpus, flavors[0] if flavors else None, spend, where.tenant
    )
