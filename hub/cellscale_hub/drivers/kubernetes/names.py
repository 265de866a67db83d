"""The names and labels cellscale gives its Kubernetes objects.

One namespace per desk (tenant), holding the desk's Kueue LocalQueues, its users' servers and
its jobs; a job's attempt is one JobSet or RayJob named after it. Kubernetes names are DNS-1123
labels (lowercase letters, digits and '-', at most 63): a cellscale name that is not one is
refused here rather than mangled, so two desks can never map to one namespace.
"""

from __future__ import annotations

import re

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MANAGED_BY = {"app.kubernetes.io/managed-by": "cellscale"}
TENANT_LABEL = "cellscale.io/tenant"
JOB_LABEL = "cellscale.io/job"
ATTEMPT_LABEL = "cellscale.io/attempt"
USER_LABEL = "cellscale.io/user"
FLAVOR_LABEL = "cellscale.io/flavor"  # on a topology backend's nodes: the ResourceFlavor they belong to

JOBS_SERVICE_ACCOUNT = "cellscale-jobs"  # in every desk's namespace: its jobs' pods run as it (no API rights)
SERVERS_SERVICE_ACCOUNT = "cellscale-servers"  # in every desk's namespace: its users' servers (no API rights)
HUB_ROLE = "cellscale-hub"  # the hub's Role and RoleBinding in every desk's namespace

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# A label key: an optional DNS-subdomain prefix and '/', then a name (Kubernetes' qualified name).
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class NotAKubernetesName(ValueError):
    pass


def dns_label(name: str, what: str) -> str:
    """`name` unchanged when Kubernetes accepts it as an object name, else a refusal naming it."""
    if not _DNS_LABEL.match(name):
        raise NotAKubernetesName(
            f"{what} {name!r} cannot name a Kubernetes object: use lowercase letters, digits and '-' "
            "(at most 63, starting and ending with a letter or digit)"
        )
    return name


def label_key(key: str, what: str) -> str:
    """`key` unchanged when Kubernetes accepts it as a label key (`[prefix/]name`), else a refusal naming it."""
    prefix, _, name = key.rpartition("/")
    if not _LABEL_NAME.match(name) or ("/" in key and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix))):
        raise NotAKubernetesName(
            f"{what} {key!r} is not a Kubernetes label key: an optional DNS subdomain and '/' (e.g. "
            "cloud.provider.com/topology-rack), then at most 63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit"
        )
    return key


def namespace(tenant: str, prefix: str = "") -> str:
    """The desk's namespace: `prefix` + the tenant's name."""
    return dns_label(prefix + tenant, "desk")


def cluster_scoped(name: str, prefix: str, what: str) -> str:
    """A cluster-wide Kueue object of the tenancy (ClusterQueue, Cohort, ResourceFlavor): `prefix` + name,
    so two cellscale installations can share a cluster (the namespaces take the same prefix)."""
    return dns_label(prefix + name, what)


def workload_name(job_id: str, attempt: int) -> str:
    """The JobSet or RayJob of one attempt: `cs-0123abcd4567-a2` (job ids are already lowercase)."""
    return dns_label(f"{job_id}-a{attempt}", "job")
