"""The cost ledger: where each dollar the fleet cost in a window went (OpenCost's model, adapted).

What the fleet cost is fixed first, then split. An on-prem flavor costs its capacity: each of
its pools' GPUs times the seconds of the window it existed, at its price, used or not. A cloud
flavor costs what the cloud billed for it in the window (boot, idle tails and instances nobody
used included). The split has three parts, and they add up to the fleet's cost exactly:

- Allocation: each attempt pays for the GPUs it held while it held them (GPUs × seconds × its
  price), whether its code kept them busy or not. This is the desk's own spending. How much of it
  the GPUs sat idle (from NVML, when the node reports it) is shown as the attempt's
  idle-in-allocation dollars: already inside the allocation, a hint at waste, not an extra charge.
  Cloud allocation is also shown as burst dollars, likewise already inside.
- Idle capacity: an on-prem flavor's GPU-seconds nobody held. The idle policy says who pays:
  nobody (`none`: shared cost), the desks with a quota on that flavor in equal parts (`even`), the
  desks that used the flavor in proportion to their use (`proportional`), or each desk the part of
  its own quota it reserved and left unused (`owner`; what no quota explains stays shared). Idle
  nobody is charged for is the shared idle cost.
- Overhead: the rest, which may be negative. For a cloud flavor, the bill minus its attempts'
  allocation: boot, idle tails and unused instances (negative if the bill came in below the
  allocation). For an on-prem flavor, allocation beyond its capacity (capacity shrank under running
  jobs: negative, never lost) and any difference between the pools' price and the attempts' price.

Everything is clipped to the window: an attempt half inside counts half its GPU-seconds, used
GPU-seconds and CPU-seconds. Nothing is rounded inside, so the identity (desk totals + shared idle
+ overhead = fleet) holds to floating error for any window.

Pure functions: the store reads the attempts, pools and bills and feeds them to `report`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum

from cellscale.vocabulary import IdlePolicy

HOUR_S = 3600.0
TINY_USD = 1e-9  # the smallest scale identity_error divides by


class FlavorKind(StrEnum):
    pool = "pool"  # on-prem: costs its capacity
    cloud = "cloud"  # costs its bill
    unpriced = "unpriced"  # attempts ran on it, but no pool or bill says what it cost: costs 0


@dataclass(frozen=True)
class Interval:
    """One ledger row: an attempt holding GPUs of one flavor from start to end."""

    job_id: str
    attempt: int
    tenant: str
    user: str
    backend: str
    flavor: str
    start: float  # unix seconds
    end: float
    gpus: int
    gpu_used_s: float | None  # GPU-seconds busy within [start, end]; None: unknown (no NVML)
    cpu_s: float
    usd_per_gpu_hour: float

    def __post_init__(self) -> None:
        if self.end < self.start or self.gpus < 0 or self.usd_per_gpu_hour < 0:
            raise ValueError(f"interval {self.job_id}#{self.attempt}: end < start, negative GPUs or price")


@dataclass(frozen=True)
class Pool:
    """An on-prem flavor's capacity over a span (a flavor whose size changed has several)."""

    flavor: str
    backend: str
    start: float
    end: float
    gpus: int  # capacity
    usd_per_gpu_hour: float

    def __post_init__(self) -> None:
        if self.end < self.start or self.gpus < 0 or self.usd_per_gpu_hour < 0:
            raise ValueError(f"pool {self.flavor}: end < start, negative GPUs or price")


@dataclass(frozen=True)
class CloudBill:
    """A cloud flavor's bill within the window, from the cloud's own ledger (several add up)."""

    flavor: str
    usd: float


@dataclass(frozen=True)
class DeskCost:
    """A desk's (or a user's) share of the window's cost."""

    allocated_gpu_s: float = 0.0
    used_gpu_s: float = 0.0  # over intervals whose usage is known
    known_gpu_s: float = 0.0  # allocated GPU-seconds of intervals whose usage is known
    cpu_s: float = 0.0
    allocation_usd: float = 0.0
    idle_in_allocation_usd: float = 0.0  # informational: inside allocation_usd
    idle_share_usd: float = 0.0  # from the idle policy (users: always 0, idle is charged to desks)
    burst_usd: float = 0.0  # allocation on cloud flavors: informational, inside allocation_usd

    @property
    def efficiency(self) -> float | None:
        return self.used_gpu_s / self.known_gpu_s if self.known_gpu_s > 0 else None

    @property
    def total_usd(self) -> float:
        return self.allocation_usd + self.idle_share_usd


