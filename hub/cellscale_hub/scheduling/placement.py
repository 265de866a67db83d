"""Placement across sites: which datacenter or cloud pool a job goes to, and why.

A job whose queue has flavors at several sites gets one `Offer` per site it may use: when it
could start there (now if its gang fits the quota and the site's own scheduler would start it;
else when the jobs in the way end; a cloud adds its boot time; moving its data and newest
checkpoint adds their transfer time), what it would cost (its expected run at the site's price;
a cloud also bills its boot and the idle tail before power-down; moving data pays egress), and
whether the desk's budget allows it. The offers are compared in one currency: dollars, plus
what the desk says an hour of waiting for one GPU is worth (`Tenant.wait_usd_per_gpu_hour`).
The cheapest offer wins; when that one cannot start now, the job waits for it (and the reason
shows the table in words). A gang is never split: an offer is one flavor at one site.

Pure functions: the controller (and the trace replay) supply the `SiteState`s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from cellscale_hub.tenancy import Budget, Site, SiteKind

UNKNOWN_WAIT_S = 4 * 3600.0  # a site whose blockers have no known end: assumed this far off


@dataclass(frozen=True)
class SiteState:
    """One flavor's site as placement sees it this cycle."""

    name: str
    site: Site
    start_in_s: float = 0.0  # the site's own scheduler's estimate for a job that fits the quota now
    unavailable: str | None = None  # why nothing may be placed there now (a stockout backoff, a lost controller)

    @property
    def cloud(self) -> bool:
        return self.site.kind is SiteKind.cloud


@dataclass(frozen=True)
class Spend:
    """A tenant's spend against its budget in the current period (what the budget covers)."""

    budget: Budget
    spent_usd: float
    spent_gpu_hours: float = 0.0

    @property
    def left_usd(self) -> float:
        return math.inf if self.budget.usd is None else max(0.0, self.budget.usd - self.spent_usd)

    @property
    def fraction(self) -> float:
        """The larger of the dollars and GPU-hours spent, as a fraction of the budget."""
        parts = [0.0]
        if self.budget.usd is not None:
            parts.append(self.spent_usd / self.budget.usd if self.budget.usd else math.inf)
        if self.budget.gpu_hours is not None:
            parts.append(self.spent_gpu_hours / self.budget.gpu_hours if self.budget.gpu_hours else math.inf)
        return max(parts)

    @property
    def exhausted(self) -> bool:
        return self.fraction >= 1.0

    def words(self, tenant: str) -> str:
        """ "$512 of desk-a's weekly $500 budget (102%)"."""
        b = self.budget
        parts = []
        if b.usd is not None:
            parts.append(f"{usd_words(self.spent_usd)} of {tenant}'s {b.period_words} {usd_words(b.usd)}")
        if b.gpu_hours is not None:
            parts.append(f"{self.spent_gpu_hours:,.1f} of {b.gpu_hours:,.0f} GPU-hours")
        return f"{' and '.join(parts)} budget ({self.fraction:.0%})"


@dataclass(frozen=True)
class Offer:
    flavor: str
    site: str
    cloud: bool
    fits_now: bool
    start_in_s: float  # until its gang runs there, data moved (UNKNOWN_WAIT_S-based when unknown)
    known: bool  # start_in_s is an estimate, not the unknown-wait assumption
    usd: float  # compute for the expected run (cloud: + boot and idle tail)
    move_gb: float  # data and checkpoint that are elsewhere
    move_usd: float
    excluded: str | None = None  # why it may not be taken
    wait_usd: float = 0.0  # what the wait is worth to the desk

    @property
    def total_usd(self) -> float:
        return self.usd + self.move_usd

    @property
    def score(self) -> float:
        return self.total_usd + self.wait_usd


