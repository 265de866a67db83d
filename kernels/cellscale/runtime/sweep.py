"""Run a sweep's tasks: `python -m cellscale.runtime.sweep task DIR ARRAY [INDEX]` runs the
points of one index of an array (Slurm's SLURM_ARRAY_TASK_ID when INDEX is absent);
`python -m cellscale.runtime.sweep pool DIR ARRAY` is the local backend's task pool for one
array: it runs the array's tasks, at most its throttle at once, each in its own process.

A task runs its points one after another in one interpreter (packing amortises start-up),
each with a fresh namespace: the inputs bundle, the point's values as variables and
`__point__`. A point that raises is recorded failed with its traceback (a user error) and the
task goes on with the next; what the point printed goes to its own log. The task writes one
outcome per point before it exits, so a task that ends without one for a point was killed
(an infrastructure fault, a time limit, a cancel): the control plane tells which.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from cellscale.runtime import stage
from cellscale.runtime.jobdir import open_log
from cellscale.runtime.records import ArrayPlan, PointOutcome, TaskEnded, TaskStarted
from cellscale.runtime.sweepdir import SweepDir
from cellscale.vocabulary import DataMode, ExitReason, Fault, PointStatus

POOL_TICK_S = 0.05
GRACE_S = 10.0


# -- one task ------------------------------------------------------------------------------------
def run_task(job: SweepDir, number: int, index: int) -> int:
    plan = job.read_array(number)
    if plan is None or not 0 <= index < len(plan.tasks):
        print(f"[cellscale] array {number} has no task {index}", file=sys.stderr)
        return 2
    host = node_name()
    job.write_task_started(number, index, TaskStarted(host=host, pid=os.getpid(), at=time.time()))
    fields = job.read_plan_fields()
    os.environ.update(fields.get("env") or {})
    os.environ.setdefault("OMP_NUM_THREADS", str(fields.get("cpus_per_task", 1)))
    from cellscale.points import decode

    points = json.loads(job.points.read_bytes())["points"]
    source = job.cell.read_text()
    code = compile(source, str(job.cell), "exec")
    log_fd = open_log(job.log)
    try:
        with _datasets(fields, lambda words: os.write(log_fd, f"[cellscale] {words}\n".encode())):
            for point in plan.tasks[index]:
                outcome = run_point(job, number, point, decode(points[point]), code, fields, host)
                job.write_outcome(point, number, outcome)
                words = (
                    f"done in {outcome.wall_s:.1f} s"
                    if outcome.status is PointStatus.done
                    else f"failed: {outcome.error}"
                )
                os.write(log_fd, f"[point {point}] {words} (on {host})\n".encode())
    except stage.DataUnavailable as exc:
        record = exc.record
        job.write_task_end(
            number, index, TaskEnded(code=record.code, reason=record.reason, at=time.time(), message=record.message)
        )
        os.write(log_fd, f"[cellscale] {record.message}\n".encode())
        return record.code
    job.write_task_end(number, index, TaskEnded(code=0, reason=ExitReason.SUCCEEDED, at=time.time()))
    return 0


@contextmanager
def _datasets(fields: dict, say) -> Iterator[None]:
    """The task's datasets in this node's cache (held while its points run), as a job's ranks
    have them; streamed ones only named."""
    from cellscale.runtime.records import LaunchPlan

    plan = LaunchPlan.model_validate(fields)
    if plan.data_mode is DataMode.stream or plan.data_cache is None or not plan.datasets:
        os.environ.update(stage.streamed_env(plan.datasets))
        yield
        return
    with stage.stage_for_ranks(plan.datasets, plan.data_cache, say) as (env, _results):
        os.environ.update(env)
        yield


def run_point(job: SweepDir, number: int, point: int, values: dict, code, fields: dict, host: str) -> PointOutcome:
    """Run the cell on one point, its output in the point's own log; never raises for the cell."""
    began = time.monotonic()
    saved = _redirect(job.point_log(point))
    print(f"[cellscale] point {point} on {host} (array {number}): {values}", flush=True)
    try:
        namespace: dict[str, object] = {"__name__": "__main__"}
        if fields.get("input_names"):
            with open(job.inputs, "rb") as handle:  # afresh for each point: one point cannot change another's
                namespace.update(pickle.load(handle))
        namespace.update(values)
        namespace["__point__"] = dict(values)
        exec(code, namespace)  # noqa: S102 - running the user's cell is this module's purpose
        outputs = fields.get("outputs") or []
        missing = [name for name in outputs if name not in namespace]
        if missing:
            raise NameError(f"--outputs names {', '.join(missing)}, which the cell never defined")
        if outputs:
            import cloudpickle

            job.write_point_result(point, number, cloudpickle.dumps({name: namespace[name] for name in outputs}))
    except BaseException as exc:  # noqa: BLE001 - a point's failure is recorded, the task goes on
        if isinstance(exc, KeyboardInterrupt):
            raise  # a cancel (SIGINT) ends the task: no outcome, so the point is not counted as its fault
        text = "".join(traceback.format_exception(exc.__class__, exc, _cell_frames(exc.__traceback__, job)))
        sys.stderr.write(text)
        return PointOutcome(
            status=PointStatus.failed,
            fault=Fault.USER_ERROR,
            host=host,
            wall_s=time.monotonic() - began,
            at=time.time(),
            error=f"{type(exc).__name__}: {exc}"[:2000],
            traceback=text[-20_000:],
        )
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _restore(saved)
    return PointOutcome(
        status=PointStatus.done,
        host=host,
        wall_s=time.monotonic() - began,
        at=time.time(),
        result=bool(fields.get("outputs")),
    )


