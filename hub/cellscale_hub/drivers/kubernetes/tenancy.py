"""cellscale's tenancy mirrored into Kubernetes objects, as Slurm accounts mirror it on Slurm.

`render_tenancy(tenancy, backend, prefix)` is pure: for one backend (the flavors whose
`backend` is its name) it returns, in the order they must be created,

- with a `topology_level` (the backend's Kueue Topology Aware Scheduling): a Kueue Topology
  (`prefix`+backend) whose levels are the node labels of `topology_levels`, widest first;
- per ClusterQueue with a flavor of the backend: a Kueue ClusterQueue (`prefix`+name; one
  resource group covering `nvidia.com/gpu`, `cpu` and `memory`, per flavor the nominal,
  borrowing and lending figures of cellscale's quota), the Cohorts on its path to the root
  (each with its parent and fair-share weight), the ResourceFlavors it names (with a topology:
  naming the Topology, `topologyName`, and selecting their nodes by `cellscale.io/flavor`);
- the WorkloadPriorityClasses (cellscale's priority classes, same names and values: a job's
  `kueue.x-k8s.io/priority-class` label names one);
- per desk with a queue on those ClusterQueues: its Namespace (`prefix`+desk), the
  ServiceAccounts its jobs and its users' servers run as (no API rights), its LocalQueues
  (cellscale's queue names), a ResourceQuota (the most of each resource its queues could ever
  be admitted: the backstop for pods created outside Kueue), and the hub's Role and RoleBinding
  (namespaced: the hub never holds a ClusterRoleBinding).

A ClusterQueue admits LocalQueues only from the namespaces of the desks that use it (its
namespaceSelector), so a desk cannot point a queue of its own at another desk's quota.

`apply(objects, api)` is server-side apply (field manager `cellscale`), create-or-update and
idempotent. Everything here except the desk-scoped objects is cluster-wide: a cluster admin
applies it once and after each tenancy change (`python -m cellscale_hub.drivers.kubernetes.tenancy ... --apply`,
docs/kubernetes.md); the hub's own identity cannot.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from cellscale.vocabulary import Resource
from cellscale_hub.drivers.kubernetes.names import (
    FLAVOR_LABEL,
    HUB_ROLE,
    JOBS_SERVICE_ACCOUNT,
    MANAGED_BY,
    SERVERS_SERVICE_ACCOUNT,
    TENANT_LABEL,
    cluster_scoped,
    dns_label,
    label_key,
    namespace,
)
from cellscale_hub.tenancy import Tenancy

KUEUE_API = "kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"
COVERED = (GPU, "cpu", "memory")
FIELD_MANAGER = "cellscale"
# A resource cellscale does not quota still needs a figure in Kueue (it has no "unlimited"): one far
# above any fleet, whose milli-units still fit Kueue's int64 arithmetic.
UNLIMITED_CPU = "1000000000"
UNLIMITED_MEMORY = "1Ei"
HOSTNAME_LEVEL = "kubernetes.io/hostname"  # Kueue allows it only as a Topology's lowest level
MAX_TOPOLOGY_LEVELS = 16  # Kueue's Topology: at most 16 levels


@dataclass(frozen=True)
class HubIdentity:
    """Who the hub is to the API: a ServiceAccount (in-cluster; `namespace`/`name`) or a user
    (out of cluster: the name its client certificate or OIDC token carries)."""

    name: str = "cellscale-hub"
    namespace: str | None = "cellscale"

    @property
    def subject(self) -> dict:
        if self.namespace is None:
            return {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": self.name}
        return {"kind": "ServiceAccount", "name": self.name, "namespace": self.namespace}


# What the hub does in a desk's namespace: jobs (JobSet, RayJob) created, watched and deleted;
# Kueue's Workloads and LocalQueues read (why a job waits; whether it could ever be admitted);
# user servers' pods (KubeSpawner) and its events; pods' logs. Nothing else, nowhere else.
HUB_RULES = (
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
     "verbs": ["get", "list", "watch", "create", "delete", "patch", "update"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"],
     "verbs": ["get", "list", "watch", "create", "delete", "patch", "update"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["services", "persistentvolumeclaims"],
     "verbs": ["get", "list", "watch", "create", "delete"]},
)  # fmt: skip


def render_tenancy(
    tenancy: Tenancy,
    backend: str,
    prefix: str = "",
    *,
    hub: HubIdentity | None = None,
    topology_level: str = "",
    topology_levels: Sequence[str] = (),
) -> list[dict]:
    """Every object of the mirror, cluster-wide ones first (a namespaced object may name them).

    `topology_level` and `topology_levels` are the backend's KubernetesDriver traits of those
    names: with a level, the flavors name a Kueue Topology of those levels (`levels_of`)."""
    hub = hub or HubIdentity()
    levels = levels_of(topology_level, topology_levels)
    topology = topology_name(backend, prefix) if levels else None
    queues = [name for name in tenancy.cluster_queues if tenancy.flavors_for(name, backend)]
    desks = {tenant: _desk_queues(tenancy, tenant, queues) for tenant in tenancy.tenants}
    desks = {tenant: local for tenant, local in desks.items() if local}
    objects: list[dict] = [_topology(topology, levels)] if topology else []
    objects += [_resource_flavor(flavor, prefix, topology) for flavor in _flavors(tenancy, queues, backend)]
    objects += [_cohort(tenancy, cohort, prefix) for cohort in _cohorts(tenancy, queues)]
    objects += [_cluster_queue(tenancy, cq, backend, prefix, _users_of(desks, cq)) for cq in queues]
    objects += [_priority_class(name, value) for name, value in tenancy.priority_classes.items()]
    if hub.namespace is not None:
        objects += [_namespace(hub.namespace, {}), _service_account(hub.name, hub.namespace, token=True)]
    for tenant, local in desks.items():
        objects += _desk(tenancy, tenant, local, backend, prefix, hub)
    return objects


def levels_of(level: str, levels: Sequence[str] = ()) -> tuple[str, ...]:
    """The levels of the backend's Kueue Topology, widest first: `levels` as configured or, when
    none are, `level` above the node (kubernetes.io/hostname); none without a `level`. Refuses
    (ValueError, in words) what Kueue would, and a `level` that is not one of them: `--switches`
    asks Kueue for a domain of `level`, which only a level of the flavor's Topology can give."""
    if not level:
        if levels:
            raise ValueError(
                f"topology_levels {list(levels)} are set but topology_level is empty: set topology_level to the "
                "level `--switches 1` keeps a gang within (one of them)"
            )
        return ()
    chosen = tuple(levels) or ((level,) if level == HOSTNAME_LEVEL else (level, HOSTNAME_LEVEL))
    for key in chosen:
        label_key(key, "topology level")
    if len(set(chosen)) != len(chosen) or len(chosen) > MAX_TOPOLOGY_LEVELS:
        raise ValueError(f"topology_levels {list(chosen)}: Kueue needs at most 16 levels, each a different node label")
    if HOSTNAME_LEVEL in chosen[:-1]:
        raise ValueError(
            f"topology_levels {list(chosen)}: Kueue allows {HOSTNAME_LEVEL} only as the last (lowest) level"
        )
    if level not in chosen:
        raise ValueError(
            f"topology_level {level!r} is not one of topology_levels {list(chosen)}: Kueue would never admit a "
            "--switches job asking for it; add it to the levels or choose one of them"
        )
    return chosen


