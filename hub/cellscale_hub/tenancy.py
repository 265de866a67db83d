"""Tenancy as data, in Kueue's nouns.

- A **ResourceFlavor** is one kind of node on one backend (`flavors`): a GPU type, or a CPU
  pool.
- A **ClusterQueue** holds a quota per flavor: `nominal` GPUs it is guaranteed,
  `borrowing_limit` (how many more it may borrow from its cohort; absent: no limit) and
  `lending_limit` (how many of its nominal GPUs others may borrow; absent: all of them), and
  the same three numbers for `cpu` (cores) and `memory` (MiB, or with units) where the
  queue's CPUs and memory are quota'd.
- **Cohorts** form a tree (firm → division → desk): ClusterQueues in one tree lend to each
  other, and each node's `weight` sets its fair share among its siblings.
- A **tenant** is a JupyterHub group (a desk); its **LocalQueues** point at ClusterQueues.
- **Priority classes** order jobs before fair share does.
- A **site** is a datacenter or a cloud burst pool (`sites`): what a GPU-hour costs there, and
  for a cloud the boot time and the billed idle tail; a flavor names its site. **Datasets**
  live at a home site; moving them (or a checkpoint) elsewhere costs egress and time. A
  tenant may burst to the cloud (`burst`) within a dollar `budget` per period, and says what
  an hour of waiting for one GPU is worth to it (`wait_usd_per_gpu_hour`): placement weighs
  start time, dollars, data and budget with these (`scheduling.sites`).

The YAML the control plane is seeded from (config/tenants.yaml) has exactly this shape; the
admin API edits the stored copy and records every change.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from functools import cached_property
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from cellscale.spec import DataUrl, DataVersion, parse_memory_mb
from cellscale.vocabulary import BurstPolicy, IdlePolicy, Resource

DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY_CLASS = "normal"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SiteKind(StrEnum):
    onprem = "onprem"  # a datacenter the firm runs: its GPU-hour is an amortised cost
    cloud = "cloud"  # capacity rented by the second: booted on demand, powered down after an idle tail


class Site(Strict):
    """Where a flavor's nodes are: a datacenter or a cloud burst pool, and what using it costs."""

    kind: SiteKind = SiteKind.onprem
    gpu_hour_usd: float = Field(0.0, ge=0, description="Dollars per GPU-hour (on-prem: amortised; cloud: the price).")
    boot_s: float = Field(
        0.0, ge=0, description="Cloud: seconds from the request to the nodes running jobs (measured)."
    )
    idle_tail_s: float = Field(
        0.0, ge=0, description="Cloud: seconds a node stays up (and billed) after its job, before it powers down."
    )
    egress_usd_per_gb: float = Field(0.0, ge=0, description="Dollars to move one GB out of this site.")
    bandwidth_gb_s: float = Field(1.0, gt=0, description="GB per second data moves out of this site.")


class Dataset(Strict):
    """A named dataset with a home site (where reading it costs nothing extra), and where it is:
    `--data NAME` stages this URL at this version onto the job's nodes."""

    site: str
    size_gb: float = Field(0.0, ge=0)
    url: DataUrl | None = Field(None, description="fsspec URL of its directory or file (s3://bucket/prefix).")
    version: DataVersion | None = Field(None, description="The version jobs read unless they name another.")
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="fsspec options that are not secrets (endpoint_url); credentials come "
        "from the nodes' environment or the job's --env.",
    )


class Budget(Strict):
    """A desk's budget per period (a rolling window): dollars, GPU-hours, or both. It covers
    all its spend (`covers: all`: GPU-hours at each flavor's price, cloud bills) or only the
    cloud's (`covers: cloud`). Placement never bursts past its dollars; crossing each
    `warn_at` fraction is reported (desk quota view, `/metrics`, the DeskBudgetBurnTooFast
    alert); with `hard_stop` the desk's new work is held once it is spent."""

    usd: float | None = Field(None, ge=0, description="Dollars per period; absent: no dollar limit.")
    gpu_hours: float | None = Field(
        None, ge=0, exclude_if=lambda value: value is None, description="GPU-hours per period; absent: no limit."
    )
    period: Literal["day", "week", "month"] = "week"
    covers: Literal["all", "cloud"] = Field(
        "all", exclude_if=lambda value: value == "all", description="What counts against it: all spend or the cloud's."
    )
    warn_at: tuple[float, ...] = Field(
        (0.5, 0.8, 1.0),
        exclude_if=lambda value: value == (0.5, 0.8, 1.0),
        description="Fractions of the budget at which the desk is warned.",
    )
    hard_stop: bool = Field(
        False, exclude_if=lambda value: not value, description="Hold the desk's new work once the budget is spent."
    )

    @model_validator(mode="after")
    def _a_limit(self) -> Budget:
        if self.usd is None and self.gpu_hours is None:
            raise ValueError("a budget needs usd, gpu_hours or both")
        if any(not 0 < f <= 10 for f in self.warn_at):
            raise ValueError("warn_at fractions must be above 0 (1.0 = the whole budget)")
        return self

    @property
    def seconds(self) -> float:
        return {"day": 86400.0, "week": 7 * 86400.0, "month": 30 * 86400.0}[self.period]

    @property
    def period_words(self) -> str:
        return {"day": "daily", "week": "weekly", "month": "monthly"}[self.period]


