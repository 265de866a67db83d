"""One real JupyterHub for all integration tests (with the control plane as its managed
service, configurable-http-proxy from npm, and real user servers), started once per session.

Fixtures: `hub` (URLs, admin API, state dir), `token(user)`, `server(user)`, `kernel(user)`,
`browser` (headless Debian Chromium through Playwright; screenshots go to ARTIFACTS),
`prometheus` (a real Prometheus with config/prometheus/rules.yml, tests/prometheus.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration.kernel import RemoteKernel
from tests.integration.kube_fixtures import kube_api, kube_can_run, kube_desks, kube_state_dir  # noqa: F401 - session fixtures
from tests.integration.slurm_fixtures import slurm_cluster  # noqa: F401 - a session fixture
from tests.prometheus import Prometheus

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("jupyterhub_test_config.py")
USER_SCOPES = ["custom:cellscale:submit", "custom:cellscale:read", "access:services!service=cellscale"]
CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = os.environ.get("CELLSCALE_DEMO_PASSWORD", "cellscale-demo")  # the demo users' (config/jupyterhub_config.py)
ARTIFACTS = Path(os.environ.get("CELLSCALE_ARTIFACTS", ROOT / "test-artifacts"))

pytestmark = pytest.mark.integration

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - reported by the fixture below
    sync_playwright = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Hub:
    url: str
    service_url: str
    state: Path
    admin: httpx.Client
    jobs_root: Path | None = None  # where job directories live (shared with the Slurm dev cluster)
    kube_prefix: str | None = None  # the desks' namespace prefix on the dev kube-apiserver (backend k8s), if any

    @property
    def data_dir(self) -> Path:
        return self.state / "cellscale"

    def control_plane_pid(self) -> int:
        return int((self.data_dir / "control-plane.pid").read_text())

    def wait_for_service(self, timeout: float = 90) -> None:
        _wait(f"{self.service_url}/api/health", timeout)


def _wait(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} not up within {timeout}s")


@contextlib.contextmanager
def running_hub(state: Path, extra_env: dict[str, str] | None = None):
    """A JupyterHub subprocess on free ports with the test config; stopped with SIGTERM."""
    ports = {name: free_port() for name in ("hub", "api", "proxy", "service")}
    admin_token = secrets.token_hex(16)
    env = dict(
        os.environ,
        CELLSCALE_STATE_DIR=str(state),
        CELLSCALE_HUB_URL=f"http://127.0.0.1:{ports['hub']}",
        CELLSCALE_HUB_API_URL=f"http://127.0.0.1:{ports['api']}",
        CELLSCALE_PROXY_API_URL=f"http://127.0.0.1:{ports['proxy']}",
        CELLSCALE_SERVICE_PORT=str(ports["service"]),
        CELLSCALE_TEST_ADMIN_TOKEN=admin_token,
        CELLSCALE_LOCAL_GPUS="4",
        **(extra_env or {}),
    )
    log = open(state / "jupyterhub.log", "wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("jupyterhub")), "-f", str(CONFIG)],
        cwd=state,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{ports['hub']}"
    admin = httpx.Client(base_url=f"{url}/hub/api/", headers={"Authorization": f"token {admin_token}"}, timeout=30)
    the_hub = Hub(url=url, service_url=f"{url}/services/cellscale", state=state, admin=admin)
    try:
        _wait(f"{url}/hub/api/", 90)
        the_hub.wait_for_service()
        yield the_hub
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        print((state / "jupyterhub.log").read_text()[-3000:])


@pytest.fixture(scope="session")
def hub(tmp_path_factory, slurm_cluster):
    """The demo hub, with the Slurm dev cluster as a second backend (`--backend slurm`) and, where
    the dev kube-apiserver can run, a Kubernetes backend (`--backend k8s`) whose desks' namespaces
    take a prefix of this session's own. The hub does not wait for the apiserver (its first build
    takes minutes and runs beside the other tests): the backend reads the kubeconfig `kube_api`
    writes when the kube tests start it, as a hub reads a rotated kubeconfig."""
    jobs_root = Path(tempfile.mkdtemp(prefix="hub-", dir=slurm_cluster.jobs_dir))
    jobs_root.chmod(0o711)  # researchers' Slurm jobs reach their own job dirs, nothing else
    env = {"CELLSCALE_SLURM_CONF": slurm_cluster.env["SLURM_CONF"], "CELLSCALE_JOBS_ROOT": str(jobs_root)}
    if slurm_cluster.sites:  # the second datacenter and the burst partition, as the README starts them
        env["CELLSCALE_SLURM_SITES"] = "1"
    prefix = f"hub-{secrets.token_hex(3)}-" if kube_can_run() else None
    if prefix:
        env |= {"CELLSCALE_KUBECONFIG": str(kube_state_dir() / "kubeconfig"), "CELLSCALE_KUBE_NAMESPACE_PREFIX": prefix}
    with running_hub(tmp_path_factory.mktemp("hubstate"), env) as the_hub:
        the_hub.jobs_root, the_hub.kube_prefix = jobs_root, prefix
        yield the_hub


def pytest_collection_modifyitems(items):
    """The Kubernetes tests last: the dev kube-apiserver they need builds (minutes, the first time)
    in the background while the others run."""
    items.sort(
        key=lambda item: Path(str(item.fspath)).name.startswith("test_kube") and "integration" in str(item.fspath)
    )


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory):
    """One real Prometheus for the session, scraping nothing yet: tests `add_target` what they
    serve. Skipped when the binary is absent, unless CI is set (then it fails)."""
    with Prometheus(tmp_path_factory.mktemp("prometheus")) as prom:
        yield prom


@pytest.fixture(scope="session")
def token(hub):
    made: dict[str, str] = {}

    def make(user: str, scopes: list[str] | None = None) -> str:
        key = f"{user}:{scopes}"
        if key not in made:
            if scopes is None:
                scopes = [*USER_SCOPES, f"access:servers!user={user}"]
            response = hub.admin.post(f"users/{user}/tokens", json={"scopes": scopes, "note": "tests"})
            made[key] = response.raise_for_status().json()["token"]
        return made[key]

    return make


def start_server(hub: Hub, user: str, timeout: float = 120) -> None:
    """Start a user's server through the hub's API and wait until the hub says it is ready."""
    response = hub.admin.post(f"users/{user}/server")
    assert response.status_code in (201, 202, 400), response.text
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hub.admin.get(f"users/{user}").json().get("servers", {}).get("", {}).get("ready"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{user}'s server did not start within {timeout}s")


@pytest.fixture(scope="session")
def server(hub):
    started: set[str] = set()

    def start(user: str) -> None:
        if user not in started:
            start_server(hub, user)
            started.add(user)

    return start


@pytest.fixture
def kernel(hub, token, server):
    kernels = []

    def open_kernel(user: str, notebook: str | None = None) -> RemoteKernel:
        server(user)
        k = RemoteKernel(hub.url, user, token(user), notebook)
        kernels.append(k)
        return k

    yield open_kernel
    for k in kernels:
        k.close()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium (never `playwright install`: it downloads a browser of its own).
    One per test module: Playwright's sync API keeps an event loop running on the main thread
    while it is open, and later tests that call asyncio.run() (tests/server) would fail."""
    missing = (
        "playwright (the test extra)"
        if sync_playwright is None
        else "Debian's chromium (scripts/test installs it)"
        if not CHROMIUM.exists()
        else None
    )
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the browser test needs {missing}")
        pytest.skip(f"the browser test needs {missing}")
    expect.set_options(timeout=20_000)  # two shared cores: the OAuth round trip can be slow
    with sync_playwright() as p:
        # root has no user namespaces for Chromium's sandbox
        the_browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        yield the_browser
        the_browser.close()


def api(hub: Hub, token: str) -> httpx.Client:
    return httpx.Client(base_url=f"{hub.service_url}/api/", headers={"Authorization": f"token {token}"}, timeout=30)
