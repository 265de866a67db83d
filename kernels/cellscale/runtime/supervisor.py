"""Run one attempt of a job on one node: `python -m cellscale.runtime.supervisor DIR N`.

One supervisor runs per node (the local backend starts one; on Slurm, `srun` starts one per
node and SLURM_NODEID says which; on Kubernetes, each pod of an Indexed Job runs one and its
JOB_COMPLETION_INDEX says which). It holds its node's lock for as long as it lives (so the
control plane can tell a live attempt from a dead one even after its own restart), starts
the launcher, writes heartbeats, enforces the time limit, forwards cancellation, meters what
the node uses (usage.json) and writes the exit record that the control plane reads. JAX has
no launcher: for a jax job the supervisor starts the node's rank processes itself and stops
them all when one fails.
"""

from __future__ import annotations

import errno
import fcntl
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import IO

from cellscale.runtime import raycluster, stage, usage
from cellscale.runtime.jobdir import JobDir, open_log
from cellscale.runtime.pump import pump_lines
from cellscale.runtime.records import ExitRecord, Heartbeat, LaunchPlan, PreemptNotice, Started
from cellscale.vocabulary import DataMode, ExitReason, Launcher

HEARTBEAT_SECONDS = 2.0
GRACE_SECONDS = 10.0


def launcher_argv(plan: LaunchPlan, job: JobDir, node: int = 0, master: str = "127.0.0.1") -> list[str]:
    """The command that starts this node's ranks."""
    rank = ["-m", "cellscale.runtime.rank", str(job.root), str(plan.attempt)]
    if plan.launcher is not Launcher.torchrun:
        return [sys.executable, *rank]
    common = [f"--nproc-per-node={plan.procs_per_node}", "--max-restarts=0", "--monitor-interval=0.1"]
    if plan.nodes == 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", *common, *rank]
    # static rendezvous: node k's ranks are k*procs .. k*procs+procs-1, the conventional layout
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={plan.nodes}",
        f"--node-rank={node}",
        f"--master-addr={master}",
        f"--master-port={plan.master_port}",
        *common,
        *rank,
    ]


def jax_ranks(plan: LaunchPlan, node: int, master: str, port: int) -> list[dict[str, str]]:
    """The environment of each of this node's processes in a jax job: torchrun's variables
    (so JobEnvironment and the log's rank prefix work) and the coordinates
    `cellscale.jax.initialize()` passes to `jax.distributed.initialize`. Node k runs processes
    k*procs .. k*procs+procs-1, as torchrun lays out ranks; process 0 runs the coordinator."""
    world = plan.nodes * plan.procs_per_node
    return [
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(world),
            "JAX_COORDINATOR_ADDRESS": f"{master}:{port}",
            "JAX_NUM_PROCESSES": str(world),
            "JAX_PROCESS_ID": str(rank),
        }
        for local, rank in enumerate(range(node * plan.procs_per_node, (node + 1) * plan.procs_per_node))
    ]