def offer(
    flavor: str,
    state: SiteState,
    *,
    gpus: int,
    runtime_s: float,
    data: tuple[tuple[str, float], ...],
    sites: Mapping[str, Site],
    fits_now: bool,
    blocked_until_s: float | None,
    wait_usd_per_gpu_hour: float,
    spend: Spend | None,
) -> Offer:
    """One site's offer for a job. `blocked_until_s`: when the quota or capacity in the way
    frees (None: unknown) for a job that does not fit now; `data`: (home site, GB) of each
    dataset and checkpoint it reads."""
    site = state.site
    moving = [(home, gb) for home, gb in data if home != state.name and gb > 0]
    move_gb = sum(gb for _, gb in moving)
    move_usd = sum(gb * sites[home].egress_usd_per_gb for home, gb in moving if home in sites)
    move_s = max((gb / sites[home].bandwidth_gb_s for home, gb in moving if home in sites), default=0.0)
    billed_s = runtime_s + (site.boot_s + site.idle_tail_s if state.cloud else 0.0)
    usd = gpus * billed_s / 3600 * site.gpu_hour_usd
    known = fits_now or blocked_until_s is not None
    wait = state.start_in_s if fits_now else (blocked_until_s if blocked_until_s is not None else UNKNOWN_WAIT_S)
    start_in_s = max(wait + (site.boot_s if state.cloud else 0.0), move_s)
    excluded = state.unavailable
    if excluded is None and state.cloud and spend is not None and usd + move_usd > spend.left_usd:
        cost, left = usd_words(usd + move_usd), usd_words(spend.left_usd)
        excluded = f"would cost ≈{cost} > {left} left of the {spend.budget.period}ly budget"
    return Offer(
        flavor,
        state.name,
        state.cloud,
        fits_now and excluded is None,
        start_in_s,
        known,
        usd,
        move_gb,
        move_usd,
        excluded,
        gpus * start_in_s / 3600 * wait_usd_per_gpu_hour,
    )


def choose(offers: list[Offer]) -> Offer | None:
    """The offer to take (or wait for): the lowest dollars plus wait value; ties go to the
    one that starts sooner, then to the site listed first. None: every offer is excluded."""
    open_ = [(o.score, o.start_in_s, i, o) for i, o in enumerate(offers) if o.excluded is None]
    return min(open_)[3] if open_ else None


def usd_words(usd: float) -> str:
    return f"${usd:,.2f}" if usd < 10 else f"${usd:,.0f}"


def duration_words(seconds: float) -> str:
    if seconds < 60:
        return "now"
    if round(seconds / 60) < 60:
        return f"≈{round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"≈{seconds / 3600:.1f} h".replace(".0 h", " h")
    return f"≈{seconds / 86400:.1f} days"


def offer_words(o: Offer, tenant: str, spend: Spend | None) -> str:
    """One site in words: "dcb starts now", "burst ≈4 min for ≈$37 (12% of desk-a's weekly
    budget)", "dca ≈2 h (moves 40 GB, ≈$3.60)"."""
    when = duration_words(o.start_in_s)
    if not o.known:
        when = f"not before {when}" if when != "now" else "unknown"
    words = f"{o.site} starts now" if when == "now" else f"{o.site} {when}"
    if o.cloud:
        words += f" for ≈{usd_words(o.total_usd)}"
        if spend is not None and spend.budget.usd:
            share = o.total_usd / spend.budget.usd
            of = f"{share:.0%} of" if share < 10 else f"{share:,.0f}×"
            words += f" ({of} {tenant}'s {spend.budget.period_words} budget)"
    if o.move_gb > 0:
        words += f", moving {o.move_gb:,.0f} GB" + (f" (≈${o.move_usd:,.2f} egress)" if o.move_usd else "")
    if o.excluded:
        words += f": not allowed, {o.excluded}"
    return words


def table_words(offers: list[Offer], tenant: str, spend: Spend | None) -> str:
    """Every site, the soonest first: "dcb starts now; burst ≈4 min for ≈$37 (...); dca ≈2 h"."""
    ordered = sorted(offers, key=lambda o: (o.excluded is not None, o.start_in_s, o.site))
    return "; ".join(offer_words(o, tenant, spend) for o in ordered)
