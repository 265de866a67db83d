"""The Slurm mirror of the desks: each desk's Slurm account gets a GrpTRES ceiling per
resource and a Fairshare, so that Slurm never holds back a job cellscale admitted, and a job
submitted around cellscale meets the same ceiling."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cellscale.vocabulary import Resource
from cellscale_hub.drivers.capabilities import MirrorsTenancy
from cellscale_hub.drivers.slurm.script import SAFE_NAME
from cellscale_hub.scheduling.fairshare import FairTree
from cellscale_hub.scheduling.resources import RESOURCES, Amounts
from cellscale_hub.scheduling.usage import QuotaBook
from cellscale_hub.tenancy import Tenancy


class SlurmAccounts(MirrorsTenancy):
    """A mixin of `SlurmDriver` (traits `account`, `shares_accounts_with`)."""

    def apply_tenancy(self, tenancy: Tenancy) -> None:
        """Mirror each desk's quota and fair share onto its Slurm account (see
        `account_limits`); accounts Slurm does not know are left to the Slurm admin."""
        if self.account:
            return  # one fixed account: the Slurm admin's to limit
        backends = [self.name, *self.shares_accounts_with]
        cluster = self.cluster_name()
        assocs = ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"cluster={cluster}", "format=account"]
        known = set(self._run(assocs).split())
        for account, limits in account_limits(tenancy, backends, self._cluster_amounts()).items():
            if account not in known:
                self.log.warning("Slurm cluster %s has no account %s: its quota is not mirrored", cluster, account)
                continue
            self._run(
                [
                    "sacctmgr",
                    "-i",
                    "modify",
                    "account",
                    "where",
                    f"name={account}",
                    f"cluster={cluster}",  # this backend's cluster only: another site's association is its own
                    "set",
                    limits.grp_tres,
                    f"Fairshare={limits.shares}",
                ]
            )


@dataclass(frozen=True)
class AccountLimits:
    """What one desk's Slurm account is set to: a GrpTRES ceiling per resource (None: no
    limit, written -1 so an earlier one is cleared) and its Fairshare."""

    gpus: int | None
    cpus: int | None
    memory_mb: int | None
    shares: int

    @property
    def grp_tres(self) -> str:
        memory = "-1" if self.memory_mb is None else f"{self.memory_mb}M"
        return f"GrpTRES=cpu={_limit(self.cpus)},mem={memory},gres/gpu={_limit(self.gpus)}"


def account_limits(tenancy: Tenancy, backends: Iterable[str], cluster: Amounts) -> dict[str, AccountLimits]:
    """Per Slurm account (= tenant) with flavors on `backends` (the partitions of one cluster):
    its GrpTRES ceilings and Fairshare.

    Each ceiling is the most cellscale could ever admit for the tenant of that resource on
    those backends' flavors (nominal + borrowable, summed over the flavors, at most the whole
    cluster), so Slurm never holds back a job cellscale admitted, and a job submitted around
    cellscale meets the same ceiling. A resource one of those flavors does not quota is bounded
    there only by capacity, so the account gets no limit on it. Fairshare is the tenant's
    entitled fraction of the fleet from the cohort tree's weights, in thousandths, so Slurm's
    own fair-share factor orders anything it orders the way cellscale would."""
    tree = FairTree.of(tenancy)
    short = _short_rooms(tenancy)
    backends = list(backends)
    limits: dict[str, AccountLimits] = {}
    for tenant, config in tenancy.tenants.items():
        if not SAFE_NAME.match(tenant):
            continue  # not a valid Slurm account name: such a tenant cannot submit to Slurm either
        queues = {local.cluster_queue for local in config.queues.values()}
        placed = [(cq, flavor) for cq in queues for backend in backends for flavor in tenancy.flavors_for(cq, backend)]
        if not placed:
            continue
        ceilings = [
            _ceiling(tenancy, placed, resource, cap, short) for resource, cap in zip(RESOURCES, cluster, strict=True)
        ]
        fraction = sum(_entitled(tree, cq) for cq in {cq for cq, _ in placed})
        limits[tenant] = AccountLimits(*ceilings, shares=max(1, round(1000 * fraction)))
    return limits


def _ceiling(
    tenancy: Tenancy, placed: list[tuple[str, str]], resource: Resource, cap: int, short: dict[tuple[str, str], int]
) -> int | None:
    """The most of `resource` these (cluster queue, flavor) pairs could hold at once (GPUs: and
    what their trees' short-work shares may lend them beyond it); None when one of them has no
    quota on it."""
    amounts = [tenancy.max_admissible(cq, flavor, resource) for cq, flavor in placed]
    if any(amount is None for amount in amounts):
        return None
    if resource is Resource.gpu:
        amounts += [short.get((tenancy.root_of(cq), flavor), 0) for cq, flavor in placed]
    return min(sum(amounts), cap)


def _short_rooms(tenancy: Tenancy) -> dict[tuple[str, str], int]:
    """(tree root, flavor) -> GPUs its short-work share may lend (none without service levels)."""
    return QuotaBook(tenancy).short_room if tenancy.ordering.service_levels_gpu_hours else {}


def _limit(amount: int | None) -> str:
    return "-1" if amount is None else str(amount)


def _entitled(tree: FairTree, cluster_queue: str) -> float:
    fraction = 1.0
    for node in tree.paths[cluster_queue]:
        fraction *= tree.share[node]
    return fraction