def coordinator_port(plan: LaunchPlan) -> int:
    """The plan's rendezvous port (every node derives it alike); a one-node job without one
    (the local backend's) takes a free port of this machine."""
    if plan.master_port is not None:
        return plan.master_port
    if plan.nodes > 1:
        raise ValueError("a multi-node jax job needs a rendezvous port in its plan (master_port)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def first_host(env: dict[str, str]) -> str:
    """Node 0's address: the plan's, or the first host of the Slurm allocation."""
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return "127.0.0.1"
    hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return hosts.stdout.split()[0]


class Supervisor:
    def __init__(self, job: JobDir, attempt: int, node: int):
        self.job = job
        self.attempt = attempt
        self.node = node
        self.dir = job.node_dir(attempt, node)
        self.plan = job.read_plan()
        self.children: list[subprocess.Popen[bytes]] = []  # the launcher, or a jax job's processes
        self.stop_reason: ExitReason | None = None  # why the supervisor itself stopped the launcher
        self.done = threading.Event()
        self.usage: usage.UsageMeter | None = None  # None: not metering (never started, failed, or final)
        self._usage_lock = threading.Lock()

    def run(self) -> int:
        # before Started is written: once the control plane sees the attempt run, a warning is handled
        # (the notice waits for the ranks, who read it when they start)
        signal.signal(signal.SIGUSR1, self._on_preempt_warning)
        # and a cancel from the first moment it can be handled: one that arrives while the attempt
        # starts is recorded (CANCELLED) like any other, never a supervisor gone without a record
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.dir.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.job.lock_file(self.attempt, self.node), os.O_RDWR | os.O_CREAT, 0o640)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # held until this process ends
        if self.job.read_exit(self.attempt, self.node) is not None or self.job.read_started(self.attempt, self.node):
            return 0  # this attempt already ran on this node: never run it twice
        if self.job.pass_gate(self.attempt, "started") != "started":
            return 0  # the control plane moved this attempt to another site while this one was cut off
        host = socket.gethostname()
        self.job.write_started(self.attempt, self.node, Started(pid=os.getpid(), host=host, at=time.time()))
        log_fd = open_log(self.job.log)
        where = f"node {self.node} ({host})" if self.plan.nodes > 1 else host
        os.write(log_fd, f"[cellscale] attempt {self.attempt} starting on {where}\n".encode())
        self._start_usage()
        threading.Thread(target=self._heartbeat, daemon=True).start()
        try:
            with self._datasets(log_fd) as data_env:
                record = self._launch(log_fd, data_env) if self.stop_reason is None else self._record(0)
        except stage.DataUnavailable as exc:
            record = exc.record
        except Exception as exc:  # the launcher could not start
            record = launch_failure(exc)
        self.done.set()
        os.write(
            log_fd,
            f"[cellscale] attempt {self.attempt} {where} ended: {record.reason.value} (exit {record.code})\n".encode(),
        )
        self._metered(self._final_usage)
        self.job.write_exit(self.attempt, self.node, record.model_copy(update={"at": time.time()}))
        return record.code

    @contextmanager
    def _datasets(self, log_fd: int) -> Iterator[dict[str, str]]:
        """The job's datasets on this node for the ranks' lifetime: from the node's cache
        (staged while the job waited) or fetched now; streamed ones only named."""
        plan = self.plan
        if plan.data_mode is DataMode.stream or plan.data_cache is None:
            yield stage.streamed_env(plan.datasets)
            return

        def say(words: str) -> None:
            os.write(log_fd, f"[cellscale] {words}\n".encode())

        os.environ.update(plan.env)  # the source's credentials, as the ranks have them
        with stage.stage_for_ranks(plan.datasets, plan.data_cache, say) as (env, results):
            self.job.write_stage(self.attempt, self.node, [stage.record_of(self.node, *staged) for staged in results])
            yield env

    def _launch(self, log_fd: int, data_env: dict[str, str]) -> ExitRecord:
        env = self._environment() | data_env
        master = self.plan.master_addr or first_host(env)
        if self.plan.launcher is Launcher.ray and self.node > 0:
            with warning_ignored():  # node 0's supervisor writes the notice every rank reads
                code = raycluster.worker(self.plan, self.job, master, env, self.node)
            return self._record(code)
        argv = launcher_argv(self.plan, self.job, self.node, master)
        with ExitStack() as stack:
            read_end, write_end = os.pipe()  # every process's own output, on one pipe
            with os.fdopen(write_end, "wb") as output, warning_ignored():
                stack.enter_context(raycluster.head_if(self.plan, self.job, env, log_fd))
                self._start_all(argv, self._processes(env, master), output)
            prefix = "[launcher] " if self.plan.nodes == 1 else f"[node {self.node}] "
            pump = pump_lines(os.fdopen(read_end, "rb"), log_fd, prefix)
            record = self._wait()
            pump.join(timeout=5)
        return record

    def _processes(self, env: dict[str, str], master: str) -> list[dict[str, str]]:
        """The environment of each process to start: the launcher's, or each rank's of a jax job."""
        if self.plan.launcher is not Launcher.jax:
            return [env]
        return [env | rank for rank in jax_ranks(self.plan, self.node, master, coordinator_port(self.plan))]

    def _start_all(self, argv: list[str], envs: list[dict[str, str]], output: IO[bytes]) -> None:
        """Start every process or none: one that cannot start stops those started before it."""
        try:
            for env in envs:
                self.children.append(_start(argv, env, output))
        except BaseException:
            self._terminate()
            raise

    def _wait(self) -> ExitRecord:
        """Wait for the launcher or the processes; a timer enforces the time limit (a wait with
        a timeout polls, every 50 ms: the exit record would come that much later)."""
        limit = threading.Timer(self.plan.timeout_s, self._time_out)
        limit.daemon = True
        limit.start()
        code = self._gang_exit(self.children)
        limit.cancel()
        return self._record(code)

    def _gang_exit(self, children: list[subprocess.Popen[bytes]]) -> int:
        """0 when every process exits 0; else the first failure's status, once the others are
        stopped: a rank that dies fails the gang, as torchrun makes it (its peers would block
        in their next collective until JAX's heartbeat timeout)."""
        if len(children) == 1:
            return children[0].wait()
        ended: queue.SimpleQueue[int] = queue.SimpleQueue()
        for child in children:
            threading.Thread(target=lambda c=child: ended.put(c.wait()), daemon=True).start()
        failure = 0
        for _ in children:
            code = ended.get()
            if code != 0 and failure == 0:
                failure = code
                threading.Thread(target=self._terminate, daemon=True).start()
        return failure

    def _time_out(self) -> None:
        if any(child.poll() is None for child in self.children):  # not a gang that just ended on its own
            self.stop_reason = ExitReason.TIMEOUT
            self._terminate()

    def _record(self, code: int) -> ExitRecord:
        if self.stop_reason is ExitReason.TIMEOUT:
            return ExitRecord(
                code=code, reason=ExitReason.TIMEOUT, message=f"ran past its time limit ({self.plan.timeout_s:.0f} s)"
            )
        if self.stop_reason is ExitReason.CANCELLED:
            return ExitRecord(code=code, reason=ExitReason.CANCELLED)
        if code == 0:
            return ExitRecord(code=0, reason=ExitReason.SUCCEEDED)
        if self.job.preempt_requested(self.attempt):  # torchrun turns a rank's exit code into 1
            return ExitRecord(code=code, reason=ExitReason.PREEMPTED, message="stopped after the preemption warning")
        error = self.job.read_error(self.attempt)
        if error and error.peer_lost:
            return ExitRecord(code=code, reason=ExitReason.FAILED, message=f"a rank was lost ({error.summary})")
        if error:
            return ExitRecord(code=code, reason=ExitReason.USER_ERROR, message=error.summary)
        return ExitRecord(code=code, reason=ExitReason.FAILED, message=f"a rank exited with status {code}")

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.plan.env)
        env.update(
            CELLSCALE_JOB_ID=self.plan.job_id,
            CELLSCALE_ATTEMPT=str(self.attempt),
            CELLSCALE_NODE=str(self.node),
            CELLSCALE_JOB_DIR=str(self.job.root),
            PYTHONUNBUFFERED="1",
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        )
        if self.plan.launcher is Launcher.plain:  # one rank per node
            env.update(RANK=str(self.node), LOCAL_RANK="0", WORLD_SIZE=str(self.plan.nodes))
        if self.plan.gpu_ids:  # the local backend assigns ids; Slurm sets CUDA_VISIBLE_DEVICES itself
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.plan.gpu_ids))
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
        env.setdefault("OMP_NUM_THREADS", str(self.plan.cpus_per_task))  # the cores each process asked for
        return env

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stop_reason = self.stop_reason or ExitReason.CANCELLED
        threading.Thread(target=self._terminate, daemon=True).start()

    def _on_preempt_warning(self, _signum: int, _frame: object) -> None:
        """The backend will stop this attempt after a grace period: tell the ranks (they see
        it through JobEnvironment.preempt_requested()) so they can checkpoint and exit."""
        self.job.write_preempt_notice(self.attempt, PreemptNotice(at=time.time()))

    def _terminate(self) -> None:
        """SIGTERM to every running process's group; SIGKILL to those still there after the grace period."""
        running = [child for child in self.children if child.poll() is None]
        for child in running:
            _killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        for child in running:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _killpg(child.pid, signal.SIGKILL)

    def _heartbeat(self) -> None:
        """Every few seconds: alive, with rank 0's last reported step."""
        while not self.done.is_set():
            beat = Heartbeat(at=time.time(), pid=os.getpid(), step=self.job.read_step(self.attempt))
            self.job.write_heartbeat(self.attempt, self.node, beat)
            self._metered(self._write_usage)
            self.done.wait(HEARTBEAT_SECONDS)

    def _start_usage(self) -> None:
        """Meter the node from now on: GPUs as the ranks' environment has them (a job's --env may
        ask for simulated ones), every CELLSCALE_USAGE_SAMPLE_S of the supervisor's own."""
        try:
            interval = usage.sample_interval(os.environ)
            sampler = usage.gpu_sampler(self._environment(), self.plan.gpus_per_node)
            self.usage = usage.UsageMeter(self.plan.gpus_per_node, sampler)
        except Exception as exc:
            _usage_stopped(exc)
            return
        threading.Thread(target=self._sample_usage, args=(interval,), daemon=True).start()

    def _sample_usage(self, interval: float) -> None:
        while self.usage is not None and not self.done.wait(interval):
            self._metered(lambda meter: meter.sample())

    def _metered(self, action: Callable[[usage.UsageMeter], None]) -> None:
        """One step of metering, one at a time. Metering never breaks a job: its first
        failure is logged and it stops; the job goes on."""
        with self._usage_lock:
            meter = self.usage
            if meter is None:
                return
            try:
                action(meter)
            except Exception as exc:
                self.usage = None
                _usage_stopped(exc)

    def _write_usage(self, meter: usage.UsageMeter) -> None:
        self.job.write_usage(self.attempt, self.node, meter.record())

    def _final_usage(self, meter: usage.UsageMeter) -> None:
        """The last sample and record, before exit.json; none after it."""
        self.usage = None
        meter.sample()
        self._write_usage(meter)


