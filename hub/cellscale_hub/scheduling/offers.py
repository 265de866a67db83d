"""A cycle's site offers for one job (`scheduling.placement` scores them): whether it fits
at each site now or when the jobs in its way end, what its desk may still spend, and the
budget gate that holds a desk's new work once its budget is spent.
"""

from __future__ import annotations

from cellscale.vocabulary import PendingCode
from cellscale_hub.scheduling.placement import Offer, Spend, offer
from cellscale_hub.scheduling.resources import RESOURCES
from cellscale_hub.scheduling.state import Cycle, claimant, estimate
from cellscale_hub.scheduling.types import PendingReason, Snapshot, Workload
from cellscale_hub.scheduling.usage import Usage


def across_sites(snap: Snapshot, flavors: list[str]) -> bool:
    """Placement weighs sites when the job may use flavors at more than one site, or a cloud
    site (whose dollars count against the desk's budget)."""
    sites = [snap.sites[f] for f in flavors if f in snap.sites]
    return len({s.name for s in sites}) > 1 or any(s.cloud for s in sites)


def site_offers(snap: Snapshot, usage: Usage, job: Workload, flavors: list[str], cycle: Cycle) -> list[Offer]:
    """One offer per flavor with a site (`scheduling.placement`): fits now, or when what is in
    its way ends."""
    tenant = snap.tenancy.tenants.get(job.tenant)
    wait_value = tenant.wait_usd_per_gpu_hour if tenant else 0.0
    out = []
    for f in flavors:
        if f not in snap.sites:
            continue
        cq = job.cluster_queue
        fits = usage.fits(cq, f, job.demand) and not (
            usage.borrows(cq, f, job.demand) and claimant(usage, cycle, job, f)
        )
        out.append(
            offer(
                f,
                snap.sites[f],
                gpus=job.gpus,
                runtime_s=job.runtime_s,
                data=job.data,
                sites=snap.tenancy.sites,
                fits_now=fits,
                blocked_until_s=None if fits else _blocked_for(snap, usage, job, f, cycle),
                wait_usd_per_gpu_hour=wait_value,
                spend=tenant_spend(snap, cycle, job.tenant),
            )
        )
    return out


def tenant_spend(snap: Snapshot, cycle: Cycle, tenant: str) -> Spend | None:
    """The tenant's cloud spend, counting what this cycle already admitted to the cloud."""
    spend = snap.spend.get(tenant)
    if spend is None or not cycle.spent.get(tenant):
        return spend
    return Spend(spend.budget, spend.spent_usd + cycle.spent[tenant])


def _blocked_for(snap: Snapshot, usage: Usage, job: Workload, flavor: str, cycle: Cycle) -> float | None:
    """Seconds until the jobs in the way on `flavor` have ended (at their time limits), enough
    for this job and for the queues already waiting there ahead of it (`cycle.queued_from`)."""
    short = usage.short(job.cluster_queue, flavor, job.demand)
    ahead = cycle.waiting_for.get(flavor, (0, 0, 0))
    if short is None:
        if not any(ahead):
            return 0.0  # fits, but a blocked head ahead claims it: frees when that head starts
        resource = RESOURCES[next(i for i, a in enumerate(ahead) if a)]
        available, code = usage.headroom(job.cluster_queue, flavor, resource)[0], PendingCode.CapacityFull
    else:
        resource, available, code = short
    i = RESOURCES.index(resource)
    until = estimate(snap, usage, job, flavor, code, i, cycle, job.demand[i] + ahead[i] - available)
    return None if until is None else until - snap.now


def over_budget(snap: Snapshot, job: Workload) -> PendingReason | None:
    """Held: its desk's budget is spent and stops new work (`hard_stop`)."""
    spend = snap.spend.get(job.tenant)
    if spend is None or not spend.budget.hard_stop or not spend.exhausted:
        return None
    return PendingReason(
        PendingCode.BudgetSpent,
        f"held: {job.tenant} has spent its budget ({spend.words(job.tenant)}), which stops new work; "
        "it starts when the period's spend falls below the budget or an admin raises it",
        1,
        needs=job.gpus,
    )
