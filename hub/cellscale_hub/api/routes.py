"""Routes. Authorization rule: a user sees their tenants' jobs and changes only their own
(hub admins see and change all); any other job is reported as not found."""

from __future__ import annotations

import asyncio
import re
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel

from cellscale.points import GridError, read_manifest
from cellscale.spec import (
    MAX_INPUTS_BYTES,
    MAX_SAFE_INT,
    RESULT_TAG_HEADER,
    BackendView,
    BundleRef,
    BundleShare,
    CheckpointView,
    CostEstimate,
    EventView,
    JobLimits,
    JobPage,
    JobSpec,
    JobView,
    LogChunk,
    QueueUsage,
    RenderView,
    SubmitRequest,
    WhoAmI,
    exec_refusal,
)
from cellscale.vocabulary import EventKind, EventReason, Phase
from cellscale_hub.api import admin, cost, logs, oauth, points
from cellscale_hub.api.context import Context, context, require
from cellscale_hub.api.edge import DEFAULT_MAX_BODY_BYTES, InputEdge
from cellscale_hub.api.errors import install_error_handlers, refusals
from cellscale_hub.auth import SCOPE_READ, SCOPE_SUBMIT, Principal
from cellscale_hub.bundles import BundleRefused
from cellscale_hub.drivers import AttemptRef, Driver
from cellscale_hub.routing import NoTenant, Placement, Refused, job_limits, place
from cellscale_hub.refs import attempt_ref
from cellscale_hub.store import jobs as q
from cellscale_hub.store import usage
from cellscale_hub.store.jobs import IdempotencyConflict
from cellscale_hub.store.models import Job, utcnow
from cellscale_hub.store.points import create_points, settle_points
from cellscale_hub.cost import costs

Reader = Annotated[Principal, Depends(require(SCOPE_READ))]
Submitter = Annotated[Principal, Depends(require(SCOPE_SUBMIT))]
Ctx = Annotated[Context, Depends(context)]

JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
"""What a job id can look like; anything else is not looked up."""


