"""The local backend: all-or-nothing jobs on this machine against a declared number of
logical GPUs. It is the embedded default and a real backend, not a test double: each
attempt is a detached supervisor process that outlives the control plane."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

from traitlets import Float, Integer, default

from cellscale.runtime.supervisor import launcher_argv
from cellscale.spec import BackendView
from cellscale.vocabulary import AttemptState, ExitReason, Fault, Launcher
from cellscale_hub import proc
from cellscale_hub.drivers.base import AttemptRef, Driver, Observation, SpecRejected, heartbeat_of

SUPERVISOR = ("-m", "cellscale.runtime.supervisor")


class LocalDriver(Driver):
    kind = "local"

    gpus = Integer(
        4,
        help="""Logical GPUs this machine offers. Jobs get distinct ids 0..gpus-1 through
        CUDA_VISIBLE_DEVICES; a job starts only when all the GPUs it asks for are free.""",
    ).tag(config=True)

    start_grace_seconds = Float(
        30.0,
        help="How long a submitted attempt may take to show its supervisor before it counts as lost.",
    ).tag(config=True)

    assigns_gpu_ids = True

    @default("name")
    def _default_name(self) -> str:
        return "local"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._children: dict[tuple[str, int], subprocess.Popen[bytes]] = {}

    def capacity(self) -> BackendView:
        return BackendView(
            name=self.name,
            kind=self.kind,
            capacity_gpus=self.gpus,
            max_nodes=1,
            gpus_per_node=self.gpus,
            launchers=list(Launcher),
        )

    def validate(self, spec) -> None:
        if spec.resources.nodes > 1:
            raise SpecRejected(
                f"the {self.name!r} backend is this one machine: use --gpus N without --nodes, "
                "or pick a cluster backend with --backend"
            )
        super().validate(spec)

    def argv(self, ref: AttemptRef) -> list[str]:
        return [sys.executable, *SUPERVISOR, str(ref.job_dir), str(ref.number)]

    def render(self, ref: AttemptRef) -> str:
        gpus = ",".join(map(str, ref.gpu_ids)) or "none"
        lines = [
            "#!/bin/sh",
            f"# cellscale local backend: job {ref.job_id}, attempt {ref.number}, GPUs {gpus}",
            f"# the supervisor then starts: {shlex.join(launcher_argv(self.launch_plan(ref), ref.dir))}",
            f"cd {shlex.quote(str(ref.job_dir))}",
            f"exec {shlex.join(self.argv(ref))}",
        ]
        return "\n".join(lines) + "\n"

    def submit(self, ref: AttemptRef) -> str:
        node_dir = ref.dir.node_dir(ref.number)
        node_dir.mkdir(parents=True, exist_ok=True)
        if ref.dir.read_started(ref.number) or ref.dir.supervisor_alive(ref.number):
            return ref.backend_ref or "local"  # already launched: never twice
        child = proc.spawn_detached(
            self.argv(ref),
            cwd=ref.job_dir,
            log=ref.dir.process_log(ref.number, 0, "supervisor"),
            env=proc.job_environment(),
        )
        self._children[ref.key] = child
        return f"pid:{child.pid}"

    def poll(self, refs: list[AttemptRef]) -> dict[tuple[str, int], Observation]:
        for child in self._children.values():
            child.poll()  # reap exited supervisors
        return {ref.key: self._observe(ref) for ref in refs}

    def _observe(self, ref: AttemptRef) -> Observation:
        jd = ref.dir
        record = jd.read_exit(ref.number)
        if record is not None:
            self._children.pop(ref.key, None)
            state = _state_for(record.reason)
            fault = (
                record.reason.fault if state is AttemptState.FAILED or record.reason is ExitReason.PREEMPTED else None
            )
            return Observation(state, exit_code=record.code, reason=record.message or record.reason.value, fault=fault)
        heartbeat, step = heartbeat_of(ref, 1)
        if jd.supervisor_alive(ref.number):
            all_ranks = jd.ranks_started(ref.number) >= self.launch_plan(ref).expected_ranks
            return Observation(
                AttemptState.RUNNING if all_ranks else AttemptState.STARTING, heartbeat=heartbeat, step=step
            )
        if jd.read_started(ref.number):
            return Observation(
                AttemptState.LOST,
                reason="the supervisor died without writing an exit record",
                fault=Fault.INFRASTRUCTURE,
            )
        if ref.submitted_at is None or time.time() - ref.submitted_at.timestamp() < self.start_grace_seconds:
            return Observation(AttemptState.SUBMITTING)
        return Observation(
            AttemptState.LOST,
            reason=f"the supervisor never started within {self.start_grace_seconds:.0f}s",
            fault=Fault.INFRASTRUCTURE,
        )

    def cancel(self, ref: AttemptRef) -> None:
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


def _state_for(reason: ExitReason) -> AttemptState:
    return {
        ExitReason.SUCCEEDED: AttemptState.SUCCEEDED,
        ExitReason.CANCELLED: AttemptState.CANCELLED,
        ExitReason.PREEMPTED: AttemptState.CANCELLED,
    }.get(reason, AttemptState.FAILED)