class CostPolicy(Strict):
    idle: IdlePolicy = Field(IdlePolicy.proportional, description="Who pays for the fleet's idle GPUs.")


class Flavor(Strict):
    backend: str = Field(description="The backend whose nodes this flavor names.")
    site: str | None = Field(
        None,
        exclude_if=lambda value: value is None,
        description="The site (datacenter or cloud pool) of these nodes; jobs are placed across the sites of "
        "their queue's flavors.",
    )
    gpu_hour_usd: float | None = Field(
        None,
        ge=0,
        exclude_if=lambda value: value is None,
        description="Dollars per GPU-hour on this flavor; absent: its site's price (0 without a site).",
    )
    cpu_only: bool = Field(
        False,
        exclude_if=lambda value: not value,
        description="A CPU node pool: jobs without GPUs go to a queue's CPU pools when it has any (and GPU "
        "jobs never do), so CPU work does not take the cores GPU jobs need on GPU nodes.",
    )


MAX_QUOTA_GPUS = 1_000_000
"""The largest quota figure accepted: more GPUs than any fleet has, and far inside every store's integers."""


MAX_QUOTA_AMOUNT = 2**50
"""The largest CPU or memory (MiB) quota figure accepted."""


class ResourceQuota(Strict):
    """One resource's share of a flavor: the same three numbers Kueue gives every covered resource."""

    nominal: int = Field(0, ge=0, le=MAX_QUOTA_AMOUNT, description="Guaranteed to this queue.")
    borrowing_limit: int | None = Field(
        None, ge=0, le=MAX_QUOTA_AMOUNT, description="Most it may borrow; absent: no limit."
    )
    lending_limit: int | None = Field(
        None, ge=0, le=MAX_QUOTA_AMOUNT, description="Most of its nominal others may borrow; absent: all."
    )

    @model_validator(mode="after")
    def _lending_within_nominal(self) -> ResourceQuota:
        if self.lending_limit is not None and self.lending_limit > self.nominal:
            raise ValueError(f"lending_limit {self.lending_limit} exceeds nominal {self.nominal}")
        return self

    @property
    def lendable(self) -> int:
        return self.nominal if self.lending_limit is None else self.lending_limit


class MemoryQuota(ResourceQuota):
    """Memory in MiB; the YAML may write sizes with units ("512Gi", "64G", "1T")."""

    @model_validator(mode="before")
    @classmethod
    def _sizes(cls, value):
        if isinstance(value, dict):
            return {k: parse_memory_mb(v) if isinstance(v, str) else v for k, v in value.items()}
        return value


class Quota(ResourceQuota):
    """A ClusterQueue's quota on one flavor: GPUs in the top-level fields (as before CPUs and
    memory were quota'd), and optionally CPUs and memory. A resource without a quota here is
    bounded only by the flavor's capacity; a CPU pool is a flavor with `nominal: 0` GPUs and a
    `cpu` quota."""

    nominal: int = Field(0, ge=0, le=MAX_QUOTA_GPUS, description="GPUs guaranteed to this queue.")
    borrowing_limit: int | None = Field(
        None, ge=0, le=MAX_QUOTA_GPUS, description="Most GPUs it may borrow; absent: no limit."
    )
    lending_limit: int | None = Field(
        None, ge=0, le=MAX_QUOTA_GPUS, description="Most of its nominal GPUs others may borrow; absent: all."
    )
    cpu: ResourceQuota | None = Field(
        None, description="CPU cores; absent: not limited by quota.", exclude_if=lambda value: value is None
    )
    memory: MemoryQuota | None = Field(
        None,
        description="Memory in MiB (or with units); absent: not limited by quota.",
        exclude_if=lambda value: value is None,
    )

    def of(self, resource: Resource) -> ResourceQuota | None:
        """The quota of one resource; None: not limited by quota."""
        if resource is Resource.gpu:
            return self
        return self.cpu if resource is Resource.cpu else self.memory