def topology_name(backend: str, prefix: str = "") -> str:
    """The backend's Kueue Topology: `prefix` + the backend's name."""
    return cluster_scoped(backend, prefix, "backend (its Kueue Topology's name)")


def _desk_queues(tenancy: Tenancy, tenant: str, queues: list[str]) -> dict[str, str]:
    """The desk's LocalQueues that land on this backend's ClusterQueues: {queue: cluster queue}."""
    local = tenancy.tenants[tenant].queues
    return {name: q.cluster_queue for name, q in local.items() if q.cluster_queue in queues}


def _users_of(desks: dict[str, dict[str, str]], cluster_queue: str) -> list[str]:
    return sorted(tenant for tenant, local in desks.items() if cluster_queue in local.values())


def _flavors(tenancy: Tenancy, queues: list[str], backend: str) -> list[str]:
    seen: dict[str, None] = {}
    for cq in queues:
        seen.update(dict.fromkeys(tenancy.flavors_for(cq, backend)))
    return list(seen)


def _cohorts(tenancy: Tenancy, queues: list[str]) -> list[str]:
    """The cohorts on the queues' paths to their roots, each after its parent."""
    seen: dict[str, None] = {}
    for cq in queues:
        cohort = tenancy.cluster_queues[cq].cohort
        if cohort:
            seen.update(dict.fromkeys(n.partition(":")[2] for n in tenancy.fair_share_path(cq)[:-1]))
    return list(seen)


