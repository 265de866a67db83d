"""Placement across sites (scheduling.placement and scheduling.offers, through cycle.schedule): table-driven."""

from __future__ import annotations

import pytest

from cellscale.vocabulary import PendingCode
from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.placement import SiteState, Spend, choose, duration_words, offer
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.tenancy import Budget, Tenancy

TENANCY = Tenancy.model_validate(
    {
        "sites": {
            "dca": {"gpu_hour_usd": 1.0, "egress_usd_per_gb": 0.09, "bandwidth_gb_s": 0.5},
            "dcb": {"gpu_hour_usd": 1.0, "egress_usd_per_gb": 0.09, "bandwidth_gb_s": 0.5},
            "burst": {"kind": "cloud", "gpu_hour_usd": 2.5, "boot_s": 90, "idle_tail_s": 60},
        },
        "flavors": {
            "dca": {"backend": "slurm", "site": "dca"},
            "dcb": {"backend": "slurm-dcb", "site": "dcb"},
            "burst": {"backend": "slurm-burst", "site": "burst"},
        },
        "datasets": {"bars": {"site": "dca", "size_gb": 400}},
        "cluster_queues": {
            "desk-a": {"quotas": {"dca": {"nominal": 32}, "dcb": {"nominal": 16}, "burst": {"nominal": 32}}},
            "desk-b": {"quotas": {"dca": {"nominal": 32}, "dcb": {"nominal": 16}, "burst": {"nominal": 32}}},
        },
        "tenants": {
            "desk-a": {"queues": {"default": {"cluster_queue": "desk-a"}}, "burst": "allow"},
            "desk-b": {"queues": {"default": {"cluster_queue": "desk-b"}}, "burst": "allow"},
        },
    }
)
CAPACITY = {"dca": 32, "dcb": 16, "burst": 32}
SITES = {f: SiteState(TENANCY.flavors[f].site, TENANCY.sites[TENANCY.flavors[f].site]) for f in CAPACITY}
HOUR = 3600.0


def holder(job: str, flavor: str, gpus: int, ends_in_h: float | None, cq: str = "desk-b") -> Holder:
    ends = None if ends_in_h is None else ends_in_h * HOUR
    return Holder(job, cq, flavor, gpus, started=0.0, ends_by=ends, tenant=cq)


def job(gpus: int = 16, data=(), runtime_h: float = 1.0) -> Workload:
    return Workload("j", "desk-a", gpus, tenant="desk-a", data=data, runtime_s=runtime_h * HOUR)


def decide(holders=(), pending=None, spend=None, sites=SITES):
    snap = Snapshot(
        TENANCY,
        CAPACITY,
        tuple(holders),
        (pending or job(),),
        now=0.0,
        sites=sites,
        spend=spend or {},
    )
    return schedule(snap)


@pytest.mark.parametrize(
    ("holders", "data", "expected"),
    [
        # everything free: the data's home wins (no transfer, no egress)
        ((), (("dca", 400.0),), "dca"),
        # dca full for 2 h, data at dca: moving 400 GB to dcb (13 min, $36) beats 2 h of waiting
        ((holder("b1", "dca", 32, 2.0),), (("dca", 400.0),), "dcb"),
        # dca full for 2 h, no data: dcb starts now
        ((holder("b1", "dca", 32, 2.0),), (), "dcb"),
        # both datacenters full for hours: the burst pool (boot 90 s) for ≈$42
        ((holder("b1", "dca", 32, 6.0), holder("b2", "dcb", 16, 6.0)), (), "burst"),
    ],
)
def test_the_cheapest_offer_in_dollars_and_waiting_wins(holders, data, expected):
    decision = decide(holders, job(data=data))
    assert [a.flavor for a in decision.admit] == [expected]
    assert decision.admit[0].placed.startswith(f"placed at {expected}: ")


def test_waits_for_the_cheap_site_when_it_frees_soon():
    """dca frees in 5 minutes: waiting costs 16 GPUs x 5 min x $2 = $2.7, bursting ≈$42."""
    holders = (holder("b1", "dca", 32, 5 / 60), holder("b2", "dcb", 16, 6.0))
    decision = decide(holders)
    assert decision.admit == []
    reason = decision.pending["j"]
    assert reason.message.startswith("waits for dca (burst ≈2 min for ≈$42; dca ≈5 min; dcb ≈6 h)")
    assert {o.site for o in reason.offers} == {"dca", "dcb", "burst"}


def test_a_budget_keeps_a_desk_off_the_cloud_and_says_so():
    holders = (holder("b1", "dca", 32, 6.0), holder("b2", "dcb", 16, 6.0))
    spend = {"desk-a": Spend(Budget(usd=300, period="week"), spent_usd=290)}
    decision = decide(holders, spend=spend)
    assert decision.admit == []
    message = decision.pending["j"].message
    assert "burst ≈2 min for ≈$42 (14% of desk-a's weekly budget): not allowed, would cost ≈$42 > $10 left" in message


def test_budget_left_shows_its_share():
    holders = (holder("b1", "dca", 32, 6.0), holder("b2", "dcb", 16, 6.0))
    spend = {"desk-a": Spend(Budget(usd=300, period="week"), spent_usd=0)}
    decision = decide(holders, spend=spend)
    assert decision.admit[0].flavor == "burst"
    assert "burst ≈2 min for ≈$42 (14% of desk-a's weekly budget)" in decision.admit[0].placed


