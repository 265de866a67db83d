"""The admin API and page: the tenancy tree, quotas against use, pending pressure, and the
audit log; quota and weight edits, validated as a whole. Hub admins only."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel, Field, ValidationError

from cellscale.spec import QueueUsage
from cellscale.vocabulary import BurstPolicy, Resource
from cellscale_hub.api.context import Context, Ctx, presented_token, principal
from cellscale_hub.api.csrf import csrf_token
from cellscale_hub.api.errors import refusals
from cellscale_hub.auth import Principal, Unauthenticated
from cellscale_hub.drivers import flavor_capacities
from cellscale_hub.scheduling.resources import UNLIMITED
from cellscale_hub.scheduling.usage import QuotaBook
from cellscale_hub.store import usage
from cellscale_hub.store.models import utcnow
from cellscale_hub.tenancy import SHORT_WORK_SHARE, Budget, Quota, Tenancy

STATIC = Path(__file__).with_name("static")
NODE_FAULT_FLAG = 2  # faults within the window that flag a node to admins


def require_admin(who: Principal = Depends(principal)) -> Principal:
    if not who.admin:
        raise HTTPException(403, "quotas and tenants are for hub admins")
    return who


Admin = Annotated[Principal, Depends(require_admin)]


class FlavorCapacity(BaseModel):
    flavor: str
    backend: str
    cpu_only: bool = Field(False, description="A CPU node pool (the tenancy's flavors.NAME.cpu_only).")
    capacity_gpus: int = Field(description="Physical GPUs of its backend now (0: the backend is not configured).")
    nominal_total: int = Field(description="Sum of the nominal quotas on this flavor.")
    capacity_cpus: int | None = Field(None, description="CPU cores of its backend now (None: it does not count them).")
    capacity_memory_mb: int | None = Field(None, description="Memory of its backend now, MiB (None: not counted).")
    cpu_nominal_total: int | None = Field(None, description="Sum of the CPU quotas on this flavor (None: none).")
    memory_mb_nominal_total: int | None = Field(None, description="Sum of the memory quotas, MiB (None: none).")
    gpu_hours: float = Field(0.0, description="GPU-hours held on it so far, every desk's (the cost ledger).")


class ShortWorkView(BaseModel):
    """A cohort tree's short-work share on one flavor: what level-0 work of any of its desks may
    use beyond its desk's quota, and what it lends now."""

    cohort: str = Field(description="The tree's root cohort (it sets short_work_share).")
    flavor: str
    share: float = Field(description="Its short_work_share: the fraction of the tree's nominal GPUs here.")
    gpus: int = Field(description="The GPUs that fraction comes to.")
    lent: int = Field(description="GPUs lent now to jobs still at level 0 (they are not reclaimed).")
    jobs: list[str] = Field(description="Those jobs.")
    lender_wait_max_s: float = Field(
        0.0,
        description="The longest a job within its desk's quota waited while the share lent GPUs in its way, "
        "since this control plane started.",
    )


class ShortShareUpdate(BaseModel):
    short_work_share: float = Field(ge=0, le=1)


class TenancyView(BaseModel):
    tenancy: dict[str, Any] = Field(
        description="The document in force: flavors, cohorts, cluster_queues, tenants, "
        "priority_classes (the shape of config/tenants.yaml)."
    )
    flavors: list[FlavorCapacity]
    usage: list[QueueUsage]
    short_work: list[ShortWorkView] = Field(description="Each cohort tree's short-work share, per flavor.")
    fair_share_half_life_s: float
    preemption_grace_s: float


class QuotaUpdate(Quota):
    """The whole new quota of one cluster queue on one flavor: GPUs, and `cpu` and `memory`
    where they are quota'd (a part left out is no longer quota'd)."""


class CloudUpdate(BaseModel):
    """A desk's cloud policy: whether its jobs may burst by default, and its budget (null: none)."""

    burst: BurstPolicy
    budget: Budget | None = None


class WeightUpdate(BaseModel):
    weight: float = Field(gt=0, le=1000)


class NodeFaults(BaseModel):
    node: str
    faults: int = Field(description="Infrastructure faults of jobs that blamed this node.")
    jobs: list[str]
    last_at: datetime
    flagged: bool = Field(description="At or above the threshold: an admin should look at it.")


class AuditView(BaseModel):
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    before: dict | None
    after: dict | None
    revision: int | None


router = APIRouter()


@router.get("/admin/tenancy", response_model=TenancyView, responses=refusals(401, 403))
def tenancy_view(who: Admin, ctx: Ctx) -> TenancyView:
    t = ctx.tenancy.current
    with ctx.store.session() as session:
        queues = usage.queue_usage(  # quotas on the flavors this deployment runs (the Flavors list says the rest)
            session, t, utcnow(), ctx.settings.fair_share_half_life_s, backends=set(ctx.drivers)
        )
        hours = usage.flavor_gpu_hours(session)
        lent = usage.short_share_loans(session, t, utcnow())
    return TenancyView(
        tenancy=t.model_dump(mode="json"),
        flavors=_capacities(ctx, t, hours),
        usage=queues,
        short_work=_short_work(ctx, t, lent),
        fair_share_half_life_s=ctx.settings.fair_share_half_life_s,
        preemption_grace_s=ctx.settings.preemption_grace_s,
    )


