"""A real kube-apiserver on this machine, for cellscale's Kubernetes tests and demos.

    python -m cellscale_hub.dev.kube prepare|build|up|down|status [--state-dir DIR]   (default /tmp/cellscale-kube)

No registry here ships a modern apiserver (docs/kubernetes.md), so `build` compiles one from
Debian bookworm's own `kubernetes` SOURCE package (upstream 1.20.2 with Debian's patches) with
Debian's Go 1.19, into `.tools/kube/1.20.2/kube-apiserver` (cached: a build that exists is
reused; `prepare` installs golang-go, etcd-server, dpkg-dev and openssl and adds a deb-src entry
when the machine has none). `up` starts Debian's etcd and that apiserver on loopback (free ports
chosen at each start, an empty etcd each time):

- TLS with a CA made here (`<state>/pki`), a static admin token (group system:masters) in the
  admin kubeconfig `<state>/kubeconfig`;
- RBAC authorization only (no AlwaysAllow), so Roles and RoleBindings are really enforced;
- service-account token signing (--service-account-issuer/-signing-key-file/-key-file): the
  TokenRequest API issues ServiceAccount tokens without a kube-controller-manager;
- the pinned CRDs of config/kubernetes/crds (Kueue, JobSet, KubeRay) installed, minus what 1.20
  does not know (`for_kube_1_20`), so their objects can be stored, listed and watched.

No controller of any kind runs: no kube-controller-manager (namespaces being deleted stay
Terminating, ServiceAccount token Secrets and ResourceQuota status are never written), no
scheduler or kubelet (pods stay Pending), no Kueue/JobSet/KubeRay controllers.

`down` stops both daemons (by pid file; nothing else) and keeps the state dir.

Measured on a 2-core machine shared with other work (load 8-12): `build` from nothing 875 s
(`nice`d; most of it Go compiling, ~1.3 GB RAM), then 0 s; `up` 35-63 s (most of it the
apiserver digesting the ~1 MB KubeRay and Kueue schemas); the apiserver ~900 MB RSS, etcd ~70 MB.
"""

from __future__ import annotations

import argparse
import base64
import copy
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from cellscale_hub import proc

KUBE_VERSION = "1.20.2"
SOURCE_PACKAGE = "kubernetes"  # bookworm: 1.20.5+really1.20.2-1.1+deb12u1 (upstream 1.20.2)
# rsync: the source tree's hack/ scripts copy generated files with it (a fresh machine may lack it)
PACKAGES = ("golang-go", "etcd-server", "dpkg-dev", "openssl", "rsync", "golang-github-modern-go-reflect2-dev")
# 1.20 vendors reflect2 1.0.1, whose map iteration crashes under Go >= 1.18 ("fatal error: fault" in
# UnsafeMapType.UnsafeIterate, on the first JSON map it sorts); Debian's 1.0.2 source replaces it
REFLECT2 = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")
DEB_SRC_FILE = Path("/etc/apt/sources.list.d/cellscale-debsrc.sources")
DEB_SRC_ENTRY = """\
# added by cellscale (dev/kube.py): Debian's kubernetes SOURCE package builds the dev kube-apiserver
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
DEFAULT_STATE_DIR = Path("/tmp/cellscale-kube")
REPO = Path(__file__).resolve().parents[3]
CRD_DIR = REPO / "config" / "kubernetes" / "crds"
ADMIN_USER = "cellscale-admin"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
BUILD_TIMEOUT_S = 3600

Log = Callable[[str], None]


class KubeError(RuntimeError):
    pass


# ---------------------------------------------------------------------------- where things are


def tools_dir() -> Path:
    """The build cache: CELLSCALE_KUBE_TOOLS, else the repository's .tools/kube."""
    return Path(os.environ.get("CELLSCALE_KUBE_TOOLS", REPO / ".tools" / "kube"))


@dataclass(frozen=True)
class Build:
    root: Path  # tools_dir()/KUBE_VERSION

    @property
    def apiserver(self) -> Path:
        return self.root / "kube-apiserver"

    @property
    def failed(self) -> Path:
        """Written when a build fails (its error); the test fixture reports it instead of building again."""
        return self.root / "build.failed"

    @property
    def log(self) -> Path:
        return self.root / "build.log"

    @property
    def work(self) -> Path:
        return self.root / "work"


