"""The Slurm backend: one sbatch job per attempt, the gang as whole nodes.

`render()` is the exact batch script (golden-file tested): `--nodes`, one task per node
(`srun` starts one cellscale supervisor per node, which starts torchrun or Ray there) holding
all of the node's cores (`--cpus-per-task` = the job's tasks per node x its cores per task,
shared by the ranks torchrun starts), `--mem` per node when the job asks, `--gres=gpu:N`,
`--switches` for topology, and the tenant as the Slurm account. It is a pure
function of the attempt and the driver's traits (no Slurm command runs): a site adds its own
`#SBATCH` lines (`extra_directives`), setup lines (`prologue`) or rewrites the whole script
(`batch_template`) in config, the way batchspawner and dask-jobqueue do. Jobs are
submitted under the researcher's own Unix identity (`submit_as`, e.g. sudo to the user),
never a shared service account. One `squeue --json` plus, for jobs that have left the
queue, one `sacct --json` per poll cycle; a job neither knows about is UNKNOWN, never gone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import string
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from traitlets import Bool, Float, Integer, List, TraitError, Unicode, default, validate

from cellscale.runtime.records import LaunchPlan
from cellscale.spec import AttemptState, BackendView, JobSpec, Launcher
from cellscale.vocabulary import Fault, Resource
from cellscale_hub import proc
from cellscale_hub.cost.cloudbill import Instance, Run
from cellscale_hub.drivers.base import (
    ArrayPlan,
    ArrayRef,
    AttemptRef,
    BackendUnreachable,
    Driver,
    Observation,
    SpecRejected,
    TaskEnd,
    as_user,
    fault_from_job_dir,
    hand_to_owner,
    heartbeat_of,
    owner_of,
)
from cellscale_hub.scheduling.fairshare import FairTree
from cellscale_hub.scheduling.resources import RESOURCES, Amounts
from cellscale_hub.tenancy import Tenancy

SAFE_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SBATCH_BARE = re.compile(r"[\w@%+=:,./-]+", re.ASCII)  # what an #SBATCH line may hold unquoted
# the options render() sets itself: an extra directive must not override them (--account is the
# desk's charge, --job-name finds a job again after a restart, --output/--chdir the job dir)
MANAGED_OPTIONS = frozenset(
    {
        "job-name",
        "account",
        "partition",
        "nodes",
        "ntasks-per-node",
        "cpus-per-task",
        "mem",
        "mem-per-cpu",  # sbatch refuses it beside --mem
        "mem-per-gpu",
        "cpus-per-gpu",  # would change the cores a GPU job holds behind cellscale's back
        "gres",
        "time",
        "switches",
        "exclude",
        "chdir",
        "output",
        "requeue",
        "no-requeue",
        "comment",
        "array",  # a sweep's, with its throttle
    }
)
DEFAULT_BATCH_TEMPLATE = """\
#!/bin/bash
{header}
{directives}
{prologue}
{command}
"""
TEMPLATE_FIELDS = {
    "header": "the `# cellscale job ...` comment line",
    "directives": "every `#SBATCH` line, cellscale's then `extra_directives`",
    "prologue": "the `prologue` lines",
    "command": "`exec srun ... <supervisor>`: one cellscale supervisor per node",
    "supervisor": "the supervisor's command line alone (for a template with its own srun line)",
    "job_name": "the Slurm job name (`<job id>-a<attempt>`)",
    "job_id": "the cellscale job id",
    "attempt": "the attempt number",
    "owner": "the researcher (Unix user) the job runs as",
    "tenant": "the desk, which is the Slurm account",
    "partition": "the partition",
    "nodes": "the number of nodes",
    "gpus_per_node": "GPUs per node",
    "cpus_per_node": "cores per node: the --cpus-per-task of the node's one task (the supervisor)",
    "timeout_min": "the wall-clock limit in minutes",
    "launcher": "torchrun, ray, plain or jax",
    "job_dir": "the job directory (shell-quoted)",
    "python": "the Python that runs the supervisor (shell-quoted)",
}
# stderr of a Slurm client whose controller (or slurmdbd) does not answer: the backend is
# unreachable, and what it runs is unknown, not gone (samples in tests/unit/test_slurm_driver.py)
UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Unable to establish controller|Connection refused|"
    r"Socket timed out|Zero Bytes were transmitted or received|Problem talking to the database|"
    r"Connection timed out|Communication connection failure|No route to host|"
    r"Unable to connect to database|slurm_persist_conn_open",
    re.IGNORECASE,
)
# the reason a node's Slurm state carries: the cloud simulation (and real cloud glue, by
# convention) marks a resume that found no capacity "stockout: ...", one that never
# registered "boot-failed: ...", and a spot reclaim notice "spot-reclaim: ..."
CAPACITY_REASONS = ("stockout", "boot-failed")
DEFAULT_MAX_ARRAY_SIZE = 1001  # slurm.conf's default MaxArraySize
NOTICE_REASON = "spot-reclaim"
ESTIMATE = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
ESTIMATE_NODES = re.compile(r" on nodes (\S+) in partition")
PIN_WITHIN_S = 60  # a job is pinned to its staged nodes only when they can start it about now
QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED"}
ACTIVE = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
ENDED = {
    "COMPLETED": AttemptState.SUCCEEDED,
    "CANCELLED": AttemptState.CANCELLED,
    "FAILED": AttemptState.FAILED,
    "TIMEOUT": AttemptState.FAILED,
    "NODE_FAIL": AttemptState.FAILED,
    "PREEMPTED": AttemptState.FAILED,
    "OUT_OF_MEMORY": AttemptState.FAILED,
    "BOOT_FAIL": AttemptState.FAILED,
    "DEADLINE": AttemptState.FAILED,
}


@dataclass(frozen=True)
class PartitionLimits:
    """What a partition keeps from its jobs on every node."""

    max_cpus_per_node: int | None  # MaxCPUsPerNode: the cores all its jobs together may hold on a node
    no_gpus: bool  # its QOS allows no GPU

    def cores_of(self, node_cpus: int) -> int:
        return node_cpus if self.max_cpus_per_node is None else min(node_cpus, self.max_cpus_per_node)


def stage_job_name(ref: AttemptRef) -> str:
    return f"cellscale-stage-{ref.job_id}"


def job_name(ref: AttemptRef) -> str:
    return f"{ref.job_id}-a{ref.number}"


def array_name(array: ArrayRef) -> str:
    """A sweep array's Slurm job name: the attempt's, and its number."""
    return f"{job_name(array.ref)}-s{array.plan.number}"


def _check_names(ref: AttemptRef) -> None:
    """What goes into the script's names must be a plain account, user and job name."""
    if not SAFE_NAME.match(ref.tenant):
        raise SpecRejected(f"tenant {ref.tenant!r} cannot be a Slurm account name (lower-case letters, digits, -, _)")
    if not SAFE_NAME.match(ref.owner):
        raise SpecRejected(f"user name {ref.owner!r} is not a valid Unix user name; Slurm jobs run as their owner")
    if not SAFE_NODE.match(ref.job_id):
        raise SpecRejected(f"job id {ref.job_id!r} cannot be part of a Slurm job name")


def master_port(ref: AttemptRef) -> int:
    """A rendezvous port every node derives alike from the attempt (no coordination needed)."""
    return 20000 + int.from_bytes(f"{ref.job_id}/{ref.number}".encode(), "big") % 20000


def _state(entry: dict) -> str:
    """A job's state from squeue's or sacct's JSON (the field moved between Slurm versions)."""
    state = entry.get("job_state") or entry.get("state", {})
    if isinstance(state, dict):
        state = state.get("current", "")
    if isinstance(state, list):
        state = state[0] if state else ""
    return str(state).split()[0] if state else ""


