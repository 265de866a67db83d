"""Cost: the ledger's report for a window (a desk sees its own desks, an admin the fleet),
each desk's budget, and `/metrics` for Prometheus."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, Field

from cellscale_hub.api.context import Ctx, Reader
from cellscale_hub.api.errors import refusals
from cellscale_hub.cost.costs import cost_report, cost_series
from cellscale_hub.cost.ledger import DeskCost
from cellscale_hub.scheduling.placement import Spend
from cellscale_hub.store import usage
from cellscale_hub.store.models import utcnow

MAX_WINDOW = timedelta(days=400)
MAX_POINTS = 400  # steps in one series


class CostLine(BaseModel):
    """A desk's (or a user's) cost in the window."""

    tenant: str
    user: str | None = None
    gpu_hours: float = Field(description="GPU-hours allocated (GPUs × the backend's own wall time).")
    used_gpu_hours: float = Field(description="Of those where the GPUs were sampled, the busy ones.")
    efficiency: float | None = Field(None, description="Busy / allocated where sampled (None: nothing sampled).")
    cpu_hours: float
    allocation_usd: float
    idle_in_allocation_usd: float = Field(description="Dollars of GPUs held but idle (inside allocation_usd).")
    idle_share_usd: float = Field(description="Its share of the fleet's unheld GPUs (the tenancy's cost.idle policy).")
    burst_usd: float = Field(description="Allocation on cloud pools (inside allocation_usd).")
    total_usd: float


class IdleJob(BaseModel):
    job_id: str
    tenant: str
    user: str
    gpu_hours: float
    efficiency: float | None
    usd: float
    idle_usd: float


class FleetCost(BaseModel):
    """Admins only: where every dollar of the fleet went."""

    fleet_usd: float
    desks_usd: float
    shared_idle_usd: float
    overhead_usd: float = Field(description="Cloud boot, idle tails and unused instances; price differences.")
    identity_error: float = Field(description="|desks + shared idle + overhead − fleet| / fleet: 0 when it reconciles.")


class CostView(BaseModel):
    since: datetime
    until: datetime
    idle_policy: str
    desks: list[CostLine]
    users: list[CostLine]
    top_idle_jobs: list[IdleJob]
    fleet: FleetCost | None = None


class CostPoint(BaseModel):
    """One desk's cost in one step of a series."""

    start: datetime
    tenant: str
    gpu_hours: float
    used_gpu_hours: float
    total_usd: float
    idle_in_allocation_usd: float


class CostSeries(BaseModel):
    since: datetime
    until: datetime
    step_s: float
    points: list[CostPoint]


class BudgetView(BaseModel):
    tenant: str
    period: str
    usd: float | None
    gpu_hours: float | None
    spent_usd: float
    spent_gpu_hours: float
    fraction: float = Field(description="The larger of dollars and GPU-hours spent, of the budget.")
    warning: str | None = Field(None, description="The highest warn_at threshold crossed, in words.")
    hard_stop: bool
    holding: bool = Field(description="Spent, with a hard stop: its new work is held.")


def _line(tenant: str, user: str | None, d: DeskCost) -> CostLine:
    return CostLine(
        tenant=tenant,
        user=user,
        gpu_hours=d.allocated_gpu_s / 3600,
        used_gpu_hours=d.used_gpu_s / 3600,
        efficiency=d.efficiency,
        cpu_hours=d.cpu_s / 3600,
        allocation_usd=d.allocation_usd,
        idle_in_allocation_usd=d.idle_in_allocation_usd,
        idle_share_usd=d.idle_share_usd,
        burst_usd=d.burst_usd,
        total_usd=d.total_usd,
    )


router = APIRouter()