@dataclass(frozen=True)
class JobCost:
    """A job's attempts within the window."""

    job_id: str
    tenant: str
    user: str
    allocated_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    known_gpu_s: float = 0.0
    usd: float = 0.0  # its allocation
    idle_in_allocation_usd: float = 0.0

    @property
    def efficiency(self) -> float | None:
        return self.used_gpu_s / self.known_gpu_s if self.known_gpu_s > 0 else None


@dataclass(frozen=True)
class Usage:
    """Totals of one (tenant, user, backend, flavor) series, for metrics."""

    allocated_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    usd: float = 0.0


@dataclass(frozen=True)
class FlavorCost:
    """One flavor's line: fleet_usd = allocation_usd + idle_usd + overhead_usd."""

    flavor: str
    kind: FlavorKind
    fleet_usd: float
    capacity_gpu_s: float  # on-prem only
    allocated_gpu_s: float
    allocation_usd: float
    idle_gpu_s: float  # on-prem only
    idle_usd: float
    idle_shares: dict[str, float]  # tenant -> what the policy charged it
    shared_idle_usd: float
    overhead_usd: float


@dataclass(frozen=True)
class CostReport:
    window: tuple[float, float]
    policy: IdlePolicy
    desks: dict[str, DeskCost]
    users: dict[tuple[str, str], DeskCost]  # (tenant, user)
    jobs: dict[str, JobCost]
    series: dict[tuple[str, str, str, str], Usage]  # (tenant, user, backend, flavor)
    flavors: dict[str, FlavorCost]
    fleet_usd: float
    shared_idle_usd: float
    overhead_usd: float
    fleet_idle_gpu_s: float

    def identity_error(self) -> float:
        """|desk totals + shared idle + overhead - fleet|, relative to the largest of these
        (the fleet's cost, or the desks' charges where a flavor has no cost of its own)."""
        totals = [d.total_usd for d in self.desks.values()]
        gap = math.fsum([*totals, self.shared_idle_usd, self.overhead_usd, -self.fleet_usd])
        scale = max(abs(self.fleet_usd), math.fsum(abs(t) for t in totals), abs(self.overhead_usd), TINY_USD)
        return abs(gap) / scale

    def top_idle_jobs(self, n: int) -> list[JobCost]:
        """The n jobs whose allocation sat idle for the most dollars (known usage only)."""
        known = (j for j in self.jobs.values() if j.known_gpu_s > 0)
        return sorted(known, key=lambda j: (-j.idle_in_allocation_usd, j.job_id))[:n]


@dataclass
class _Tally:
    allocated_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    known_gpu_s: float = 0.0
    cpu_s: float = 0.0
    allocation_usd: float = 0.0
    idle_in_allocation_usd: float = 0.0
    idle_share_usd: float = 0.0
    burst_usd: float = 0.0
    by_flavor_gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, c: _Clipped, cloud: bool) -> None:
        self.allocated_gpu_s += c.gpu_s
        self.cpu_s += c.cpu_s
        self.allocation_usd += c.usd
        if c.used_gpu_s is not None:
            self.used_gpu_s += c.used_gpu_s
            self.known_gpu_s += c.gpu_s
            self.idle_in_allocation_usd += c.idle_usd
        if cloud:
            self.burst_usd += c.usd
        self.by_flavor_gpu_s[c.flavor] += c.gpu_s

    def desk(self) -> DeskCost:
        return DeskCost(**{f.name: getattr(self, f.name) for f in fields(DeskCost)})


@dataclass(frozen=True)
class _Clipped:
    """The part of an interval inside the window."""

    flavor: str
    gpu_s: float
    used_gpu_s: float | None
    cpu_s: float
    usd: float

    @property
    def idle_usd(self) -> float:
        if self.used_gpu_s is None or self.gpu_s <= 0:
            return 0.0
        return self.usd * (1.0 - self.used_gpu_s / self.gpu_s)


def _overlap(start: float, end: float, w0: float, w1: float) -> float:
    return max(0.0, min(end, w1) - max(start, w0))