class SlurmDriver(Driver):
    kind = "slurm"
    runs_sweeps = True

    partition = Unicode("gpu", help="Partition the jobs go to.").tag(config=True)
    account = Unicode(
        "",
        help="""The Slurm account every job of this backend is charged to, whatever its desk. Empty: the
        desk's name (a hub's desks are Slurm accounts, and `apply_tenancy` mirrors their quotas onto them).
        A personal control plane sets it to its user's default account ($SLURM_ACCOUNT, else sacctmgr's
        DefaultAccount); with an account set here, its limits are the Slurm admin's, never changed by cellscale.""",
    ).tag(config=True)
    shares_accounts_with = List(
        Unicode(),
        help="""The other backends that submit to the same Slurm cluster (its other partitions, e.g.
        a CPU partition beside the GPU one). Slurm's GrpTRES on an account counts the account's
        jobs in every partition, so the limits `apply_tenancy` mirrors are summed over the
        desk's flavors on this backend and on these; give each of them the same list, naming
        the others, so they all write the same limits.""",
    ).tag(config=True)
    python = Unicode(
        help="The Python (with cellscale installed) at the same path on every node. Default: the control plane's.",
    ).tag(config=True)
    slurm_conf = Unicode("", help="SLURM_CONF for the Slurm commands; empty: their default.").tag(config=True)
    submit_as = List(
        Unicode(),
        help="""Prefix that runs a Slurm command as the submitting researcher; `{user}` is replaced
        by the (validated) user name. Production: ["sudo", "-n", "-u", "{user}", "--"] with a
        sudoers rule that lets the control plane's account run only sbatch and scancel as
        researchers. Default: runuser when the control plane runs as root (dev clusters), else sudo.""",
    ).tag(config=True)
    master_addr = Unicode(
        "",
        help="Address of a job's first node as ranks see it. Empty: the first host of the allocation. "
        "127.0.0.1 for a dev cluster whose nodes share this host.",
    ).tag(config=True)
    capacity_seconds = Float(30.0, help="How long the partition's size from sinfo is reused.").tag(config=True)
    nodes_seconds = Float(
        2.0,
        help="How long one `sinfo --json` (node states, reasons, spot-reclaim notices) is reused.",
    ).tag(config=True)
    estimate_seconds = Float(
        10.0, help="How long a start estimate (`sbatch --test-only`) is reused for one job shape and account."
    ).tag(config=True)
    cloud_ledger_url = Unicode(
        "",
        help="""For a partition of rented (cloud) nodes: where its bill is, per instance, as JSON
        `{"instances": [{"node", "requested", "stopped", "dollars"}, ...]}` (epoch seconds; stopped
        null while running). The dev cloud simulation serves one at http://127.0.0.1:PORT/ledger;
        for a real cloud, a small adaptor over its billing export. Empty: no bill to attribute.""",
    ).tag(config=True)
    cloud_ledger_token_file = Unicode(
        "", help="A file holding the bearer token for `cloud_ledger_url` (readable by the control plane only)."
    ).tag(config=True)
    cluster = Unicode(
        "",
        help="""The Slurm cluster this backend submits to, as accounting names it (ClusterName).
        Empty: read from `slurm_conf` (or `scontrol show config`). Every account change
        (`apply_tenancy`) is scoped to it, so a backend of one site never touches another's.""",
    ).tag(config=True)
    command_timeout = Integer(30, help="Seconds a Slurm command may take.").tag(config=True)
    stage_ahead = Bool(
        True,
        help="""Stage a waiting job's datasets onto the nodes Slurm plans for it. Off for a partition of
        rented (cloud) nodes: a staging job would power them up, and bill them, before the job is admitted.""",
    ).tag(config=True)
    stage_partition = Unicode(
        "",
        help="""Partition of the small jobs that stage a waiting job's datasets (`--data`) onto the nodes
        `sbatch --test-only` says it will start on: one core and `stage_mem_mb` per node, beside whatever
        runs there, so it needs spare cores on those nodes (a partition over the same nodes that may hold a
        few of their cores, like the dev cluster's `cpu`). Empty: the backend's own partition.""",
    ).tag(config=True)
    stage_mem_mb = Integer(1024, min=64, help="Memory of each node's staging task, in MiB.").tag(config=True)
    stage_horizon_s = Float(
        3600.0,
        help="""Stage a waiting job's datasets only when Slurm expects it to start within this many seconds
        (its nodes may change before a later start).""",
    ).tag(config=True)
    extra_directives = List(
        Unicode(),
        help="""More sbatch options for every job, one option per entry, each written as an
        `#SBATCH` line after cellscale's own, e.g. ["--constraint=a100", "--qos=normal",
        "--exclusive"]. Each must start with `--` (long options only; no newlines).
        An entry is one option: a value with spaces or quotes is quoted for sbatch. The options
        cellscale sets itself (--job-name, --account, --partition, --nodes, --gres, --time,
        --cpus-per-task, --mem, --chdir, --output, ...) are refused: use the matching trait
        (`partition`) or the job's resources (memory a job does not ask for is the partition's
        DefMemPerCPU). Like dask-jobqueue's `job_extra_directives` and batchspawner's `req_options`.""",
    ).tag(config=True)
    prologue = List(
        Unicode(),
        help="""Shell lines the batch script runs before it starts the job's nodes, e.g.
        ["module load cuda/12.4", "source /opt/site/env.sh"]. Written as given (they are the site
        admin's shell, not user input), after the `#SBATCH` lines; one line per entry, and no
        `#SBATCH` lines here (use `extra_directives`). Like dask-jobqueue's
        `job_script_prologue` and batchspawner's `req_prologue`.""",
    ).tag(config=True)
    batch_template = Unicode(
        DEFAULT_BATCH_TEMPLATE,
        help="""The whole batch script, with `{field}` placeholders (Python str.format; write `{{` and
        `}}` for a literal brace, e.g. `${{SLURM_JOB_ID}}`). A line holding only a placeholder whose
        value is empty (e.g. `{prologue}` with no prologue) is left out. It must start with `#!`
        and contain `{directives}` and `{command}` (or `{supervisor}` in an srun line of your own);
        sbatch reads `#SBATCH` lines only before the first command, so keep `{directives}` above
        any command. Fields: """
        + "; ".join(f"`{{{name}}}` {what}" for name, what in TEMPLATE_FIELDS.items())
        + """. Every value is validated or shell-quoted. The default gives
        `#!/bin/bash`, `{header}`, `{directives}`, `{prologue}`, `{command}`, one per line.""",
    ).tag(config=True)

    @default("name")
    def _default_name(self) -> str:
        return "slurm"

    @default("python")
    def _default_python(self) -> str:
        return sys.executable

    @default("submit_as")
    def _default_submit_as(self) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "{user}", "--"]
        return ["sudo", "-n", "-u", "{user}", "--"]

    @validate("account")
    def _valid_account(self, proposal) -> str:
        if proposal["value"] and not SAFE_NAME.match(proposal["value"]):
            raise TraitError(
                f"SlurmDriver.account: {proposal['value']!r} is not a plain Slurm account name "
                "(lower-case letters, digits, - and _)"
            )
        return proposal["value"]

    def account_of(self, tenant: str) -> str:
        """The Slurm account a job of `tenant` is charged to."""
        return self.account or tenant

    @validate("extra_directives")
    def _valid_directives(self, proposal) -> list[str]:
        for directive in proposal["value"]:
            if _unprintable(directive):
                raise TraitError(
                    f"SlurmDriver.extra_directives: {directive!r} holds a newline or control "
                    "character; give one option per entry"
                )
            if not re.fullmatch(r"--[A-Za-z][A-Za-z0-9-]*(=.*)?", directive):
                raise TraitError(
                    f"SlurmDriver.extra_directives: {directive!r} is not a long sbatch option; "
                    "write each as --name or --name=value, e.g. --constraint=a100"
                )
            option = directive[2:].split("=", 1)[0]
            if option in MANAGED_OPTIONS:
                raise TraitError(
                    f"SlurmDriver.extra_directives: --{option} is set by cellscale for every job "
                    "(from the job's resources, its desk and the driver's traits) and cannot be "
                    "overridden"
                )
        return proposal["value"]

    @validate("prologue")
    def _valid_prologue(self, proposal) -> list[str]:
        for line in proposal["value"]:
            if _unprintable(line, tab=True):
                raise TraitError(
                    f"SlurmDriver.prologue: {line!r} holds a newline or control character; "
                    "give one shell line per entry"
                )
            if line.lstrip().startswith("#SBATCH"):
                raise TraitError(
                    f"SlurmDriver.prologue: {line!r} is an #SBATCH line; put sbatch options in "
                    "SlurmDriver.extra_directives"
                )
        return proposal["value"]

    @validate("batch_template")
    def _valid_template(self, proposal) -> str:
        template = proposal["value"]
        if not template.startswith("#!"):
            raise TraitError(
                "SlurmDriver.batch_template must start with an interpreter line such as #!/bin/bash "
                "(sbatch refuses a script without one)"
            )
        if "\0" in template:
            raise TraitError("SlurmDriver.batch_template holds a NUL character")
        try:
            fields = [parsed for line in template.splitlines() for parsed in string.Formatter().parse(line)]
        except ValueError as exc:
            raise TraitError(f"SlurmDriver.batch_template: {exc} (write {{{{ and }}}} for literal braces)") from None
        used = set()
        for _, name, spec, conversion in fields:
            if name is None:
                continue
            if name not in TEMPLATE_FIELDS or spec or conversion:
                raise TraitError(
                    f"SlurmDriver.batch_template: unknown placeholder {{{name}}}; the fields are "
                    f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)} (write {{{{ and }}}} for "
                    "literal braces, e.g. ${{SLURM_JOB_ID}})"
                )
            used.add(name)
        if "directives" not in used:
            raise TraitError(
                "SlurmDriver.batch_template must contain {directives}: they name, place and charge the job"
            )
        if not used & {"command", "supervisor"}:
            raise TraitError(
                "SlurmDriver.batch_template must contain {command} (or {supervisor} in an srun line "
                "of its own): it is what runs the job"
            )
        return template

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._capacity: tuple[float, BackendView] | None = None
        self._node_info: tuple[float, list[dict]] | None = None
        self._estimates: dict[tuple, tuple[float, float | None]] = {}
        self._cluster_name: str | None = None
        self._account_users: dict[str, str | None] = {}
        self._array_size: tuple[float, int] | None = None

    # -- commands ----------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        return proc.job_environment({"SLURM_CONF": self.slurm_conf} if self.slurm_conf else None)

    def _run(self, argv: list[str]) -> str:
        try:
            result = proc.run(argv, timeout=self.command_timeout, env=self._env())
        except subprocess.TimeoutExpired:
            raise BackendUnreachable(
                f"{shlex.join(argv)} did not answer within {self.command_timeout} s: Slurm does not answer"
            ) from None
        if result.returncode:
            raise command_error(argv, result.returncode, result.stderr)
        return result.stdout

    def _json(self, argv: list[str]) -> dict:
        """A `--json` query; Slurm 22.05's squeue and sinfo exit 0 with an empty list and an
        `errors` entry when the controller does not answer: that is unreachable, not empty."""
        return json_answer(argv, self._run(argv))

    def cluster_name(self) -> str:
        """This backend's ClusterName: the trait, else slurm.conf's, else `scontrol show config`."""
        if self._cluster_name is None:
            name = self.cluster or (_conf_cluster_name(Path(self.slurm_conf)) if self.slurm_conf else None)
            if not name:
                config = self._run(["scontrol", "show", "config"])
                match = re.search(r"^ClusterName\s*=\s*(\S+)", config, re.MULTILINE)
                if not match:
                    raise RuntimeError("`scontrol show config` names no ClusterName")
                name = match.group(1)
            if not SAFE_NAME.match(name.lower()):
                raise RuntimeError(f"Slurm cluster name {name!r} is not a plain name")
            self._cluster_name = name.lower()
        return self._cluster_name

    def _as_user(self, user: str) -> list[str]:
        return as_user(self.submit_as, user)

    # -- capacity ----------------------------------------------------------------------------
    def capacity(self) -> BackendView:
        """The partition's nodes, GPUs, cores and memory (sinfo, `scontrol show partition`),
        as far as its jobs may use them: at most `MaxCPUsPerNode` cores of each node (a
        partition that shares nodes with another, like a CPU partition on GPU nodes), and no
        GPUs when the partition's QOS allows none."""
        now = time.monotonic()
        if self._capacity and now - self._capacity[0] < self.capacity_seconds:
            return self._capacity[1]
        nodes = [n for n in self._nodes() if self.partition in n.get("partitions", [])]
        limits = self._partition_limits() if nodes else PartitionLimits(None, no_gpus=False)  # no such partition
        gpus = [0 if limits.no_gpus else _gpus_of(n.get("gres", "")) for n in nodes]
        cpus = [limits.cores_of(int(n.get("cpus", 0))) for n in nodes]
        memory = [int(n.get("real_memory", 0)) for n in nodes]
        per_node = max(gpus, default=0)
        view = BackendView(
            name=self.name,
            kind=self.kind,
            capacity_gpus=sum(gpus),
            max_nodes=len(nodes),
            gpus_per_node=per_node,
            launchers=list(Launcher),
            capacity_cpus=sum(cpus),
            cpus_per_node=max(cpus, default=0),
            capacity_memory_mb=sum(memory),
            memory_mb_per_node=max(memory, default=0),
        )
        self._capacity = (now, view)
        return view

    def _nodes(self) -> list[dict]:
        """Every node of the cluster, as `sinfo --json` describes it (reused `nodes_seconds`)."""
        now = time.monotonic()
        if self._node_info and now - self._node_info[0] < self.nodes_seconds:
            return self._node_info[1]
        nodes = self._json(["sinfo", "--json"])["nodes"]
        self._node_info = (now, nodes)
        return nodes

    # -- the cloud bill ------------------------------------------------------------------------
    def cloud_instances(self) -> list[Instance]:
        if not self.cloud_ledger_url:
            return []
        token = Path(self.cloud_ledger_token_file).read_text().strip() if self.cloud_ledger_token_file else ""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        answer = httpx.get(self.cloud_ledger_url, headers=headers, timeout=self.command_timeout)
        answer.raise_for_status()
        return [
            Instance(
                str(i["node"]),
                float(i["requested"]),
                None if i.get("stopped") is None else float(i["stopped"]),
                float(i["dollars"]),
            )
            for i in answer.json()["instances"]
        ]

    def node_runs(self, refs: list[AttemptRef]) -> list[Run]:
        """From sacct: each attempt's nodes, from its allocation (its Start: the nodes were
        requested then) to its end."""
        ids = {ref.backend_ref: ref for ref in refs if ref.backend_ref}
        if not ids:
            return []
        jobs = self._json(["sacct", "--json", "-X", f"--clusters={self.cluster_name()}", "-j", ",".join(ids)])["jobs"]
        runs = []
        for job in jobs:
            ref = ids.get(str(job.get("job_id")))
            times = job.get("time") or {}
            if ref is None or not times.get("start"):
                continue
            end = float(times["end"]) if times.get("end") else None
            for node in expand_hostlist(str(job.get("nodes") or "")):
                runs.append(Run(ref.key, node, float(times["start"]), end))
        return runs

    def node_notices(self) -> dict[str, str]:
        """This partition's nodes whose Slurm reason is a spot reclaim notice
        (`spot-reclaim: terminating in 30 s`): node -> the notice."""
        return {
            n["name"]: str(n.get("reason") or "")
            for n in self._nodes()
            if self.partition in n.get("partitions", [])
            and str(n.get("reason") or "").startswith(NOTICE_REASON)
            and "POWERED_DOWN" not in n.get("state_flags", [])  # already gone: no longer a notice
        }

    # -- when would Slurm start it ---------------------------------------------------------------
    def start_estimate(self, spec: JobSpec, account: str) -> float | None:
        """When Slurm's scheduler would start the job if submitted now (`sbatch --test-only`,
        run as a member of the account so its associations apply); None when Slurm cannot say
        or says something absurd: 22.05 sometimes answers now + 3.5 days while nodes are still
        COMPLETING, so an estimate beyond half the partition's MaxTime while enough idle nodes
        (powered-down cloud nodes included) exist for the gang counts as unknown. Reused
        `estimate_seconds` per (shape, account), so a scheduling cycle may ask per pending head."""
        spec = self.shape(spec)
        res = spec.resources
        key = (account, res.nodes, res.gpus_per_node, res.cpus_per_node, res.memory_mb_per_node, res.timeout_min)
        now = time.monotonic()
        cached = self._estimates.get(key)
        if cached and now - cached[0] < self.estimate_seconds:
            return cached[1]
        estimate = self._estimate(spec, account)
        self._estimates[key] = (now, estimate)
        return estimate

    def _estimate(self, spec: JobSpec, account: str) -> float | None:
        answer = self._test_only(spec, account)
        at = parse_estimate(answer) if answer else None
        if at is None:
            return None
        res = spec.resources
        if at - time.time() >= self._max_time_s() / 2 - 60 and self._idle_nodes() >= res.nodes:
            self.log.info("Slurm's start estimate %s for a %d-node gang ignored: nodes are idle", at, res.nodes)
            return None
        return at

    def _test_only(
        self, spec: JobSpec, account: str, excluded: tuple[str, ...] = (), nodelist: tuple[str, ...] = ()
    ) -> str | None:
        """What `sbatch --test-only` says of the job (run as a member of the account, so its
        associations apply); None when it refuses."""
        account = self.account_of(account)
        if not SAFE_NAME.match(account):
            return None
        user = self._account_user(account)
        if user is None:
            return None
        res = spec.resources
        avoid = sorted(node for node in excluded if SAFE_NODE.match(node))
        argv = [
            *self._as_user(user),
            "sbatch",
            "--test-only",
            f"--account={account}",
            f"--partition={self.partition}",
            f"--nodes={res.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={res.cpus_per_node}",
            *([f"--mem={res.memory_mb_per_node}M"] if res.memory_mb_per_node else []),
            *([f"--gres=gpu:{res.gpus_per_node}"] if res.gpus_per_node else []),
            f"--time={res.timeout_min}",
            *([f"--switches={res.switches}"] if res.switches else []),
            *([f"--exclude={','.join(avoid)}"] if avoid else []),
            *([f"--nodelist={','.join(nodelist)}"] if nodelist else []),
            "--output=/dev/null",
            "--chdir=/",
            "--wrap=true",
        ]
        try:
            result = proc.run(argv, timeout=self.command_timeout, env=self._env())
        except subprocess.TimeoutExpired:
            raise BackendUnreachable(f"sbatch --test-only did not answer within {self.command_timeout} s") from None
        if result.returncode:
            error = command_error(argv, result.returncode, result.stderr)
            if isinstance(error, BackendUnreachable):
                raise error
            self.log.debug("sbatch --test-only refused: %s", error)
            return None
        return result.stderr + result.stdout

    # -- staging a waiting job's datasets onto the nodes it will start on ----------------------------
    @property
    def stages_ahead(self) -> bool:
        return self.stage_ahead

    def stage_targets(self, ref: AttemptRef) -> list[str] | None:
        """The nodes `sbatch --test-only` says the job would start on now, if it says so
        within `stage_horizon_s` (the nodes it would avoid left out, as its submit does)."""
        avoiding = self._avoiding(ref)
        answer = self._test_only(self.shape(ref.spec), ref.tenant, avoiding.excluded_nodes)
        at = parse_estimate(answer) if answer else None
        if at is None or at - time.time() > self.stage_horizon_s:
            return None
        nodes = parse_estimate_nodes(answer)
        return nodes if nodes and all(SAFE_NODE.match(n) for n in nodes) else None

    def start_staging(self, ref: AttemptRef, nodes: list[str]) -> None:
        """One small job over those nodes, a task each: `cellscale.runtime.stage` as the job's owner.
        A staging job of the same job still queued or running is cancelled first (its nodes changed)."""
        name = stage_job_name(ref)
        self._run(["scancel", f"--name={name}"])
        script = ref.dir.staging / "stage.sbatch"
        script.write_text(self.render_staging(ref, nodes))
        hand_to_owner(ref.owner, ref.job_dir)
        self._run([*self._as_user(ref.owner), "sbatch", "--parsable", str(script)])

    def render_staging(self, ref: AttemptRef, nodes: list[str]) -> str:
        """The staging job's batch script (a pure function of its arguments and the traits)."""
        _check_names(ref)
        bad = [node for node in nodes if not SAFE_NODE.match(node)]
        if bad:
            raise ValueError(f"node name {bad[0]!r} is not a plain name")
        directives = [
            f"--job-name={stage_job_name(ref)}",
            f"--account={self.account_of(ref.tenant)}",
            f"--partition={self.stage_partition or self.partition}",
            f"--nodelist={','.join(nodes)}",
            f"--nodes={len(nodes)}",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            f"--mem={self.stage_mem_mb}M",
            f"--time={max(5, int(self.stage_horizon_s // 60))}",
            f"--chdir={ref.job_dir}",
            f"--output={ref.dir.staging / 'slurm-%j.out'}",
            "--no-requeue",
            "--comment=cellscale-stage",
        ]
        stager = shlex.join([self.python, "-m", "cellscale.runtime.stage", str(ref.job_dir)])
        return "\n".join(
            [
                "#!/bin/bash",
                f"# cellscale: stage the datasets of job {ref.job_id} (owner {ref.owner}) onto {', '.join(nodes)}",
                *(f"#SBATCH {sbatch_quote(d)}" for d in directives),
                *self.prologue,
                f"exec srun --ntasks-per-node=1 {stager}",
                "",
            ]
        )

    def _account_user(self, account: str) -> str | None:
        """A researcher of the account in this cluster (sbatch --test-only must run as one)."""
        if account not in self._account_users:
            rows = self._run(
                [
                    "sacctmgr",
                    "-n",
                    "-P",
                    "show",
                    "assoc",
                    "where",
                    f"cluster={self.cluster_name()}",
                    f"account={account}",
                    "format=user",
                ]
            )
            users = sorted({u for u in rows.split() if SAFE_NAME.match(u)})
            self._account_users[account] = users[0] if users else None
        return self._account_users[account]

    def _max_time_s(self) -> float:
        fields = _key_values(self._run(["scontrol", "-o", "show", "partition", self.partition]))
        return _slurm_minutes(fields.get("MaxTime", "")) * 60.0

    def _idle_nodes(self) -> int:
        """Nodes of the partition that take a job now or once powered up."""
        return sum(
            1
            for n in self._nodes()
            if self.partition in n.get("partitions", [])
            and str(n.get("state", "")).lower() == "idle"
            and not {"DRAIN", "DOWN", "FAIL"} & {str(f).upper() for f in n.get("state_flags", [])}
        )

    def _partition_limits(self) -> PartitionLimits:
        """What the partition itself holds back: its MaxCPUsPerNode, and whether its QOS
        (a partition QOS with MaxTRESPerJob or MaxTRESPerNode gres/gpu=0) allows no GPU."""
        fields = _key_values(self._run(["scontrol", "-o", "show", "partition", self.partition]))
        max_cpus = fields.get("MaxCPUsPerNode", "")
        qos = fields.get("QoS", "N/A")
        no_gpus = False
        if qos not in ("N/A", "(null)", ""):
            rows = self._run(["sacctmgr", "-n", "-P", "show", "qos", qos, "format=maxtres,maxtrespernode"])
            no_gpus = any(_tres(limit).get("gres/gpu") == "0" for limit in re.split(r"[|\n]", rows))
        return PartitionLimits(int(max_cpus) if max_cpus.isdigit() else None, no_gpus)

    def shape(self, spec: JobSpec) -> JobSpec:
        """`--gpus 16` on 8-GPU nodes becomes 2 whole nodes of 8."""
        res = spec.resources
        per_node = self.capacity().gpus_per_node
        if res.nodes == 1 and per_node and res.gpus_per_node > per_node and res.gpus_per_node % per_node == 0:
            split = {"nodes": res.gpus_per_node // per_node, "gpus_per_node": per_node}
            if res.tasks_per_node == res.gpus_per_node:  # one task per GPU, on each node
                split["tasks_per_node"] = per_node
            resources = res.model_copy(update=split)
            return spec.model_copy(update={"resources": resources})
        return spec

    def launch_plan(self, ref: AttemptRef) -> LaunchPlan:
        """Ranks on other nodes need node 0's address and a rendezvous port."""
        return (
            super()
            .launch_plan(ref)
            .model_copy(update={"master_addr": self.master_addr or None, "master_port": master_port(ref)})
        )

    # -- the batch script ----------------------------------------------------------------------
    def script_path(self, ref: AttemptRef) -> Path:
        return ref.dir.attempt_dir(ref.number) / "job.sbatch"

    def render(self, ref: AttemptRef) -> str:
        """The batch script: a pure function of the attempt and the driver's traits.

        It runs no Slurm command: whatever it needs from the cluster is decided before, in
        `submit` (which nodes to avoid, see `_avoiding`) or `shape` (whole nodes).

        Slurm sees one task per node, the supervisor, with every core the node's processes need
        (`--cpus-per-task` = tasks per node x cores per task): torchrun's ranks share them, and
        Slurm counts what cellscale's admission counts. `--mem` is per node, in MiB, only when
        the job asks (otherwise the partition's DefMemPerCPU applies)."""
        if ref.spec.sweep is not None:
            return self.render_array(self.sample_array(ref))
        res = ref.spec.resources
        _check_names(ref)
        out = ref.dir.attempt_dir(ref.number) / "slurm-%j.out"
        excluded = sorted({node for node in ref.excluded_nodes if SAFE_NODE.match(node)})
        pinned = [node for node in ref.nodelist if SAFE_NODE.match(node)]
        directives = [
            f"--job-name={job_name(ref)}",
            f"--account={self.account_of(ref.tenant)}",
            f"--partition={self.partition}",
            f"--nodes={res.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={res.cpus_per_node}",
            *([f"--mem={res.memory_mb_per_node}M"] if res.memory_mb_per_node else []),
            *([f"--gres=gpu:{res.gpus_per_node}"] if res.gpus_per_node else []),
            f"--time={res.timeout_min}",
            *([f"--switches={res.switches}"] if res.switches else []),
            *([f"--exclude={','.join(excluded)}"] if excluded else []),
            *([f"--nodelist={','.join(pinned)}"] if pinned else []),
            f"--chdir={ref.job_dir}",
            f"--output={out}",
            "--no-requeue",
            "--comment=cellscale",
            *self.extra_directives,
        ]
        supervisor = shlex.join([self.python, "-m", "cellscale.runtime.supervisor", str(ref.job_dir), str(ref.number)])
        header = (
            f"# cellscale job {ref.job_id}, attempt {ref.number}, owner {ref.owner}: "
            f"{res.nodes} node(s) x {res.gpus_per_node} GPU(s), {res.cpus_per_node} CPU(s)"
            + (f", {res.memory_mb_per_node}M" if res.memory_mb_per_node else "")
            + f", launcher {ref.spec.launcher.value}"
        )
        command = (
            f"exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task={res.cpus_per_node} " + supervisor
        )
        fields = self._fields(ref, job_name(ref), header, directives, command, supervisor)
        return fill_template(self.batch_template, fields)

    def _fields(
        self, ref: AttemptRef, name: str, header: str, directives: list[str], command: str, supervisor: str
    ) -> dict[str, str]:
        res = ref.spec.resources
        return {
            "header": header,
            "directives": "\n".join(f"#SBATCH {sbatch_quote(d)}" for d in directives),
            "prologue": "\n".join(self.prologue),
            "command": command,
            "supervisor": supervisor,
            "job_name": name,
            "job_id": ref.job_id,
            "attempt": str(ref.number),
            "owner": ref.owner,
            "tenant": ref.tenant,
            "partition": shlex.quote(self.partition),
            "nodes": str(res.nodes),
            "gpus_per_node": str(res.gpus_per_node),
            "cpus_per_node": str(res.cpus_per_node),
            "timeout_min": str(res.timeout_min),
            "launcher": ref.spec.launcher.value,
            "job_dir": shlex.quote(str(ref.job_dir)),
            "python": shlex.quote(self.python),
        }

    # -- sweeps: one job array per chunk of tasks ------------------------------------------------
    def max_array_size(self) -> int:
        """The cluster's live MaxArraySize (indexes 0..size-1), reused `capacity_seconds`."""
        now = time.monotonic()
        if self._array_size and now - self._array_size[0] < self.capacity_seconds:
            return self._array_size[1]
        match = re.search(r"^MaxArraySize\s*=\s*(\d+)", self._run(["scontrol", "show", "config"]), re.MULTILINE)
        size = int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE
        self._array_size = (now, size)
        return size

    def sample_array(self, ref: AttemptRef) -> ArrayRef:
        """The first array a sweep's attempt would submit (for the dry run, which runs no Slurm
        command: chunked by the MaxArraySize last read, else Slurm's default)."""
        sweep = ref.spec.sweep
        tasks = min(sweep.tasks, self._array_size[1] if self._array_size else DEFAULT_MAX_ARRAY_SIZE)
        plan = ArrayPlan(
            number=1,
            attempt=ref.number,
            tasks=[list(range(i * sweep.per_task, min((i + 1) * sweep.per_task, sweep.points))) for i in range(tasks)],
            throttle=sweep.slots,
            timeout_s=ref.spec.resources.timeout_min * 60.0 * sweep.per_task,
        )
        return ArrayRef(ref, plan)

    def render_array(self, array: ArrayRef) -> str:
        """The batch script of one array: each index runs `cellscale.runtime.sweep task` on its
        points (no srun: a task is one process on one node); `%N` throttles it."""
        ref, plan = array.ref, array.plan
        res = ref.spec.resources
        _check_names(ref)
        excluded = sorted({node for node in plan.excluded_nodes if SAFE_NODE.match(node)})
        directives = [
            f"--job-name={array_name(array)}",
            f"--account={self.account_of(ref.tenant)}",
            f"--partition={self.partition}",
            "--nodes=1",
            "--ntasks-per-node=1",
            f"--cpus-per-task={res.cpus_per_node}",
            *([f"--mem={res.memory_mb_per_node}M"] if res.memory_mb_per_node else []),
            *([f"--gres=gpu:{res.gpus_per_node}"] if res.gpus_per_node else []),
            f"--time={max(1, -(-int(plan.timeout_s) // 60))}",
            f"--array=0-{len(plan.tasks) - 1}%{max(1, plan.throttle)}",
            *([f"--exclude={','.join(excluded)}"] if excluded else []),
            f"--chdir={ref.job_dir}",
            f"--output={ref.job_dir / 'arrays' / 'slurm-%A_%a.out'}",
            "--no-requeue",
            "--comment=cellscale",
            *self.extra_directives,
        ]
        task = shlex.join([self.python, "-m", "cellscale.runtime.sweep", "task", str(ref.job_dir), str(plan.number)])
        sweep = ref.spec.sweep
        header = (
            f"# cellscale sweep {ref.job_id}, attempt {ref.number}, owner {ref.owner}: array {plan.number}, "
            f"{len(plan.tasks)} task(s) from task {plan.offset} of {sweep.tasks}, {sweep.per_task} point(s) each, "
            f"{res.gpus_per_node} GPU(s) and {res.cpus_per_node} CPU(s) per task"
        )
        return fill_template(
            self.batch_template, self._fields(ref, array_name(array), header, directives, f"exec {task}", task)
        )

    def submit_array(self, array: ArrayRef) -> str:
        ref = array.ref
        script = ref.job_dir / "arrays" / f"{array.plan.number}.sbatch"
        if ref.resubmit or script.exists():  # submitted before a restart, or by a try that failed late
            found = self._find_name(array_name(array))
            if found:
                return found
        script.write_text(self.render_array(array))
        script.chmod(0o644)
        if owner_of(ref.job_dir) != ref.owner:
            hand_to_owner(ref.owner, ref.job_dir)
        out = self._run([*self._as_user(ref.owner), "sbatch", "--parsable", str(script)])
        return out.strip().split(";")[0]

    def live_tasks(self, arrays: list[ArrayRef]) -> dict[tuple[str, int], dict[int, str]]:
        """ONE `squeue -r` for every array (by name: a finished array's id may be unknown to
        slurmctld already): index -> pending | running."""
        out: dict[tuple[str, int], dict[int, str]] = {a.key: {} for a in arrays}
        by_id = {a.backend_ref: a for a in arrays if a.backend_ref}
        names = sorted({array_name(a) for a in arrays})
        for start in range(0, len(names), 100):
            argv = ["squeue", "-h", "-r", f"--name={','.join(names[start : start + 100])}", "-o", "%i|%T"]
            for line in self._run(argv).splitlines():
                task_id, _, state = line.strip().partition("|")
                array_id, _, index = task_id.partition("_")
                if array_id in by_id and index.isdigit():
                    running = state in ACTIVE
                    out[by_id[array_id].key][int(index)] = "running" if running else "pending"
        return out

    def task_end(self, array: ArrayRef, index: int) -> TaskEnd | None:
        """How one task that left points without an outcome ended, from accounting (None while
        slurmdbd has not settled it)."""
        task = f"{array.backend_ref}_{index}"
        argv = ["sacct", "-n", "-X", "-P", f"--clusters={self.cluster_name()}", "-j", task, "-o", "State,NodeList"]
        rows = [line.split("|") for line in self._run(argv).splitlines() if "|" in line]
        if not rows:
            return None
        state, nodes = rows[0][0].split()[0], rows[0][1]
        if state in QUEUED | ACTIVE:
            return None
        node = next(iter(expand_hostlist(nodes)), None) if nodes not in ("", "None assigned") else None
        if state == "NODE_FAIL":
            down = self._down_nodes(nodes)
            words = ", ".join(f"{name} ({why})" for name, why in down) or f"node {node}"
            return TaskEnd(Fault.INFRASTRUCTURE, f"node failure: {words}", down[0][0] if down else node)
        if state == "TIMEOUT":
            return TaskEnd(
                Fault.TIMEOUT, f"ran past its time limit ({array.plan.timeout_s / 60:.0f} min, Slurm TIMEOUT)"
            )
        if state == "CANCELLED":
            return TaskEnd(None, "cancelled")
        if state == "PREEMPTED":
            return TaskEnd(Fault.PREEMPTION, "preempted by Slurm")
        return TaskEnd(Fault.INFRASTRUCTURE, f"its process ended without finishing its points (Slurm {state})", node)

    def cancel_array(self, array: ArrayRef) -> None:
        if array.backend_ref:
            self._run([*self._as_user(array.ref.owner), "scancel", array.backend_ref])

    def throttle_array(self, array: ArrayRef, throttle: int) -> None:
        if not array.backend_ref or throttle < 1:
            return
        user = self._as_user(array.ref.owner)
        update = [*user, "scontrol", "update", f"JobId={array.backend_ref}", f"ArrayTaskThrottle={throttle}"]
        result = proc.run(update, timeout=self.command_timeout, env=self._env())
        # an array some of whose tasks finished answers 1 with "Job has already finished" for those
        # and "No error" for the rest: taken
        if result.returncode and "No error" not in result.stderr + result.stdout:
            raise command_error(update, result.returncode, result.stderr)

    def _find_name(self, name: str) -> str | None:
        out = self._run(["squeue", "-h", f"--name={name}", "-o", "%F"]).split()
        return out[0] if out else None

    def _on_staged_nodes(self, ref: AttemptRef) -> AttemptRef:
        """The attempt pinned to the nodes its datasets were staged on, when they could start it
        now (`sbatch --test-only --nodelist`): Slurm, left to pick, may start it on nodes just
        freed elsewhere, and those would fetch everything again. Not pinned when they are busy:
        a job never waits for its data's nodes."""
        plan = ref.dir.read_stage_plan() if ref.spec.datasets and ref.spec.sweep is None else None
        nodes = tuple(plan.nodes) if plan else ()
        if len(nodes) != ref.spec.resources.nodes or set(nodes) & set(ref.excluded_nodes):
            return ref
        answer = self._test_only(ref.spec, ref.tenant, nodelist=nodes)
        at = parse_estimate(answer) if answer else None
        if at is None or at - time.time() > PIN_WITHIN_S:
            return ref
        return replace(ref, nodelist=nodes)

    def _avoiding(self, ref: AttemptRef) -> AttemptRef:
        """The attempt avoiding the nodes that failed this job, while enough others remain for
        its gang (so a job is never left waiting for nodes it excluded); asks sinfo (cached)."""
        bad = sorted({node for node in ref.excluded_nodes if SAFE_NODE.match(node)})
        if bad and self.capacity().max_nodes - len(bad) < ref.spec.resources.nodes:
            bad = []
        return replace(ref, excluded_nodes=tuple(bad))

    # -- submit / poll / cancel ------------------------------------------------------------------
    def submit(self, ref: AttemptRef) -> str:
        existing = self._find(ref) if ref.resubmit else None
        if existing:
            return existing  # submitted before a restart of the control plane: adopt it
        self.script_path(ref).write_text(self.render(self._on_staged_nodes(self._avoiding(ref))))
        hand_to_owner(ref.owner, ref.job_dir)
        out = self._run([*self._as_user(ref.owner), "sbatch", "--parsable", str(self.script_path(ref))])
        return out.strip().split(";")[0]

    def _find(self, ref: AttemptRef) -> str | None:
        """The attempt's Slurm job, by its name, in this backend's cluster only (job ids of two
        clusters collide; `slurm_conf` picks squeue's cluster, `-M` sacct's)."""
        out = self._run(["squeue", "-h", f"--name={job_name(ref)}", "-o", "%i"]).split()
        if not out:
            out = self._run(
                [
                    "sacct",
                    "-n",
                    "-X",
                    "-P",
                    f"--clusters={self.cluster_name()}",
                    f"--name={job_name(ref)}",
                    "-o",
                    "JobID",
                    "-S",
                    "now-7days",
                ]
            ).split()
        return out[0] if out else None

    def poll(self, refs: list[AttemptRef]) -> dict[tuple[str, int], Observation]:
        ids = {ref.backend_ref: ref for ref in refs if ref.backend_ref}
        observed: dict[tuple[str, int], Observation] = {
            ref.key: Observation(AttemptState.SUBMITTING) for ref in refs if not ref.backend_ref
        }
        if not ids:
            return observed
        queue = {str(j["job_id"]): j for j in self._json(["squeue", "--json"])["jobs"]}
        gone = [job_id for job_id in ids if job_id not in queue or _state(queue[job_id]) not in QUEUED | ACTIVE]
        history = {}
        if gone:
            accounting = self._json(
                ["sacct", "--json", "-X", f"--clusters={self.cluster_name()}", "-j", ",".join(gone)]
            )
            history = {str(j["job_id"]): j for j in accounting["jobs"]}
        for job_id, ref in ids.items():
            entry = history.get(job_id) or queue.get(job_id)
            observed[ref.key] = dataclasses.replace(self._observe(ref, entry), held=_held(entry))
        return observed

    def _observe(self, ref: AttemptRef, entry: dict | None) -> Observation:
        if entry is None:
            return Observation(AttemptState.UNKNOWN, reason="neither squeue nor sacct knows the job (yet)")
        state = _state(entry)
        placed = tuple(expand_hostlist(str(entry.get("nodes") or "")))
        if state in QUEUED:
            why = entry.get("state_reason") or "queued"
            return Observation(
                AttemptState.STARTING, reason=f"Slurm job {ref.backend_ref} {state.lower()} ({why})", nodes=placed
            )
        if state in ACTIVE:
            running = ref.dir.ranks_started(ref.number) >= self.launch_plan(ref).expected_ranks
            heartbeat, step = heartbeat_of(ref, ref.spec.resources.nodes)
            return Observation(
                AttemptState.RUNNING if running else AttemptState.STARTING,
                heartbeat=heartbeat,
                step=step,
                nodes=placed,
            )
        if state in ENDED:
            if not entry.get("allocation_nodes") and entry.get("nodes") not in (None, "", "None assigned"):
                # slurmdbd writes asynchronously: for a moment after the end the record shows
                # the first node only and no allocation; the next poll sees it whole
                return Observation(
                    AttemptState.UNKNOWN, reason=f"Slurm accounting of job {ref.backend_ref} is settling"
                )
            if state == "NODE_FAIL":
                reasons = self._node_reasons(placed)
                short = [(n, why) for n, why in reasons.items() if why.startswith(CAPACITY_REASONS)]
                if short:  # the cloud could not provide the nodes: not the job's fault, nor the nodes'
                    return Observation(
                        ENDED[state],
                        exit_code=_exit_code(entry),
                        reason=capacity_words(short),
                        fault=Fault.CAPACITY,
                        nodes=placed,
                    )
                reclaimed = [n for n, why in reasons.items() if why.startswith(NOTICE_REASON)]
                if reclaimed:  # a spot reclaim took the nodes: preempted, never counted
                    return Observation(
                        ENDED[state],
                        exit_code=_exit_code(entry),
                        reason=f"spot reclaim of {', '.join(reclaimed)}: {reasons[reclaimed[0]]}",
                        fault=Fault.PREEMPTION,
                        nodes=placed,
                    )
            failed_nodes = self._down_nodes(entry.get("nodes", "")) if state == "NODE_FAIL" else []
            return Observation(
                ENDED[state],
                exit_code=_exit_code(entry),
                reason=self._end_reason(ref, state, failed_nodes),
                fault=self._fault(ref, state),
                failed_nodes=tuple(name for name, _ in failed_nodes),
                nodes=placed,
            )
        return Observation(AttemptState.UNKNOWN, reason=f"Slurm state {state or '?'}")

    def _end_reason(self, ref: AttemptRef, state: str, failed_nodes: list[tuple[str, str]]) -> str:
        if state == "COMPLETED":
            return "every rank exited 0"
        if state == "NODE_FAIL":
            nodes = ", ".join(f"{name} ({why})" for name, why in failed_nodes) or "a node of the job"
            return f"node failure: {nodes}"
        if state == "TIMEOUT":
            return f"ran past --time {ref.spec.resources.timeout_min} min (Slurm TIMEOUT)"
        if state == "PREEMPTED":
            return "preempted by Slurm"
        error = ref.dir.read_error(ref.number)
        return error.summary if error else f"Slurm job {ref.backend_ref} ended {state}"

    def _fault(self, ref: AttemptRef, state: str) -> Fault | None:
        if state in ("COMPLETED", "CANCELLED"):
            return None
        return {"NODE_FAIL": Fault.INFRASTRUCTURE, "TIMEOUT": Fault.TIMEOUT, "PREEMPTED": Fault.PREEMPTION}.get(
            state
        ) or fault_from_job_dir(ref, ref.spec.resources.nodes)

    def _node_reasons(self, nodes: Iterable[str]) -> dict[str, str]:
        """Slurm's reason of each of these nodes that has one, whatever its state (a
        stockout leaves the nodes powered-down idle, with the reason kept)."""
        wanted = set(nodes)
        if not wanted:
            return {}
        try:
            info = self._nodes()
        except (RuntimeError, ValueError, KeyError):
            return {}
        return {n["name"]: str(n["reason"]) for n in info if n["name"] in wanted and n.get("reason")}

    def _down_nodes(self, nodes: str) -> list[tuple[str, str]]:
        """(name, Slurm's reason) of the job's nodes that are down, drained or failed."""
        try:
            hosts = set(self._run(["scontrol", "show", "hostnames", nodes]).split()) if nodes else set()
            info = json.loads(self._run(["sinfo", "--json"]))["nodes"]
        except (RuntimeError, ValueError, KeyError):
            return []
        return [
            (n["name"], n.get("reason") or "down")
            for n in info
            if n["name"] in hosts and any(s in str(n.get("state", "")).upper() for s in ("DOWN", "DRAIN", "FAIL"))
        ]

    def cancel(self, ref: AttemptRef) -> None:
        if ref.backend_ref:
            self._run([*self._as_user(ref.owner), "scancel", ref.backend_ref])

    # -- living with Slurm's own scheduler ------------------------------------------------------
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

    def _cluster_amounts(self) -> Amounts:
        """GPUs, cores and memory (MiB) of this backend's whole cluster (the one its
        `slurm_conf` names), every partition's nodes, powered-down CLOUD nodes included (a burst
        partition's jobs are charged to the same accounts): an account's GrpTRES counts its
        jobs in all of them."""
        nodes = self._nodes()
        return Amounts(
            sum(_gpus_of(n.get("gres", "")) for n in nodes),
            sum(int(n.get("cpus", 0)) for n in nodes),
            sum(int(n.get("real_memory", 0)) for n in nodes),
        )

    def warn(self, ref: AttemptRef) -> None:
        """SIGUSR1 to every step's tasks (the supervisors), not to the batch shell."""
        if ref.backend_ref:
            self._run([*self._as_user(ref.owner), "scancel", "--signal=USR1", ref.backend_ref])


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
    backends = list(backends)
    limits: dict[str, AccountLimits] = {}
    for tenant, config in tenancy.tenants.items():
        if not SAFE_NAME.match(tenant):
            continue  # not a valid Slurm account name: such a tenant cannot submit to Slurm either
        queues = {local.cluster_queue for local in config.queues.values()}
        placed = [(cq, flavor) for cq in queues for backend in backends for flavor in tenancy.flavors_for(cq, backend)]
        if not placed:
            continue
        ceilings = [_ceiling(tenancy, placed, resource, cap) for resource, cap in zip(RESOURCES, cluster, strict=True)]
        fraction = sum(_entitled(tree, cq) for cq in {cq for cq, _ in placed})
        limits[tenant] = AccountLimits(*ceilings, shares=max(1, round(1000 * fraction)))
    return limits


def _ceiling(tenancy: Tenancy, placed: list[tuple[str, str]], resource: Resource, cap: int) -> int | None:
    """The most of `resource` these (cluster queue, flavor) pairs could hold at once; None
    when one of them has no quota on it."""
    amounts = [tenancy.max_admissible(cq, flavor, resource) for cq, flavor in placed]
    if any(amount is None for amount in amounts):
        return None
    return min(sum(amounts), cap)


def _limit(amount: int | None) -> str:
    return "-1" if amount is None else str(amount)


def _entitled(tree: FairTree, cluster_queue: str) -> float:
    fraction = 1.0
    for node in tree.paths[cluster_queue]:
        fraction *= tree.share[node]
    return fraction


def sbatch_quote(option: str) -> str:
    """One argument of an `#SBATCH` line. sbatch splits the line at blanks and honours double
    quotes and backslashes (not single quotes, unlike a shell), and an unquoted `#` ends it."""
    if SBATCH_BARE.fullmatch(option):
        return option
    return '"' + option.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fill_template(template: str, fields: dict[str, str]) -> str:
    """`template` with its `{field}`s filled, line by line; a line that is only one field whose
    value is empty is left out (the default template's `{prologue}` when there is none)."""
    lines = []
    for line in template.splitlines(keepends=True):
        parsed = list(string.Formatter().parse(line.rstrip("\n")))
        if len(parsed) == 1 and parsed[0][0] == "" and parsed[0][1] and fields.get(parsed[0][1]) == "":
            continue
        lines.append(line.format_map(fields))
    return "".join(lines)


def _unprintable(text: str, tab: bool = False) -> bool:
    return any(ord(c) < 32 and not (tab and c == "\t") or ord(c) == 127 for c in text)


def command_error(argv: list[str], returncode: int, stderr: str) -> RuntimeError:
    """The error a failed Slurm command raises: BackendUnreachable when its stderr says the
    controller (or slurmdbd) does not answer, else a RuntimeError with the stderr's tail."""
    tail = stderr.strip()[-500:]
    if UNREACHABLE.search(stderr):
        return BackendUnreachable(f"{shlex.join(argv)}: Slurm does not answer ({tail})")
    return RuntimeError(f"{shlex.join(argv)} failed ({returncode}): {tail}")


def json_answer(argv: list[str], out: str) -> dict:
    """A `--json` answer; its `errors` (22.05 exits 0 with them when the controller does not
    answer, and an empty list of jobs or nodes) become BackendUnreachable."""
    answer = json.loads(out)
    # sacct's "Nothing found with query" (no such job in accounting) is an answer, not an error
    errors = [e for e in answer.get("errors") or [] if "nothing found" not in json.dumps(e).lower()]
    if errors:
        words = "; ".join(f"{e.get('source') or ''} {e.get('description') or e.get('error') or ''}" for e in errors)
        raise BackendUnreachable(f"{shlex.join(argv)}: Slurm answered with errors ({words.strip()})")
    return answer


def parse_estimate(text: str) -> float | None:
    """`sbatch: Job 5 to start at 2026-12-06T20:09:10 using 2 processors on nodes b[1-2] in
    partition gpu` -> that time (local time, as sbatch writes it) in epoch seconds."""
    match = ESTIMATE.search(text)
    if not match:
        return None
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))