@router.get("/cost", response_model=CostView, responses=refusals(400, 401, 403, 422))
def cost(
    who: Reader,
    ctx: Ctx,
    since: datetime | None = None,
    until: datetime | None = None,
    days: Annotated[float, Query(gt=0, le=400)] = 7.0,
) -> CostView:
    """What your desks spent in the window (default: the last `days` days): per desk and
    user, allocation, use, idle, and the fleet's idle shared by the tenancy's policy; admins
    also get the fleet's reconciliation."""
    until = until or utcnow()
    try:
        since = since or until - timedelta(days=days)
    except OverflowError:  # `until` in year 1: no window of `days` before it
        raise HTTPException(400, f"the window cannot end at {until.isoformat()}: give a later until") from None
    if since >= until or until - since > MAX_WINDOW:
        raise HTTPException(400, "the window must start before it ends and last at most 400 days")
    tenancy = ctx.tenancy.current
    with ctx.store.session() as session:
        report = cost_report(session, tenancy, ctx.drivers, since, until)
    visible = set(tenancy.tenants) if who.admin else set(who.tenants)
    jobs = [j for j in report.top_idle_jobs(50) if j.tenant in visible][:10]
    fleet = None
    if who.admin:
        desks_usd = sum(d.total_usd for d in report.desks.values())
        fleet = FleetCost(
            fleet_usd=report.fleet_usd,
            desks_usd=desks_usd,
            shared_idle_usd=report.shared_idle_usd,
            overhead_usd=report.overhead_usd,
            identity_error=report.identity_error(),
        )
    return CostView(
        since=since,
        until=until,
        idle_policy=report.policy.value,
        desks=[_line(t, None, d) for t, d in sorted(report.desks.items()) if t in visible],
        users=[_line(t, u, d) for (t, u), d in sorted(report.users.items()) if t in visible],
        top_idle_jobs=[
            IdleJob(
                job_id=j.job_id,
                tenant=j.tenant,
                user=j.user,
                gpu_hours=j.allocated_gpu_s / 3600,
                efficiency=j.efficiency,
                usd=j.usd,
                idle_usd=j.idle_in_allocation_usd,
            )
            for j in jobs
        ],
        fleet=fleet,
    )


@router.get("/cost/series", response_model=CostSeries, responses=refusals(400, 401, 403, 422))
def series(
    who: Reader,
    ctx: Ctx,
    days: Annotated[float, Query(gt=0, le=400)] = 7.0,
    step_s: Annotated[float, Query(ge=60, le=31 * 86400)] = 86400.0,
) -> CostSeries:
    """Your desks' cost and GPU-hours per step over the last `days` days (every desk's, for
    an admin): what the admin page plots."""
    until = utcnow()
    since = until - timedelta(days=days)
    if (until - since).total_seconds() / step_s > MAX_POINTS:
        raise HTTPException(400, f"at most {MAX_POINTS} steps: raise step_s or shorten days")
    tenancy = ctx.tenancy.current
    with ctx.store.session() as session:
        reports = cost_series(session, tenancy, ctx.drivers, since, until, timedelta(seconds=step_s))
    visible = set(tenancy.tenants) if who.admin else set(who.tenants)
    points = [
        CostPoint(
            start=start,
            tenant=tenant,
            gpu_hours=d.allocated_gpu_s / 3600,
            used_gpu_hours=d.used_gpu_s / 3600,
            total_usd=d.total_usd,
            idle_in_allocation_usd=d.idle_in_allocation_usd,
        )
        for start, report in reports
        for tenant, d in sorted(report.desks.items())
        if tenant in visible
    ]
    return CostSeries(since=since, until=until, step_s=step_s, points=points)


@router.get("/budgets", response_model=list[BudgetView], responses=refusals(401, 403))
def budgets(who: Reader, ctx: Ctx) -> list[BudgetView]:
    """Your desks' budgets (every desk's, for an admin): spent in the period, warnings, holds."""
    tenancy = ctx.tenancy.current
    with ctx.store.session() as session:
        spend = usage.budget_spend(session, tenancy, utcnow(), only=None if who.admin else set(who.tenants))
    return [budget_view(tenant, s) for tenant, s in sorted(spend.items())]


@router.get("/metrics", responses=refusals(401, 403))
def metrics(who: Reader, ctx: Ctx) -> Response:
    """Prometheus exposition (admins' tokens, or the token given to Prometheus): no job ids."""
    if not who.admin:
        raise HTTPException(403, "metrics are for hub admins (give Prometheus an admin service's token)")
    return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def budget_view(tenant: str, s: Spend) -> BudgetView:
    crossed = [f for f in s.budget.warn_at if s.fraction >= f]
    warning = None
    if crossed:
        warning = f"past {max(crossed):.0%} of the budget: {s.words(tenant)}"
    return BudgetView(
        tenant=tenant,
        period=s.budget.period,
        usd=s.budget.usd,
        gpu_hours=s.budget.gpu_hours,
        spent_usd=s.spent_usd,
        spent_gpu_hours=s.spent_gpu_hours,
        fraction=s.fraction,
        warning=warning,
        hard_stop=s.budget.hard_stop,
        holding=s.budget.hard_stop and s.exhausted,
    )
