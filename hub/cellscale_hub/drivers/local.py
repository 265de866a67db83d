"""The local backend: all-or-nothing jobs on this machine against a declared number of
logical GPUs. It is the embedded default and a real backend, not a test double: each
attempt is a detached supervisor process that outlives the control plane, started as the
job's owner (the same privilege step as the Slurm driver's) in a job directory only that
user can read."""

from __future__ import annotations

import dataclasses
import os
import pwd
import shlex
import signal
import subprocess
import sys
import threading
import time

from traitlets import Float, Integer, List, Unicode, default

from cellscale.runtime import stage
from cellscale.runtime.jobdir import JobDir
from cellscale.runtime.records import ExitRecord, Started
from cellscale.runtime.supervisor import launcher_argv
from cellscale.runtime.sweepdir import SweepDir
from cellscale.spec import BackendView
from cellscale.vocabulary import AttemptState, ExitReason, Fault, Launcher, TaskLiveness
from cellscale_hub import proc
from cellscale_hub.drivers.base import Driver
from cellscale_hub.drivers.capabilities import ArrayRef, AssignsGpuIds, RunsSweeps, StagesAhead, TaskEnd
from cellscale_hub.drivers.jobfiles import heartbeat_of
from cellscale_hub.drivers.owners import as_user, hand_files_to_owner, hand_to_owner, owner_of
from cellscale_hub.drivers.types import AttemptRef, Observation, SpecRejected

SUPERVISOR = ("-m", "cellscale.runtime.supervisor")
POOL = ("-m", "cellscale.runtime.sweep", "pool")