def _clip(iv: Interval, w0: float, w1: float) -> _Clipped | None:
    seconds = _overlap(iv.start, iv.end, w0, w1)
    if seconds <= 0:
        return None
    fraction = seconds / (iv.end - iv.start)
    gpu_s = iv.gpus * seconds
    used = None
    if iv.gpu_used_s is not None:  # NVML noise never makes a GPU busier than held
        used = min(max(iv.gpu_used_s * fraction, 0.0), gpu_s)
    return _Clipped(iv.flavor, gpu_s, used, iv.cpu_s * fraction, gpu_s * iv.usd_per_gpu_hour / HOUR_S)


def idle_shares(
    policy: IdlePolicy,
    flavor: str,
    idle_usd: float,
    idle_gpu_s: float,
    allocated: Mapping[str, float],
    quotas: Mapping[str, Mapping[str, int]],
    window_s: float,
) -> dict[str, float]:
    """What each tenant pays of one on-prem flavor's idle dollars; the rest stays shared.

    `allocated`: tenant -> its GPU-seconds on the flavor in the window."""
    if idle_usd <= 0:
        return {}
    if policy is IdlePolicy.even:
        owners = sorted(t for t, q in quotas.items() if q.get(flavor, 0) > 0)
        return {t: idle_usd / len(owners) for t in owners}
    if policy is IdlePolicy.proportional:
        total = math.fsum(a for a in allocated.values() if a > 0)
        return {t: idle_usd * a / total for t, a in sorted(allocated.items()) if a > 0} if total > 0 else {}
    if policy is IdlePolicy.owner:
        unused = {
            t: max(0.0, q.get(flavor, 0) * window_s - allocated.get(t, 0.0))
            for t, q in sorted(quotas.items())
            if q.get(flavor, 0) > 0
        }
        reserved = math.fsum(unused.values())
        if reserved <= 0:
            return {}
        # each unused GPU-second at the idle rate, scaled down if reservations exceed the idle
        scale = max(reserved, idle_gpu_s)
        return {t: idle_usd * u / scale for t, u in unused.items() if u > 0}
    return {}


def report(
    intervals: Iterable[Interval],
    pools: Iterable[Pool],
    cloud_bills: Iterable[CloudBill],
    quotas: Mapping[str, Mapping[str, int]],
    policy: IdlePolicy,
    window: tuple[float, float],
) -> CostReport:
    w0, w1 = window
    if w1 < w0:
        raise ValueError(f"window ends before it starts: {window}")
    policy = IdlePolicy(policy)

    bills: dict[str, float] = defaultdict(float)
    for bill in cloud_bills:
        bills[bill.flavor] += bill.usd
    capacity_s, capacity_usd = _capacity(pools, bills, w0, w1)

    held = _Held()
    for iv in intervals:
        c = _clip(iv, w0, w1)
        if c is not None:
            held.add(iv, c, iv.flavor in bills)

    flavors: dict[str, FlavorCost] = {}
    for flavor in sorted(set(bills) | set(capacity_s) | set(held.flavor_s)):
        line = flavors[flavor] = _flavor_line(flavor, bills, capacity_s, capacity_usd, held, policy, quotas, w1 - w0)
        for tenant, usd in line.idle_shares.items():
            held.desks[tenant].idle_share_usd += usd

    for tenant in quotas:  # a desk with a quota and nothing in the window still gets its line
        held.desks.setdefault(tenant, _Tally())
    lines = flavors.values()
    return CostReport(
        window=(w0, w1),
        policy=policy,
        desks={t: d.desk() for t, d in sorted(held.desks.items())},
        users={k: u.desk() for k, u in sorted(held.users.items())},
        jobs=dict(sorted(held.jobs.items())),
        series=dict(sorted(held.series.items())),
        flavors=flavors,
        fleet_usd=math.fsum(f.fleet_usd for f in lines),
        shared_idle_usd=math.fsum(f.shared_idle_usd for f in lines),
        overhead_usd=math.fsum(f.overhead_usd for f in lines),
        fleet_idle_gpu_s=math.fsum(f.idle_gpu_s for f in lines),
    )