def build_for(tools: Path | None = None) -> Build:
    return Build((tools or tools_dir()) / KUBE_VERSION)


@dataclass(frozen=True)
class Layout:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", self.root.resolve())

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def settings(self) -> Path:
        return self.root / "settings.json"

    def pidfile(self, daemon: str) -> Path:
        return self.root / f"{daemon}.pid"

    def console(self, daemon: str) -> Path:
        return self.root / f"{daemon}.log"


# ---------------------------------------------------------------------------- commands


def run_cmd(argv: Sequence[str], *, timeout: float = 120, env: dict[str, str] | None = None, cwd: Path | None = None):
    """Run one command (an argv list, never a shell); a KubeError with its output when it fails."""
    try:
        result = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False
        )
    except FileNotFoundError as exc:
        raise KubeError(f"{argv[0]} is not installed (python -m cellscale_hub.dev.kube prepare installs it)") from exc
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip())[-3000:]
        raise KubeError(f"`{' '.join(argv)}` exited {result.returncode}: {output}")
    return result


def log_tail(path: Path, lines: int = 20) -> str:
    if not path.exists():
        return ""
    tail = path.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- last lines of {path} ---\n" + "\n".join(tail)


# ---------------------------------------------------------------------------- prepare and build


def missing_packages() -> list[str]:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Status}\n", *PACKAGES], capture_output=True, text=True, check=False
    )
    installed = {line.split()[0] for line in result.stdout.splitlines() if line.endswith("install ok installed")}
    return [name for name in PACKAGES if name not in installed]


def has_deb_src() -> bool:
    """Whether apt knows any deb-src entry (one-line or deb822 format)."""
    files = [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]
    for path in files:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split()
            if words[:1] == ["deb-src"] or (words[:1] == ["Types:"] and "deb-src" in words):
                return True
    return False


def prepare(log: Log = print) -> None:
    """Install the build's and etcd's Debian packages and add a deb-src entry when missing (root)."""
    missing, deb_src = missing_packages(), has_deb_src()
    if not missing and deb_src:
        return
    if os.geteuid() != 0:
        raise KubeError(f"run as root to install {' '.join(missing) or 'a deb-src entry'}")
    if not deb_src:
        log(f"adding the deb-src entry {DEB_SRC_FILE}")
        DEB_SRC_FILE.write_text(DEB_SRC_ENTRY)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run_cmd(["apt-get", "update", "-qq"], env=env, timeout=600)
    if missing:
        log(f"installing {' '.join(missing)}")
        run_cmd(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env, timeout=1800)