class ResourceWeights(Strict):
    """What one unit of each resource weighs in fair share and in choosing preemption victims,
    in GPU-equivalents (as Slurm's TRESBillingWeights): a job's weight is the sum over its
    resources. The defaults price a core at 1/16 of a GPU and a GiB of memory at 1/128; a
    GPU-only job weighs its GPUs, as before CPUs and memory were counted."""

    gpu: float = Field(1.0, ge=0)
    cpu: float = Field(0.0625, ge=0)
    memory_gib: float = Field(0.0078125, ge=0, description="Per GiB of memory.")


class Ordering(Strict):
    """How work is ordered, backfilled and preempted INSIDE each ClusterQueue, after quotas,
    borrowing and fair share between desks have had their say (`scheduling.cycle`).

    Least attained service, discretized (as in Tiresias): a job's level is how many of
    `service_levels_gpu_hours` the GPU-hours it has already received (all attempts) have
    passed; a lower level goes first, then submit time. No run-time knowledge is needed:
    short cells finish in level 0 while long trainings sink. A job that waits
    `promote_after_hours` goes back to level 0 (it cannot starve behind new work)."""

    service_levels_gpu_hours: list[float] = Field(
        default_factory=lambda: [1.0, 10.0, 100.0],
        description="Attained-service thresholds, increasing; empty: submit order only.",
    )
    backfill: bool = Field(
        True,
        description="Jobs behind a waiting job may start when they fit, until it reserves (reserve_after_minutes).",
    )
    reserve_after_minutes: float = Field(
        30.0,
        ge=0,
        description="A waiting job this old reserves its flavor: nothing behind it starts there unless its --time "
        "ends before the reservation's estimated start.",
    )
    promote_after_hours: float = Field(
        8.0, gt=0, description="A job that has waited this long goes back to the lowest level (no starvation)."
    )
    preempt_for_service: bool = Field(
        True,
        description="A waiting job may preempt its own queue's jobs of a higher level (more service received).",
    )
    preempt_levels_apart: int = Field(
        1,
        ge=1,
        description="A job preempts only jobs at least this many levels above its own: a long training for a short "
        "cell, not one short job for another.",
    )
    fresh_checkpoint_minutes: float = Field(
        10.0,
        ge=0,
        description="Such a victim must have checkpointed (or started) at most this long ago: little work is lost.",
    )
    max_preemptions: int = Field(
        2,
        ge=0,
        description="A job preempted this many times is no longer preempted for service (quota reclaim still may).",
    )

    @classmethod
    def submit_order(cls) -> Ordering:
        """Strict submit order: a waiting head blocks its queue, no preemption for service."""
        return cls(service_levels_gpu_hours=[], backfill=False, preempt_for_service=False)

    @model_validator(mode="after")
    def _levels_increase(self) -> Ordering:
        levels = self.service_levels_gpu_hours
        if any(b <= a for a, b in zip(levels, levels[1:], strict=False)) or any(x <= 0 for x in levels):
            raise ValueError("service_levels_gpu_hours must be positive and increasing")
        return self


SHORT_WORK_SHARE = 0.1  # the default short-work share of a cohort tree: a tenth of its GPUs


class Cohort(Strict):
    parent: str | None = None
    weight: float = Field(1.0, gt=0, description="Fair-share weight among its siblings.")
    short_work_share: float = Field(
        SHORT_WORK_SHARE,
        ge=0,
        le=1,
        exclude_if=lambda value: value == SHORT_WORK_SHARE,
        description="On a tree's root cohort: the fraction of its GPUs (nominal, per flavor) that level-0 work of any "
        "desk may use on idle GPUs beyond its desk's quota, not reclaimed while it stays at level 0. 0: off.",
    )


class ClusterQueue(Strict):
    cohort: str | None = None
    weight: float = Field(1.0, gt=0, description="Fair-share weight among its siblings.")
    quotas: dict[str, Quota] = Field(default_factory=dict, description="Per flavor, tried in this order.")


class LocalQueue(Strict):
    cluster_queue: str


