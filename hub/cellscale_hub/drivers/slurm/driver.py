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

The class is assembled from one mixin per capability (`arrays`, `accounts`, `nodes`,
`estimate`, `staging`) over the Slurm commands (`commands`); the script's pieces are in
`script`, the parsing of what Slurm answers in `parse`.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from traitlets import Bool, Float, Integer, List, TraitError, Unicode, default, validate

from cellscale.runtime.records import LaunchPlan
from cellscale.spec import AttemptState, BackendView, JobSpec
from cellscale.vocabulary import Fault
from cellscale_hub.drivers.base import Driver
from cellscale_hub.drivers.jobfiles import fault_from_job_dir, heartbeat_of
from cellscale_hub.drivers.owners import hand_to_owner
from cellscale_hub.drivers.slurm.accounts import SlurmAccounts
from cellscale_hub.drivers.slurm.arrays import SlurmArrays
from cellscale_hub.drivers.slurm.commands import SlurmCommands
from cellscale_hub.drivers.slurm.estimate import SlurmEstimates
from cellscale_hub.drivers.slurm.nodes import SlurmNodes
from cellscale_hub.drivers.slurm.parse import (
    ACTIVE,
    CAPACITY_REASONS,
    ENDED,
    NOTICE_REASON,
    QUEUED,
    End,
    capacity_words,
    exit_code,
    expand_hostlist,
    held,
    job_state,
)
from cellscale_hub.drivers.slurm.script import (
    DEFAULT_BATCH_TEMPLATE,
    SAFE_NAME,
    SAFE_NODE,
    TEMPLATE_FIELDS,
    check_directives,
    check_names,
    check_prologue,
    check_template,
    fill_template,
    job_name,
    sbatch_quote,
)
from cellscale_hub.drivers.slurm.staging import SlurmStaging
from cellscale_hub.drivers.types import AttemptRef, Observation


def master_port(ref: AttemptRef) -> int:
    """A rendezvous port every node derives alike from the attempt (no coordination needed)."""
    return 20000 + int.from_bytes(f"{ref.job_id}/{ref.number}".encode(), "big") % 20000


class SlurmDriver(SlurmCommands, SlurmNodes, SlurmEstimates, SlurmStaging, SlurmArrays, SlurmAccounts, Driver):
    kind = "slurm"

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
        return check_directives(proposal["value"])

    @validate("prologue")
    def _valid_prologue(self, proposal) -> list[str]:
        return check_prologue(proposal["value"])

    @validate("batch_template")
    def _valid_template(self, proposal) -> str:
        return check_template(proposal["value"])

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._capacity: tuple[float, BackendView] | None = None
        self._node_info: tuple[float, list[dict]] | None = None
        self._estimates: dict[tuple, tuple[float, float | None]] = {}
        self._cluster_name: str | None = None
        self._account_users: dict[str, str | None] = {}
        self._array_size: tuple[float, int] | None = None

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
        check_names(ref)
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

    def _avoiding(self, ref: AttemptRef) -> AttemptRef:
        """The attempt avoiding the nodes that failed this job, while enough others remain for
        its gang (so a job is never left waiting for nodes it excluded); asks sinfo (cached)."""
        bad = sorted({node for node in ref.excluded_nodes if SAFE_NODE.match(node)})
        if bad and self.capacity().max_nodes - len(bad) < ref.spec.resources.nodes:
            bad = []
        return replace(ref, excluded_nodes=tuple(bad))

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
        gone = [job_id for job_id in ids if job_id not in queue or job_state(queue[job_id]) not in QUEUED | ACTIVE]
        history = {}
        if gone:
            accounting = self._json(
                ["sacct", "--json", "-X", f"--clusters={self.cluster_name()}", "-j", ",".join(gone)]
            )
            history = {str(j["job_id"]): j for j in accounting["jobs"]}
        for job_id, ref in ids.items():
            entry = history.get(job_id) or queue.get(job_id)
            observed[ref.key] = dataclasses.replace(self._observe(ref, entry), held=held(entry))
        return observed

    def _observe(self, ref: AttemptRef, entry: dict | None) -> Observation:
        if entry is None:
            return Observation(AttemptState.UNKNOWN, reason="neither squeue nor sacct knows the job (yet)")
        state = job_state(entry)
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
            return self._ended(ref, entry, state, placed)
        return Observation(AttemptState.UNKNOWN, reason=f"Slurm state {state or '?'}")

    def _ended(self, ref: AttemptRef, entry: dict, state: str, placed: tuple[str, ...]) -> Observation:
        """An ended job, as its end state's row of `ENDED` says; a node failure's nodes' Slurm
        reasons tell the cloud having no capacity, or a spot reclaim, from nodes that failed."""
        end = ENDED[state]
        if end.nodes_failed:
            reasons = self._node_reasons(placed)
            short = [(n, why) for n, why in reasons.items() if why.startswith(CAPACITY_REASONS)]
            if short:  # the cloud could not provide the nodes: not the job's fault, nor the nodes'
                return Observation(
                    end.state,
                    exit_code=exit_code(entry),
                    reason=capacity_words(short),
                    fault=Fault.CAPACITY,
                    nodes=placed,
                )
            reclaimed = [n for n, why in reasons.items() if why.startswith(NOTICE_REASON)]
            if reclaimed:  # a spot reclaim took the nodes: preempted, never counted
                return Observation(
                    end.state,
                    exit_code=exit_code(entry),
                    reason=f"spot reclaim of {', '.join(reclaimed)}: {reasons[reclaimed[0]]}",
                    fault=Fault.PREEMPTION,
                    nodes=placed,
                )
        failed_nodes = self._down_nodes(entry.get("nodes", "")) if end.nodes_failed else []
        return Observation(
            end.state,
            exit_code=exit_code(entry),
            reason=self._end_words(ref, state, end, failed_nodes),
            fault=fault_from_job_dir(ref, ref.spec.resources.nodes) if end.job_says else end.fault,
            failed_nodes=tuple(name for name, _ in failed_nodes),
            nodes=placed,
        )

    def _end_words(self, ref: AttemptRef, state: str, end: End, failed_nodes: list[tuple[str, str]]) -> str:
        if end.words is not None:
            nodes = ", ".join(f"{name} ({why})" for name, why in failed_nodes) or "a node of the job"
            limit = f"--time {ref.spec.resources.timeout_min} min (Slurm TIMEOUT)"
            return end.words.format(nodes=nodes, limit=limit)
        error = ref.dir.read_error(ref.number)
        return error.summary if error else f"Slurm job {ref.backend_ref} ended {state}"

    def cancel(self, ref: AttemptRef) -> None:
        if ref.backend_ref:
            self._run([*self._as_user(ref.owner), "scancel", ref.backend_ref])

    def warn(self, ref: AttemptRef) -> None:
        """SIGUSR1 to every step's tasks (the supervisors), not to the batch shell."""
        if ref.backend_ref:
            self._run([*self._as_user(ref.owner), "scancel", "--signal=USR1", ref.backend_ref])