def _meta(name: str, namespace_: str | None = None, labels: dict | None = None) -> dict:
    meta: dict = {"name": name}
    if namespace_ is not None:
        meta["namespace"] = namespace_
    meta["labels"] = {**MANAGED_BY, **(labels or {})}
    return meta


def _weight(value: float) -> str:
    """A fair-share weight as a Kubernetes quantity ("1", "0.5")."""
    return str(int(value)) if value == int(value) else repr(value)


def _mebibytes(amount: int) -> str:
    """MiB as Kubernetes writes a quantity back (its canonical form: the largest binary unit that
    keeps it whole), so applying the same quota again changes nothing."""
    for unit in ("Mi", "Gi", "Ti", "Pi"):
        if amount % 1024 or not amount:
            return f"{amount}{unit}"
        amount //= 1024
    return f"{amount}Ei"


def _topology(name: str, levels: tuple[str, ...]) -> dict:
    levels_ = [{"nodeLabel": level} for level in levels]
    return {"apiVersion": KUEUE_API, "kind": "Topology", "metadata": _meta(name), "spec": {"levels": levels_}}


def _resource_flavor(flavor: str, prefix: str, topology: str | None) -> dict:
    """Without a topology no node labels (an admin's survive re-applying). With one, Kueue wants at
    least one node label (its rule "at least one nodeLabel is required when topology is set"), and
    both are immutable from then on: the flavor's nodes are those labelled `cellscale.io/flavor=<name>`."""
    name = cluster_scoped(flavor, prefix, "flavor")
    spec = {} if topology is None else {"nodeLabels": {FLAVOR_LABEL: name}, "topologyName": topology}
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": _meta(name), "spec": spec}


def _cohort(tenancy: Tenancy, cohort: str, prefix: str) -> dict:
    config = tenancy.cohorts[cohort]
    spec: dict = {"fairSharing": {"weight": _weight(config.weight)}}
    if config.parent is not None:
        spec["parentName"] = cluster_scoped(config.parent, prefix, "cohort")
    name = cluster_scoped(cohort, prefix, "cohort")
    return {"apiVersion": KUEUE_API, "kind": "Cohort", "metadata": _meta(name), "spec": spec}


def _cluster_queue(tenancy: Tenancy, cq: str, backend: str, prefix: str, tenants: list[str]) -> dict:
    config = tenancy.cluster_queues[cq]
    in_cohort = config.cohort is not None
    flavors = [
        {"name": cluster_scoped(flavor, prefix, "flavor"), "resources": _flavor_quotas(tenancy, cq, flavor, in_cohort)}
        for flavor in tenancy.flavors_for(cq, backend)
    ]
    spec: dict = {
        "namespaceSelector": {"matchExpressions": [{"key": TENANT_LABEL, "operator": "In", "values": tenants}]},
        "resourceGroups": [{"coveredResources": list(COVERED), "flavors": flavors}],
        "fairSharing": {"weight": _weight(config.weight)},
    }
    if in_cohort:
        spec["cohortName"] = cluster_scoped(config.cohort, prefix, "cohort")
    return {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": _meta(cluster_scoped(cq, prefix, "queue")),
            "spec": spec}  # fmt: skip


