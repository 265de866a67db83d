"""The Slurm backend: one sbatch job per attempt, the gang as whole nodes.

`render()` is the exact batch script (golden-file tested): `--nodes`, one task per node
(`srun` starts one cellscale supervisor per node, which starts torchrun or Ray there),
`--gres=gpu:N`, `--switches` for topology, and the tenant as the Slurm account. Jobs are
submitted under the researcher's own Unix identity (`submit_as`, e.g. sudo to the user),
never a shared service account. One `squeue --json` plus, for jobs that have left the
queue, one `sacct --json` per poll cycle; a job neither knows about is UNKNOWN, never gone.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import sys
import time
from pathlib import Path

from traitlets import Float, Integer, List, Unicode, default

from cellscale.spec import AttemptState, BackendView, JobSpec, Launcher
from cellscale_hub import proc
from cellscale_hub.drivers.base import AttemptRef, Driver, Observation, SpecRejected, fault_from_job_dir, heartbeat_of
from cellscale_hub.faults import Fault
from cellscale_hub.scheduling.fairshare import FairTree
from cellscale_hub.tenancy import Tenancy
from cellscale.runtime.jobdir import LaunchPlan

SAFE_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
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


def job_name(ref: AttemptRef) -> str:
    return f"{ref.job_id}-a{ref.number}"


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

    partition = Unicode("gpu", help="Partition the jobs go to.").tag(config=True)
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
        "", help="Address of a job's first node as ranks see it. Empty: the first host of the allocation. "
                 "127.0.0.1 for a dev cluster whose nodes share this host.",
    ).tag(config=True)
    capacity_seconds = Float(30.0, help="How long the partition's size from sinfo is reused.").tag(config=True)
    command_timeout = Integer(30, help="Seconds a Slurm command may take.").tag(config=True)

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

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._capacity: tuple[float, BackendView] | None = None

    # -- commands ----------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        return proc.job_environment({"SLURM_CONF": self.slurm_conf} if self.slurm_conf else None)

    def _run(self, argv: list[str]) -> str:
        result = proc.run(argv, timeout=self.command_timeout, env=self._env())
        if result.returncode:
            raise RuntimeError(f"{shlex.join(argv)} failed ({result.returncode}): {result.stderr.strip()[-500:]}")
        return result.stdout

    def _as_user(self, user: str) -> list[str]:
        if not SAFE_NAME.match(user):
            raise SpecRejected(f"user name {user!r} is not a valid Unix user name; Slurm jobs run as their owner")
        return [part.replace("{user}", user) for part in self.submit_as]

    # -- capacity ----------------------------------------------------------------------------
    def capacity(self) -> BackendView:
        now = time.monotonic()
        if self._capacity and now - self._capacity[0] < self.capacity_seconds:
            return self._capacity[1]
        nodes = [n for n in json.loads(self._run(["sinfo", "--json"]))["nodes"] if self.partition in n.get("partitions", [])]
        per_node = max((_gpus_of(n.get("gres", "")) for n in nodes), default=0)
        view = BackendView(name=self.name, kind=self.kind, capacity_gpus=per_node * len(nodes), max_nodes=len(nodes),
                           gpus_per_node=per_node, launchers=list(Launcher))
        self._capacity = (now, view)
        return view

    def shape(self, spec: JobSpec) -> JobSpec:
        """`--gpus 16` on 8-GPU nodes becomes 2 whole nodes of 8."""
        res = spec.resources
        per_node = self.capacity().gpus_per_node
        if res.nodes == 1 and per_node and res.gpus_per_node > per_node and res.gpus_per_node % per_node == 0:
            resources = res.model_copy(update={"nodes": res.gpus_per_node // per_node, "gpus_per_node": per_node})
            return spec.model_copy(update={"resources": resources})
        return spec

    def launch_plan(self, ref: AttemptRef) -> LaunchPlan:
        """Ranks on other nodes need node 0's address and a rendezvous port."""
        return super().launch_plan(ref).model_copy(
            update={"master_addr": self.master_addr or None, "master_port": master_port(ref)})

    # -- the batch script ----------------------------------------------------------------------
    def script_path(self, ref: AttemptRef) -> Path:
        return ref.dir.attempt_dir(ref.number) / "job.sbatch"

    def render(self, ref: AttemptRef) -> str:
        res = ref.spec.resources
        if not SAFE_NAME.match(ref.tenant):
            raise SpecRejected(f"tenant {ref.tenant!r} cannot be a Slurm account name (lower-case letters, digits, -, _)")
        out = ref.dir.attempt_dir(ref.number) / "slurm-%j.out"
        directives = [
            f"--job-name={job_name(ref)}",
            f"--account={ref.tenant}",
            f"--partition={self.partition}",
            f"--nodes={res.nodes}",
            "--ntasks-per-node=1",
            *([f"--gres=gpu:{res.gpus_per_node}"] if res.gpus_per_node else []),
            f"--time={res.timeout_min}",
            *([f"--switches={res.switches}"] if res.switches else []),
            *([f"--exclude={','.join(excluded)}"] if (excluded := self._excludable(ref)) else []),
            f"--chdir={ref.job_dir}",
            f"--output={out}",
            "--no-requeue",
            "--comment=cellscale",
        ]
        supervisor = [self.python, "-m", "cellscale.runtime.supervisor", str(ref.job_dir), str(ref.number)]
        lines = [
            "#!/bin/bash",
            f"# cellscale job {ref.job_id}, attempt {ref.number}, owner {ref.owner}: "
            f"{res.nodes} node(s) x {res.gpus_per_node} GPU(s), launcher {ref.spec.launcher.value}",
            *(f"#SBATCH {shlex.quote(d)}" for d in directives),
            f"exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 {shlex.join(supervisor)}",
        ]
        return "\n".join(lines) + "\n"

    def _excludable(self, ref: AttemptRef) -> list[str]:
        """The nodes that failed this job, while enough others remain for its gang."""
        bad = sorted({node for node in ref.excluded_nodes if SAFE_NODE.match(node)})
        if not bad or self.capacity().max_nodes - len(bad) < ref.spec.resources.nodes:
            return []
        return bad

    # -- submit / poll / cancel ------------------------------------------------------------------
    def submit(self, ref: AttemptRef) -> str:
        existing = self._find(ref) if ref.resubmit else None
        if existing:
            return existing  # submitted before a restart of the control plane: adopt it
        self.script_path(ref).write_text(self.render(ref))
        _give_to(ref.owner, ref.job_dir)
        out = self._run([*self._as_user(ref.owner), "sbatch", "--parsable", str(self.script_path(ref))])
        return out.strip().split(";")[0]

    def _find(self, ref: AttemptRef) -> str | None:
        out = self._run(["squeue", "-h", f"--name={job_name(ref)}", "-o", "%i"]).split()
        if not out:
            out = self._run(["sacct", "-n", "-X", "-P", f"--name={job_name(ref)}", "-o", "JobID", "-S", "now-7days"]).split()
        return out[0] if out else None

    def poll(self, refs: list[AttemptRef]) -> dict[tuple[str, int], Observation]:
        ids = {ref.backend_ref: ref for ref in refs if ref.backend_ref}
        observed: dict[tuple[str, int], Observation] = {
            ref.key: Observation(AttemptState.SUBMITTING) for ref in refs if not ref.backend_ref
        }
        if not ids:
            return observed
        queue = {str(j["job_id"]): j for j in json.loads(self._run(["squeue", "--json"]))["jobs"]}
        gone = [job_id for job_id in ids if job_id not in queue or _state(queue[job_id]) not in QUEUED | ACTIVE]
        history = {}
        if gone:
            accounting = json.loads(self._run(["sacct", "--json", "-X", "-j", ",".join(gone)]))
            history = {str(j["job_id"]): j for j in accounting["jobs"]}
        for job_id, ref in ids.items():
            entry = history.get(job_id) or queue.get(job_id)
            observed[ref.key] = self._observe(ref, entry)
        return observed

    def _observe(self, ref: AttemptRef, entry: dict | None) -> Observation:
        if entry is None:
            return Observation(AttemptState.UNKNOWN, reason="neither squeue nor sacct knows the job (yet)")
        state = _state(entry)
        if state in QUEUED:
            why = entry.get("state_reason") or "queued"
            return Observation(AttemptState.STARTING, reason=f"Slurm job {ref.backend_ref} {state.lower()} ({why})")
        if state in ACTIVE:
            running = ref.dir.ranks_started(ref.number) >= self.launch_plan(ref).expected_ranks
            heartbeat, step = heartbeat_of(ref, ref.spec.resources.nodes)
            return Observation(AttemptState.RUNNING if running else AttemptState.STARTING, heartbeat=heartbeat, step=step)
        if state in ENDED:
            if not entry.get("allocation_nodes") and entry.get("nodes") not in (None, "", "None assigned"):
                # slurmdbd writes asynchronously: for a moment after the end the record shows
                # the first node only and no allocation; the next poll sees it whole
                return Observation(AttemptState.UNKNOWN, reason=f"Slurm accounting of job {ref.backend_ref} is settling")
            failed_nodes = self._down_nodes(entry.get("nodes", "")) if state == "NODE_FAIL" else []
            return Observation(ENDED[state], exit_code=_exit_code(entry), reason=self._end_reason(ref, state, failed_nodes),
                               fault=self._fault(ref, state), failed_nodes=tuple(name for name, _ in failed_nodes))
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
        return error["summary"] if error else f"Slurm job {ref.backend_ref} ended {state}"

    def _fault(self, ref: AttemptRef, state: str) -> Fault | None:
        if state in ("COMPLETED", "CANCELLED"):
            return None
        return {"NODE_FAIL": Fault.INFRASTRUCTURE, "TIMEOUT": Fault.TIMEOUT, "PREEMPTED": Fault.PREEMPTION}.get(state) \
            or fault_from_job_dir(ref, ref.spec.resources.nodes)

    def _down_nodes(self, nodes: str) -> list[tuple[str, str]]:
        """(name, Slurm's reason) of the job's nodes that are down, drained or failed."""
        try:
            hosts = set(self._run(["scontrol", "show", "hostnames", nodes]).split()) if nodes else set()
            info = json.loads(self._run(["sinfo", "--json"]))["nodes"]
        except (RuntimeError, ValueError, KeyError):
            return []
        return [(n["name"], n.get("reason") or "down") for n in info
                if n["name"] in hosts and any(s in str(n.get("state", "")).upper() for s in ("DOWN", "DRAIN", "FAIL"))]

    def cancel(self, ref: AttemptRef) -> None:
        if ref.backend_ref:
            self._run([*self._as_user(ref.owner), "scancel", ref.backend_ref])

    # -- living with Slurm's own scheduler ------------------------------------------------------
    def apply_tenancy(self, tenancy: Tenancy) -> None:
        """Mirror each desk's quota and fair share onto its Slurm account (see
        `account_limits`); accounts Slurm does not know are left to the Slurm admin."""
        cluster_gpus = self.capacity().capacity_gpus
        known = set(self._run(["sacctmgr", "-n", "-P", "show", "account", "format=account"]).split())
        for account, (gpus, shares) in account_limits(tenancy, self.name, cluster_gpus).items():
            if account not in known:
                self.log.warning("Slurm has no account %s: its quota is not mirrored", account)
                continue
            self._run(["sacctmgr", "-i", "modify", "account", "where", f"name={account}", "set",
                       f"GrpTRES=gres/gpu={gpus}", f"Fairshare={shares}"])

    def warn(self, ref: AttemptRef) -> None:
        """SIGUSR1 to every step's tasks (the supervisors), not to the batch shell."""
        if ref.backend_ref:
            self._run([*self._as_user(ref.owner), "scancel", "--signal=USR1", ref.backend_ref])