class LocalDriver(Driver, RunsSweeps, StagesAhead, AssignsGpuIds):
    kind = "local"

    gpus = Integer(
        4,
        help="""Logical GPUs this machine offers. Jobs get distinct ids 0..gpus-1 through
        CUDA_VISIBLE_DEVICES; a job starts only when all the GPUs it asks for are free.""",
    ).tag(config=True)

    cpus = Integer(
        help="""CPU cores jobs may use at once: admission bounds the sum of the running jobs'
        cores by it (a CPU backtest waits for cores as a GPU job waits for GPUs). Default: the
        machine's cores, and never fewer than `gpus`, so that a torchrun job of every GPU (a task
        and a core per GPU) always fits on a machine that emulates more GPUs than it has cores.""",
    ).tag(config=True)

    memory_mb = Integer(
        help="Memory (MiB) jobs may ask for at once with --mem. Default: the machine's memory.",
    ).tag(config=True)

    start_grace_seconds = Float(
        30.0,
        help="How long a submitted attempt may take to show its supervisor before it counts as lost.",
    ).tag(config=True)

    submit_as = List(
        Unicode(),
        help="""Prefix that starts a job's supervisor as the job's owner; `{user}` is replaced by the
        (validated) user name. Default: ["runuser", "-u", "{user}", "--"] when the control plane
        runs as root, so every user's jobs run as that user's own Unix identity and the OS keeps
        users apart; production without root: ["sudo", "-n", "-u", "{user}", "--"] with a sudoers
        rule for the supervisor command. [] runs every job as the control plane's own user: only for
        a personal control plane or a single-user machine (a warning says so at start).""",
    ).tag(config=True)

    @default("submit_as")
    def _default_submit_as(self) -> list[str]:
        return ["runuser", "-u", "{user}", "--"] if os.geteuid() == 0 else []

    @default("name")
    def _default_name(self) -> str:
        return "local"

    @default("cpus")
    def _default_cpus(self) -> int:
        return max(os.cpu_count() or 1, self.gpus)

    @default("memory_mb")
    def _default_memory_mb(self) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20

    @default("log_poll_interval")
    def _default_log_poll_interval(self) -> float:
        return 5.0  # its jobs write on this host: inotify reports every line; the check is only a safety net

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._children: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self._cancelled: set[tuple[str, int]] = set()  # attempts this driver was told to stop
        if not self.submit_as:
            self.log.warning(
                "LocalDriver %r runs EVERY user's jobs as %s (submit_as is empty): users are not kept apart. "
                "Fine for a personal control plane; on a shared machine run the control plane as root "
                "(jobs then run as their owners) or set c.LocalDriver.submit_as to a sudo rule.",
                self.name,
                pwd.getpwuid(os.geteuid()).pw_name,
            )

    def capacity(self) -> BackendView:
        return BackendView(
            name=self.name,
            kind=self.kind,
            capacity_gpus=self.gpus,
            max_nodes=1,
            gpus_per_node=self.gpus,
            launchers=list(Launcher),
            capacity_cpus=self.cpus,
            cpus_per_node=self.cpus,
            capacity_memory_mb=self.memory_mb,
            memory_mb_per_node=self.memory_mb,
        )

    def validate(self, spec) -> None:
        if spec.resources.nodes > 1:
            raise SpecRejected(
                f"the {self.name!r} backend is this one machine: use --gpus N without --nodes, "
                "or pick a cluster backend with --backend"
            )
        super().validate(spec)

    def argv(self, ref: AttemptRef) -> list[str]:
        prefix = as_user(self.submit_as, ref.owner) if self.submit_as else []
        return [*prefix, sys.executable, *SUPERVISOR, str(ref.job_dir), str(ref.number)]

    def render(self, ref: AttemptRef) -> str:
        if ref.spec.sweep is not None:
            return self._render_pool(ref)
        gpus = ",".join(map(str, ref.gpu_ids)) or "none"
        plan = self.launch_plan(ref)
        each = f", once for each of its {plan.procs_per_node} processes" if plan.launcher is Launcher.jax else ""
        lines = [
            "#!/bin/sh",
            f"# cellscale local backend: job {ref.job_id}, attempt {ref.number}, GPUs {gpus}",
            f"# the supervisor then starts{each}: {shlex.join(launcher_argv(plan, ref.dir))}",
            f"cd {shlex.quote(str(ref.job_dir))}",
            f"exec {shlex.join(self.argv(ref))}",
        ]
        return "\n".join(lines) + "\n"

    def _render_pool(self, ref: AttemptRef) -> str:
        sweep = ref.spec.sweep
        task = [sys.executable, "-m", "cellscale.runtime.sweep", "task", str(ref.job_dir), "1", "INDEX"]
        lines = [
            "#!/bin/sh",
            f"# cellscale local backend: sweep {ref.job_id}, attempt {ref.number}: {sweep.points} point(s) in "
            f"{sweep.tasks} task(s) of {sweep.per_task}, at most {sweep.slots} at once, each with "
            f"{ref.spec.resources.gpus_per_node} GPU(s)",
            "# one task pool per array; each task runs its points one after another:",
            f"#   {shlex.join(task)}",
            f"cd {shlex.quote(str(ref.job_dir))}",
            f"exec {shlex.join(self._pool_argv(ref, 1))}",
        ]
        return "\n".join(lines) + "\n"

    def submit(self, ref: AttemptRef) -> str:
        node_dir = ref.dir.node_dir(ref.number)
        node_dir.mkdir(parents=True, exist_ok=True)
        if ref.dir.read_started(ref.number) or ref.dir.supervisor_alive(ref.number):
            return ref.backend_ref or "local"  # already launched: never twice
        if self.submit_as:
            hand_to_owner(ref.owner, ref.job_dir)
        child = proc.spawn_detached(
            self.argv(ref),
            cwd=ref.job_dir,
            log=ref.dir.process_log(ref.number, 0, "supervisor"),
            env=proc.job_environment(),
        )
        self._children[ref.key] = child
        threading.Thread(target=self._reap, args=(child,), name=f"reap-{ref.job_id}", daemon=True).start()
        return f"pid:{child.pid}"

    # -- staging ahead: this machine is the one node ---------------------------------------------------
    def stage_targets(self, ref: AttemptRef) -> list[str] | None:
        return [stage.node_name()]

    def start_staging(self, ref: AttemptRef, nodes: list[str]) -> None:
        """The stager, detached, as the job's owner (it reads the source with their rights)."""
        prefix = as_user(self.submit_as, ref.owner) if self.submit_as else []
        if self.submit_as:
            hand_to_owner(ref.owner, ref.job_dir)
        child = proc.spawn_detached(
            [*prefix, sys.executable, "-m", "cellscale.runtime.stage", str(ref.job_dir)],
            cwd=ref.job_dir,
            log=ref.dir.staging / "stage.log",
            env=proc.job_environment(),
        )
        threading.Thread(target=child.wait, name=f"reap-stage-{ref.job_id}", daemon=True).start()

    def _reap(self, child: subprocess.Popen[bytes]) -> None:
        """Wait for a supervisor this driver started, then wake the controller: the supervisor
        writes its exit record before it exits, so the cycle sees how the attempt ended."""
        child.wait()
        self.notify()

    def poll(self, refs: list[AttemptRef]) -> dict[tuple[str, int], Observation]:
        return {ref.key: self._observe(ref) for ref in refs}

    def _observe(self, ref: AttemptRef) -> Observation:
        """What the attempt's files and supervisor say, with this machine's allocation: from the
        supervisor taking the attempt to its exit (each record read once)."""
        jd = ref.dir
        child = self._children.get(ref.key)
        exited = child is not None and child.poll() is not None  # before the records: all it wrote is there
        record = jd.read_exit(ref.number)
        started = jd.read_started(ref.number)
        held = (started.at, record.at if record is not None else None) if started and started.at is not None else None
        return dataclasses.replace(self._state(ref, jd, child, exited, record, started), held=held)

    def _state(
        self,
        ref: AttemptRef,
        jd: JobDir,
        child: subprocess.Popen[bytes] | None,
        exited: bool,
        record: ExitRecord | None,
        started: Started | None,
    ) -> Observation:
        if record is not None:
            self._children.pop(ref.key, None)
            self._cancelled.discard(ref.key)
            state = _state_for(record.reason)
            fault = (
                record.reason.fault if state is AttemptState.FAILED or record.reason is ExitReason.PREEMPTED else None
            )
            return Observation(state, exit_code=record.code, reason=record.message or record.reason.value, fault=fault)
        if jd.supervisor_alive(ref.number):
            heartbeat, step = heartbeat_of(ref, 1)
            all_ranks = jd.ranks_started(ref.number) >= self.launch_plan(ref).expected_ranks
            return Observation(
                AttemptState.RUNNING if all_ranks else AttemptState.STARTING, heartbeat=heartbeat, step=step
            )
        if exited:
            self._children.pop(ref.key, None)
        if ref.key in self._cancelled and (exited or started):
            # stopped before it could record how it ended (a cancel in its first moments): what it was told
            return Observation(AttemptState.CANCELLED, reason="cancelled while its supervisor was starting")
        if started:
            return Observation(
                AttemptState.LOST,
                reason="the supervisor died without writing an exit record",
                fault=Fault.INFRASTRUCTURE,
            )
        if exited:  # the process this driver spawned is gone and wrote nothing: no need to wait out the grace
            return Observation(
                AttemptState.LOST,
                reason=f"the supervisor exited ({child.returncode}) before it started",
                fault=Fault.INFRASTRUCTURE,
            )
        if ref.submitted_at is None or time.time() - ref.submitted_at.timestamp() < self.start_grace_seconds:
            return Observation(AttemptState.SUBMITTING)
        return Observation(
            AttemptState.LOST,
            reason=f"the supervisor never started within {self.start_grace_seconds:.0f}s",
            fault=Fault.INFRASTRUCTURE,
        )

    # -- sweeps: one detached task pool per array ----------------------------------------------------
    def _pool_argv(self, ref: AttemptRef, number: int) -> list[str]:
        prefix = as_user(self.submit_as, ref.owner) if self.submit_as else []
        return [*prefix, sys.executable, *POOL, str(ref.job_dir), str(number)]

    def max_array_size(self) -> int:
        return 1_000_000  # a pool has no index limit of its own

    def submit_array(self, array: ArrayRef) -> str:
        ref, number = array.ref, array.plan.number
        sweep = SweepDir(ref.job_dir)
        if sweep.pool_alive(number) or sweep.pool_started(number).exists():
            return array.backend_ref or f"pool:{number}"  # already launched: never twice
        if self.submit_as and owner_of(ref.job_dir) != ref.owner:  # the pool runs as the owner
            hand_to_owner(ref.owner, ref.job_dir)
        child = proc.spawn_detached(
            self._pool_argv(ref, number),
            cwd=ref.job_dir,
            log=sweep.arrays / f"{number}.pool.log",
            env=proc.job_environment(),
        )
        self._children[(ref.job_id, -number)] = child
        threading.Thread(target=self._reap, args=(child,), name=f"reap-{ref.job_id}-{number}", daemon=True).start()
        return f"pool:{child.pid}"

    def live_tasks(self, arrays: list[ArrayRef]) -> dict[tuple[str, int], dict[int, TaskLiveness]]:
        out = {}
        for array in arrays:
            sweep, number = SweepDir(array.ref.job_dir), array.plan.number
            if sweep.pool_alive(number):
                ended = sweep.ended_tasks(number)
                started = {i for n, i, _ in sweep.started_tasks() if n == number}
                live = (i for i in range(len(array.plan.tasks)) if i not in ended)
                out[array.key] = {i: TaskLiveness.running if i in started else TaskLiveness.pending for i in live}
            elif not sweep.pool_started(number).exists() and self._starting(array):
                out[array.key] = dict.fromkeys(range(len(array.plan.tasks)), TaskLiveness.pending)
            else:
                out[array.key] = {}
        return out

    def _starting(self, array: ArrayRef) -> bool:
        at = array.submitted_at
        return at is None or time.time() - at.timestamp() < self.start_grace_seconds

    def task_end(self, array: ArrayRef, index: int) -> TaskEnd:
        sweep, number = SweepDir(array.ref.job_dir), array.plan.number
        record = sweep.read_task_end(number, index)
        if record is not None and record.reason is ExitReason.TIMEOUT:
            return TaskEnd(Fault.TIMEOUT, record.message or "ran past its time limit")
        if record is not None:
            return TaskEnd(Fault.INFRASTRUCTURE, record.message or f"its process ended ({record.reason.value})")
        return TaskEnd(Fault.INFRASTRUCTURE, "its task pool died before the task ended")

    def cancel_array(self, array: ArrayRef) -> None:
        pid = _pool_pid(array)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def throttle_array(self, array: ArrayRef, throttle: int) -> None:
        sweep = SweepDir(array.ref.job_dir)
        sweep.write_throttle(array.plan.number, throttle)
        if self.submit_as:  # the owner's pool re-reads it
            hand_files_to_owner(array.ref.owner, [sweep.throttle_file(array.plan.number)])

    def cancel(self, ref: AttemptRef) -> None:
        self._cancelled.add(ref.key)
        self._signal(ref, signal.SIGTERM)

    def warn(self, ref: AttemptRef) -> None:
        self._signal(ref, signal.SIGUSR1)

    def _signal(self, ref: AttemptRef, signum: int) -> None:
        """Signal the attempt's supervisor: by the pid it recorded, or, when it was launched
        moments ago and has not recorded it yet, by the process this driver spawned."""
        started = ref.dir.read_started(ref.number)
        child = self._children.get(ref.key)
        pid = started.pid if started else (child.pid if child else None)
        if pid is None:
            return
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _pool_pid(array: ArrayRef) -> int | None:
    """The pool's pid: what it wrote when it took the array's lock, else the one spawned."""
    try:
        return int(SweepDir(array.ref.job_dir).pool_started(array.plan.number).read_text())
    except (OSError, ValueError):
        ref = array.backend_ref or ""
        return int(ref.removeprefix("pool:")) if ref.startswith("pool:") and ref[5:].isdigit() else None


def _state_for(reason: ExitReason) -> AttemptState:
    return {
        ExitReason.SUCCEEDED: AttemptState.SUCCEEDED,
        ExitReason.CANCELLED: AttemptState.CANCELLED,
        ExitReason.PREEMPTED: AttemptState.CANCELLED,
    }.get(reason, AttemptState.FAILED)