def _flavor_quotas(tenancy: Tenancy, cq: str, flavor: str, in_cohort: bool) -> list[dict]:
    """nvidia.com/gpu, cpu, memory on one flavor. Borrowing limits only in a cohort (Kueue refuses
    them outside one); a resource cellscale leaves unquota'd gets the largest figure it accepts."""
    quota = tenancy.cluster_queues[cq].quotas[flavor]
    resources = []
    for resource, name in ((Resource.gpu, GPU), (Resource.cpu, "cpu"), (Resource.memory, "memory")):
        own = quota.of(resource)
        amount = _mebibytes if resource is Resource.memory else str
        if own is None:
            resources.append({"name": name, "nominalQuota": UNLIMITED_MEMORY if name == "memory" else UNLIMITED_CPU})
            continue
        entry: dict = {"name": name, "nominalQuota": amount(own.nominal)}
        if own.borrowing_limit is not None and in_cohort:
            entry["borrowingLimit"] = amount(own.borrowing_limit)
        if own.lending_limit is not None and in_cohort:  # Kueue: "must be nil when cohort is empty"
            entry["lendingLimit"] = amount(own.lending_limit)
        resources.append(entry)
    return resources


def _priority_class(name: str, value: int) -> dict:
    return {
        "apiVersion": KUEUE_API,
        "kind": "WorkloadPriorityClass",
        "metadata": _meta(dns_label(name, "priority class")),
        "value": value,
        "description": f"cellscale priority class {name}",
    }


def _namespace(name: str, labels: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name, labels=labels)}