def parse_estimate_nodes(text: str) -> list[str]:
    """The nodes of a `sbatch --test-only` answer (`... on nodes b[1-2] in partition gpu`)."""
    match = ESTIMATE_NODES.search(text)
    return expand_hostlist(match.group(1)) if match else []


def capacity_words(short: list[tuple[str, str]]) -> str:
    names = ", ".join(name for name, _ in short)
    kind = short[0][1].split(":", 1)[0]
    return f"the cloud had no capacity for {names} ({kind}): {short[0][1]}"


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compact node list as names: 'c[1-2],node[1,3-4],cpu1' -> ['c1', 'c2', 'node1',
    'node3', 'node4', 'cpu1']; zero padding kept ('n[01-02]'). '', 'None assigned' -> []."""
    text = text.strip()
    if not text or text.startswith("None") or text == "(null)":
        return []
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", text):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if not last:
                names.append(prefix + first)
                continue
            width = len(first) if first.startswith("0") else 0
            names += [f"{prefix}{i:0{width}d}" for i in range(int(first), int(last) + 1)]
    return names


def _conf_cluster_name(conf: Path) -> str | None:
    try:
        text = conf.read_text()
    except OSError:
        return None
    match = re.search(r"^\s*ClusterName\s*=\s*(\S+)", text, re.MULTILINE | re.IGNORECASE)
    return match.group(1) if match else None


def _slurm_minutes(value: str) -> float:
    """A partition's MaxTime ('7-00:00:00', '60', '1:00:00', 'UNLIMITED') in minutes; inf when unlimited."""
    if not value or value.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return float("inf")
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        minutes = parts[0]
    elif len(parts) == 2:
        minutes = parts[0] + parts[1] / 60
    else:
        minutes = parts[0] * 60 + parts[1] + parts[2] / 60
    return (int(days) if days else 0) * 1440 + minutes