@router.put(
    "/admin/cluster-queues/{name}/quotas/{flavor}",
    response_model=TenancyView,
    responses=refusals(401, 403, 404, 413, 422),
)
def set_quota(name: str, flavor: str, body: QuotaUpdate, who: Admin, ctx: Ctx) -> TenancyView:
    def edit(doc: dict):
        queue = _lookup(doc["cluster_queues"], name, "cluster queue")
        if flavor not in doc["flavors"]:
            raise HTTPException(404, f"no flavor {flavor!r}; flavors: {', '.join(sorted(doc['flavors']))}")
        before = queue["quotas"].get(flavor)
        queue["quotas"][flavor] = body.model_dump()
        return before, queue["quotas"][flavor]

    _change(ctx, who, "set-quota", f"cluster_queues/{name}/quotas/{flavor}", edit)
    return tenancy_view(who, ctx)


@router.put(
    "/admin/cluster-queues/{name}/weight", response_model=TenancyView, responses=refusals(401, 403, 404, 413, 422)
)
def set_queue_weight(name: str, body: WeightUpdate, who: Admin, ctx: Ctx) -> TenancyView:
    _change(ctx, who, "set-weight", f"cluster_queues/{name}/weight", _set_weight("cluster_queues", name, body.weight))
    return tenancy_view(who, ctx)


@router.put("/admin/tenants/{name}/cloud", response_model=TenancyView, responses=refusals(401, 403, 404, 413, 422))
def set_cloud(name: str, body: CloudUpdate, who: Admin, ctx: Ctx) -> TenancyView:
    """Whether the desk bursts to cloud sites by default, and its cloud budget per period."""

    def edit(doc: dict):
        tenant = _lookup(doc["tenants"], name, "tenant")
        before = {"burst": tenant.get("burst", BurstPolicy.never), "budget": tenant.get("budget")}
        tenant["burst"] = body.burst
        tenant.pop("budget", None)
        if body.budget is not None:
            tenant["budget"] = body.budget.model_dump()
        return before, body.model_dump()

    _change(ctx, who, "set-cloud", f"tenants/{name}/cloud", edit)
    return tenancy_view(who, ctx)


@router.put("/admin/cohorts/{name}/weight", response_model=TenancyView, responses=refusals(401, 403, 404, 413, 422))
def set_cohort_weight(name: str, body: WeightUpdate, who: Admin, ctx: Ctx) -> TenancyView:
    _change(ctx, who, "set-weight", f"cohorts/{name}/weight", _set_weight("cohorts", name, body.weight))
    return tenancy_view(who, ctx)


@router.put(
    "/admin/cohorts/{name}/short-work-share",
    response_model=TenancyView,
    responses=refusals(401, 403, 404, 413, 422),
)
def set_short_work_share(name: str, body: ShortShareUpdate, who: Admin, ctx: Ctx) -> TenancyView:
    """The fraction of a cohort tree's GPUs level-0 work of any desk may use beyond its desk's quota
    (on the tree's root cohort; 0 turns it off)."""

    def edit(doc: dict):
        cohort = _lookup(doc["cohorts"], name, "cohort")
        before, cohort["short_work_share"] = cohort.get("short_work_share", SHORT_WORK_SHARE), body.short_work_share
        return before, body.short_work_share

    _change(ctx, who, "set-short-work-share", f"cohorts/{name}/short_work_share", edit)
    return tenancy_view(who, ctx)


@router.get("/admin/nodes", response_model=list[NodeFaults], responses=refusals(401, 403, 422))
def node_faults(who: Admin, ctx: Ctx, days: Annotated[int, Query(ge=1, le=90)] = 7) -> list[NodeFaults]:
    """Nodes blamed for jobs' infrastructure faults, most faults first."""
    with ctx.store.session() as session:
        found = usage.node_faults(session, utcnow() - timedelta(days=days))
    return [
        NodeFaults(
            node=node,
            faults=len(hits),
            jobs=sorted({job for job, _ in hits}),
            last_at=max(at for _, at in hits),
            flagged=len(hits) >= NODE_FAULT_FLAG,
        )
        for node, hits in sorted(found.items(), key=lambda item: (-len(item[1]), item[0]))
    ]


