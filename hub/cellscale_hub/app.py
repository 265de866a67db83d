"""`python -m cellscale_hub`: the control plane process.

Runs as a JupyterHub-managed service (it reads the JUPYTERHUB_* environment the hub gives
it), or as a personal control plane for one user on this machine (`--personal`), the way
`ray.init()` starts a local cluster. Configure it like JupyterHub: a Python config file
where class names are keys (`c.ControlPlane.db_url = ...`, `c.LocalDriver.gpus = 8`).
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import os
import secrets
import shutil
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import uvicorn
from jupyterhub.services.auth import HubOAuth
from traitlets import Bool, Dict, Float, Integer, Unicode, default
from traitlets.config import Application, Config

from cellscale_hub.api import build_app
from cellscale_hub.api.context import Context
from cellscale_hub.auth import HubIdentity, Identity, StaticTokenIdentity
from cellscale_hub.bundles import BundleStore
from cellscale_hub.control.controller import Controller
from cellscale_hub.drivers import Driver, driver_class
from cellscale_hub.metrics import Metrics, State
from cellscale_hub.settings import Settings
from cellscale_hub.store import Store
from cellscale_hub.store.tenancy_book import TenancyBook
from cellscale_hub.tenancy import Tenancy

PERSONAL_TENANT = "personal"
SINFO_TIMEOUT_S = 10


def cellscale_home() -> Path:
    """This user's cellscale folder: ~/.cellscale, or $CELLSCALE_HOME."""
    return Path(os.environ.get("CELLSCALE_HOME", Path.home() / ".cellscale"))


def personal_dir() -> Path:
    return cellscale_home() / "personal"