class Tenant(Strict):
    queues: dict[str, LocalQueue]
    burst: BurstPolicy = Field(
        BurstPolicy.never,
        exclude_if=lambda value: value == BurstPolicy.never,
        description="Whether its jobs may go to cloud sites by default (--burst overrides).",
    )
    budget: Budget | None = Field(
        None, exclude_if=lambda value: value is None, description="Its spending limit per period."
    )
    wait_usd_per_gpu_hour: float = Field(
        2.0,
        ge=0,
        exclude_if=lambda value: value == 2.0,
        description="What one GPU-hour of waiting is worth to the desk: placement pays up to this to start sooner.",
    )


class Tenancy(Strict):
    flavors: dict[str, Flavor] = Field(default_factory=dict)
    sites: dict[str, Site] = Field(default_factory=dict, exclude_if=lambda value: not value)
    datasets: dict[str, Dataset] = Field(default_factory=dict, exclude_if=lambda value: not value)
    cohorts: dict[str, Cohort] = Field(default_factory=dict)
    cluster_queues: dict[str, ClusterQueue] = Field(default_factory=dict)
    tenants: dict[str, Tenant] = Field(default_factory=dict)
    priority_classes: dict[str, int] = Field(
        default_factory=lambda: {"low": -100, DEFAULT_PRIORITY_CLASS: 0, "high": 100}
    )
    resource_weights: ResourceWeights = Field(default_factory=ResourceWeights)
    cost: CostPolicy = Field(default_factory=CostPolicy, exclude_if=lambda value: value == CostPolicy())
    ordering: Ordering = Field(default_factory=Ordering, exclude_if=lambda value: value == Ordering())

    @model_validator(mode="after")
    def _references_resolve(self) -> Tenancy:
        for name, flavor in self.flavors.items():
            if flavor.site is not None and flavor.site not in self.sites:
                raise ValueError(
                    f"flavor {name!r}: site {flavor.site!r} is not defined "
                    f"(sites: {', '.join(sorted(self.sites)) or 'none'})"
                )
        for name, dataset in self.datasets.items():
            if dataset.site not in self.sites:
                raise ValueError(f"dataset {name!r}: site {dataset.site!r} is not defined")
        for name, cohort in self.cohorts.items():
            if cohort.parent is not None and cohort.parent not in self.cohorts:
                raise ValueError(f"cohort {name!r}: parent {cohort.parent!r} is not a cohort")
        for name in self.cohorts:
            self._cohort_path(name)  # raises on a cycle
        for name in (
            c for c, cohort in self.cohorts.items() if cohort.parent and "short_work_share" in cohort.model_fields_set
        ):
            raise ValueError(f"cohort {name!r}: set short_work_share on its tree's root {self._cohort_path(name)[0]!r}")
        for name, cq in self.cluster_queues.items():
            if cq.cohort is not None and cq.cohort not in self.cohorts:
                raise ValueError(f"cluster queue {name!r}: cohort {cq.cohort!r} is not defined")
            for flavor in cq.quotas:
                if flavor not in self.flavors:
                    raise ValueError(
                        f"cluster queue {name!r}: flavor {flavor!r} is not defined "
                        f"(flavors: {', '.join(sorted(self.flavors))})"
                    )
        for tenant, config in self.tenants.items():
            for queue, local in config.queues.items():
                if local.cluster_queue not in self.cluster_queues:
                    raise ValueError(
                        f"tenant {tenant!r} queue {queue!r}: cluster queue {local.cluster_queue!r} is not defined"
                    )
        if DEFAULT_PRIORITY_CLASS not in self.priority_classes:
            raise ValueError(f"priority_classes must define {DEFAULT_PRIORITY_CLASS!r}")
        return self

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, text: str) -> Tenancy:
        return cls.model_validate(yaml.safe_load(text) or {})

    @classmethod
    def single(cls, tenant: str, capacities: dict[str, int]) -> Tenancy:
        """One tenant owning every backend's whole capacity (a personal control plane)."""
        return cls(
            flavors={backend: Flavor(backend=backend) for backend in capacities},
            cluster_queues={tenant: ClusterQueue(quotas={b: Quota(nominal=gpus) for b, gpus in capacities.items()})},
            tenants={tenant: Tenant(queues={DEFAULT_QUEUE: LocalQueue(cluster_queue=tenant)})},
        )

    # -- lookups ---------------------------------------------------------------------------
    def tenants_of(self, groups: list[str]) -> list[str]:
        return sorted(group for group in groups if group in self.tenants)

    def resolve_queue(self, tenant: str, queue: str | None) -> tuple[str, str]:
        """(LocalQueue, ClusterQueue) a job of `tenant` lands in; a ValueError names the choices."""
        queues = self.tenants[tenant].queues
        name = queue or (DEFAULT_QUEUE if DEFAULT_QUEUE in queues else next(iter(queues)))
        if name not in queues:
            raise ValueError(f"tenant {tenant!r} has no queue {name!r}; its queues are: {', '.join(sorted(queues))}")
        return name, queues[name].cluster_queue

    def priority_of(self, priority_class: str | None) -> int:
        name = priority_class or DEFAULT_PRIORITY_CLASS
        if name not in self.priority_classes:
            raise ValueError(f"unknown priority class {name!r}; classes: {', '.join(sorted(self.priority_classes))}")
        return self.priority_classes[name]

    def flavors_for(self, cluster_queue: str, backend: str | None = None) -> list[str]:
        """The queue's flavors in the order admission tries them, optionally on one backend."""
        return [
            f
            for f in self.cluster_queues[cluster_queue].quotas
            if backend is None or self.flavors[f].backend == backend
        ]

    def site_of(self, flavor: str) -> Site | None:
        name = self.flavors[flavor].site
        return None if name is None else self.sites[name]

    def is_cloud(self, flavor: str) -> bool:
        site = self.site_of(flavor)
        return site is not None and site.kind is SiteKind.cloud

    def price_of(self, flavor: str) -> float:
        """Dollars per GPU-hour on the flavor: its own price, else its site's."""
        config = self.flavors[flavor]
        if config.gpu_hour_usd is not None:
            return config.gpu_hour_usd
        site = self.site_of(flavor)
        return site.gpu_hour_usd if site else 0.0

    def is_cloud_site(self, site: str) -> bool:
        return self.sites[site].kind is SiteKind.cloud

    def fair_share_path(self, cluster_queue: str) -> list[str]:
        """Node names from the root down to the queue: cohorts as `cohort:NAME`, then `cq:NAME`."""
        cohort = self.cluster_queues[cluster_queue].cohort
        return ([f"cohort:{c}" for c in self._cohort_path(cohort)] if cohort else []) + [f"cq:{cluster_queue}"]

    def weight_of(self, node: str) -> float:
        kind, _, name = node.partition(":")
        return self.cohorts[name].weight if kind == "cohort" else self.cluster_queues[name].weight

    def root_of(self, cluster_queue: str) -> str:
        """The tree a queue borrows within: its top-most cohort, or itself when it has none."""
        return self._roots[cluster_queue]

    def members(self, root: str) -> Iterator[str]:
        """The cluster queues that borrow and lend within one tree."""
        return iter(self._trees.get(root, ()))

    @cached_property
    def _roots(self) -> dict[str, str]:  # a Tenancy is replaced, never edited, once validated
        return {
            name: f"cohort:{self._cohort_path(cq.cohort)[0]}" if cq.cohort else f"cq:{name}"
            for name, cq in self.cluster_queues.items()
        }

    @cached_property
    def _trees(self) -> dict[str, list[str]]:
        trees: dict[str, list[str]] = {}
        for name, root in self._roots.items():
            trees.setdefault(root, []).append(name)
        return trees

    def max_admissible(self, cluster_queue: str, flavor: str, resource: Resource = Resource.gpu) -> int | None:
        """The most of `resource` on `flavor` one job of this queue could ever get: its nominal
        quota plus what it may borrow, and no more than the others in its tree may lend (None:
        the queue has no quota on that resource, so only the flavor's capacity bounds it)."""
        own = self.cluster_queues[cluster_queue].quotas[flavor].of(resource)
        if own is None:
            return None
        lendable = 0
        for other in self.members(self.root_of(cluster_queue)):
            theirs = self.cluster_queues[other].quotas.get(flavor)
            if other != cluster_queue and theirs is not None and theirs.of(resource) is not None:
                lendable += theirs.of(resource).lendable
        borrowable = lendable if own.borrowing_limit is None else min(own.borrowing_limit, lendable)
        return own.nominal + borrowable

    def _cohort_path(self, cohort: str) -> list[str]:
        path: list[str] = []
        node: str | None = cohort
        while node is not None:
            if node in path:
                raise ValueError(f"cohorts form a cycle: {' → '.join([*path, node])}")
            path.append(node)
            node = self.cohorts[node].parent
        return list(reversed(path))