@router.get("/admin/audit", response_model=list[AuditView], responses=refusals(401, 403, 422))
def audit(who: Admin, ctx: Ctx, limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> list[AuditView]:
    return [AuditView.model_validate(e, from_attributes=True) for e in ctx.tenancy.audit(limit)]


def page(prefix: str) -> APIRouter:
    r = APIRouter(prefix=prefix)

    @r.get("/admin", include_in_schema=False)
    def admin_page(request: Request):
        """The admin page; a browser without a session signs in through the hub first."""
        ctx: Context = request.app.state.ctx
        token = presented_token(request)
        if not token:
            return RedirectResponse(f"{prefix}/login?next={prefix}/admin", status_code=302)
        try:
            who = ctx.identity.principal(token)
        except Unauthenticated:
            return RedirectResponse(f"{prefix}/login?next={prefix}/admin", status_code=302)
        if not who.admin:
            return HTMLResponse("<h1>403</h1><p>The cellscale admin page is for hub admins.</p>", status_code=403)
        # the page's anti-CSRF token (api/csrf.py): its script sends it with every change
        html = (STATIC / "admin.html").read_text().replace("{{PREFIX}}", prefix).replace("{{CSRF}}", csrf_token(token))
        return HTMLResponse(
            html,
            headers={
                # frame-ancestors: no page of another origin (another port of this host included) may
                # frame this one and have an admin click on it
                "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                "frame-ancestors 'self'",
                "Cache-Control": "no-store",
                "Referrer-Policy": "same-origin",
            },
        )

    @r.get("/admin/admin.js", include_in_schema=False)
    def admin_js():
        return HTMLResponse((STATIC / "admin.js").read_text(), media_type="text/javascript")

    return r


def _lookup(table: dict, name: str, kind: str) -> dict:
    if name not in table:
        raise HTTPException(404, f"no {kind} {name!r}; {kind}s: {', '.join(sorted(table))}")
    return table[name]


def _set_weight(table: str, name: str, weight: float):
    def edit(doc: dict):
        entry = _lookup(doc[table], name, table.rstrip("s").replace("_", " "))
        before, entry["weight"] = entry.get("weight", 1.0), weight
        return before, weight

    return edit


def _change(ctx: Context, who: Principal, action: str, target: str, edit) -> None:
    """Apply and validate; refuse (422) a document that is invalid or promises more GPUs
    than a flavor's backend has."""

    def checked(doc: dict):
        before, after = edit(doc)
        _check_capacity(ctx, Tenancy.model_validate(doc))
        return before, after

    try:
        ctx.tenancy.change(who.user, action, target, checked)
    except ValidationError as exc:
        raise HTTPException(422, "; ".join(_plain(e) for e in exc.errors())) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    ctx.wake()


def _plain(error: dict) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "__root__")
    message = error.get("msg", "invalid").removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _capacities(ctx: Context, t: Tenancy, hours: dict[str, float] | None = None) -> list[FlavorCapacity]:
    """Each flavor's backend capacity and the quotas on it (`hours`: the GPU-hours held on each)."""
    capacity = flavor_capacities(t, ctx.drivers)
    return [
        FlavorCapacity(
            flavor=f,
            backend=spec.backend,
            cpu_only=spec.cpu_only,
            capacity_gpus=capacity[f].gpu,
            nominal_total=_nominal_total(t, f, Resource.gpu) or 0,
            capacity_cpus=_counted(capacity[f].cpu),
            capacity_memory_mb=_counted(capacity[f].memory),
            cpu_nominal_total=_nominal_total(t, f, Resource.cpu),
            memory_mb_nominal_total=_nominal_total(t, f, Resource.memory),
            gpu_hours=round((hours or {}).get(f, 0.0), 4),
        )
        for f, spec in t.flavors.items()
    ]


def _nominal_total(t: Tenancy, flavor: str, resource: Resource) -> int | None:
    """The sum of the queues' nominal quotas of `resource` on `flavor`; None where no queue has one."""
    quotas = [cq.quotas[flavor].of(resource) for cq in t.cluster_queues.values() if flavor in cq.quotas]
    nominals = [q.nominal for q in quotas if q is not None]
    return sum(nominals) if nominals else None


def _counted(amount: int) -> int | None:
    """A capacity as the page shows it: None for one the backend does not report."""
    return None if amount >= UNLIMITED else amount


def _check_capacity(ctx: Context, t: Tenancy) -> None:
    for flavor in _capacities(ctx, t):
        for promised, has, unit in (
            (flavor.nominal_total, flavor.capacity_gpus, "GPUs"),
            (flavor.cpu_nominal_total, flavor.capacity_cpus, "CPUs"),
            (flavor.memory_mb_nominal_total, flavor.capacity_memory_mb, "MiB of memory"),
        ):
            if has and promised and promised > has:
                raise ValueError(
                    f"nominal quotas on flavor {flavor.flavor} would sum to {promised} {unit}, "
                    f"more than its backend {flavor.backend} has ({has}); lower another queue's nominal quota first"
                )


def _short_work(ctx: Context, t: Tenancy, lent: dict[tuple[str, str], list[tuple[str, int]]]) -> list[ShortWorkView]:
    """Each tree's short-work share on the flavors this deployment runs, with what it lends now."""
    views = []
    for (tree, flavor), gpus in sorted(QuotaBook(t).short_room.items()):
        if t.flavors[flavor].backend not in ctx.drivers:
            continue
        cohort, loans = tree.partition(":")[2], lent.get((tree, flavor), [])
        views.append(
            ShortWorkView(
                cohort=cohort,
                flavor=flavor,
                share=t.cohorts[cohort].short_work_share,
                gpus=gpus,
                lent=sum(g for _, g in loans),
                jobs=[job_id for job_id, _ in loans],
                lender_wait_max_s=round(ctx.metrics.lender_wait_max.get(cohort, 0.0), 1),
            )
        )
    return views
