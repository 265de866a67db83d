"""`/metrics` in Prometheus' exposition format.

Counters of the ledger (GPU-seconds allocated and used, dollars) grow as the controller writes
its rows, starting from the ledger's totals when the control plane starts; admission waits,
evictions and cycle times are observed as they happen; gauges (GPUs held and present, pending
jobs by reason, quota, budgets) are read at scrape time. Labels are desks, users, backends,
flavors, queues and reasons: bounded by the tenancy, never a job id (kueue#972).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from cellscale.vocabulary import ACTIVE_ATTEMPT_STATES, QUOTA_HOLDING_PHASES, EventReason, Fault, Phase
from cellscale_hub.drivers import Driver, flavor_capacities
from cellscale_hub.store import Store, usage
from cellscale_hub.store.models import Attempt, Job, LedgerHour, LedgerRow, utcnow
from cellscale_hub.store.tenancy_book import TenancyBook
from cellscale_hub.tenancy import Tenancy
from cellscale_hub.waiting import WaitingBoard

SERIES = ("tenant", "user", "backend", "flavor")
# preempted, or a retry: its fault
EVICTION_REASONS = (EventReason.Preempted.value, *(f.value for f in Fault if f is not Fault.PREEMPTION))
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, float("inf"))
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, float("inf"))


class Metrics:
    """The control plane's instruments, on their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.allocated = Counter(
            "cellscale_gpu_allocated_seconds",
            "GPU-seconds held by attempts (gang x wall time).",
            SERIES,
            registry=self.registry,
        )
        self.used = Counter(
            "cellscale_gpu_used_seconds",
            "GPU-seconds the GPUs were busy, where the nodes sampled them.",
            SERIES,
            registry=self.registry,
        )
        self.cost = Counter(
            "cellscale_cost_dollars",
            "Dollars of allocation (GPU-hours at the flavor's price).",
            SERIES,
            registry=self.registry,
        )
        self.evicted = Counter(
            "cellscale_evicted_jobs",
            "Attempts stopped before their end and requeued, by reason.",
            ("tenant", "reason"),
            registry=self.registry,
        )
        self.admission_wait = Histogram(
            "cellscale_admission_wait_seconds",
            "Seconds from submit (or requeue) to admission.",
            ("tenant",),
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.lender_wait = Histogram(
            "cellscale_short_share_lender_wait_seconds",
            "Seconds a job within its desk's nominal quota waited while its cohort's short-work share lent GPUs "
            "in its way, by tree (root cohort).",
            ("cohort",),
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.lender_wait_max: dict[str, float] = {}  # root cohort -> the longest such wait since start
        self.cycle = Histogram(
            "cellscale_controller_cycle_seconds",
            "Seconds one reconcile cycle took.",
            buckets=CYCLE_BUCKETS,
            registry=self.registry,
        )

    def seed(self, store: Store) -> None:
        """Start the ledger's counters at its totals (a restart is not a counter reset)."""
        labels = (LedgerHour.tenant, LedgerHour.owner, LedgerHour.backend, LedgerHour.flavor)
        query = select(
            *labels, func.sum(LedgerHour.gpu_s), func.sum(LedgerHour.gpu_used_s), func.sum(LedgerHour.usd)
        ).group_by(*labels)
        with store.session() as session:
            for tenant, owner, backend, flavor, gpu_s, used, usd in session.execute(query):
                series = (tenant, owner, backend, flavor)
                self.allocated.labels(*series).inc(gpu_s or 0.0)
                self.used.labels(*series).inc(used or 0.0)
                self.cost.labels(*series).inc(usd or 0.0)

    def metered(self, row: LedgerRow) -> None:
        labels = (row.tenant, row.owner, row.backend, row.flavor)
        self.allocated.labels(*labels).inc(row.gpu_s)
        if row.gpu_used_s is not None:
            self.used.labels(*labels).inc(row.gpu_used_s)
        self.cost.labels(*labels).inc(row.usd)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def watch(self, state: State) -> None:
        """Add the gauges read at scrape time, and start each desk's eviction counts at 0 (a
        desk never evicted reads 0, not "no data")."""
        self.registry.register(Gauges(state))
        for tenant in state.tenancy.current.tenants:
            for reason in EVICTION_REASONS:
                self.evicted.labels(tenant, reason)


@dataclass
class State:
    """Where the gauges are read from at scrape time."""

    store: Store
    tenancy: TenancyBook
    drivers: dict[str, Driver]
    waiting: WaitingBoard


class Gauges(Collector):
    def __init__(self, state: State) -> None:
        self.state = state

    def describe(self) -> list:
        return []  # read at scrape time: nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s, tenancy = self.state, self.state.tenancy.current
        with s.store.session() as session:
            yield _held(session, tenancy)
            yield from _pending(session, s.waiting)
            yield _quota(session, tenancy)
            yield from _budgets(session, tenancy)
        yield _capacity(tenancy, s.drivers)


def _family(name: str, doc: str, labels: tuple[str, ...], rows: dict[tuple, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for key, value in sorted(rows.items()):
        family.add_metric(list(key), value)
    return family


def _held(session, tenancy: Tenancy) -> GaugeMetricFamily:
    """GPUs held per desk and flavor: every flavor a desk's queues have quota on, 0 when idle (a
    series that vanished would read as "no data", not as nothing held)."""
    query = (
        select(Job.tenant, Attempt.backend, func.coalesce(Attempt.flavor, Attempt.backend), func.sum(Job.gpus))
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Attempt.state.in_(ACTIVE_ATTEMPT_STATES))
        .group_by(Job.tenant, Attempt.backend, func.coalesce(Attempt.flavor, Attempt.backend))
    )
    rows = {
        (tenant, tenancy.flavors[f].backend, f): 0.0
        for tenant, config in tenancy.tenants.items()
        for local in config.queues.values()
        for f in tenancy.cluster_queues[local.cluster_queue].quotas
    }
    rows.update({(t, b, f): float(n or 0) for t, b, f, n in session.execute(query)})
    return _family("cellscale_gpus_allocated", "GPUs held by active attempts.", ("tenant", "backend", "flavor"), rows)


def _pending(session, waiting: WaitingBoard) -> Iterator[GaugeMetricFamily]:
    codes = waiting.codes()
    rows: dict[tuple, float] = defaultdict(float)
    query = select(Job.id, Job.tenant, Job.queue).where(Job.phase == Phase.PENDING)
    for job_id, tenant, queue in session.execute(query):
        rows[tenant, queue, codes.get(job_id, "NotYetScheduled")] += 1
    yield _family("cellscale_pending_jobs", "Jobs waiting for admission, by why.", ("tenant", "queue", "reason"), rows)


def _quota(session, tenancy: Tenancy) -> GaugeMetricFamily:
    # what usage.holders() adds up, as one aggregate: not every holding job's row and attempts
    query = (
        select(Job.cluster_queue, Job.flavor, func.sum(Job.gpus))
        .where(Job.phase.in_(QUOTA_HOLDING_PHASES), Job.flavor.is_not(None))
        .group_by(Job.cluster_queue, Job.flavor)
    )
    held: dict[tuple[str, str], int] = {(cq, flavor): int(n or 0) for cq, flavor, n in session.execute(query)}
    rows: dict[tuple, float] = {}
    for (cq, flavor), lent in lent_gpus(tenancy, held).items():
        quota = tenancy.cluster_queues[cq].quotas[flavor]
        used = held.get((cq, flavor), 0)
        rows[cq, flavor, "nominal"] = quota.nominal
        rows[cq, flavor, "used"] = used
        rows[cq, flavor, "borrowed"] = max(0, used - quota.nominal)
        rows[cq, flavor, "lent"] = lent
    return _family(
        "cellscale_quota_gpus", "Quota per cluster queue and flavor.", ("cluster_queue", "flavor", "kind"), rows
    )


def lent_gpus(tenancy: Tenancy, held: dict[tuple[str, str], int]) -> dict[tuple[str, str], float]:
    """Per (queue, flavor): GPUs of its nominal quota other queues of its tree use now. What a
    tree borrows is spread over its lenders in proportion to the lendable quota they leave unused."""
    out: dict[tuple[str, str], float] = {}
    trees: dict[tuple[str, str], list[str]] = defaultdict(list)
    for cq, config in tenancy.cluster_queues.items():
        for flavor in config.quotas:
            trees[tenancy.root_of(cq), flavor].append(cq)
    for (_, flavor), members in trees.items():
        quotas = {cq: tenancy.cluster_queues[cq].quotas[flavor] for cq in members}
        borrowed = sum(max(0, held.get((cq, flavor), 0) - q.nominal) for cq, q in quotas.items())
        spare = {cq: max(0, min(q.lendable, q.nominal - held.get((cq, flavor), 0))) for cq, q in quotas.items()}
        total = sum(spare.values())
        for cq in members:
            out[cq, flavor] = borrowed * spare[cq] / total if total else 0.0
    return out


def _budgets(session, tenancy: Tenancy) -> Iterator[GaugeMetricFamily]:
    spend = usage.budget_spend(session, tenancy, utcnow())
    budget = GaugeMetricFamily(
        "cellscale_budget_dollars", "A desk's budget for its period.", labels=["tenant", "period"]
    )
    spent = GaugeMetricFamily(
        "cellscale_budget_spent_dollars", "A desk's spend within its budget's period.", labels=["tenant", "period"]
    )
    period = GaugeMetricFamily(
        "cellscale_budget_period_seconds", "The length of a desk's budget period.", labels=["tenant"]
    )
    for tenant, s in sorted(spend.items()):
        if s.budget.usd is not None:
            budget.add_metric([tenant, s.budget.period], s.budget.usd)
        spent.add_metric([tenant, s.budget.period], s.spent_usd)
        period.add_metric([tenant], s.budget.seconds)
    yield from (budget, spent, period)


def _capacity(tenancy: Tenancy, drivers: dict[str, Driver]) -> GaugeMetricFamily:
    rows = {
        (tenancy.flavors[f].backend, f): float(amounts.gpu)
        for f, amounts in flavor_capacities(tenancy, drivers).items()
        if f in tenancy.flavors
    }
    return _family("cellscale_gpus_capacity", "GPUs of each flavor's backend now.", ("backend", "flavor"), rows)