def slurm_here() -> bool:
    """Slurm is configured on this machine (a login node): SLURM_CONF is set, or `sinfo` answers."""
    if os.environ.get("SLURM_CONF"):
        return True
    if not shutil.which("sinfo"):
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=SINFO_TIMEOUT_S).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def default_slurm_account(user: str) -> str:
    """The account Slurm charges this user's jobs to when they name none: $SLURM_ACCOUNT (as sbatch
    reads it), else the user's DefaultAccount in Slurm's accounting; "" when neither says."""
    if os.environ.get("SLURM_ACCOUNT"):
        return os.environ["SLURM_ACCOUNT"]
    argv = ["sacctmgr", "-n", "-P", "show", "user", user, "format=defaultaccount"]
    try:
        answer = subprocess.run(argv, capture_output=True, text=True, timeout=SINFO_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return answer.stdout.split()[0] if answer.returncode == 0 and answer.stdout.split() else ""


class ControlPlane(Application):
    name = "cellscale-hub"
    description = "The cellscale control plane: jobs, admission, backends."

    config_file = Unicode("", help="Python config file to load.").tag(config=True)
    data_dir = Unicode(help="Where the control plane keeps its SQLite store, job directories and bundles.").tag(
        config=True
    )
    db_url = Unicode(
        help="""SQLAlchemy URL of the store. Default: SQLite (WAL) in data_dir. Production:
        postgresql+psycopg://user:pass@host/db.""",
    ).tag(config=True)
    jobs_root = Unicode(
        help="""Directory holding one directory per job; every node of every backend must see it
        at the same path (the cluster's shared filesystem). Default: data_dir/jobs.""",
    ).tag(config=True)
    backends = Dict(
        help="""Backends by name. A value is a driver name ("local", or a dotted class path), or a
        dict {"driver": NAME, **traits} to configure several backends of one kind. Default: "local";
        a personal control plane where Slurm is configured (SLURM_CONF set, or `sinfo` answers) has
        "slurm" first (the default of `%%cluster`), then "local".""",
    ).tag(config=True)
    tenants_file = Unicode(
        "",
        help="""YAML file of flavors, cohorts, cluster queues, tenants and priority classes
        (see cellscale_hub.tenancy). It seeds an empty database; after that the admin API and page
        are the source of truth, unless reseed_tenancy is set.""",
    ).tag(config=True)
    reseed_tenancy = Bool(
        False,
        help="""Apply tenants_file again at start, as a new audited revision that
        replaces what admins changed since.""",
    ).tag(config=True)
    preemption_grace = Float(
        30.0,
        help="""Seconds between a preemption warning (SIGUSR1 to the job) and
        its stop: the time a victim has to checkpoint.""",
    ).tag(config=True)
    heartbeat_timeout = Float(
        60.0,
        help="""Seconds without a heartbeat from any node of a running attempt
        before it counts as hung (an infrastructure fault: stopped and retried).""",
    ).tag(config=True)
    fair_share_half_life = Float(
        3600.0,
        help="""Seconds after which past GPU use counts half in fair share;
        0: only current use counts.""",
    ).tag(config=True)
    bundle_quota_mb = Integer(
        1024,
        help="""MiB of input bundles (pickled notebook variables) each user may keep. A bundle
        no waiting or running job uses is removed after bundle_grace.""",
    ).tag(config=True)
    bundle_grace = Float(
        3600.0,
        help="Seconds an input bundle no waiting or running job uses is kept (the time from upload to submit).",
    ).tag(config=True)
    bundle_keep_succeeded = Float(
        86400.0,
        help="""Seconds the input bundle of a job that succeeded is kept after it finished, so
        `%cluster promote` can save it beside the asset module it writes; counted in the user's
        bundle quota. 0: removed like any unused one, after bundle_grace.""",
    ).tag(config=True)
    personal = Bool(False, help="Run as a personal control plane: no hub, one user, a static token.").tag(config=True)
    ip = Unicode("127.0.0.1", help="Address to listen on (as a hub service: from JUPYTERHUB_SERVICE_URL).").tag(
        config=True
    )
    port = Integer(
        0, help="Port to listen on; 0 picks a free one (as a hub service: from JUPYTERHUB_SERVICE_URL)."
    ).tag(config=True)
    poll_interval = Float(0.5, help="Seconds between reconcile cycles.").tag(config=True)
    wake_gap = Float(
        0.05,
        min=0.0,
        help="""Least seconds from the start of one controller cycle to the start of a cycle woken by a
        submit, a cancel or an ended job: a flood of submits then costs one cycle per gap, not one per
        submit. A job is admitted at most this much later; 0: every wake runs a cycle at once.""",
    ).tag(config=True)
    admission_interval = Float(
        30.0,
        help="""Most seconds between two admission cycles when nothing changed. Admission runs at once
        after a submit, a cancel, an admin's change, an attempt that started or ended, or a change in a
        backend's capacity; this timer only refreshes fair share (it decays) and estimated starts.""",
    ).tag(config=True)
    backfill_depth = Integer(
        100,
        min=1,
        allow_none=True,
        help="""Most jobs one admission cycle looks at behind a queue's first waiting job (Slurm's
        bf_max_job_test): the next cycle resumes where this one stopped, so deeper jobs are reached
        a cycle or a few later. None: every job, every cycle (a cycle then costs the whole queue).""",
    ).tag(config=True)
    meter_interval = Float(
        60.0,
        min=0.1,
        help="""Seconds between two rows of the cost ledger for a running attempt (an ended one gets its
        last row at once). Each running attempt costs one read of its nodes' usage records and one row
        per interval; budgets and /metrics see running jobs' spend this late at most.""",
    ).tag(config=True)
    service_name = Unicode(help="The hub service name (from JUPYTERHUB_SERVICE_NAME).").tag(config=True)
    max_request_bytes = Integer(
        2 * 2**20,
        min=64 * 1024,
        help="""Largest JSON request body the API reads (a job's spec: its cell is at most 1 MiB); larger
        ones are refused (413) unread. An inputs bundle has its own limit (64 MiB).""",
    ).tag(config=True)
    auth_cache_seconds = Float(
        5.0,
        min=0,
        help="""Seconds the hub's answers about a token (its user and scopes) and about a user (groups,
        admin) are reused: a revoked token, or a user removed from a desk, loses access at most this
        long after. Each active token and each active user costs one hub API call per period; 0 asks
        the hub on every request.""",
    ).tag(config=True)

    aliases = {
        "config": "ControlPlane.config_file",
        "db-url": "ControlPlane.db_url",
        "data-dir": "ControlPlane.data_dir",
        "port": "ControlPlane.port",
        "tenants": "ControlPlane.tenants_file",
        "preemption-grace": "ControlPlane.preemption_grace",
        "fair-share-half-life": "ControlPlane.fair_share_half_life",
        "gpus": "LocalDriver.gpus",
    }
    flags = {
        "personal": ({"ControlPlane": {"personal": True}}, "Run a personal control plane for this user."),
        "reseed-tenancy": ({"ControlPlane": {"reseed_tenancy": True}}, "Re-apply the tenants file as a new revision."),
    }

    @default("backends")
    def _backends(self) -> dict:
        if self.personal and slurm_here():
            return {"slurm": "slurm", "local": "local"}
        return {"local": "local"}

    @default("data_dir")
    def _data_dir(self) -> str:
        if self.personal:
            return str(personal_dir())
        return os.environ.get("CELLSCALE_DATA_DIR", str(Path.cwd() / "var" / "cellscale"))

    @default("db_url")
    def _db_url(self) -> str:
        return f"sqlite:///{Path(self.data_dir) / 'cellscale.sqlite'}"

    @default("jobs_root")
    def _jobs_root(self) -> str:
        return str(Path(self.data_dir) / "jobs")

    @default("service_name")
    def _service_name(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_NAME", "cellscale")

    def initialize(self, argv=None) -> None:
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)
            self.update_config(self.cli_config)  # the command line wins over the file
        elif self.personal and self.user_config_file().exists():
            self.load_config_file(str(self.user_config_file()))
            self.update_config(self.cli_config)
        if self.personal:
            self.update_config(self.personal_defaults())
        logging.basicConfig(level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")

    @staticmethod
    def user_config_file() -> Path:
        """A personal control plane's config file: ~/.cellscale/config.py ($CELLSCALE_HOME/config.py)."""
        return cellscale_home() / "config.py"

    def personal_defaults(self) -> Config:
        """What a personal control plane's Slurm backend needs, unless the user's config says
        otherwise: it submits as its own user (no sudo), to the SLURM_CONF it was started with,
        charged to the user's default Slurm account."""
        slurm, defaults = self.config.SlurmDriver, Config()
        if "submit_as" not in slurm:
            defaults.SlurmDriver.submit_as = []
        if "slurm_conf" not in slurm and os.environ.get("SLURM_CONF"):
            defaults.SlurmDriver.slurm_conf = os.environ["SLURM_CONF"]
        if "account" not in slurm and self._uses_slurm():
            account = default_slurm_account(getpass.getuser())
            if account:
                defaults.SlurmDriver.account = account
            else:
                self.log.warning(
                    "no Slurm account found for %s (neither $SLURM_ACCOUNT nor a DefaultAccount in sacctmgr): "
                    "set c.SlurmDriver.account in %s",
                    getpass.getuser(),
                    self.user_config_file(),
                )
        return defaults

    def _uses_slurm(self) -> bool:
        drivers = (value["driver"] if isinstance(value, dict) else value for value in self.backends.values())
        return "slurm" in drivers

    def make_drivers(self) -> dict[str, Driver]:
        drivers = {}
        for name, value in self.backends.items():
            settings = dict(value) if isinstance(value, dict) else {"driver": value}
            cls = driver_class(settings.pop("driver"))
            drivers[name] = cls(parent=self, name=name, **settings)
        return drivers

    def make_tenancy(self, store: Store, drivers: dict[str, Driver]) -> TenancyBook:
        book = TenancyBook(store)
        if self.personal:
            capacities = {name: driver.capacity().capacity_gpus for name, driver in drivers.items()}
            book.seed(Tenancy.single(PERSONAL_TENANT, capacities), actor="personal", replace=True)
            return book
        if not self.tenants_file:
            raise SystemExit("cellscale-hub: set ControlPlane.tenants_file (--tenants FILE) or run with --personal")
        try:
            seed = Tenancy.from_yaml(Path(self.tenants_file).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"cellscale-hub: {self.tenants_file}: {exc}") from exc
        book.seed(seed, actor=f"file:{self.tenants_file}", replace=self.reseed_tenancy)
        return book

    def listen_socket(self) -> socket.socket:
        ip, port = self.ip, self.port
        service_url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        if service_url and not self.personal:
            parsed = urlparse(service_url)
            ip, port = parsed.hostname or ip, parsed.port or port
        if self.personal and not port:
            previous = _previous_port(Path(self.data_dir) / "server.json")
            if previous:
                try:
                    return listening_socket(ip, previous)  # a restart keeps its address: clients need not look again
                except OSError:
                    self.log.info("port %d of the last run is taken; listening on a new one", previous)
        return listening_socket(ip, port)

    def settings(self) -> Settings:
        """The traits the controller and the API run by, read once."""
        return Settings(
            interval=self.poll_interval,
            wake_gap_s=self.wake_gap,
            preemption_grace_s=self.preemption_grace,
            fair_share_half_life_s=self.fair_share_half_life,
            heartbeat_timeout_s=self.heartbeat_timeout,
            admission_interval_s=self.admission_interval,
            backfill_depth=self.backfill_depth,
            meter_interval_s=self.meter_interval,
            bundle_keep_succeeded_s=self.bundle_keep_succeeded,
        )

    def make_dirs(self) -> tuple[Path, Path, Path]:
        """The data, jobs and bundles folders, made with their modes: (data, jobs_root, bundles_root)."""
        os.umask(0o077)  # what the control plane writes (store, bundles, job files before hand-over) is its own
        data = Path(self.data_dir)
        jobs_root, bundles_root = Path(self.jobs_root), data / "bundles"
        for path in (data, bundles_root, jobs_root):
            path.mkdir(parents=True, exist_ok=True)
        bundles_root.chmod(0o700)
        # jobs run as their owners: they may traverse to their own job dir (0700, theirs), list nothing
        jobs_root.chmod(0o711)
        data.chmod(0o711 if data in jobs_root.parents else 0o700)
        return data, jobs_root, bundles_root

    def make_identity(self, data: Path) -> tuple[Identity, HubOAuth | None, str, str | None]:
        """Who a token is: (identity, hub_oauth, URL prefix, the personal token or None)."""
        if self.personal:
            token = _personal_token(data / "token")
            return StaticTokenIdentity(token, getpass.getuser(), (PERSONAL_TENANT,)), None, "/", token
        # HubOAuth's cache_max_age is whole seconds and 0 means forever: HubIdentity skips it for 0
        cache_max_age = max(1, math.ceil(self.auth_cache_seconds))
        hub_oauth = HubOAuth(api_token=os.environ["JUPYTERHUB_API_TOKEN"], cache_max_age=cache_max_age)
        identity = HubIdentity(hub_oauth, self.service_name, cache_seconds=self.auth_cache_seconds)
        return identity, hub_oauth, os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/"), None

    def start(self) -> None:
        data, jobs_root, bundles_root = self.make_dirs()
        store = Store(self.db_url)
        store.migrate()
        _private_sqlite(store)
        drivers = self.make_drivers()
        tenancy = self.make_tenancy(store, drivers)
        bundles = BundleStore(bundles_root, quota_bytes=self.bundle_quota_mb * 2**20, grace_s=self.bundle_grace)
        metrics = Metrics()
        metrics.seed(store)
        settings = self.settings()
        controller = Controller(store, drivers, jobs_root, bundles, tenancy, settings, metrics=metrics)
        sock = self.listen_socket()
        identity, hub_oauth, prefix, token = self.make_identity(data)
        ctx = Context(
            store=store,
            wake=controller.wake,
            waiting=controller.waiting,
            metrics=metrics,
            drivers=drivers,
            tenancy=tenancy,
            identity=identity,
            jobs_root=jobs_root,
            bundles=bundles,
            prefix=prefix,
            settings=settings,
            hub_oauth=hub_oauth,
        )
        metrics.watch(State(store, tenancy, drivers, controller.waiting))
        app = build_app(ctx, max_body_bytes=self.max_request_bytes)
        controller.start()
        host, port = sock.getsockname()[:2]
        url = f"http://{host}:{port}{prefix}"
        _write_private(data / "control-plane.pid", str(os.getpid()))
        if self.personal:
            _write_private(data / "server.json", json.dumps({"url": url, "token": token, "pid": os.getpid()}))
        self.log.info(
            "cellscale control plane on %s (store %s, backends %s)",
            url,
            store.engine.url.render_as_string(),
            list(drivers),
        )
        try:
            _serve(app, sock)
        finally:
            controller.stop()
            store.dispose()


def _serve(app, sock: socket.socket) -> None:
    """Serve the API on `sock` until the hub stops the service."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3, access_log=False))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # the hub stops its services with SIGINT/SIGTERM
        pass


def listening_socket(ip: str, port: int) -> socket.socket:
    """The server's socket. Made with IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on the
    connections it accepts only when the listening socket's proto says TCP, and without it
    every request on a kept-alive connection after the first waited ~44 ms (Nagle's algorithm
    meeting the client's delayed ACK)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ip, port))
    return sock


def _previous_port(server_json: Path) -> int | None:
    """The port a personal control plane listened on last time (its server.json, if any)."""
    try:
        return urlparse(json.loads(server_json.read_text())["url"]).port
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _personal_token(path: Path) -> str:
    """A personal control plane's token, made once and kept (0600) so a restart (a crash, a
    reboot, `cellscale serve --personal`) does not lock out the kernels and CLIs that hold it."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if not token:
        token = secrets.token_urlsafe(32)
        _write_private(path, token)
    return token


def _private_sqlite(store: Store) -> None:
    """An SQLite store made before the control plane's umask was private is made private now."""
    url = store.engine.url
    if url.get_backend_name() == "sqlite" and url.database:
        for suffix in ("", "-wal", "-shm"):
            path = Path(url.database + suffix)
            if path.exists():
                path.chmod(0o600)


def _write_private(path: Path, text: str) -> None:
    """Write a file only this user can read, so readers see all of it or none (rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(path)


def main(argv=None) -> None:
    ControlPlane.launch_instance(argv)