def account_limits(tenancy: Tenancy, backend: str, cluster_gpus: int) -> dict[str, tuple[int, int]]:
    """Per Slurm account (= tenant): (GrpTRES gres/gpu, Fairshare).

    The GPU limit is the most cellscale could ever admit for the tenant on this backend
    (nominal + borrowable, at most the cluster), so Slurm never holds back a job cellscale
    admitted, and a job submitted around cellscale meets the same ceiling. Fairshare is the
    tenant's entitled fraction of the fleet from the cohort tree's weights, in thousandths,
    so Slurm's own fair-share factor orders anything it orders the way cellscale would."""
    tree = FairTree.of(tenancy)
    limits: dict[str, tuple[int, int]] = {}
    for tenant, config in tenancy.tenants.items():
        if not SAFE_NAME.match(tenant):
            continue  # not a valid Slurm account name: such a tenant cannot submit to Slurm either
        queues = {local.cluster_queue for local in config.queues.values()}
        gpus = sum(tenancy.max_admissible(cq, f) for cq in queues for f in tenancy.flavors_for(cq, backend))
        fraction = sum(_entitled(tree, cq) for cq in queues if tenancy.flavors_for(cq, backend))
        if gpus or fraction:
            limits[tenant] = (min(gpus, cluster_gpus), max(1, round(1000 * fraction)))
    return limits


def _entitled(tree: FairTree, cluster_queue: str) -> float:
    fraction = 1.0
    for node in tree.paths[cluster_queue]:
        fraction *= tree.share[node]
    return fraction


def _gpus_of(gres: str) -> int:
    """'gpu:8' or 'gpu:tesla:8(S:0)' → 8."""
    match = re.search(r"gpu(?::[^:,(]+)?:(\d+)", gres)
    return int(match.group(1)) if match else 0


def _exit_code(entry: dict) -> int | None:
    code = entry.get("exit_code")
    if isinstance(code, dict):
        return code.get("return_code")
    return code if isinstance(code, int) else None


def _give_to(user: str, job_dir: Path) -> None:
    """As root (dev clusters), hand the job dir to the researcher who runs the job; in production
    the control plane writes into a group-shared job root instead."""
    if os.geteuid() != 0:
        return
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise RuntimeError(f"there is no Unix user {user!r} here; Slurm jobs run as their owner") from None
    for path in [job_dir, *job_dir.rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid)
