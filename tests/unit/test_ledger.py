"""The cost ledger (cellscale_hub.cost.ledger): hand-computed tables, and the identity
desk totals + shared idle + overhead = fleet over random fleets."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellscale.vocabulary import IdlePolicy
from cellscale_hub.cost.ledger import CloudBill, FlavorKind, Interval, Pool, report

H = 3600.0
WINDOW = (0.0, H)


def iv(job, tenant, gpus, used_h=None, *, start=0.0, end=H, flavor="h100", price=2.0, user="u", cpu_s=0.0):
    """An attempt; used_h: GPU-hours busy over the whole interval (None: unknown)."""
    used = None if used_h is None else used_h * H
    return Interval(job, 1, tenant, user, "slurm", flavor, start, end, gpus, used, cpu_s, price)


H100 = Pool("h100", "slurm", 0.0, H, 16, 2.0)  # 16 GPUs at $2/GPU-h for the hour: $32
# A holds 6 GPUs ($12, half busy), B 2 GPUs ($4, all busy): 8 GPU-h ($16) of the pool sit idle
TWO_DESKS = [iv("a1", "A", 6, used_h=3), iv("b1", "B", 2, used_h=2)]


@pytest.mark.parametrize(
    ("policy", "quotas", "totals", "shared"),
    [
        # nobody pays for idle
        (IdlePolicy.none, {"A": {"h100": 8}, "B": {"h100": 4}}, {"A": 12, "B": 4}, 16),
        # the two desks with a quota split $16: C's zero quota is no quota
        (IdlePolicy.even, {"A": {"h100": 8}, "B": {"h100": 4}, "C": {"h100": 0}}, {"A": 20, "B": 12, "C": 0}, 0),
        # nobody has a quota on the flavor: shared
        (IdlePolicy.even, {"A": {"a100": 8}}, {"A": 12, "B": 4}, 16),
        # by use: 6 : 2
        (IdlePolicy.proportional, {}, {"A": 24, "B": 8}, 0),
        # each its unused quota: A 8-6, B 4-2 GPU-h ($4 each); 4 GPU-h no quota explains stay shared
        (IdlePolicy.owner, {"A": {"h100": 8}, "B": {"h100": 4}}, {"A": 16, "B": 8}, 8),
        # unused quotas (8 + 8 GPU-h) exceed the idle (8): scaled down by half
        (IdlePolicy.owner, {"A": {"h100": 14}, "B": {"h100": 10}}, {"A": 20, "B": 12}, 0),
        # quotas fully used: nothing to charge
        (IdlePolicy.owner, {"A": {"h100": 6}, "B": {"h100": 2}}, {"A": 12, "B": 4}, 16),
        # a desk that reserved 4 GPUs and ran nothing pays for them
        (IdlePolicy.owner, {"C": {"h100": 4}}, {"A": 12, "B": 4, "C": 8}, 8),
    ],
)
def test_idle_policies(policy, quotas, totals, shared):
    r = report(TWO_DESKS, [H100], [], quotas, policy, WINDOW)
    assert {t: pytest.approx(d.total_usd) for t, d in r.desks.items()} == totals
    assert r.shared_idle_usd == pytest.approx(shared)
    assert r.fleet_usd == pytest.approx(32)
    assert r.fleet_idle_gpu_s == pytest.approx(8 * H)
    assert r.overhead_usd == pytest.approx(0, abs=1e-9)
    assert r.identity_error() <= 1e-12
    assert r.desks["A"].allocation_usd == pytest.approx(12)
    assert r.desks["A"].idle_in_allocation_usd == pytest.approx(6)  # half of its $12 sat idle
    assert r.desks["A"].efficiency == pytest.approx(0.5)
    assert r.desks["B"].efficiency == pytest.approx(1.0)
    assert r.flavors["h100"].idle_usd == pytest.approx(16)
    assert math.fsum(r.flavors["h100"].idle_shares.values()) == pytest.approx(16 - shared)


def test_clipping_to_the_window():
    intervals = [
        # half before the window: 2 of its 4 GPU-h, half its usage and CPU
        iv("a1", "A", 4, used_h=2, start=-H / 2, end=H / 2, cpu_s=1000),
        # half after, usage unknown
        iv("b1", "B", 2, start=H / 2, end=1.5 * H),
        # wholly outside: not in the report at all
        iv("c1", "C", 8, used_h=8, start=2 * H, end=3 * H),
    ]
    pool = Pool("h100", "slurm", -H, 2 * H, 16, 2.0)  # clipped to the hour: $32
    r = report(intervals, [pool], [], {}, IdlePolicy.proportional, WINDOW)
    a, b = r.desks["A"], r.desks["B"]
    assert (a.allocated_gpu_s, a.used_gpu_s, a.known_gpu_s, a.cpu_s) == pytest.approx((2 * H, H, 2 * H, 500))
    assert a.allocation_usd == pytest.approx(4)
    assert (b.allocated_gpu_s, b.known_gpu_s, b.efficiency) == (H, 0.0, None)
    assert set(r.desks) == {"A", "B"} and set(r.jobs) == {"a1", "b1"}
    assert r.fleet_usd == pytest.approx(32)
    assert r.fleet_idle_gpu_s == pytest.approx(13 * H)
    assert a.idle_share_usd == pytest.approx(26 * 2 / 3) and b.idle_share_usd == pytest.approx(26 / 3)
    assert r.identity_error() <= 1e-12


def test_unknown_usage_is_left_out_of_efficiency():
    intervals = [iv("a1", "A", 2, used_h=0.5), iv("a2", "A", 4)]  # a2: no NVML
    r = report(intervals, [H100], [], {}, IdlePolicy.none, WINDOW)
    a = r.desks["A"]
    assert (a.allocated_gpu_s, a.known_gpu_s, a.used_gpu_s) == pytest.approx((6 * H, 2 * H, 0.5 * H))
    assert a.efficiency == pytest.approx(0.25)
    assert a.idle_in_allocation_usd == pytest.approx(3)  # a1's $4, three quarters idle; a2 unknown: none
    assert a.allocation_usd == pytest.approx(12)
    assert r.jobs["a2"].efficiency is None and r.jobs["a1"].efficiency == pytest.approx(0.25)
    assert r.users[("A", "u")] == a  # one user: the desk's line (users carry no idle share)


@pytest.mark.parametrize(("bill", "overhead"), [(10.0, 4.0), (5.0, -1.0), (6.0, 0.0)])
def test_cloud_bill_beyond_allocation_is_overhead(bill, overhead):
    # 2 GPUs for the hour at $3: $6 of allocation; the rest of the bill (boot, tails) is overhead
    r = report(
        [iv("a1", "A", 2, used_h=2, flavor="cloud-a100", price=3.0)],
        [],
        [CloudBill("cloud-a100", bill)],
        {},
        IdlePolicy.proportional,
        WINDOW,
    )
    a = r.desks["A"]
    assert (a.allocation_usd, a.burst_usd, a.idle_share_usd, a.total_usd) == pytest.approx((6, 6, 0, 6))
    assert r.fleet_usd == pytest.approx(bill) and r.overhead_usd == pytest.approx(overhead)
    assert r.fleet_idle_gpu_s == 0 and r.shared_idle_usd == 0
    assert r.flavors["cloud-a100"].kind is FlavorKind.cloud
    assert r.identity_error() <= 1e-12


def test_a_bill_nobody_ran_on_is_all_overhead():
    r = report([], [], [CloudBill("cloud-a100", 7.0), CloudBill("cloud-a100", 1.0)], {}, IdlePolicy.even, WINDOW)
    assert (r.fleet_usd, r.overhead_usd, r.desks) == (8.0, 8.0, {})
    assert r.identity_error() == 0


def test_capacity_shrink_is_negative_overhead():
    # 16 GPUs the first half hour, 8 the second: 12 GPU-h, $24; A held 14 GPUs all hour: $28
    pools = [Pool("h100", "slurm", 0.0, H / 2, 16, 2.0), Pool("h100", "slurm", H / 2, H, 8, 2.0)]
    r = report([iv("a1", "A", 14, used_h=14)], pools, [], {"A": {"h100": 16}}, IdlePolicy.owner, WINDOW)
    assert r.fleet_usd == pytest.approx(24)
    assert r.desks["A"].total_usd == pytest.approx(28)
    assert (r.fleet_idle_gpu_s, r.shared_idle_usd) == (0, 0)
    assert r.overhead_usd == pytest.approx(-4)
    assert r.identity_error() <= 1e-12


def test_price_difference_and_unpriced_flavor_are_overhead():
    # the pool costs $2/GPU-h but A's attempt was priced at $3; B ran on a flavor nothing prices
    intervals = [iv("a1", "A", 16, price=3.0), iv("b1", "B", 1, flavor="mystery", price=5.0)]
    r = report(intervals, [H100], [], {}, IdlePolicy.none, WINDOW)
    assert r.fleet_usd == pytest.approx(32)
    assert r.flavors["h100"].overhead_usd == pytest.approx(-16)
    assert r.flavors["mystery"].kind is FlavorKind.unpriced
    assert r.flavors["mystery"].overhead_usd == pytest.approx(-5)
    assert r.identity_error() <= 1e-12


def test_a_flavor_is_a_pool_or_a_cloud_not_both():
    with pytest.raises(ValueError, match="both"):
        report([], [H100], [CloudBill("h100", 1.0)], {}, IdlePolicy.none, WINDOW)


def test_top_idle_jobs():
    intervals = [
        iv("j1", "A", 4, used_h=3),  # $8, a quarter idle: $2
        iv("j2", "A", 2, used_h=0),  # $4, all idle: $4
        iv("j3", "B", 8, used_h=4),  # $16, half idle: $8
        iv("j4", "B", 4, used_h=3),  # $8, a quarter idle: $2 (ties j1: by id)
        iv("j5", "B", 6),  # unknown usage: not ranked
        iv("j3", "B", 1, used_h=0, start=H / 2, end=H),  # j3's second attempt: +$1 idle
    ]
    r = report(intervals, [Pool("h100", "slurm", 0.0, H, 32, 2.0)], [], {}, IdlePolicy.none, WINDOW)
    top = r.top_idle_jobs(10)
    assert [j.job_id for j in top] == ["j3", "j2", "j1", "j4"]
    assert [j.idle_in_allocation_usd for j in top] == pytest.approx([9, 4, 2, 2])
    assert [j.job_id for j in r.top_idle_jobs(2)] == ["j3", "j2"]


def test_users_and_metric_series():
    intervals = [
        iv("a1", "A", 2, used_h=1, user="ann"),
        iv("a2", "A", 4, used_h=4, user="bob"),
        iv("a3", "A", 1, used_h=1, user="bob", flavor="cloud-a100", price=3.0),
    ]
    r = report(intervals, [H100], [CloudBill("cloud-a100", 4.0)], {}, IdlePolicy.proportional, WINDOW)
    assert r.users[("A", "ann")].allocation_usd == pytest.approx(4)
    assert r.users[("A", "bob")].allocation_usd == pytest.approx(11)
    assert r.users[("A", "bob")].burst_usd == pytest.approx(3)
    assert all(u.idle_share_usd == 0 for u in r.users.values())
    assert r.desks["A"].idle_share_usd == pytest.approx(20)  # all of the 10 idle GPU-h: the only desk
    bob_cloud = r.series[("A", "bob", "slurm", "cloud-a100")]
    assert (bob_cloud.allocated_gpu_s, bob_cloud.used_gpu_s, bob_cloud.usd) == pytest.approx((H, H, 3))
    assert len(r.series) == 3


# -- the identity over random fleets --------------------------------------------------------

TENANTS = ["A", "B", "C", "D"]
ONPREM = ["h100", "l40"]
CLOUD = ["cloud-a100"]
FLAVORS = [*ONPREM, *CLOUD, "unpriced"]
times = st.floats(-2000, 10000, allow_nan=False)
lengths = st.floats(0, 10000, allow_nan=False)
prices = st.floats(0, 12, allow_nan=False)


@st.composite
def intervals(draw):
    start, length, gpus = draw(times), draw(lengths), draw(st.integers(0, 16))
    used = draw(st.none() | st.floats(0, 1.3).map(lambda f: f * gpus * length))  # > 1: NVML noise
    return Interval(
        draw(st.sampled_from(["j1", "j2", "j3", "j4", "j5", "j6"])),
        draw(st.integers(1, 3)),
        draw(st.sampled_from(TENANTS)),
        draw(st.sampled_from(["u1", "u2"])),
        draw(st.sampled_from(["slurm", "local"])),
        draw(st.sampled_from(FLAVORS)),
        start,
        start + length,
        gpus,
        used,
        draw(st.floats(0, 1e6)),
        draw(prices),
    )


pools = st.builds(
    lambda f, s, n, g, p: Pool(f, "slurm", s, s + n, g, p),
    st.sampled_from(ONPREM),
    times,
    lengths,
    st.integers(0, 64),
    prices,
)
bills = st.builds(CloudBill, st.sampled_from(CLOUD), st.floats(0, 5000, allow_nan=False))
quotas = st.dictionaries(
    st.sampled_from(TENANTS), st.dictionaries(st.sampled_from(FLAVORS), st.integers(0, 32), min_size=1), min_size=1
)
windows = st.tuples(times, lengths).map(lambda w: (w[0], w[0] + w[1]))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(intervals(), min_size=1, max_size=25),
    st.lists(pools, min_size=1, max_size=5),
    st.lists(bills, max_size=3),
    quotas,
    st.sampled_from(list(IdlePolicy)),
    windows,
)
def test_every_dollar_is_somewhere(ivs, pls, bls, qts, policy, window):
    r = report(ivs, pls, bls, qts, policy, window)
    assert r.identity_error() <= 1e-9
    scale = max(r.fleet_usd, sum(d.total_usd for d in r.desks.values()), 1.0)
    for desk in r.desks.values():
        assert desk.allocation_usd >= 0 and desk.idle_share_usd >= 0 and desk.total_usd >= 0
        assert 0 <= desk.burst_usd <= desk.allocation_usd * (1 + 1e-12)
        assert -1e-9 * scale <= desk.idle_in_allocation_usd <= desk.allocation_usd * (1 + 1e-12) + 1e-9
        assert desk.efficiency is None or 0 <= desk.efficiency <= 1 + 1e-12
    assert r.shared_idle_usd >= -1e-9 * scale and r.fleet_idle_gpu_s >= 0
    for line in r.flavors.values():  # the idle policy never charges more than the idle
        assert math.fsum(line.idle_shares.values()) <= line.idle_usd * (1 + 1e-12) + 1e-12
        assert line.fleet_usd == pytest.approx(line.allocation_usd + line.idle_usd + line.overhead_usd, abs=1e-9)
    users = math.fsum(u.allocation_usd for u in r.users.values())
    assert users == pytest.approx(math.fsum(d.allocation_usd for d in r.desks.values()), abs=1e-9)
    assert math.fsum(j.usd for j in r.jobs.values()) == pytest.approx(users, abs=1e-9)
    assert math.fsum(s.usd for s in r.series.values()) == pytest.approx(users, abs=1e-9)
    if policy is IdlePolicy.none:
        assert all(d.idle_share_usd == 0 for d in r.desks.values())