def test_an_unavailable_site_is_skipped_with_its_reason():
    sites = {**SITES, "dca": SiteState("dca", TENANCY.sites["dca"], unavailable="its controller does not answer")}
    decision = decide(sites=sites)
    assert decision.admit[0].flavor == "dcb"
    assert "dca starts now: not allowed, its controller does not answer" in decision.admit[0].placed


def test_no_site_at_all():
    sites = {f: SiteState(s.name, s.site, unavailable="stockout") for f, s in SITES.items()}
    decision = decide(sites=sites)
    reason = decision.pending["j"]
    assert reason.code is PendingCode.NoFlavor
    assert reason.message.startswith("no site may take it now: ")


def test_one_site_only_keeps_the_old_rules():
    """A queue whose flavors are all at one site chooses as before (first that fits)."""
    decision = decide(sites={})
    assert decision.admit[0].flavor == "dca" and decision.admit[0].placed is None


def test_gangs_never_split():
    """24 GPUs: dca has 16 free and dcb 16 free (32 together), but no one site has 24."""
    holders = (holder("b1", "dca", 16, 6.0), holder("b2", "burst", 32, 6.0))
    decision = decide(holders, job(gpus=24))
    assert decision.admit == []


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "now"),
        (59, "now"),
        (240, "≈4 min"),
        (3590, "≈1 h"),
        (7200, "≈2 h"),
        (5400, "≈1.5 h"),
        (3 * 86400, "≈3.0 days"),
    ],
)
def test_durations(seconds, words):
    assert duration_words(seconds) == words


def test_cloud_dollars_include_boot_and_idle_tail():
    o = offer(
        "burst",
        SITES["burst"],
        gpus=16,
        runtime_s=3600,
        data=(),
        sites=TENANCY.sites,
        fits_now=True,
        blocked_until_s=None,
        wait_usd_per_gpu_hour=2.0,
        spend=None,
    )
    assert o.usd == pytest.approx(16 * 2.5 * (3600 + 90 + 60) / 3600)
    assert o.start_in_s == 90
    assert choose([o]) is o


def test_a_budget_holds_across_the_jobs_admitted_in_one_cycle():
    """$60 left: the first $41 burst fits, the second would overspend."""
    holders = (holder("b1", "dca", 32, 6.0), holder("b2", "dcb", 16, 6.0))
    jobs = (
        Workload("j1", "desk-a", 8, tenant="desk-a", submitted=1.0, runtime_s=2 * HOUR),
        Workload("j2", "desk-a", 8, tenant="desk-a", submitted=2.0, runtime_s=2 * HOUR),
    )
    spend = {"desk-a": Spend(Budget(usd=60, period="week"), spent_usd=0)}
    snap = Snapshot(TENANCY, CAPACITY, holders, jobs, now=0.0, sites=SITES, spend=spend)
    decision = schedule(snap)
    assert [a.job_id for a in decision.admit] == ["j1"]
    assert "would cost ≈$41 > $19 left of the weekly budget" in decision.pending["j2"].message


def test_a_wait_counts_the_jobs_already_waiting_for_the_same_site():
    """dca frees 16 GPUs in 5 minutes and the rest in 6 h: the first 16-GPU job waits for those
    16; the next one would get them only after it, in 6 h, so it bursts."""
    holders = (
        holder("b1", "dca", 16, 5 / 60, cq="desk-a"),
        holder("b2", "dca", 16, 6.0, cq="desk-b"),
        holder("b3", "dcb", 16, 6.0),
    )
    first = Workload("ja", "desk-a", 16, tenant="desk-a", submitted=1.0)
    second = Workload("jb", "desk-b", 16, tenant="desk-b", submitted=2.0)
    snap = Snapshot(TENANCY, CAPACITY, holders, (first, second), now=0.0, sites=SITES)
    decision = schedule(snap)
    waits = [j for j in ("ja", "jb") if j in decision.pending]
    assert len(waits) == 1 and decision.pending[waits[0]].message.startswith("waits for dca")
    assert [a.flavor for a in decision.admit] == ["burst"]


@pytest.mark.parametrize(
    ("behind", "unlisted", "minutes"),
    [
        # dca frees 1 GPU a minute; desk-a's head (1 GPU) waits there first, then desk-b's
        (0, 0, 2),  # the head ahead, then this job: the 2nd end
        (10, 0, 12),  # and the 10 jobs queued behind that head
        (0, 20, 22),  # and 20 GPUs of its queue left out of `pending`
        (5, 10, 17),  # both
    ],
)
def test_a_wait_counts_the_whole_queue_ahead_not_its_head_only(behind, unlisted, minutes):
    """A site whose 32 holders end one a minute: a head that waits there behind another queue
    starts after the GPUs of that whole queue have freed, not at the first ends."""
    holders = tuple(holder(f"b{m}", "dca", 1, m / 60) for m in range(1, 33)) + (holder("d", "dcb", 16, 6.0),)
    at = ("dca", "dcb")
    queue_a = [Workload(f"a{n}", "desk-a", 1, submitted=n, flavors=at, tenant="desk-a") for n in range(behind + 1)]
    jb = Workload("jb", "desk-b", 1, submitted=0.5, flavors=at, tenant="desk-b")
    unlisted_gpus = {"desk-a": Amounts(unlisted)} if unlisted else {}
    snap = Snapshot(TENANCY, CAPACITY, holders, (*queue_a, jb), now=0.0, sites=SITES, unlisted=unlisted_gpus)
    reason = schedule(snap).pending["jb"]
    assert reason.message.startswith("waits for dca")
    dca = next(o for o in reason.offers if o.flavor == "dca")
    assert dca.start_in_s == pytest.approx(minutes * 60)
