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

Import it from a conftest: `from tests.integration.kube_fixtures import kube_api  # noqa: F401`
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from cellscale_hub.dev import kube as dev_kube


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


@pytest.fixture(scope="session")
def kube_api():
    build = dev_kube.build_for()
    if os.geteuid() != 0 and not (build.apiserver.exists() and shutil.which("etcd")):
        pytest.skip("the dev kube-apiserver is not built here and building it needs root (Debian packages)")
    state_dir = Path(os.environ.get("CELLSCALE_KUBE_STATE_DIR", dev_kube.DEFAULT_STATE_DIR))
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