@contextmanager
def locked(path: Path, log: Log, waiting: str, timeout: float) -> Iterator[None]:
    """Hold an exclusive lock on `path`, waiting up to `timeout` s for its holder (said once in the log)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        deadline, told = time.monotonic() + timeout, False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    log(waiting)
                    told = True
                if time.monotonic() > deadline:
                    raise KubeError(f"{waiting}: still not done after {timeout:.0f} s") from None
                time.sleep(1)
        yield


def build(tools: Path | None = None, *, log: Log = print, retry_failed: bool = True) -> Path:
    """The kube-apiserver binary, built once from Debian's source (a build in progress is waited for).

    With `retry_failed=False` (the test fixture) a build that failed before is reported, not
    run again: the failure and its log say what to fix, and `build` retries it."""
    target = build_for(tools)
    waiting = f"waiting for the kube-apiserver build in progress (log: {target.log})"
    with locked(target.root / "build.lock", log, waiting, BUILD_TIMEOUT_S):
        if target.apiserver.exists():
            return target.apiserver
        if target.failed.exists() and not retry_failed:
            raise KubeError(
                f"the kube-apiserver build failed: {target.failed.read_text().strip()}{log_tail(target.log)}\n"
                "Fix the cause, then build it again: python -m cellscale_hub.dev.kube build"
            )
        target.failed.unlink(missing_ok=True)
        began = time.monotonic()
        log(f"building kube-apiserver {KUBE_VERSION} from Debian's source (minutes; log: {target.log})")
        try:
            prepare(log)
            compile_apiserver(target)
        except (KubeError, subprocess.TimeoutExpired, OSError) as exc:
            target.failed.write_text(f"{exc}\n")
            raise KubeError(f"the kube-apiserver build failed: {exc}") from exc
        shutil.rmtree(target.work, ignore_errors=True)  # source tree and Go cache: ~2.5 GB
        log(f"built {target.apiserver} in {time.monotonic() - began:.0f} s")
        return target.apiserver


def compile_apiserver(target: Build) -> None:
    """apt-get source (Debian's patches applied), Debian's reflect2 1.0.2 in vendor/ (REFLECT2), the
    generated OpenAPI code, then `go build` in GOPATH mode as Debian's rules do."""
    shutil.rmtree(target.work, ignore_errors=True)
    download = target.work / "download"
    download.mkdir(parents=True)
    with open(target.log, "w") as out:

        def step(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            done = subprocess.run(
                argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False
            )
            if done.returncode != 0:
                raise KubeError(f"`{' '.join(argv[:4])} ...` exited {done.returncode} (see {target.log})")

        step(["apt-get", "source", "--download-only", SOURCE_PACKAGE], download)
        dsc = next(download.glob(f"{SOURCE_PACKAGE}_*.dsc"), None)
        if dsc is None:
            raise KubeError(f"apt-get source left no {SOURCE_PACKAGE} .dsc in {download}")
        gopath = target.work / "gopath"
        source = gopath / "src" / "k8s.io" / "kubernetes"
        source.parent.mkdir(parents=True)
        step(["dpkg-source", "-x", str(dsc), str(source)], download)
        vendored = source / "vendor" / "github.com" / "modern-go" / "reflect2"
        shutil.rmtree(vendored)
        shutil.copytree(REFLECT2, vendored)
        out.write(f"vendor/github.com/modern-go/reflect2: replaced by {REFLECT2} (Go 1.18+ map iteration)\n")
        env = {
            **os.environ,
            "GOPATH": str(gopath),
            "GO111MODULE": "off",  # 1.20's tree builds in GOPATH mode with its vendor/ (as Debian's rules)
            "CGO_ENABLED": "0",
            "GOCACHE": str(target.work / "gocache"),
            "GOFLAGS": "",
        }
        # the OpenAPI definitions are generated, not in the source (Debian's `make` makes them too)
        step(["nice", "-n", "5", "make", "gen_openapi"], source, {**env, "HOME": str(target.work)})
        partial = target.apiserver.with_suffix(".partial")
        step(["nice", "-n", "5", "go", "build", "-ldflags", version_ldflags(), "-o", str(partial),
              "k8s.io/kubernetes/cmd/kube-apiserver"], source, env)  # fmt: skip
        out.write(f"built from {dsc.name}\n")
    partial.rename(target.apiserver)


def version_ldflags() -> str:
    """What `hack/lib/version.sh` stamps, so /version says v1.20.2 (clients read it); -s -w: no symbols."""
    flags = ["-s", "-w"]
    for package in ("client-go/pkg/version", "component-base/version"):
        prefix = f"k8s.io/kubernetes/vendor/k8s.io/{package}"
        major, minor, _ = KUBE_VERSION.split(".")
        flags += [f"-X {prefix}.gitVersion=v{KUBE_VERSION}", f"-X {prefix}.gitMajor={major}"]
        flags += [f"-X {prefix}.gitMinor={minor}"]
    return " ".join(flags)


# ---------------------------------------------------------------------------- CRDs for 1.20


UNKNOWN_TO_1_20_SCHEMA = ("x-kubernetes-validations",)  # CEL rules: apiextensions 1.25+ (alpha 1.23)
UNKNOWN_TO_1_20_VERSION = ("selectableFields",)  # field selectors on custom resources: 1.30+


def for_kube_1_20(crd: dict) -> tuple[dict, list[str]]:
    """The CRD without what a 1.20 apiserver refuses or does not know, and the JSON paths removed.

    Only these go: an empty-string default of a string field (`default: ""`, which 1.20 refuses
    as "must be of type string: null"; kubebuilder writes it for `name` in references; where that
    field keys a list-map, e.g. imagePullSecrets' `name`, 1.20 then wants it required, so it
    becomes required: an entry without it is refused rather than defaulted to ""), the CEL
    rules (`x-kubernetes-validations`, anywhere in a schema) and a version's `selectableFields`.
    1.20 would drop the last two silently (it decodes without strict field validation);
    removing them here makes what is installed exactly what is enforced, and lists it."""
    crd = copy.deepcopy(crd)
    removed: list[str] = []

    def strip(node: object, path: str) -> None:
        if isinstance(node, dict):
            for key in UNKNOWN_TO_1_20_SCHEMA:
                if key in node:
                    del node[key]
                    removed.append(f"{path}.{key}")
            if node.get("type") == "string" and node.get("default") == "":
                del node["default"]
                removed.append(f"{path}.default")
            for key, value in node.items():
                strip(value, f"{path}.{key}")
            require_map_keys(node, path)
        elif isinstance(node, list):
            for index, value in enumerate(node):
                strip(value, f"{path}[{index}]")

    def require_map_keys(node: dict, path: str) -> None:
        """A list-map's key must have a default or be required: the key whose "" default went is required."""
        items = node.get("items", {})
        for key in node.get("x-kubernetes-list-map-keys", []):
            if "default" not in items.get("properties", {}).get(key, {}) and key not in items.get("required", []):
                items.setdefault("required", []).append(key)
                removed.append(f"{path}.items.properties.{key}.default (now required)")

    for index, version in enumerate(crd["spec"]["versions"]):
        for key in UNKNOWN_TO_1_20_VERSION:
            if version.pop(key, None) is not None:
                removed.append(f"spec.versions[{index}].{key}")
        strip(version.get("schema", {}), f"spec.versions[{index}].schema")
    return crd, removed


def load_crds(crd_dir: Path) -> list[dict]:
    files = sorted(crd_dir.glob("*.yaml"))
    if not files:
        raise KubeError(f"no CRDs (*.yaml) in {crd_dir}")
    return [yaml.safe_load(path.read_text()) for path in files]


# ---------------------------------------------------------------------------- certificates


def make_pki(pki: Path) -> None:
    """A CA, the apiserver's serving certificate for 127.0.0.1/localhost, and the service-account key."""
    pki.mkdir(parents=True, exist_ok=True)
    openssl = ["openssl"]
    run_cmd([*openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj",
             "/CN=cellscale-dev-kube-ca", "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt")])  # fmt: skip
    (pki / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    run_cmd([*openssl, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
             "-keyout", str(pki / "server.key"), "-out", str(pki / "server.csr")])  # fmt: skip
    run_cmd([*openssl, "x509", "-req", "-in", str(pki / "server.csr"), "-CA", str(pki / "ca.crt"),
             "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "3650",
             "-extfile", str(pki / "server.ext"), "-out", str(pki / "server.crt")])  # fmt: skip
    run_cmd([*openssl, "genrsa", "-out", str(pki / "sa.key"), "2048"])
    run_cmd([*openssl, "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")])
    for key in pki.glob("*.key"):
        key.chmod(0o600)


# ---------------------------------------------------------------------------- daemons


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pid_of(layout: Layout, daemon: str) -> int | None:
    """The pid in the daemon's pid file, if that process is alive and runs from our state dir."""
    try:
        pid = int(layout.pidfile(daemon).read_text().split()[0])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    ours = Path(os.fsdecode(argv[0])).name == daemon and any(os.fsencode(str(layout.root)) in a for a in argv)
    return pid if ours and state not in ("Z", "X") else None


_children: dict[int, subprocess.Popen[bytes]] = {}


def start(daemon: str, argv: list[str], layout: Layout, log: Log) -> subprocess.Popen[bytes]:
    child = proc.spawn_detached(argv, cwd=layout.root, log=layout.console(daemon), env=dict(os.environ))
    _children[child.pid] = child
    layout.pidfile(daemon).write_text(f"{child.pid}\n")
    log(f"started {daemon} (pid {child.pid})")
    return child


def stop(daemon: str, layout: Layout, log: Log, grace: float = 20) -> bool:
    pid = pid_of(layout, daemon)
    layout.pidfile(daemon).unlink(missing_ok=True)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    child = _children.pop(pid, None)
    if child is not None:
        child.wait(timeout=5)
    log(f"stopped {daemon} (pid {pid})")
    return True


def _alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_until(check: Callable[[], bool], what: str, timeout: float, child: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if child.poll() is not None:
            raise KubeError(f"{what} exited ({child.returncode}){log_tail(log_path)}")
        time.sleep(0.2)
    raise KubeError(f"{what} not ready within {timeout:.0f} s{log_tail(log_path)}")


def etcd_argv(layout: Layout, client_port: int, peer_port: int) -> list[str]:
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return ["etcd", "--name", "cellscale-dev", "--data-dir", str(layout.etcd_data),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"cellscale-dev={peer}",
            "--max-request-bytes", str(8 * 1024 * 1024),  # the KubeRay and Kueue CRDs are ~1 MB of JSON each
            "--quota-backend-bytes", str(1024**3), "--log-level", "warn"]  # fmt: skip


def apiserver_argv(binary: Path, layout: Layout, port: int, etcd_port: int) -> list[str]:
    pki = layout.pki
    return [str(binary), "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--tls-cert-file={pki / 'server.crt'}", f"--tls-private-key-file={pki / 'server.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--anonymous-auth=false",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}", f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-signing-key-file={pki / 'sa.key'}", f"--service-account-key-file={pki / 'sa.pub'}",
            "--service-cluster-ip-range=10.96.0.0/16", f"--cert-dir={pki}", "--profiling=false",
            "--enable-priority-and-fairness=false", "--logtostderr=true", "--v=0"]  # fmt: skip


@dataclass(frozen=True)
class Cluster:
    """A running dev apiserver: `kubeconfig` is an admin kubeconfig (token of `cellscale-admin`,
    group system:masters); `server`, `ca_file` and `admin_token` are the same, taken apart."""

    state_dir: Path
    kubeconfig: Path
    server: str
    ca_file: Path
    admin_token: str
    started: bool
    seconds: float

    def admin_client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.server, verify=str(self.ca_file), headers=bearer(self.admin_token), timeout=30
        )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def ready(server: str, ca_file: Path, token: str) -> bool:
    try:
        return httpx.get(f"{server}/readyz", verify=str(ca_file), headers=bearer(token), timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def running(layout: Layout) -> Cluster | None:
    """The cluster of this state dir when both daemons run and the apiserver answers."""
    if not layout.settings.exists() or not (pid_of(layout, "etcd") and pid_of(layout, "kube-apiserver")):
        return None
    settings = json.loads(layout.settings.read_text())
    cluster = cluster_of(layout, settings, started=False, seconds=0)
    return cluster if ready(cluster.server, cluster.ca_file, cluster.admin_token) else None


def cluster_of(layout: Layout, settings: dict, *, started: bool, seconds: float) -> Cluster:
    return Cluster(
        state_dir=layout.root,
        kubeconfig=layout.kubeconfig,
        server=f"https://127.0.0.1:{settings['port']}",
        ca_file=layout.pki / "ca.crt",
        admin_token=settings["admin_token"],
        started=started,
        seconds=seconds,
    )


def write_kubeconfig(cluster: Cluster) -> None:
    ca = base64.b64encode(cluster.ca_file.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "cellscale-dev", "cluster": {"server": cluster.server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": ADMIN_USER, "user": {"token": cluster.admin_token}}],
        "contexts": [{"name": "cellscale-dev", "context": {"cluster": "cellscale-dev", "user": ADMIN_USER}}],
        "current-context": "cellscale-dev",
    }
    cluster.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
    cluster.kubeconfig.chmod(0o600)


def install_crds(cluster: Cluster, crd_dir: Path, log: Log, timeout: float = 60) -> None:
    """Create (or replace) each CRD as 1.20 takes it, then wait until all are Established."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    names = []
    with cluster.admin_client() as client:
        for original in load_crds(crd_dir):
            crd, removed = for_kube_1_20(original)
            name = crd["metadata"]["name"]
            names.append(name)
            response = client.post(path, json=crd)
            if response.status_code == 409:
                current = client.get(f"{path}/{name}").json()
                crd["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                response = client.put(f"{path}/{name}", json=crd)
            if response.status_code >= 300:
                raise KubeError(f"CRD {name} was refused ({response.status_code}): {response.text[:2000]}")
            log(f"CRD {name}: installed ({len(removed)} CEL rule(s), empty defaults or selectable fields left out)")
        deadline = time.monotonic() + timeout
        for name in names:
            while not established(client.get(f"{path}/{name}").json()):
                if time.monotonic() > deadline:
                    raise KubeError(f"CRD {name} not Established within {timeout:.0f} s")
                time.sleep(0.2)


def established(crd: dict) -> bool:
    conditions = crd.get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def up(
    state_dir: Path | str = DEFAULT_STATE_DIR,
    *,
    tools: Path | None = None,
    crd_dir: Path = CRD_DIR,
    log: Log = print,
    retry_failed_build: bool = True,
) -> Cluster:
    """Start etcd and the apiserver unless they run (idempotent), with the CRDs installed."""
    layout = Layout(Path(state_dir))
    layout.root.mkdir(parents=True, exist_ok=True)
    if not (shutil.which("etcd") and shutil.which("openssl")):
        prepare(log)
    binary = build(tools, log=log, retry_failed=retry_failed_build)
    waiting = f"waiting for another `up` or `down` of {layout.root}"
    with locked(layout.root / "lock", log, waiting, 300):
        existing = running(layout)
        if existing is not None:
            return existing
        began = time.monotonic()
        for daemon in ("kube-apiserver", "etcd"):
            stop(daemon, layout, log)
        shutil.rmtree(layout.etcd_data, ignore_errors=True)  # each start begins empty
        make_pki(layout.pki)
        settings = {"port": free_port(), "etcd_port": free_port(), "etcd_peer_port": free_port()}
        settings["admin_token"] = secrets.token_hex(24)
        (layout.pki / "tokens.csv").write_text(
            f'{settings["admin_token"]},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
        )
        (layout.pki / "tokens.csv").chmod(0o600)
        layout.settings.write_text(json.dumps(settings))
        layout.settings.chmod(0o600)
        try:  # a half-started cluster is stopped: `running` would take it for a whole one
            etcd = start("etcd", etcd_argv(layout, settings["etcd_port"], settings["etcd_peer_port"]), layout, log)
            etcd_health = f"http://127.0.0.1:{settings['etcd_port']}/health"
            wait_until(lambda: _answers(etcd_health), "etcd", 30, etcd, layout.console("etcd"))
            cluster = cluster_of(layout, settings, started=True, seconds=0)
            apiserver = start(
                "kube-apiserver", apiserver_argv(binary, layout, settings["port"], settings["etcd_port"]), layout, log
            )
            wait_until(
                lambda: ready(cluster.server, cluster.ca_file, cluster.admin_token),
                "kube-apiserver",
                120,
                apiserver,
                layout.console("kube-apiserver"),
            )
            write_kubeconfig(cluster)
            install_crds(cluster, crd_dir, log)
        except BaseException:
            for daemon in ("kube-apiserver", "etcd"):
                stop(daemon, layout, log)
            raise
        return cluster_of(layout, settings, started=True, seconds=time.monotonic() - began)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def down(state_dir: Path | str = DEFAULT_STATE_DIR, *, log: Log = print) -> None:
    """Stop the apiserver and etcd of this state dir (by pid file); keep the state dir."""
    layout = Layout(Path(state_dir))
    if not layout.root.exists():
        log(f"nothing to stop in {layout.root}")
        return
    with locked(layout.root / "lock", log, f"waiting for another `up` or `down` of {layout.root}", 300):
        stopped = [daemon for daemon in ("kube-apiserver", "etcd") if stop(daemon, layout, log)]
    if not stopped:
        log(f"nothing was running in {layout.root}")


def status(state_dir: Path | str = DEFAULT_STATE_DIR, *, log: Log = print) -> bool:
    layout = Layout(Path(state_dir))
    for daemon in ("etcd", "kube-apiserver"):
        pid = pid_of(layout, daemon)
        log(f"{daemon:<15} {pid or '-':>8}  {'running' if pid else 'stopped'}")
    cluster = running(layout)
    if cluster:
        log(f"\nexport KUBECONFIG={cluster.kubeconfig}   # {cluster.server}, admin token (system:masters)")
    return cluster is not None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellscale_hub.dev.kube", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("prepare", "build", "up", "down", "status"))
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help=f"default: {DEFAULT_STATE_DIR}")
    parser.add_argument("--crds", type=Path, default=CRD_DIR, help=f"folder of the CRDs to install; default: {CRD_DIR}")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            prepare()
        elif args.command == "build":
            print(build())
        elif args.command == "up":
            cluster = up(args.state_dir, crd_dir=args.crds)
            print(f"apiserver {'started' if cluster.started else 'already running'} in {cluster.seconds:.1f} s")
            status(args.state_dir)
        elif args.command == "down":
            down(args.state_dir)
        else:
            return 0 if status(args.state_dir) else 3
    except KubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