def _start(argv: list[str], env: dict[str, str], output: IO[bytes]) -> subprocess.Popen[bytes]:
    """The launcher or a rank, in its own session (so a signal to its group reaches all it started)."""
    return subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
    )


def _usage_stopped(exc: Exception) -> None:
    print(f"[cellscale] usage metering stopped: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def launch_failure(exc: Exception) -> ExitRecord:
    """The exit record of a launcher that could not start: the job's own fault when the OS
    refused its input (E2BIG: its --env or arguments are too large for one exec), so no
    retry is spent on it; else an infrastructure fault."""
    if isinstance(exc, OSError) and exc.errno == errno.E2BIG:
        return ExitRecord(
            code=127,
            reason=ExitReason.INPUT_REFUSED,
            message="the OS refused to start the job: its environment or arguments are too large "
            "(Argument list too long); set fewer or smaller --env variables",
        )
    return ExitRecord(code=127, reason=ExitReason.LAUNCH_FAILED, message=f"{type(exc).__name__}: {exc}")


@contextmanager
def warning_ignored():
    """Processes started inside ignore the preemption warning (SIGUSR1): an ignored signal
    stays ignored across exec, and Slurm delivers `scancel --signal` to every process of the
    step, where its default action would kill torchrun and the ranks. The supervisor alone
    handles it and tells the ranks through the notice file."""
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m cellscale.runtime.supervisor JOB_DIR ATTEMPT", file=sys.stderr)
        return 2
    return Supervisor(JobDir(argv[0]), int(argv[1]), node_index(os.environ)).run()


def node_index(env: dict[str, str] | os._Environ) -> int:
    """Which node of the gang this is: Slurm's SLURM_NODEID, a Kubernetes Indexed Job's
    JOB_COMPLETION_INDEX (one pod per node), else 0 (the local backend's one node)."""
    return int(env.get("SLURM_NODEID") or env.get("JOB_COMPLETION_INDEX") or "0")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
