"""`kube_api`: a real kube-apiserver (Kubernetes 1.20, built from Debian's source) with etcd, RBAC,
TokenRequest and the pinned Kueue/JobSet/KubeRay CRDs, started once per test session
(`python -m cellscale_hub.dev.kube up`; docs/kubernetes.md says what it can and cannot prove).

The first run on a machine builds the apiserver (minutes); scripts/test starts that build in the
background before the tests, and the fixture waits for it (or reports how it failed). An
apiserver this session started is stopped at its end; one already running (a developer's
`up`) is reused and left running. CELLSCALE_KUBE_STATE_DIR picks the state dir (default
/tmp/cellscale-kube); CELLSCALE_KUBE_KEEP=1 leaves it running.

Nothing deletes namespaces here (no kube-controller-manager finalizes them): tests make their
objects under names of their own (`kube_api.unique("desk")`).

`kube_desks` (session): a tenancy with a `k8s` backend mirrored into it by `kube.tenancy` (as a
cluster admin applies it), under a prefix of its own, and the hub's ServiceAccount token.

Import them from a conftest: `from tests.integration.kube_fixtures import kube_api, kube_desks  # noqa: F401`
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration

from cellscale_hub.dev import kube as dev_kube
from cellscale_hub.drivers.kubernetes import tenancy as kube_tenancy
from cellscale_hub.drivers.kubernetes.tenancy import HubIdentity
from cellscale_hub.tenancy import Tenancy


@dataclass(frozen=True)
class KubeApi:
    """The running apiserver: `kubeconfig` is the admin's (system:masters; a cluster admin's
    rights); `token_for` and `kubeconfig_for` make other identities."""

    kubeconfig: Path
    server: str
    ca_file: Path
    admin_token: str
    state_dir: Path

    def admin(self) -> httpx.Client:
        """An httpx client with the admin's token (close it, or use it in `with`)."""
        return self.client(self.admin_token)

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.server, verify=str(self.ca_file), headers=dev_kube.bearer(token), timeout=30)

    def unique(self, stem: str) -> str:
        """A fresh DNS-label name (namespaces are never deleted here)."""
        return f"{stem}-{secrets.token_hex(3)}"

    def token_for(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A ServiceAccount's token from the TokenRequest API (signed by the apiserver itself)."""
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        with self.admin() as admin:
            response = admin.post(path, json=request)
        assert response.status_code == 201, response.text
        return response.json()["status"]["token"]

    def kubeconfig_for(self, token: str, path: Path) -> Path:
        """A kubeconfig at `path` that authenticates with `token`."""
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "dev", "cluster": {"server": self.server, "certificate-authority-data": ca}}],
            "users": [{"name": "them", "user": {"token": token}}],
            "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "them"}}],
            "current-context": "dev",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path


def kube_can_run() -> bool:
    """Whether the dev kube-apiserver is built here, or can be (as root: Debian packages)."""
    return os.geteuid() == 0 or (dev_kube.build_for().apiserver.exists() and shutil.which("etcd") is not None)


def kube_state_dir() -> Path:
    return Path(os.environ.get("CELLSCALE_KUBE_STATE_DIR", dev_kube.DEFAULT_STATE_DIR))


@pytest.fixture(scope="session")
def kube_api():
    if not kube_can_run():
        pytest.skip("the dev kube-apiserver is not built here and building it needs root (Debian packages)")
    state_dir = kube_state_dir()
    try:
        cluster = dev_kube.up(state_dir, log=lambda line: print(f"[kube up] {line}"), retry_failed_build=False)
    except dev_kube.KubeError as exc:
        pytest.fail(f"the dev kube-apiserver did not start: {exc}")
    print(f"[kube up] {'started' if cluster.started else 'already running'} in {cluster.seconds:.1f} s")
    yield KubeApi(
        kubeconfig=cluster.kubeconfig,
        server=cluster.server,
        ca_file=cluster.ca_file,
        admin_token=cluster.admin_token,
        state_dir=cluster.state_dir,
    )
    if cluster.started and os.environ.get("CELLSCALE_KUBE_KEEP") != "1":
        dev_kube.down(state_dir, log=lambda line: print(f"[kube down] {line}"))


# A tenancy with a Kubernetes backend `k8s` beside Slurm: desk-a and desk-b in one cohort tree
# (desk-a may borrow 4 GPUs, desk-b lends at most 4), desk-c only on Slurm (so not mirrored).
DESKS_TENANCY = """
flavors:
  a100: {backend: k8s}
  slurm: {backend: slurm}
cohorts:
  firm: {}
  trading: {parent: firm, weight: 2}
cluster_queues:
  desk-a:
    cohort: trading
    quotas:
      a100: {nominal: 8, borrowing_limit: 4, cpu: {nominal: 64}, memory: {nominal: 256G}}
      slurm: {nominal: 16}
  desk-b:
    cohort: trading
    quotas:
      a100: {nominal: 8, lending_limit: 4, cpu: {nominal: 64}, memory: {nominal: 256G}}
  slurm-only:
    quotas:
      slurm: {nominal: 4}
tenants:
  desk-a: {queues: {default: {cluster_queue: desk-a}}}
  desk-b: {queues: {default: {cluster_queue: desk-b}}}
  desk-c: {queues: {default: {cluster_queue: slurm-only}}}
"""


@dataclass(frozen=True)
class Desks:
    """DESKS_TENANCY mirrored (as a cluster admin applies it) under a prefix of this session's own;
    `hub_token` is the hub's ServiceAccount token (TokenRequest), the identity the hub runs as."""

    prefix: str
    objects: list[dict]
    hub: HubIdentity
    hub_token: str

    def namespace(self, desk: str) -> str:
        return f"{self.prefix}{desk}"


def apply_as_admin(kube_api: KubeApi, objects: list[dict]) -> None:
    async def run() -> None:
        configuration = Configuration()
        await config.load_kube_config(config_file=str(kube_api.kubeconfig), client_configuration=configuration)
        async with ApiClient(configuration) as api:
            await kube_tenancy.apply(objects, api)

    asyncio.run(run())


def seed_quota_status(kube_api: KubeApi, namespace: str, name: str = "cellscale") -> None:
    """TEST-ONLY stand-in for kube-controller-manager's resourcequota controller, which does not
    run here: it writes the quota's first status (hard = spec.hard, nothing used), as that
    controller does when a quota is created. From then on the ResourceQuota admission plugin (real,
    in the apiserver) checks each pod against it and counts what it admits into status.used."""
    with kube_api.admin() as admin:
        path = f"/api/v1/namespaces/{namespace}/resourcequotas/{name}"
        quota = admin.get(path).json()
        hard = quota["spec"]["hard"]
        quota["status"] = {"hard": hard, "used": {resource: "0" for resource in hard}}
        response = admin.put(f"{path}/status", json=quota)
        assert response.status_code == 200, response.text


@pytest.fixture(scope="session")
def kube_desks(kube_api):
    prefix = kube_api.unique("t") + "-"
    hub = HubIdentity(name="cellscale-hub", namespace=f"{prefix}cellscale")
    tenancy = Tenancy.from_yaml(DESKS_TENANCY)
    objects = kube_tenancy.render_tenancy(tenancy, "k8s", prefix, hub=hub)
    apply_as_admin(kube_api, objects)
    yield Desks(prefix=prefix, objects=objects, hub=hub, hub_token=kube_api.token_for(hub.namespace, hub.name))