def _service_account(name: str, namespace_: str, *, token: bool = False) -> dict:
    """A ServiceAccount; its token is mounted into pods only with `token` (the hub's own)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(name, namespace_),
        "automountServiceAccountToken": token,
    }


def _desk(
    tenancy: Tenancy, tenant: str, local: dict[str, str], backend: str, prefix: str, hub: HubIdentity
) -> list[dict]:
    ns = namespace(tenant, prefix)
    label = {TENANT_LABEL: tenant}
    objects = [
        _namespace(ns, label),
        _service_account(JOBS_SERVICE_ACCOUNT, ns),
        _service_account(SERVERS_SERVICE_ACCOUNT, ns),
    ]
    for queue, cq in local.items():
        objects.append(
            {
                "apiVersion": KUEUE_API,
                "kind": "LocalQueue",
                "metadata": _meta(dns_label(queue, "queue"), ns, label),
                "spec": {"clusterQueue": cluster_scoped(cq, prefix, "queue")},
            }
        )
    hard = _quota_hard(tenancy, sorted(set(local.values())), backend)
    if hard:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": _meta("cellscale", ns, label),
                "spec": {"hard": hard},
            }
        )
        defaults = _default_requests(hard)
        if defaults:
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "LimitRange",
                    "metadata": _meta("cellscale", ns, label),
                    "spec": {"limits": [{"type": "Container", "defaultRequest": defaults}]},
                }
            )
    objects.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(HUB_ROLE, ns),
            "rules": copy.deepcopy(list(HUB_RULES)),
        }  # fmt: skip
    )
    objects.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(HUB_ROLE, ns),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": HUB_ROLE},
            "subjects": [hub.subject],
        }
    )
    return objects


DEFAULT_REQUESTS = {"requests.cpu": ("cpu", "1"), "requests.memory": ("memory", "1Gi")}
"""What a container that names no cpu or memory request gets in a desk namespace whose quota
bounds it: Kubernetes refuses a pod without a request for a resource a ResourceQuota covers, and
a job without --mem (or a server profile without a memory guarantee) names none."""


def _default_requests(hard: dict[str, str]) -> dict[str, str]:
    return dict(DEFAULT_REQUESTS[key] for key in hard if key in DEFAULT_REQUESTS)


def _quota_hard(tenancy: Tenancy, queues: list[str], backend: str) -> dict[str, str]:
    """The most of each resource the desk's queues could ever be admitted on this backend (their
    nominal quota plus what they may borrow); a resource without a bound on some flavor is left out."""
    hard: dict[str, str] = {}
    for resource, key, amount in (
        (Resource.gpu, f"requests.{GPU}", str),
        (Resource.cpu, "requests.cpu", str),
        (Resource.memory, "requests.memory", _mebibytes),
    ):
        bounds = [tenancy.max_admissible(cq, f, resource) for cq in queues for f in tenancy.flavors_for(cq, backend)]
        if bounds and None not in bounds:
            hard[key] = amount(sum(bounds))
    return hard


# ---------------------------------------------------------------------------- applying


_PLURALS = {
    "Namespace": "namespaces",
    "ServiceAccount": "serviceaccounts",
    "ResourceQuota": "resourcequotas",
    "LimitRange": "limitranges",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ResourceFlavor": "resourceflavors",
    "Topology": "topologies",
    "Cohort": "cohorts",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
}


def object_path(obj: dict) -> str:
    """The object's URL path on the API (the kinds `render_tenancy` makes)."""
    api_version, kind, meta = obj["apiVersion"], obj["kind"], obj["metadata"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    scope = f"/namespaces/{meta['namespace']}" if "namespace" in meta else ""
    return f"{base}{scope}/{_PLURALS[kind]}/{meta['name']}"


async def apply(objects: Sequence[dict], api) -> None:
    """Server-side apply each object in order (field manager `cellscale`, conflicts forced):
    creates what is missing, updates what differs, leaves fields other managers own alone.

    `api` is a kubernetes_asyncio ApiClient (any kubeconfig: token, certificate, exec plugin)."""
    for obj in objects:
        await api.call_api(
            object_path(obj),
            "PATCH",
            query_params=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=obj,
            auth_settings=["BearerToken"],
            response_types_map={},
            _return_http_data_only=True,
        )


def to_yaml(objects: Sequence[dict]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, width=120)


async def _apply_with_kubeconfig(objects: list[dict], kubeconfig: Path | None) -> None:
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import ApiClient, Configuration

    configuration = Configuration()
    path = str(kubeconfig) if kubeconfig else None
    await config.load_kube_config(config_file=path, client_configuration=configuration)
    async with ApiClient(configuration) as api:
        await apply(objects, api)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cellscale_hub.drivers.kubernetes.tenancy",
        description="Print (or, with --apply, apply as a cluster admin) cellscale's tenancy as Kubernetes objects.",
    )
    parser.add_argument("tenancy", type=Path, help="the tenancy YAML (config/tenants.yaml's shape)")
    parser.add_argument("--backend", required=True, help="the backend whose flavors are mirrored (e.g. k8s)")
    parser.add_argument("--prefix", default="", help="prefix of namespaces and cluster-wide names")
    parser.add_argument("--hub-service-account", default="cellscale/cellscale-hub", metavar="NAMESPACE/NAME")
    parser.add_argument("--hub-user", help="the hub is this user (out of cluster) rather than a ServiceAccount")
    parser.add_argument(
        "--topology-level", default="", metavar="LABEL", help="the backend's KubernetesDriver.topology_level"
    )
    parser.add_argument(
        "--topology-levels", nargs="+", default=[], metavar="LABEL", help="its KubernetesDriver.topology_levels"
    )
    parser.add_argument("--apply", action="store_true", help="server-side apply them (admin credentials)")
    parser.add_argument("--kubeconfig", type=Path, help="with --apply; default: $KUBECONFIG or ~/.kube/config")
    args = parser.parse_args(argv)
    if args.hub_user:
        hub = HubIdentity(name=args.hub_user, namespace=None)
    else:
        hub_namespace, _, hub_name = args.hub_service_account.partition("/")
        hub = HubIdentity(name=hub_name, namespace=hub_namespace)
    tenancy = Tenancy.from_yaml(args.tenancy.read_text())
    try:
        objects = render_tenancy(
            tenancy, args.backend, args.prefix, hub=hub,
            topology_level=args.topology_level, topology_levels=args.topology_levels,
        )  # fmt: skip
    except ValueError as exc:
        parser.error(str(exc))
    if not args.apply:
        sys.stdout.write(to_yaml(objects))
        return 0
    import asyncio

    asyncio.run(_apply_with_kubeconfig(objects, args.kubeconfig))
    print(f"applied {len(objects)} objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