def _cell_frames(tb, job: SweepDir):
    """The traceback from the cell's first frame on (this module's frames dropped)."""
    cell = str(job.cell)
    while tb is not None and tb.tb_frame.f_code.co_filename != cell:
        tb = tb.tb_next
    return tb


def _redirect(path) -> tuple[int, int]:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return saved


def _restore(saved: tuple[int, int]) -> None:
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    os.close(saved[0])
    os.close(saved[1])


def node_name() -> str:
    """The node as the scheduler names it (Slurm's node name: several nodes may share a host
    name, as the dev cluster's do), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


# -- the local backend's pool --------------------------------------------------------------------
class Pool:
    """Run one array's tasks on this machine, at most the array's throttle at once (re-read
    every tick: the control plane rebalances throttles across a sweep's arrays), each task on a
    free slot's GPUs, each killed at its time limit. A slot is taken with a lock its task holds
    while it lives, so the pools of a sweep's arrays never hand one GPU to two tasks."""

    def __init__(self, job: SweepDir, plan: ArrayPlan):
        self.job, self.plan = job, plan
        self.running: dict[int, tuple[subprocess.Popen[bytes], float]] = {}
        self.stopping = threading.Event()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        done = self.job.ended_tasks(self.plan.number)  # after a restart of the pool: never run a task twice
        waiting = [i for i in range(len(self.plan.tasks)) if i not in done]
        while (waiting or self.running) and not self.stopping.is_set():
            self._reap()
            throttle = self.job.read_throttle(self.plan.number, self.plan.throttle)
            while waiting and len(self.running) < throttle and self._start(waiting[0]):
                waiting.pop(0)
            time.sleep(POOL_TICK_S)
        if self.stopping.is_set():
            self._stop_all()
        return 0

    def _take_slot(self) -> tuple[int, list[int]] | None:
        """A locked free slot (fd, its GPU ids); (-1, []) when tasks have no GPUs; None: all busy."""
        if not self.plan.slot_gpus:
            return -1, []
        for k, gpus in enumerate(self.plan.slot_gpus):
            fd = os.open(self.job.arrays / f"slot{k}.lock", os.O_RDWR | os.O_CREAT, 0o640)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd, gpus
        return None

    def _start(self, index: int) -> bool:
        slot = self._take_slot()
        if slot is None:
            return False
        fd, gpus = slot
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)))
        argv = [sys.executable, "-m", "cellscale.runtime.sweep", "task", str(self.job.root), str(self.plan.number)]
        try:
            child = subprocess.Popen(
                [*argv, str(index)],
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.job.root,
                pass_fds=(fd,) if fd >= 0 else (),  # the task holds the slot's lock while it lives
            )
        finally:
            if fd >= 0:
                os.close(fd)
        self.running[index] = (child, time.monotonic())
        return True

    def _reap(self) -> None:
        for index, (child, began) in list(self.running.items()):
            code = child.poll()
            if code is None and time.monotonic() - began > self.plan.timeout_s:
                _kill_group(child, signal.SIGKILL)
                code = child.wait()
                self._ended(index, code, ExitReason.TIMEOUT, f"ran past its time limit ({self.plan.timeout_s:.0f} s)")
            elif code is not None and self.job.read_task_end(self.plan.number, index) is None:
                self._ended(index, code, ExitReason.FAILED, f"the task's process exited with status {code}")
            if code is not None:
                del self.running[index]

    def _ended(self, index: int, code: int, reason: ExitReason, message: str) -> None:
        record = TaskEnded(code=code, reason=reason, at=time.time(), message=message)
        self.job.write_task_end(self.plan.number, index, record)

    def _stop_all(self) -> None:
        """Cancelled: SIGINT to every task (its point is left without an outcome), SIGKILL after the grace."""
        for child, _ in self.running.values():
            _kill_group(child, signal.SIGINT)
        deadline = time.monotonic() + GRACE_S
        for child, _ in self.running.values():
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(child, signal.SIGKILL)


def _kill_group(child: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:
        pass


def run_pool(job: SweepDir, number: int) -> int:
    plan = job.read_array(number)
    if plan is None:
        print(f"[cellscale] no array {number} in {job.root}", file=sys.stderr)
        return 2
    lock = os.open(job.pool_lock(number), os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another pool runs this array: never twice
    job.pool_started(number).write_text(str(os.getpid()))
    return Pool(job, plan).run()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("task", "pool"):
        print("usage: python -m cellscale.runtime.sweep task DIR ARRAY [INDEX] | pool DIR ARRAY", file=sys.stderr)
        return 2
    job, number = SweepDir(argv[1]), int(argv[2])
    if argv[0] == "pool":
        return run_pool(job, number)
    index = int(argv[3]) if len(argv) > 3 else int(os.environ["SLURM_ARRAY_TASK_ID"])
    return run_task(job, number, index)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
