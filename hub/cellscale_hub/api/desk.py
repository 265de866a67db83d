"""A user's desk as the API shows it: who they are, their queues' quota and use, the most
one job may ask for, the backends, and the health check."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from cellscale.spec import BackendView, JobLimits, QueueUsage, WhoAmI
from cellscale_hub.api.context import Ctx, Reader
from cellscale_hub.api.errors import refusals
from cellscale_hub.routing import NoTenant, Refused, job_limits
from cellscale_hub.store import usage
from cellscale_hub.store.models import utcnow

router = APIRouter()


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