def _capacity(pools: Iterable[Pool], bills: Mapping[str, float], w0: float, w1: float):
    """(GPU-seconds, dollars) of each on-prem flavor's pools within the window."""
    capacity_s: dict[str, float] = defaultdict(float)
    capacity_usd: dict[str, float] = defaultdict(float)
    for pool in pools:
        if pool.flavor in bills:
            raise ValueError(f"flavor {pool.flavor!r} has both an on-prem pool and a cloud bill")
        seconds = _overlap(pool.start, pool.end, w0, w1)
        capacity_s[pool.flavor] += pool.gpus * seconds
        capacity_usd[pool.flavor] += pool.gpus * seconds * pool.usd_per_gpu_hour / HOUR_S
    return capacity_s, capacity_usd


@dataclass
class _Held:
    """What the attempts held within the window: by desk, user, job, series and flavor."""

    desks: dict[str, _Tally] = field(default_factory=lambda: defaultdict(_Tally))
    users: dict[tuple[str, str], _Tally] = field(default_factory=lambda: defaultdict(_Tally))
    jobs: dict[str, JobCost] = field(default_factory=dict)
    series: dict[tuple[str, str, str, str], Usage] = field(default_factory=dict)
    flavor_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    flavor_usd: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, iv: Interval, c: _Clipped, cloud: bool) -> None:
        self.desks[iv.tenant].add(c, cloud)
        self.users[(iv.tenant, iv.user)].add(c, cloud)
        self.flavor_s[iv.flavor] += c.gpu_s
        self.flavor_usd[iv.flavor] += c.usd
        job = self.jobs.get(iv.job_id) or JobCost(iv.job_id, iv.tenant, iv.user)
        known = c.used_gpu_s is not None
        self.jobs[iv.job_id] = JobCost(
            job.job_id,
            job.tenant,
            job.user,
            job.allocated_gpu_s + c.gpu_s,
            job.used_gpu_s + (c.used_gpu_s or 0.0),
            job.known_gpu_s + (c.gpu_s if known else 0.0),
            job.usd + c.usd,
            job.idle_in_allocation_usd + c.idle_usd,
        )
        key = (iv.tenant, iv.user, iv.backend, iv.flavor)
        s = self.series.get(key, Usage())
        self.series[key] = Usage(s.allocated_gpu_s + c.gpu_s, s.used_gpu_s + (c.used_gpu_s or 0.0), s.usd + c.usd)


def _flavor_line(
    flavor: str,
    bills: Mapping[str, float],
    capacity_s: Mapping[str, float],
    capacity_usd: Mapping[str, float],
    held: _Held,
    policy: IdlePolicy,
    quotas: Mapping[str, Mapping[str, int]],
    window_s: float,
) -> FlavorCost:
    """One flavor's line: its cost (bill, capacity or none), what was held of it, its idle and
    who pays for that idle under the policy."""
    alloc_s, alloc_usd = held.flavor_s.get(flavor, 0.0), held.flavor_usd.get(flavor, 0.0)
    if flavor in bills:
        kind, fleet, cap_s, idle_s, idle_usd = FlavorKind.cloud, bills[flavor], 0.0, 0.0, 0.0
    elif flavor in capacity_s:
        kind, fleet, cap_s = FlavorKind.pool, capacity_usd[flavor], capacity_s[flavor]
        idle_s = max(0.0, cap_s - alloc_s)
        idle_usd = idle_s * fleet / cap_s if cap_s > 0 else 0.0  # at the pools' mean price
    else:
        kind, fleet, cap_s, idle_s, idle_usd = FlavorKind.unpriced, 0.0, 0.0, 0.0, 0.0
    on_flavor = {t: d.by_flavor_gpu_s[flavor] for t, d in held.desks.items() if flavor in d.by_flavor_gpu_s}
    shares = idle_shares(policy, flavor, idle_usd, idle_s, on_flavor, quotas, window_s)
    return FlavorCost(
        flavor=flavor,
        kind=kind,
        fleet_usd=fleet,
        capacity_gpu_s=cap_s,
        allocated_gpu_s=alloc_s,
        allocation_usd=alloc_usd,
        idle_gpu_s=idle_s,
        idle_usd=idle_usd,
        idle_shares=shares,
        shared_idle_usd=idle_usd - math.fsum(shares.values()),
        overhead_usd=fleet - alloc_usd - idle_usd,
    )