def build_app(ctx: Context, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The API, behind the input edge (api/edge.py): JSON bodies up to `max_body_bytes`, an
    inputs bundle up to MAX_INPUTS_BYTES."""
    prefix = ctx.prefix.rstrip("/")
    app = FastAPI(
        title="cellscale control plane",
        version="1",
        openapi_url=f"{prefix}/api/openapi.json",
        docs_url=f"{prefix}/api/docs",
        redoc_url=None,
    )
    install_error_handlers(app)
    bundles = f"{prefix}/api/bundles"
    too_large = f"inputs are larger than {MAX_INPUTS_BYTES // 2**20} MiB; ship big data by URL"
    app.add_middleware(InputEdge, max_body_bytes=max_body_bytes, raw={bundles: (MAX_INPUTS_BYTES, too_large)})
    app.state.ctx = ctx
    router = APIRouter(prefix=f"{prefix}/api")
    _job_routes(router)
    admin.routes(router)
    cost.routes(router)
    points.routes(router, visible_job)
    app.include_router(router)
    app.include_router(admin.page(prefix))
    app.include_router(oauth.router(prefix))
    return app


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


def _job_routes(router: APIRouter) -> None:
    @router.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @router.get("/whoami", response_model=WhoAmI, responses=refusals(401, 403))
    def whoami(who: Reader, ctx: Ctx) -> WhoAmI:
        queues = sorted(ctx.tenancy.current.tenants[who.tenant].queues) if who.tenant else []
        return WhoAmI(user=who.user, tenant=who.tenant, tenants=list(who.tenants), queues=queues, admin=who.admin)

    @router.get("/quota", response_model=list[QueueUsage], responses=refusals(401, 403))
    def desk_quota(who: Reader, ctx: Ctx) -> list[QueueUsage]:
        """The quota of the cluster queues your desks submit to: used, borrowed, waiting; on the
        flavors whose backend this control plane runs (a tenancy's Slurm quota is not listed where
        no Slurm backend is configured)."""
        tenancy = ctx.tenancy.current
        mine = {local.cluster_queue for t in who.tenants for local in tenancy.tenants[t].queues.values()}
        with ctx.store.session() as session:
            return usage.queue_usage(
                session, tenancy, utcnow(), ctx.settings.fair_share_half_life_s, only=mine, backends=set(ctx.drivers)
            )

    @router.get("/limits", response_model=JobLimits, responses=refusals(401, 403, 422))
    def limits(
        who: Reader,
        ctx: Ctx,
        queue: Annotated[str | None, Query(max_length=128)] = None,
        backend: Annotated[str | None, Query(max_length=128)] = None,
    ) -> JobLimits:
        """The most one job of your queue (on that backend) can ever get: what a flag above it is refused with."""
        try:
            return job_limits(ctx.tenancy.current, ctx.drivers, who, queue, backend)
        except NoTenant as exc:
            raise HTTPException(403, str(exc)) from exc
        except Refused as exc:
            raise HTTPException(422, str(exc)) from exc

    @router.get("/backends", response_model=list[BackendView], responses=refusals(401, 403))
    def backends(who: Reader, ctx: Ctx) -> list[BackendView]:
        return [driver.capacity() for driver in ctx.drivers.values()]

    @router.post("/bundles", response_model=BundleRef, status_code=201, responses=refusals(401, 403, 413))
    async def upload_bundle(request: Request, who: Submitter, ctx: Ctx) -> BundleRef:
        """Store a job's pickled inputs, content-addressed, for you alone (share one with
        POST /bundles/{sha256}/share). The bytes are never unpickled here."""
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_INPUTS_BYTES:
                raise HTTPException(
                    413, f"inputs are larger than {MAX_INPUTS_BYTES // 2**20} MiB; ship big data by URL"
                )
        try:
            stored = await asyncio.to_thread(ctx.bundles.put, who.user, bytes(data))
        except BundleRefused as exc:
            raise HTTPException(413, str(exc)) from exc
        return BundleRef(sha256=stored.sha256, size=stored.size)

    @router.post("/bundles/{sha256}/share", status_code=204, responses=refusals(401, 403, 404, 422))
    def share_bundle(sha256: str, body: BundleShare, who: Submitter, ctx: Ctx) -> Response:
        """Let another user's jobs use one of your input bundles (by its hash)."""
        try:
            ctx.bundles.share(who.user, sha256, body.user)
        except BundleRefused as exc:
            raise HTTPException(404, str(exc)) from exc
        return Response(status_code=204)

    @router.get(
        "/bundles/{sha256}",
        responses={200: {"content": {"application/octet-stream": {}}}, **refusals(401, 403, 404, 422)},
    )
    def download_bundle(sha256: str, who: Reader, ctx: Ctx) -> Response:
        """One of your input bundles (uploaded by you or shared with you), the bytes as uploaded:
        what `%cluster promote` saves beside the asset it writes. Never unpickled here."""
        path = ctx.bundles.path(who.user, sha256)
        if path is None:
            raise HTTPException(
                404,
                f"you have no input bundle {sha256} (neither uploaded by you nor shared with you; one no waiting "
                f"or running job uses is removed after {ctx.bundles.grace_s / 3600:g} h)",
            )
        return FileResponse(path, media_type="application/octet-stream")

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
        where = _placement(ctx, who, body.spec)
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
            view = q.job_view(job, ctx.waiting.view(job.id, who.user), ctx.tenancy.current.resource_weights)
        ctx.wake()
        return JSONResponse(view.model_dump(mode="json"), status_code=201 if created else 200)

    @router.post("/render", response_model=RenderView, responses=refusals(401, 403, 413, 422))
    def render(body: SubmitRequest, who: Submitter, ctx: Ctx) -> RenderView:
        """The dry run: the exact script the backend would run, without submitting."""
        where = _placement(ctx, who, body.spec)
        driver, spec = ctx.drivers[where.backend], where.spec
        gpus = tuple(range(spec.resources.gpus_per_node)) if driver.assigns_gpu_ids else ()
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
            _driver(ctx, backend).checkpoints(ctx.jobs_root / job_id, numbers),
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
            found = _driver(ctx, job.backend).result_file(ctx.jobs_root / job_id) if job.result_available else None
            if found is None:
                raise HTTPException(
                    404, f"job {job_id} has no result ({job.phase.lower()}; outputs: {job.spec.outputs})"
                )
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


def _placement(ctx: Context, who: Principal, spec: JobSpec) -> Placement:
    """Where the job goes (placement.place), its refusals as HTTP errors; an --env the OS would
    not start the job's processes with (E2BIG) is refused here, not found out by a failed attempt."""
    try:
        where = place(ctx.tenancy.current, ctx.drivers, who, spec)
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


def _estimate(session, ctx: Context, who: Principal, where: Placement) -> CostEstimate:
    """What the job would cost on its queue's first flavor there (dollars against its desk's budget)."""
    tenancy = ctx.tenancy.current
    flavors = tenancy.flavors_for(where.cluster_queue, where.backend) or tenancy.flavors_for(where.cluster_queue)
    spend = usage.budget_spend(session, tenancy, utcnow(), only={where.tenant}).get(where.tenant)
    spec = where.spec
    return costs.estimate(
        session, tenancy, who.user, spec, spec.demand.gpus, flavors[0] if flavors else None, spend, where.tenant
    )