def _gpus_of(gres: str) -> int:
    """'gpu:8' or 'gpu:tesla:8(S:0)' → 8."""
    match = re.search(r"gpu(?::[^:,(]+)?:(\d+)", gres)
    return int(match.group(1)) if match else 0


def _tres(text: str) -> dict[str, str]:
    """'cpu=4,gres/gpu=0' → {'cpu': '4', 'gres/gpu': '0'}."""
    return dict(item.split("=", 1) for item in text.strip().split(",") if "=" in item)


def _key_values(line: str) -> dict[str, str]:
    """`scontrol -o show ...`'s `Key=Value Key=Value` line as a dict."""
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def _held(entry: dict | None) -> tuple[float, float | None] | None:
    """The allocation's start and end as Slurm's own records have them (squeue's start_time of a
    started job; sacct's time.start and time.end); None before it started."""
    if entry is None or _state(entry) in QUEUED:
        return None
    times = entry.get("time")
    if isinstance(times, dict):  # sacct
        start, end = times.get("start") or 0, times.get("end") or 0
    else:  # squeue: a running job's end_time is its time limit, not an end
        start, end = entry.get("start_time") or 0, (entry.get("end_time") or 0) if _state(entry) in ENDED else 0
    if not start:
        return None
    return float(start), float(end) if end and end >= start else None


def _exit_code(entry: dict) -> int | None:
    code = entry.get("exit_code")
    if isinstance(code, dict):
        return code.get("return_code")
    return code if isinstance(code, int) else None
