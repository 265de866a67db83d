"""A real multi-node Slurm cluster on one machine, for cellscale's tests and demos.

    python -m cellscale_hub.dev.slurm up|down|status [--sites] [--state-dir DIR]   (default /tmp/cellscale-slurm)

`up` builds, from Debian's own packages (slurm-wlm 22.05, slurmdbd, munge, MariaDB):

- one munged, one MariaDB (private data dir, 127.0.0.1, own port and socket), slurmdbd,
  slurmctld, and six slurmds (`slurmd -N node1..node4, cpu1, cpu2`, one port each): 4
  emulated GPU nodes (32 cores, 8 emulated GPUs each: character devices made with mknod,
  declared in gres.conf) in partition `gpu`, and 2 emulated CPU nodes (8 cores) in partition
  `cpu`, which may also hold up to 16 cores of each GPU node (MaxCPUsPerNode: the rest stay
  for GPU jobs) and no GPU (its QOS `cpu-only`); cores and memory consumable
  (CR_Core_Memory); leaf switches under a spine (topology/tree), multifactor priority with
  fair share, QOS preemption (`high` preempts `normal`, jobs requeued), accounting with
  gres/gpu;
- cluster `dca` (ClusterName; it was `cellscale`) also has partition `burst`: CLOUD nodes
  c1-c4 (32 cores, 8 GPUs) powered up and down by Slurm's own power saving, through the
  programs written into <state dir>/bin (resume, suspend, resume-fail, PrologSlurmctld);
- with `--sites`: a second cluster `dcb` (own slurmctld, slurmds b1 and b2, partition gpu,
  same slurmdbd, accounts, fair share and QOS), and the cloud simulation (dev/cloud.py) that
  answers the burst partition's resume and suspend requests by starting and killing the cloud
  nodes' slurmds. docs/sites.md;
- Unix users alice and carol (account desk-a) and bob (account desk-b), so a job runs
  under its researcher's own identity (`runuser -u alice -- sbatch -A desk-a ...`) and is
  charged to its desk.

Every file lives in the state dir: configs rendered from the templates shipped in the package
(cellscale_hub/dev/slurm_templates/*.in, so it works from an installed wheel), logs, pid
files, spool, database, munge key and socket, `jobs/` (mode 1777) for job output, and
`data-cache/` (mode 1777): each emulated node's dataset cache is `data-cache/<node>` (nodes on
one host share its disk and page cache: only their directories are apart).
Clients need only `SLURM_CONF=<state dir>/etc/slurm.conf`. `up` is idempotent: on a running
cluster it checks and returns. `down` cancels the cluster's jobs, stops the daemons it
started (by pid file, nothing else) and keeps the state dir, so the next `up` is quick.

Measured on a 2-core Debian 12 machine (shared with other work), wall time of the command:
- `up` from nothing installed: 20.0 s (apt-get update ~2 s, install ~9 s with most .debs
  already in the machine's apt cache, database init ~3 s, daemons and accounts ~5 s);
- `up` installed but stopped (state dir kept): 3.3-3.5 s (2.9-3.1 s with four nodes); with a
  new state dir: 9.1 s (10.8 s with four nodes, the same day: database init dominates);
- `up` on a running cluster: ~1 s, and it starts nothing; `down`: ~2 s.
Idle, all ten daemons: ~0.2% of one core, ~180 MB RSS (MariaDB ~115 MB of it; a slurmd ~6.5 MB).
With `--sites` (same machine): `up --sites` with a new state dir 10.9 s; on a running
topology 1.1 s; restarting a killed slurmctld (dcb's) 6.5 s. Idle, all 15 processes ~235 MB RSS
(MariaDB ~120 MB, the cloud simulation ~23 MB, slurmctld dca ~17 MB, dcb ~9 MB).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pwd
import re
import secrets
import signal
import socket
import stat
import string
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from cellscale_hub import proc
from cellscale_hub.dev import cloud as cloud_sim
from cellscale_hub.dev import users as unix_users

DEFAULT_STATE_DIR = Path("/tmp/cellscale-slurm")
TEMPLATE_DIR: Traversable = resources.files("cellscale_hub.dev") / "slurm_templates"  # package data
TEMPLATES = ("slurm.conf", "gres.conf", "topology.conf", "slurmdbd.conf")
DCB_TEMPLATES = {"dcb-slurm.conf": "slurm.conf", "dcb-gres.conf": "gres.conf"}  # template -> etc/dcb/NAME

PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server")
NEVER_INSTALL = "slurm-wlm-emulator"  # replaces slurmctld/slurmd via alternatives; unconfigurable

CLUSTER = "dca"  # the first site (it was "cellscale" before the sites topology)
DCB_CLUSTER = "dcb"  # the second site, `up --sites`
LEGACY_CLUSTER = "cellscale"
SLURM_USER = "slurm"
DB_USER = "slurm"
GPU_NODES = ("node1", "node2", "node3", "node4")
CPU_NODES = ("cpu1", "cpu2")
NODES = GPU_NODES + CPU_NODES  # dca's static nodes
CLOUD_NODES = ("c1", "c2", "c3", "c4")  # dca's partition burst: State=CLOUD, powered up on demand
DCB_NODES = ("b1", "b2")
BURST_PARTITION = "burst"
# Slurm power saving of the burst partition, and the cloud simulation's defaults
SUSPEND_TIME = 10  # s idle before a cloud node is powered down
SUSPEND_TIMEOUT = 5  # s a power-down takes (then idle~)
RESUME_TIMEOUT = 30  # s a booting node may take to register (then ResumeFailProgram)
MAX_ARRAY_SIZE = 101  # dca's MaxArraySize: small, so that a sweep of a few hundred points spans several arrays
BOOT_DELAY = 3.0  # s the simulated cloud takes to "boot an instance" (start its slurmd)
PRICE_PER_GPU_HOUR = 2.50  # $ the simulated cloud bills per GPU-hour, by the second
GPUS_PER_NODE = 8
CPU_PARTITION_QOS = "cpu-only"  # the cpu partition's QOS: no job there may take a GPU
NVIDIA_MAJOR = 195
TENANTS = {"desk-a": ("alice", "carol"), "desk-b": ("bob",)}
DEFAULT_PORTS = {
    "mariadb": 16306,
    "slurmctld": 16817,
    "slurmdbd": 16819,
    "slurmd": 17001,
    "dcb_slurmctld": 16827,
    "cloud": 16900,
    "cloud_slurmd": 17011,
    "dcb_slurmd": 17021,
}

SBIN = Path("/usr/sbin")
BIN = Path("/usr/bin")
DAEMON_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
READY_NODE_STATES = {"idle", "mixed", "allocated", "completing"}
SAFE_VALUE = re.compile(r"[A-Za-z0-9._/-]+")  # everything substituted into a config file

Log = Callable[[str], None]


class ClusterError(RuntimeError):
    """The dev cluster could not be brought to the asked state; the message says why."""


# ---------------------------------------------------------------------------- the state dir


@dataclass(frozen=True)
class Layout:
    """Where everything lives inside the state dir."""

    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def dbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def dcb_conf(self) -> Path:
        """Cluster dcb's slurm.conf (its own folder: slurmd reads gres.conf beside it)."""
        return self.etc / "dcb" / "slurm.conf"

    @property
    def bin(self) -> Path:
        """The programs slurmctld runs (power saving, PrologSlurmctld)."""
        return self.root / "bin"

    @property
    def cloud(self) -> Path:
        """The cloud simulation's config and token."""
        return self.root / "cloud"

    @property
    def settings(self) -> Path:
        return self.root / "settings.json"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def data_cache(self) -> Path:
        return self.root / "data-cache"

    @property
    def munge(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge / "munge.socket"

    @property
    def mysql(self) -> Path:
        return self.root / "mysql"

    @property
    def mysql_socket(self) -> Path:
        return self.mysql / "mysqld.sock"

    def pidfile(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"

    def console(self, daemon: str) -> Path:
        """The daemon's stdout and stderr (Slurm daemons also keep a timestamped NAME.log)."""
        return self.log / f"{daemon}.out"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs in its environment to talk to this cluster (dca; it
        reaches dcb too with `-M dcb`, through slurmdbd)."""
        return {"SLURM_CONF": str(self.conf)}

    @property
    def dcb_env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.dcb_conf)}


def layout_for(state_dir: Path | str) -> Layout:
    path = Path(os.path.abspath(state_dir))
    if not SAFE_VALUE.fullmatch(str(path)) or ".." in path.parts:
        raise ClusterError(f"state dir {str(path)!r}: use only letters, digits and . _ / - in its path")
    return Layout(path)


@dataclass(frozen=True)
class Settings:
    """Chosen once per state dir (ports, database password) and kept in settings.json."""

    hostname: str
    mariadb_port: int
    slurmctld_port: int
    slurmdbd_port: int
    slurmd_port_first: int
    db_password: str
    # added with the sites topology: a settings.json from before gets them at the next `up`
    dcb_slurmctld_port: int = 0
    cloud_port: int = 0
    cloud_slurmd_port_first: int = 0
    dcb_slurmd_port_first: int = 0

    @property
    def slurmd_ports(self) -> dict[str, int]:
        return {node: self.slurmd_port_first + i for i, node in enumerate(NODES)}

    @property
    def cloud_slurmd_ports(self) -> dict[str, int]:
        return {node: self.cloud_slurmd_port_first + i for i, node in enumerate(CLOUD_NODES)}

    @property
    def dcb_slurmd_ports(self) -> dict[str, int]:
        return {node: self.dcb_slurmd_port_first + i for i, node in enumerate(DCB_NODES)}


def short_hostname() -> str:
    name = socket.gethostname().split(".")[0]
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*", name):
        raise ClusterError(f"hostname {name!r} cannot be a Slurm controller name")
    return name


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int, count: int = 1) -> int:
    """The first of `count` consecutive free ports, trying `preferred` first."""
    for first in range(preferred, preferred + 2000, 10):
        if all(port_free(first + i) for i in range(count)):
            return first
    raise ClusterError(f"no {count} free consecutive ports from {preferred}")


SITES_PORTS = {  # Settings field -> (DEFAULT_PORTS key, consecutive ports)
    "dcb_slurmctld_port": ("dcb_slurmctld", 1),
    "cloud_port": ("cloud", 1),
    "cloud_slurmd_port_first": ("cloud_slurmd", len(CLOUD_NODES)),
    "dcb_slurmd_port_first": ("dcb_slurmd", len(DCB_NODES)),
}


def load_settings(layout: Layout) -> Settings:
    if layout.settings.exists():
        saved = json.loads(layout.settings.read_text())
        missing = [name for name in SITES_PORTS if not saved.get(name)]
        for name in missing:  # a state dir from before the sites topology
            key, count = SITES_PORTS[name]
            saved[name] = pick_port(DEFAULT_PORTS[key], count)
        if missing:
            write_private(layout.settings, json.dumps(saved, indent=2) + "\n")
        saved["hostname"] = short_hostname()
        return Settings(**saved)
    settings = Settings(
        hostname=short_hostname(),
        mariadb_port=pick_port(DEFAULT_PORTS["mariadb"]),
        slurmctld_port=pick_port(DEFAULT_PORTS["slurmctld"]),
        slurmdbd_port=pick_port(DEFAULT_PORTS["slurmdbd"]),
        slurmd_port_first=pick_port(DEFAULT_PORTS["slurmd"], len(NODES)),
        db_password=secrets.token_hex(16),
        **{name: pick_port(DEFAULT_PORTS[key], count) for name, (key, count) in SITES_PORTS.items()},
    )
    write_private(layout.settings, json.dumps(settings.__dict__, indent=2) + "\n")
    return settings


def write_private(path: Path, text: str) -> None:
    """Write a file only root can read (it may hold a password)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)


def template_values(layout: Layout, settings: Settings) -> dict[str, str]:
    ports = settings.slurmd_ports
    values = {
        "state_dir": str(layout.root),
        "cluster": CLUSTER,
        "hostname": settings.hostname,
        "slurm_user": SLURM_USER,
        "db_user": DB_USER,
        "db_password": settings.db_password,
        "mariadb_port": str(settings.mariadb_port),
        "slurmctld_port": str(settings.slurmctld_port),
        "slurmdbd_port": str(settings.slurmdbd_port),
        "gpu_node_ports": f"{ports[GPU_NODES[0]]}-{ports[GPU_NODES[-1]]}",
        "cpu_node_ports": f"{ports[CPU_NODES[0]]}-{ports[CPU_NODES[-1]]}",
        "cpu_partition_qos": CPU_PARTITION_QOS,
        "dcb_cluster": DCB_CLUSTER,
        "dcb_slurmctld_port": str(settings.dcb_slurmctld_port),
        "cloud_port": str(settings.cloud_port),
        "cloud_node_ports": _port_range(settings.cloud_slurmd_ports),
        "dcb_node_ports": _port_range(settings.dcb_slurmd_ports),
        "suspend_time": str(SUSPEND_TIME),
        "suspend_timeout": str(SUSPEND_TIMEOUT),
        "resume_timeout": str(RESUME_TIMEOUT),
        "max_array_size": str(MAX_ARRAY_SIZE),
    }
    for key, value in values.items():
        if not SAFE_VALUE.fullmatch(value):
            raise ClusterError(f"refusing to write {key}={value!r} into a Slurm config")
    for key, port in [
        ("mariadb_port", settings.mariadb_port),
        ("slurmctld_port", settings.slurmctld_port),
        ("slurmdbd_port", settings.slurmdbd_port),
        ("dcb_slurmctld_port", settings.dcb_slurmctld_port),
        ("cloud_port", settings.cloud_port),
        *((f"slurmd-{node}'s port", port) for node, port in ports.items()),
        *((f"slurmd-{node}'s port", port) for node, port in settings.cloud_slurmd_ports.items()),
        *((f"slurmd-{node}'s port", port) for node, port in settings.dcb_slurmd_ports.items()),
    ]:
        if not 1024 <= port <= 65535:
            raise ClusterError(f"{key}={port} is not a usable port")
    return values


def _port_range(ports: Mapping[str, int]) -> str:
    values = list(ports.values())
    return f"{values[0]}-{values[-1]}"


def render(name: str, values: Mapping[str, str], template_dir: Traversable = TEMPLATE_DIR) -> str:
    template = template_dir / f"{name}.in"
    if not template.is_file():
        raise ClusterError(
            f"template {template} is missing (--templates names a folder with "
            f"{', '.join(t + '.in' for t in TEMPLATES)}; default: the package's own)"
        )
    return string.Template(template.read_text()).substitute(values)


def write_configs(layout: Layout, settings: Settings, template_dir: Traversable, log: Log) -> bool:
    """Render the four configs; True when one changed (daemons already running keep the old one)."""
    values = template_values(layout, settings)
    slurm = pwd.getpwnam(SLURM_USER)
    changed = False
    targets = [(name, layout.etc / name) for name in TEMPLATES]
    targets += [(name, layout.dcb_conf.parent / target) for name, target in DCB_TEMPLATES.items()]
    for name, path in targets:
        text = render(name, values, template_dir)
        existed = path.exists()
        if not existed or path.read_text() != text:
            if name == "slurmdbd.conf":
                write_private(path, text)
            else:
                path.write_text(text)
                os.chmod(path, 0o644)
            changed = changed or existed
            log(f"wrote {path}")
    os.chown(layout.dbd_conf, slurm.pw_uid, slurm.pw_gid)  # slurmdbd insists: mode 600, owned by SlurmUser
    return changed


def make_root(layout: Layout) -> None:
    """The state dir, refusing one that someone else made (it sits in /tmp by default)."""
    layout.root.mkdir(mode=0o755, parents=True, exist_ok=True)
    if layout.root.is_symlink() or layout.root.stat().st_uid != 0:
        raise ClusterError(f"{layout.root} must be a directory owned by root, not a link")


def make_dirs(layout: Layout) -> None:
    slurm = pwd.getpwnam(SLURM_USER)
    for path in (layout.etc, layout.run, layout.log, layout.spool, layout.dev, layout.munge, layout.mysql, layout.bin):
        path.mkdir(mode=0o755, exist_ok=True)
    layout.dcb_conf.parent.mkdir(mode=0o755, exist_ok=True)
    layout.cloud.mkdir(mode=0o750, exist_ok=True)
    os.chown(layout.cloud, 0, slurm.pw_gid)  # the power scripts (run as slurm) read its config and token
    for name in ("slurmctld", "slurmctld-dcb"):
        ctld_spool = layout.spool / name
        ctld_spool.mkdir(mode=0o700, exist_ok=True)
        os.chown(ctld_spool, slurm.pw_uid, slurm.pw_gid)  # slurmctld runs as SlurmUser
    # every node's spool up front, the cloud nodes' too (slurmd -b logs an error otherwise)
    for node in NODES + CLOUD_NODES + DCB_NODES:
        (layout.spool / f"slurmd-{node}").mkdir(mode=0o755, exist_ok=True)
    layout.jobs.mkdir(exist_ok=True)
    os.chmod(layout.jobs, 0o1777)  # every researcher's job writes its output here
    layout.data_cache.mkdir(exist_ok=True)
    os.chmod(layout.data_cache, 0o1777)  # each node's dataset cache, <data-cache>/<node>, shared by its jobs


def make_gpu_devices(layout: Layout) -> None:
    """Character devices /dev/nvidiaN look-alikes: gres.conf needs File= to exist."""
    for index in range(GPUS_PER_NODE):
        path = layout.dev / f"nvidia{index}"
        wanted = os.makedev(NVIDIA_MAJOR, index)
        if path.exists():
            info = path.lstat()
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == wanted:
                continue
            path.unlink()
        os.mknod(path, 0o666 | stat.S_IFCHR, wanted)


def make_munge_key(layout: Layout) -> None:
    key = layout.munge / "munge.key"
    if key.exists():
        return
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(secrets.token_bytes(1024))


def write_cloud_files(layout: Layout, settings: Settings, log: Log) -> None:
    """The cloud simulation's config and token, and the programs slurmctld runs for the burst
    partition (ResumeProgram, SuspendProgram, ResumeFailProgram, PrologSlurmctld)."""
    slurm = pwd.getpwnam(SLURM_USER)
    token = layout.cloud / "token"
    if not token.exists():
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        with os.fdopen(fd, "w") as out:
            out.write(cloud_sim.new_token() + "\n")
    os.chown(token, 0, slurm.pw_gid)  # root and the slurm group only
    os.chmod(token, 0o640)
    power_log = layout.log / "power.log"
    power_log.touch(exist_ok=True)
    os.chown(power_log, slurm.pw_uid, slurm.pw_gid)
    config = {
        "state_dir": str(layout.root),
        "port": settings.cloud_port,
        "slurm_conf": str(layout.conf),
        "nodes": dict.fromkeys(CLOUD_NODES, GPUS_PER_NODE),
        "price_per_gpu_hour": PRICE_PER_GPU_HOUR,
        "boot_delay": BOOT_DELAY,
        "resume_timeout": RESUME_TIMEOUT,
        "token_file": str(token),
        "log_dir": str(layout.log),
        "power_log": str(power_log),
        "slurmd": str(SBIN / "slurmd"),
        "scontrol": str(BIN / "scontrol"),
        "sinfo": str(BIN / "sinfo"),
    }
    text = json.dumps(config, indent=2) + "\n"
    path = cloud_sim.config_path(layout.root)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        os.chmod(path, 0o644)
    for program, kind in cloud_sim.POWER_PROGRAMS.items():
        script = layout.bin / program
        text = cloud_sim.power_script(kind, path)
        if not script.exists() or script.read_text() != text:
            script.write_text(text)
            log(f"wrote {script}")
        os.chmod(script, 0o755)


def clear_foreign_ctld_state(layout: Layout, log: Log) -> None:
    """slurmctld dies on "CLUSTER NAME MISMATCH" when its StateSaveLocation was made under
    another ClusterName (this cluster was "cellscale" before it became dca): clear it (jobs
    and node states only; accounting stays in slurmdbd). Only while no slurmctld runs."""
    for name, cluster in (("slurmctld", CLUSTER), ("slurmctld-dcb", DCB_CLUSTER)):
        spool = layout.spool / name
        saved = spool / "clustername"
        made_for = saved.read_text().strip() if saved.exists() else cluster
        if made_for != cluster and not pid_of(layout, name):
            for entry in spool.iterdir():
                if entry.is_file() or entry.is_symlink():
                    entry.unlink()
                else:
                    subprocess.run(["rm", "-rf", "--", str(entry)], check=False)
            log(f"cleared {spool}: it was made for cluster {made_for!r}, not {cluster!r}")
            # job ids start again at 1: the old jobs' output files (jobs/<id>.out, owned by
            # whoever ran them) would refuse the new jobs' output (Permission denied)
            old_outputs = [p for p in layout.jobs.glob("*.out") if p.stem.isdigit()]
            for output in old_outputs:
                output.unlink(missing_ok=True)
            if old_outputs:
                log(f"removed {len(old_outputs)} output file(s) of the old cluster's jobs from {layout.jobs}")


def prepare_state(layout: Layout, template_dir: Traversable, log: Log) -> Settings:
    make_dirs(layout)
    settings = load_settings(layout)
    if write_configs(layout, settings, template_dir, log) and any(pid_of(layout, d) for d in daemon_names(True)):
        log("config changed while daemons run: `down` then `up` to apply it")
    write_cloud_files(layout, settings, log)
    clear_foreign_ctld_state(layout, log)
    make_gpu_devices(layout)
    make_munge_key(layout)
    return settings


# ---------------------------------------------------------------------------- commands


def run_cmd(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    input: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run one command (an argv list, never a shell) and capture its output."""
    try:
        result = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            env=None if env is None else dict(env),
            check=False,
        )
    except FileNotFoundError as exc:
        raise ClusterError(f"{argv[0]} is not installed") from exc
    if check and result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip())[-2000:]
        raise ClusterError(f"`{' '.join(argv)}` exited {result.returncode}: {output}")
    return result


def client_env(layout: Layout) -> dict[str, str]:
    """This process's environment for Slurm clients: no inherited SLURM_* variables, our SLURM_CONF."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    env.update(layout.env)
    return env


def daemon_env(layout: Layout) -> dict[str, str]:
    return {"PATH": DAEMON_PATH, "LANG": "C.UTF-8", "HOME": "/root", **layout.env}


def wait_for(
    check: Callable[[], bool],
    what: str,
    timeout: float,
    child: subprocess.Popen | None = None,
    log_path: Path | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if child is not None and child.poll() is not None:
            raise ClusterError(f"{what}: the daemon exited ({child.returncode}){log_tail(log_path)}")
        time.sleep(0.2)
    raise ClusterError(f"{what}: not ready within {timeout:.0f} s{log_tail(log_path)}")


def log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    tail = path.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- last lines of {path} ---\n" + "\n".join(tail)


# ---------------------------------------------------------------------------- packages and users


def installed_packages(names: Sequence[str]) -> set[str]:
    result = run_cmd(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *names], check=False)
    return {line.split()[0] for line in result.stdout.splitlines() if line.endswith("install ok installed")}


def ensure_packages(log: Log) -> None:
    if installed_packages([NEVER_INSTALL]):
        raise ClusterError(
            f"{NEVER_INSTALL} is installed: it replaces slurmctld and slurmd and cannot be "
            f"configured. Remove it first: apt-get purge {NEVER_INSTALL}"
        )
    installed = installed_packages(PACKAGES)
    missing = [name for name in PACKAGES if name not in installed]
    if not missing:
        return
    log(f"installing {' '.join(missing)} (once)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run_cmd(["apt-get", "update"], env=env, timeout=600)
    run_cmd(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env, timeout=1800)
    if installed_packages([NEVER_INSTALL]):
        raise ClusterError(f"{NEVER_INSTALL} got installed; purge it: apt-get purge {NEVER_INSTALL}")


def ensure_cluster_users(log: Log) -> None:
    unix_users.ensure_users((user for members in TENANTS.values() for user in members), log)


# ---------------------------------------------------------------------------- daemons


@dataclass(frozen=True)
class Daemon:
    name: str  # pid file and log file stem
    argv: tuple[str, ...]
    ports: tuple[int, ...] = ()


def daemon_names(sites: bool = False) -> list[str]:
    """In start order; `down` stops them in reverse. With `sites`: the cloud simulation and
    cluster dcb too (the cloud nodes' slurmds are the cloud's, see `cloud_slurmd_names`)."""
    names = ["munged", "mariadb", "slurmdbd"]
    if sites:
        names.append("cloud")
    names.append("slurmctld")
    if sites:
        names.append("slurmctld-dcb")
    names += [f"slurmd-{node}" for node in NODES]
    if sites:
        names += [f"slurmd-{node}" for node in DCB_NODES]
    return names


def cloud_slurmd_names() -> list[str]:
    """The burst nodes' slurmds: started and stopped by the cloud simulation, not by `up`;
    `down` stops any it left behind (by their pid files)."""
    return [f"slurmd-{node}" for node in CLOUD_NODES]


def executable(name: str) -> str:
    if name == "cloud":
        return Path(sys.executable).name
    return {"mariadb": "mariadbd", "munged": "munged"}.get(name, name.split("-")[0])


def daemons(layout: Layout, settings: Settings) -> dict[str, Daemon]:
    conf = str(layout.conf)
    found = [
        Daemon(
            "munged",
            (
                str(SBIN / "munged"),
                "--foreground",
                "--force",
                f"--socket={layout.munge_socket}",
                f"--key-file={layout.munge / 'munge.key'}",
                f"--pid-file={layout.pidfile('munged')}",
                f"--seed-file={layout.munge / 'munged.seed'}",
                f"--log-file={layout.console('munged')}",
            ),
        ),
        Daemon(
            "mariadb",
            (
                str(SBIN / "mariadbd"),
                "--no-defaults",
                "--user=root",
                f"--datadir={layout.mysql / 'data'}",
                f"--socket={layout.mysql_socket}",
                f"--port={settings.mariadb_port}",
                "--bind-address=127.0.0.1",
                f"--pid-file={layout.pidfile('mariadb')}",
                "--skip-name-resolve",
                # half of what slurmdbd recommends, or it logs "not recommended values"
                "--innodb-buffer-pool-size=512M",
                "--innodb-lock-wait-timeout=900",
            ),
            (settings.mariadb_port,),
        ),
        Daemon("slurmdbd", (str(SBIN / "slurmdbd"), "-D"), (settings.slurmdbd_port,)),
        Daemon("slurmctld", (str(SBIN / "slurmctld"), "-D", "-f", conf), (settings.slurmctld_port,)),
    ]
    for node, port in settings.slurmd_ports.items():
        found.append(Daemon(f"slurmd-{node}", (str(SBIN / "slurmd"), "-D", "-N", node, "-f", conf), (port,)))
    # the second site and the cloud simulation (`up --sites`)
    dcb = str(layout.dcb_conf)
    found.append(Daemon("slurmctld-dcb", (str(SBIN / "slurmctld"), "-D", "-f", dcb), (settings.dcb_slurmctld_port,)))
    for node, port in settings.dcb_slurmd_ports.items():
        found.append(Daemon(f"slurmd-{node}", (str(SBIN / "slurmd"), "-D", "-N", node, "-f", dcb), (port,)))
    cloud_script = str(Path(cloud_sim.__file__).resolve())  # stdlib-only: runs as a plain script
    cloud_argv = (sys.executable, "-I", cloud_script, "--state-dir", str(layout.root), "serve")
    found.append(Daemon("cloud", cloud_argv, (settings.cloud_port,)))
    return {daemon.name: daemon for daemon in found}


_children: dict[int, subprocess.Popen[bytes]] = {}


def pid_of(layout: Layout, name: str) -> int | None:
    """The pid in the daemon's pid file, if that process is alive and is ours."""
    try:
        pid = int(layout.pidfile(name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if is_ours(pid, name, layout) else None


def is_ours(pid: int, name: str, layout: Layout) -> bool:
    """Alive, runs the daemon's executable, and names our state dir in its argv or environment."""
    reap(pid)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return False
    if state in ("Z", "X") or Path(os.fsdecode(argv[0])).name != executable(name):
        return False
    marker = os.fsencode(str(layout.root))
    if any(marker in arg for arg in argv):
        return True
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes()  # slurmdbd: only SLURM_CONF names the dir
    except PermissionError:
        return True  # not root (`status`): the pid file and the executable have to do
    except OSError:
        return False


def reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        del _children[pid]


def start(daemon: Daemon, layout: Layout, log: Log) -> subprocess.Popen[bytes] | None:
    """Start the daemon in the background unless it runs; returns the new process."""
    if pid_of(layout, daemon.name):
        return None
    busy = [port for port in daemon.ports if not port_free(port)]
    if busy:
        raise ClusterError(
            f"{daemon.name}: port {busy[0]} is taken by another program; delete {layout.settings} to choose new ports"
        )
    env = daemon_env(layout)
    if daemon.name.endswith("-dcb") or daemon.name in (f"slurmd-{node}" for node in DCB_NODES):
        env.update(layout.dcb_env)
    child = proc.spawn_detached(daemon.argv, cwd=layout.root, log=layout.console(daemon.name), env=env)
    _children[child.pid] = child
    layout.pidfile(daemon.name).write_text(f"{child.pid}\n")
    log(f"started {daemon.name} (pid {child.pid})")
    return child


def stop(name: str, layout: Layout, log: Log, grace: float = 30) -> bool:
    """SIGTERM (then SIGKILL) the daemon named by its pid file, if it is ours and alive."""
    pid = pid_of(layout, name)
    if pid is None:
        layout.pidfile(name).unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and is_ours(pid, name, layout):
        time.sleep(0.1)
    if is_ours(pid, name, layout):
        log(f"{name} (pid {pid}) ignored SIGTERM for {grace:.0f} s: SIGKILL")
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    layout.pidfile(name).unlink(missing_ok=True)
    log(f"stopped {name} (pid {pid})")
    return True


# ---------------------------------------------------------------------------- the steps of `up`


def start_munge(layout: Layout, settings: Settings, log: Log) -> bool:
    child = start(daemons(layout, settings)["munged"], layout, log)
    if child:
        wait_for(layout.munge_socket.is_socket, "munged", 20, child, layout.console("munged"))
    return child is not None


def mariadb_client(layout: Layout, *args: str) -> list[str]:
    return [str(BIN / "mariadb"), "--no-defaults", f"--socket={layout.mysql_socket}", "--user=root", *args]


def start_mariadb(layout: Layout, settings: Settings, log: Log) -> bool:
    datadir = layout.mysql / "data"
    if not (datadir / "mysql").exists():
        log("initialising the accounting database")
        run_cmd(
            [
                str(BIN / "mariadb-install-db"),
                "--no-defaults",
                "--user=root",
                f"--datadir={datadir}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            timeout=300,
        )
    child = start(daemons(layout, settings)["mariadb"], layout, log)
    if child is None:
        return False

    def answers() -> bool:
        return run_cmd(mariadb_client(layout, "-e", "SELECT 1"), check=False).returncode == 0

    wait_for(answers, "mariadb", 120, child, layout.console("mariadb"))
    password = settings.db_password  # validated: hex only
    account = f"'{DB_USER}'@'127.0.0.1'"
    run_cmd(
        mariadb_client(layout),
        input=(
            f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY '{password}';\n"
            f"ALTER USER {account} IDENTIFIED BY '{password}';\n"
            f"GRANT ALL PRIVILEGES ON slurm_acct_db.* TO {account};\n"
        ),
    )
    return True


def sacctmgr(layout: Layout, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_cmd([str(BIN / "sacctmgr"), *args], env=client_env(layout), check=check)


def sacctmgr_rows(layout: Layout, *args: str) -> list[list[str]]:
    """`sacctmgr -n -P show ...` as rows of fields."""
    output = sacctmgr(layout, "-n", "-P", "show", *args).stdout
    return [line.split("|") for line in output.splitlines() if line.strip()]


def start_slurmdbd(layout: Layout, settings: Settings, log: Log, clusters: Sequence[str] = (CLUSTER,)) -> bool:
    child = start(daemons(layout, settings)["slurmdbd"], layout, log)
    if child:

        def answers() -> bool:
            return sacctmgr(layout, "-n", "-P", "show", "cluster", check=False).returncode == 0

        wait_for(answers, "slurmdbd", 90, child, layout.console("slurmdbd"))
    known = sacctmgr_rows(layout, "cluster", "format=cluster")
    if [LEGACY_CLUSTER] in known:  # this state dir's cluster before it was renamed dca
        sacctmgr(layout, "-i", "delete", "cluster", LEGACY_CLUSTER)
        log(f"removed the old cluster {LEGACY_CLUSTER} from accounting (now {CLUSTER})")
    for cluster in clusters:
        if [cluster] not in known:
            sacctmgr(layout, "-i", "add", "cluster", cluster)  # before its slurmctld starts
            log(f"registered cluster {cluster} in accounting")
    return child is not None


def ensure_partition_qos(layout: Layout, log: Log) -> None:
    """The cpu partition's QOS, which slurm.conf names: slurmctld refuses to start without it.
    DenyOnLimit: a job over its limits is refused at submit rather than left pending forever.
    Its limit on GPUs comes later (`limit_partition_qos`)."""
    if [CPU_PARTITION_QOS] not in sacctmgr_rows(layout, "qos", "format=name"):
        sacctmgr(layout, "-i", "add", "qos", CPU_PARTITION_QOS, "Flags=DenyOnLimit")
        log(f"added QOS {CPU_PARTITION_QOS} (the cpu partition's)")


def limit_partition_qos(layout: Layout, log: Log) -> None:
    """No GPU for any job of the cpu partition (the GPU nodes' GPUs are the gpu partition's).
    Set once slurmctld has registered: accounting knows the gres/gpu TRES only from then."""
    if sacctmgr_rows(layout, "qos", CPU_PARTITION_QOS, "format=maxtres") != [["gres/gpu=0"]]:
        sacctmgr(layout, "-i", "modify", "qos", CPU_PARTITION_QOS, "set", "MaxTRESPerJob=gres/gpu=0")
        log(f"QOS {CPU_PARTITION_QOS}: no GPUs")


def cluster_env(layout: Layout, cluster: str) -> dict[str, str]:
    env = client_env(layout)
    if cluster == DCB_CLUSTER:
        env.update(layout.dcb_env)
    return env


def start_slurmctld(layout: Layout, settings: Settings, log: Log, name: str = "slurmctld") -> bool:
    child = start(daemons(layout, settings)[name], layout, log)
    if child:
        env = cluster_env(layout, DCB_CLUSTER if name == "slurmctld-dcb" else CLUSTER)

        def answers() -> bool:
            result = run_cmd([str(BIN / "scontrol"), "ping"], env=env, check=False)
            return result.returncode == 0 and " is UP" in result.stdout

        wait_for(answers, name, 60, child, layout.console(name))
    return child is not None


def start_slurmds(layout: Layout, settings: Settings, log: Log, nodes: Sequence[str] = NODES) -> bool:
    started = False
    for node in nodes:
        started = start(daemons(layout, settings)[f"slurmd-{node}"], layout, log) is not None or started
    return started


def node_states(layout: Layout, cluster: str = CLUSTER) -> dict[str, str]:
    """Every node of the cluster and its state as `sinfo -o %t` writes it: `idle`, `alloc`,
    and for the cloud nodes the power-saving suffixes (`idle~` powered down, `#` powering up,
    `%` powering down)."""
    result = run_cmd([str(BIN / "sinfo"), "-h", "-N", "-o", "%N %t"], env=cluster_env(layout, cluster), check=False)
    return dict(line.split(maxsplit=1) for line in result.stdout.splitlines() if line.strip())


def heal_cloud_nodes(layout: Layout, log: Log) -> None:
    """A cloud node left DOWN while powered down (`down~`: a reclaim or a failed resume from an
    earlier run) would never be used again: resume it (it stays powered down, `idle~`)."""
    stuck = [
        n
        for n, state in node_states(layout).items()
        if n in CLOUD_NODES and state.startswith(("down", "drain")) and state.endswith("~")
    ]
    if stuck:
        run_cmd(
            [str(BIN / "scontrol"), "update", f"nodename={','.join(stuck)}", "state=resume"], env=client_env(layout)
        )
        log(f"resumed cloud node(s) {', '.join(stuck)}: they were left DOWN while powered down")


READY_SHORT_STATES = {"idle", "mix", "alloc", "comp"}


def wait_nodes_ready(
    layout: Layout, log: Log, timeout: float = 90, cluster: str = CLUSTER, nodes: Sequence[str] = NODES
) -> None:
    """Until every static node answers and takes jobs; nodes left down or drained by an
    earlier session are resumed. Cloud nodes may be in any power state (powered down: idle~)."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = {node: state for node, state in node_states(layout, cluster).items() if node in nodes}
        if set(states) == set(nodes) and all(state in READY_SHORT_STATES for state in states.values()):
            return
        for node, state in states.items():
            if state.rstrip("*") in ("down", "drain", "drng"):
                resumed = run_cmd(
                    [str(BIN / "scontrol"), "update", f"nodename={node}", "state=resume"],
                    env=cluster_env(layout, cluster),
                    check=False,  # it may have come back by itself since sinfo answered
                )
                if resumed.returncode == 0:
                    log(f"resumed {node} (was {state})")
        time.sleep(0.3)
    raise ClusterError(
        f"{cluster}: nodes not ready within {timeout:.0f} s: {states}{log_tail(layout.console('slurmd-' + nodes[0]))}"
    )


def wait_controller_registered(layout: Layout, timeout: float = 60, cluster: str = CLUSTER) -> None:
    """slurmctld has connected to slurmdbd (GRES TRES are unknown to accounting before that)."""

    def registered() -> bool:
        rows = sacctmgr_rows(layout, "cluster", cluster, "format=controlhost")
        return bool(rows and rows[0][0])

    ctld = "slurmctld-dcb" if cluster == DCB_CLUSTER else "slurmctld"
    wait_for(registered, f"{ctld} registering with slurmdbd", timeout, None, layout.console(ctld))


def ensure_accounts(layout: Layout, log: Log, clusters: Sequence[str] = (CLUSTER,)) -> None:
    """QOS high (preempts normal), one account per desk, each researcher in their desk's
    account, in every cluster (one association per cluster)."""
    if ["high"] not in sacctmgr_rows(layout, "qos", "format=name"):
        sacctmgr(layout, "-i", "add", "qos", "high", "Priority=100", "Preempt=normal", "PreemptMode=requeue")
        log("added QOS high (preempts normal)")
    rows = sacctmgr_rows(layout, "assoc", f"cluster={','.join(clusters)}", "format=cluster,account,user")
    have = {tuple(row) for row in rows}
    for account in TENANTS:
        missing = [c for c in clusters if (c, account, "") not in have]
        if missing:
            sacctmgr(
                layout,
                "-i",
                "add",
                "account",
                account,
                f"Cluster={','.join(missing)}",
                f"Description={account}",
                "Organization=cellscale",
                "QOS=normal,high",
                "DefaultQOS=normal",
            )
            log(f"added account {account} in {', '.join(missing)}")
    for account, users in TENANTS.items():
        for user in users:
            missing = [c for c in clusters if (c, account, user) not in have]
            if missing:
                sacctmgr(
                    layout,
                    "-i",
                    "add",
                    "user",
                    user,
                    f"Account={account}",
                    f"DefaultAccount={account}",
                    f"Cluster={','.join(missing)}",
                )
                log(f"added {user} to {account} in {', '.join(missing)}")


def wait_controller_knows_users(layout: Layout, timeout: float = 30, cluster: str = CLUSTER) -> None:
    """slurmdbd pushes new associations to slurmctld asynchronously: wait until a job would be accepted."""
    wanted = {user for users in TENANTS.values() for user in users}

    def known() -> bool:
        result = run_cmd(
            [str(BIN / "scontrol"), "show", "assoc_mgr", "flags=users"], env=cluster_env(layout, cluster), check=False
        )
        seen = set(re.findall(r"UserName=([^(\s]+)", result.stdout))
        return wanted <= seen

    wait_for(known, f"{cluster}'s slurmctld learning the researchers' associations", timeout)


# ---------------------------------------------------------------------------- up, down, status


@dataclass(frozen=True)
class Cluster:
    """A running dev cluster, as `up` leaves it."""

    state_dir: Path
    started: tuple[str, ...]  # what this `up` started; empty when the cluster already ran
    seconds: float
    sites: bool = False  # dcb and the cloud simulation run too

    @property
    def layout(self) -> Layout:
        return Layout(self.state_dir)

    @property
    def env(self) -> dict[str, str]:
        """Add this to a client's environment: {"SLURM_CONF": ...}."""
        return self.layout.env

    @property
    def jobs_dir(self) -> Path:
        """Writable by every researcher (mode 1777): put job output here."""
        return self.layout.jobs

    @property
    def dcb_env(self) -> dict[str, str]:
        """{"SLURM_CONF": dcb's slurm.conf}, for a client (or a backend) of the second site."""
        return self.layout.dcb_env


def up(
    state_dir: Path | str = DEFAULT_STATE_DIR,
    *,
    template_dir: Traversable = TEMPLATE_DIR,
    log: Log = print,
    sites: bool = False,
) -> Cluster:
    """Install, configure and start the cluster; on a running cluster only check it (and
    start what is missing). `sites`: also the second cluster dcb and the cloud simulation
    behind dca's burst partition."""
    began = time.monotonic()
    require_root()
    layout = layout_for(state_dir)
    ensure_packages(log)
    ensure_cluster_users(log)
    unix_users.share_python(log)
    make_root(layout)
    with exclusive(layout):  # a second `up` (another test session) waits, then finds it running
        settings = prepare_state(layout, template_dir, log)
        names = daemon_names(sites)
        clusters = (CLUSTER, DCB_CLUSTER) if sites else (CLUSTER,)
        before = {name for name in names if pid_of(layout, name)}
        start_munge(layout, settings, log)
        start_mariadb(layout, settings, log)
        start_slurmdbd(layout, settings, log, clusters)
        ensure_partition_qos(layout, log)
        if sites:
            start_cloud(layout, settings, log)
        start_slurmctld(layout, settings, log)
        if sites:
            start_slurmctld(layout, settings, log, "slurmctld-dcb")
        start_slurmds(layout, settings, log)
        if sites:
            start_slurmds(layout, settings, log, DCB_NODES)
        started = tuple(name for name in names if name not in before)
        if started:
            wait_nodes_ready(layout, log)
            wait_controller_registered(layout)
            if sites:
                wait_nodes_ready(layout, log, cluster=DCB_CLUSTER, nodes=DCB_NODES)
                wait_controller_registered(layout, cluster=DCB_CLUSTER)
        limit_partition_qos(layout, log)
        heal_cloud_nodes(layout, log)
        ensure_accounts(layout, log, clusters)
        for cluster in clusters:
            wait_controller_knows_users(layout, cluster=cluster)
    return Cluster(layout.root, started, time.monotonic() - began, sites)


def start_cloud(layout: Layout, settings: Settings, log: Log) -> bool:
    child = start(daemons(layout, settings)["cloud"], layout, log)
    if child:

        def answers() -> bool:
            try:
                cloud_sim.CloudClient(layout.root, timeout=2).ledger()
            except cloud_sim.CloudError:
                return False
            return True

        wait_for(answers, "cloud simulation", 20, child, layout.console("cloud"))
    return child is not None


@contextmanager
def exclusive(layout: Layout) -> Iterator[None]:
    """One `up` or `down` at a time per state dir."""
    with open(layout.root / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def cancel_jobs(layout: Layout, log: Log, cluster: str = CLUSTER, timeout: float = 20) -> None:
    """Cancel every job of this cluster, so no job step outlives its slurmd."""
    env = cluster_env(layout, cluster)
    squeue = [str(BIN / "squeue"), "-h", "-o", "%i"]
    ids = run_cmd(squeue, env=env, check=False).stdout.split()
    if not ids:
        return
    run_cmd([str(BIN / "scancel"), *ids], env=env, check=False)
    log(f"cancelled {len(ids)} job(s) of {cluster}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run_cmd(squeue, env=env, check=False).stdout.split():
        time.sleep(0.3)


def down(state_dir: Path | str = DEFAULT_STATE_DIR, *, log: Log = print) -> None:
    """Stop every daemon `up` started in this state dir (by pid file); keep the state dir."""
    require_root()
    layout = layout_for(state_dir)
    if not layout.run.exists():
        log(f"nothing to stop in {layout.root}")
        return
    with exclusive(layout):
        if pid_of(layout, "slurmctld"):
            cancel_jobs(layout, log)
        if pid_of(layout, "slurmctld-dcb"):
            cancel_jobs(layout, log, DCB_CLUSTER)
        names = [*cloud_slurmd_names(), *reversed(daemon_names(True))]
        stopped = [name for name in names if stop(name, layout, log)]
    if not stopped:
        log(f"nothing was running in {layout.root}")


def status(state_dir: Path | str = DEFAULT_STATE_DIR, *, log: Log = print) -> bool:
    """Print what runs (and sinfo); True when every daemon runs."""
    layout = layout_for(state_dir)
    sites = pid_of(layout, "slurmctld-dcb") is not None or pid_of(layout, "cloud") is not None
    pids = {name: pid_of(layout, name) for name in daemon_names(sites)}
    cloud_nodes = {name: pid_of(layout, name) for name in cloud_slurmd_names()}
    log(f"{'daemon':<14} {'pid':>8}  state")
    for name, pid in pids.items():
        log(f"{name:<14} {pid or '-':>8}  {'running' if pid else 'stopped'}")
    for name, pid in cloud_nodes.items():
        if pid:
            log(f"{name:<14} {pid:>8}  running (a cloud instance)")
    if pids["slurmctld"]:
        clusters = f"{CLUSTER},{DCB_CLUSTER}" if sites else CLUSTER
        log("")
        log(run_cmd([str(BIN / "sinfo"), "-M", clusters], env=client_env(layout), check=False).stdout.rstrip())
        log("")
        log(f"export SLURM_CONF={layout.conf}" + (f"   # dcb: {layout.dcb_conf} (or -M dcb)" if sites else ""))
    return all(pids.values())


def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterError("run as root: it installs packages, creates users and starts daemons that switch users")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellscale_hub.dev.slurm", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument(
        "--sites",
        action="store_true",
        help="up: also the second cluster dcb and the cloud simulation behind dca's burst partition",
    )
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help=f"default: {DEFAULT_STATE_DIR}")
    parser.add_argument(
        "--templates",
        type=Path,
        default=TEMPLATE_DIR,
        help=f"folder of the config templates (*.in); default: {TEMPLATE_DIR}",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            cluster = up(args.state_dir, template_dir=args.templates, sites=args.sites)
            print(f"cluster {'started' if cluster.started else 'already running'} in {cluster.seconds:.1f} s")
            status(args.state_dir)
            return 0
        if args.command == "down":
            down(args.state_dir)
            return 0
        return 0 if status(args.state_dir) else 3
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
