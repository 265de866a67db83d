"""Sweeps: one job, many points (`%%cluster map`). The job is admitted once, for its slots
(`JobSpec.sweep.slots` tasks of `resources` at once); this module runs its points inside
that grant (their rows, from submit on, are store/points.py's):

- `SweepRunner.launch` plans the points to run as arrays (Slurm job arrays chunked by the
  cluster's live MaxArraySize; local task pools), throttled so that at most `slots` tasks
  run at once across all of them (`throttles`), and submits those the slots reach: the
  others wait unsubmitted until slots pass to them;
- `SweepRunner.observe` reads what tasks wrote (one outcome file per point), retries a
  point by its fault class within the job's budgets (a user error is not retried by
  default; a node failure is, on other nodes), rebalances the throttles as arrays drain, and
  ends the attempt when every point is settled.

The pure parts (`pack`, `chunk`, `throttles`, and store/points.py's `counts`) are table-tested;
the rest talks to the store, the job directory and the driver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from cellscale.spec import JobSpec
from cellscale.vocabulary import AttemptState, Fault, PointStatus, TaskLiveness
from cellscale_hub.drivers.base import Driver
from cellscale_hub.drivers.capabilities import ArrayPlan, ArrayRef, AssignsGpuIds
from cellscale_hub.drivers.types import AttemptRef, Observation
from cellscale_hub.faults import decide
from cellscale_hub.store import Store
from cellscale_hub.store.models import Job, SweepArray, SweepPoint, utcnow
from cellscale_hub.store.points import CACHE_CHUNK, CACHEABLE, SETTLED, counts, stamp_now

log = logging.getLogger("cellscale.sweeps")


# -- pure rules -----------------------------------------------------------------------------------
def pack(points: Sequence[int], per_task: int) -> list[list[int]]:
    """Points to tasks, `per_task` in each, in order."""
    return [list(points[i : i + per_task]) for i in range(0, len(points), per_task)]


def chunk(tasks: Sequence[list[int]], max_array_size: int) -> list[tuple[int, list[list[int]]]]:
    """Tasks to arrays of at most `max_array_size` indexes, each with its offset (the sweep's
    task number of its index 0): MaxArraySize caps the INDEX, so a second array starts at 0
    again rather than at 1001."""
    size = max(1, max_array_size)
    return [(start, list(tasks[start : start + size])) for start in range(0, len(tasks), size)]


def throttles(slots: int, arrays: Sequence[tuple[int, int]]) -> list[int]:
    """Each array's throttle, oldest first, for (tasks pending or running, tasks running) per
    array: never below what runs now (Slurm does not stop a running task when its throttle
    drops), the rest of `slots` to the oldest arrays first (they drain and end, and the next
    array takes over). The sum never exceeds `slots`, so neither do the tasks in flight. 0: an
    array not submitted yet waits (Slurm's %0 would mean no limit)."""
    budget = slots - sum(min(running, live) for live, running in arrays)
    out = []
    for live, running in arrays:
        running = min(running, live)
        extra = max(0, min(live - running, budget))
        budget -= extra
        out.append(running + extra)
    return out


# -- while it runs ----------------------------------------------------------------------------------
@dataclass
class _Seen:
    """What the runner already read from one sweep's job directory (re-read after a restart:
    applying an outcome or a start again changes nothing)."""

    outcomes: set[str] = field(default_factory=set)
    starts: set[tuple[int, int]] = field(default_factory=set)
    first_start: float | None = None


class SweepRunner:
    def __init__(self, store: Store):
        self.store = store
        self._seen: dict[tuple[str, int], _Seen] = {}

    # -- launch ---------------------------------------------------------------------------------
    def launch(self, driver: Driver, ref: AttemptRef) -> str:
        """Plan the attempt's arrays (every point not settled yet, packed into tasks, chunked by
        the backend's array size) and submit those the sweep's slots reach now; the others are
        submitted as slots pass to them (never a pending record the slots cannot run soon: a
        pending array's tasks count against slurmctld's MaxJobCount). Idempotent: arrays stored
        before a restart are found again (the driver's submit_array adopts them)."""
        sweep = ref.spec.sweep
        with self.store.session() as session:
            arrays = self._arrays(session, ref)
            if not arrays:
                todo = list(
                    session.scalars(
                        select(SweepPoint.index)
                        .where(SweepPoint.job_id == ref.job_id, SweepPoint.status.not_in(SETTLED))
                        .order_by(SweepPoint.index)
                    )
                )
                tasks = pack(todo, sweep.per_task)
                chunks = chunk(tasks, driver.max_array_size())
                limits = throttles(ref.spec.slots, [(len(t), 0) for _, t in chunks])
                first = self._next_number(session, ref.job_id)
                for k, ((offset, part), limit) in enumerate(zip(chunks, limits, strict=True)):
                    arrays.append(self._new_array(session, ref, first + k, offset, part, limit, []))
                self._assign(session, ref.job_id, arrays)
        try:
            for row in arrays:
                if row.throttle > 0:  # the others (0) wait, unsubmitted, until a slot is theirs
                    self._submit(driver, ref, row)
        except Exception:
            self.cancel(driver, ref)  # none of this attempt may run beside the next one
            raise
        return _summary(arrays)

    def _new_array(
        self, session: Session, ref: AttemptRef, number: int, offset: int, tasks, throttle: int, exclude: list[str]
    ) -> SweepArray:
        row = SweepArray(
            job_id=ref.job_id,
            attempt=ref.number,
            number=number,
            offset=offset,
            tasks=tasks,
            excluded_nodes=sorted(exclude),
            throttle=throttle,
            ended=False,
        )
        session.add(row)
        session.flush()
        return row

    @staticmethod
    def _assign(session: Session, job_id: str, arrays: list[SweepArray]) -> None:
        """Each point's current try belongs to the array that will run it."""
        for row in arrays:
            points = [p for task in row.tasks for p in task]
            for start in range(0, len(points), CACHE_CHUNK):
                session.execute(
                    update(SweepPoint)
                    .where(SweepPoint.job_id == job_id, SweepPoint.index.in_(points[start : start + CACHE_CHUNK]))
                    .values(array=row.number, status=PointStatus.queued, stamp=stamp_now())
                )

    @staticmethod
    def _next_number(session: Session, job_id: str) -> int:
        numbers = session.scalars(select(SweepArray.number).where(SweepArray.job_id == job_id))
        return max(numbers, default=0) + 1

    @staticmethod
    def _arrays(session: Session, ref: AttemptRef) -> list[SweepArray]:
        query = select(SweepArray).where(SweepArray.job_id == ref.job_id, SweepArray.attempt == ref.number)
        return list(session.scalars(query.order_by(SweepArray.number)))

    def _submit(self, driver: Driver, ref: AttemptRef, row: SweepArray) -> None:
        if row.backend_ref:
            return
        array = ArrayRef(ref, self._plan(driver, ref, row))
        driver.write_array(array)
        backend_ref = driver.submit_array(array)
        with self.store.session() as session:
            stored = session.get(SweepArray, row.id)
            stored.backend_ref, stored.submitted_at = backend_ref, utcnow()
        row.backend_ref, row.submitted_at = backend_ref, utcnow()

    @staticmethod
    def _plan(driver: Driver, ref: AttemptRef, row: SweepArray) -> ArrayPlan:
        res = ref.spec.resources
        per_slot = res.gpus_per_node
        slots = []
        if isinstance(driver, AssignsGpuIds) and per_slot:
            ids = list(ref.gpu_ids)
            slots = [ids[i : i + per_slot] for i in range(0, len(ids) - per_slot + 1, per_slot)]
        longest = max((len(task) for task in row.tasks), default=1)
        return ArrayPlan(
            number=row.number,
            attempt=row.attempt,
            offset=row.offset,
            tasks=row.tasks,
            throttle=row.throttle,
            timeout_s=res.timeout_min * 60.0 * longest,
            excluded_nodes=row.excluded_nodes,
            slot_gpus=slots,
        )

    def array_refs(self, driver: Driver, ref: AttemptRef, rows: list[SweepArray]) -> list[ArrayRef]:
        return [ArrayRef(ref, self._plan(driver, ref, row), row.backend_ref, row.submitted_at) for row in rows]

    # -- observe ------------------------------------------------------------------------------------
    def observe(self, driver: Driver, refs: list[AttemptRef], stopping: set[str]) -> dict[tuple[str, int], Observation]:
        """One cycle for the backend's running sweeps: ONE liveness query for all their arrays,
        then each sweep's new starts and outcomes, lost tasks, retries, throttles and end.
        `stopping`: jobs being cancelled or preempted (a task that dies now spends no budget)."""
        with self.store.session() as session:
            rows = {ref.key: self._arrays(session, ref) for ref in refs}
        handles = {ref.key: self.array_refs(driver, ref, rows[ref.key]) for ref in refs}
        live = driver.live_tasks([a for arrays in handles.values() for a in arrays if a.backend_ref])
        out = {}
        for ref in refs:
            try:
                out[ref.key] = self._observe_one(driver, ref, handles[ref.key], live, ref.job_id in stopping)
            except Exception:
                log.exception("sweep %s: this cycle's observation failed; it is kept as it was", ref.job_id)
                out[ref.key] = Observation(AttemptState.UNKNOWN, reason="the sweep's state could not be read")
        for gone in self._seen.keys() - {ref.key for ref in refs}:
            del self._seen[gone]
        return out

    def _observe_one(
        self,
        driver: Driver,
        ref: AttemptRef,
        arrays: list[ArrayRef],
        live: dict[tuple[str, int], dict[int, TaskLiveness]],
        stopping: bool,
    ) -> Observation:
        seen = self._seen.setdefault(ref.key, _Seen())
        files = driver.files.sweep_dir(ref.job_dir)
        by_number = {a.plan.number: a for a in arrays}
        # what ended is asked of the backend BEFORE the files are read: a task that ends in
        # between has written its outcomes by then, and is not taken as lost
        ended = [
            (a.plan.number, i)
            for a in arrays
            if a.backend_ref
            for i in range(len(a.plan.tasks))
            if i not in live.get(a.key, {})
        ]
        starts = [(n, i, r) for n, i, r in files.started_tasks() if n in by_number and (n, i) not in seen.starts]
        outcomes = [name for name in files.outcome_names() if name not in seen.outcomes]
        exclude: set[str] = set()
        with self.store.session() as session:
            job = session.get(Job, ref.job_id)
            points = {p.index: p for p in session.scalars(select(SweepPoint).where(SweepPoint.job_id == ref.job_id))}
            stamp = stamp_now()
            self._note_starts(seen, points, by_number, starts, stamp)
            retry = self._note_outcomes(ref, seen, files, points, outcomes, stamp)
            if not stopping:  # else the attempt's end settles what its tasks left
                retry += self._note_lost(driver, ref, points, by_number, ended, stamp, exclude)
            stored = {r.number: r for r in self._arrays(session, ref)}
            active = []
            for array in arrays:
                if array.backend_ref and not live.get(array.key):
                    stored[array.plan.number].ended = True
                elif array.backend_ref:
                    active.append(array)
            if retry and not stopping:
                avoid = sorted(exclude | set(ref.excluded_nodes))
                tasks = pack(sorted(retry), ref.spec.sweep.per_task)
                row = self._new_array(session, ref, self._next_number(session, ref.job_id), 0, tasks, 0, avoid)
                self._assign(session, ref.job_id, [row])
                stored[row.number] = row
            waiting = [] if stopping else [r for r in stored.values() if not r.backend_ref]
            changes, starting = self._rebalance(ref, active, live, stored, waiting)
            statuses = [p.status for p in points.values()]
            job.sweep = counts(statuses, sum(1 for p in points.values() if p.tries > 1)) | {
                "arrays": sum(1 for r in stored.values() if r.backend_ref) + len(starting),
                "eta_s": _eta(points.values(), seen.first_start),
            }
            settled = all(s in SETTLED for s in statuses)
            observation = self._attempt_state(points, settled, bool(active or waiting), stopping, seen)
        for row in starting:  # their slots came: submitted with them (again, if a try failed)
            self._submit(driver, ref, row)
        self._apply_throttles(driver, changes)
        return observation

    @staticmethod
    def _note_starts(seen: _Seen, points: dict[int, SweepPoint], by_number, starts, stamp: int) -> None:
        """The points of each task that started: running on its host, one try more."""
        for number, index, record in starts:
            seen.starts.add((number, index))
            seen.first_start = min(seen.first_start or record.at, record.at)
            for row in _current(points, by_number[number].plan.tasks[index], number):
                if row.status is PointStatus.queued:
                    row.status, row.node, row.tries, row.stamp = (
                        PointStatus.running,
                        record.host,
                        row.tries + 1,
                        stamp,
                    )

    def _note_outcomes(self, ref: AttemptRef, seen: _Seen, files, points, outcomes: list[str], stamp: int) -> list[int]:
        """The outcomes the tasks wrote since the last cycle; the points to try again."""
        retry = []
        for name in outcomes:
            read = files.read_outcome(name)
            if read is None:
                continue  # being written: next cycle
            seen.outcomes.add(name)
            index, number, outcome = read
            for row in _current(points, [index], number):
                if self._apply(ref, row, number, outcome, stamp):
                    retry.append(index)
        return retry

    def _note_lost(self, driver: Driver, ref: AttemptRef, points, by_number, ended, stamp: int, exclude: set[str]):
        """The points of tasks that ended without their outcomes, by the backend's account of
        each task's end; the points to try again (`exclude` gains the nodes that failed them)."""
        retry = []
        for number, index in ended:
            orphans = _current(points, by_number[number].plan.tasks[index], number)
            if not orphans:
                continue  # nothing lost
            end = driver.task_end(by_number[number], index)
            if end is None:
                continue  # the backend has not settled it yet: next cycle
            for row in orphans:
                row.stamp = stamp
                if end.fault is None:
                    row.status, row.error = PointStatus.cancelled, end.words
                    continue
                row.error, row.node = f"{end.fault.words}: {end.words}", end.node or row.node
                if end.node and end.fault is Fault.INFRASTRUCTURE:
                    exclude.add(end.node)
                if self._retry(ref.spec, row, end.fault):
                    retry.append(row.index)
        return retry

    def _apply(self, ref: AttemptRef, row: SweepPoint, number: int, outcome, stamp: int) -> bool:
        """One point's outcome; True when it is to be tried again."""
        row.node, row.wall_s, row.stamp = outcome.host, outcome.wall_s, stamp
        if outcome.status == PointStatus.done:
            row.status, row.error, row.traceback = PointStatus.done, None, None
            if outcome.result:
                row.result_job, row.result_array, row.result_point = ref.job_id, number, row.index
            return False
        row.error, row.traceback = outcome.error, outcome.traceback
        return self._retry(ref.spec, row, Fault(outcome.fault or Fault.USER_ERROR.value))

    def _retry(self, spec: JobSpec, row: SweepPoint, fault: Fault) -> bool:
        """The point's try ended with `fault`: retry it (True) within the job's budget for that
        class, or settle it failed."""
        verdict = decide(spec.retries, fault, [Fault(f) for f in row.faults])
        row.faults = [*row.faults, fault.value]
        if verdict.retry:
            row.status, row.array = PointStatus.queued, None
            row.error = f"{row.error} ({verdict.words(fault)})" if row.error else verdict.words(fault)
            return True
        row.status = PointStatus.failed
        if fault is not Fault.USER_ERROR:
            row.error = f"{row.error} ({verdict.words(fault)})"
        return False

    def _rebalance(self, ref, active: list[ArrayRef], live, stored: dict[int, SweepArray], waiting: list[SweepArray]):
        """The slots over the attempt's arrays, oldest first (`throttles`): (changes to live
        arrays' throttles, waiting arrays whose slots came and are to be submitted with them)."""
        order = sorted([*active, *waiting], key=lambda a: a.plan.number if isinstance(a, ArrayRef) else a.number)
        shape = [
            (len(live[a.key]), sum(1 for s in live[a.key].values() if s is TaskLiveness.running))
            if isinstance(a, ArrayRef)
            else (sum(1 for task in a.tasks), 0)
            for a in order
        ]
        changes, starting = [], []
        for item, limit in zip(order, throttles(ref.spec.slots, shape), strict=True):
            if isinstance(item, SweepArray):
                if limit > 0:
                    item.throttle = limit
                    starting.append(item)
                continue
            row = stored[item.plan.number]
            if limit > 0 and limit != row.throttle:  # 0: it runs what it runs until it drains
                changes.append((item, row.id, limit))
        return changes, starting

    def _apply_throttles(self, driver: Driver, changes) -> None:
        """Tell the backend each live array's new throttle, storing each once the backend took
        it: one that fails is tried again next cycle."""
        for array, row_id, limit in changes:
            try:
                driver.throttle_array(array, limit)
            except Exception:
                log.exception("sweep %s: array %d's throttle stays for now", array.ref.job_id, array.plan.number)
                continue
            with self.store.session() as session:
                session.get(SweepArray, row_id).throttle = limit

    @staticmethod
    def _attempt_state(points, settled: bool, active: bool, stopping: bool, seen: _Seen) -> Observation:
        """Running while any array is live or a point is unsettled (a lost task the backend has
        not accounted yet); then cancelled (stopped), failed (a point failed) or succeeded."""
        if active or not (settled or stopping):
            state = AttemptState.RUNNING if seen.first_start else AttemptState.STARTING
            held = (seen.first_start, None) if seen.first_start else None
            return Observation(state, held=held, reason=None if seen.first_start else "its tasks are queued")
        end = (seen.first_start, time.time()) if seen.first_start else None
        if not settled:
            return Observation(AttemptState.CANCELLED, reason="its tasks were stopped", held=end)
        failed = [p for p in points.values() if p.status is PointStatus.failed]
        done = sum(1 for p in points.values() if p.status in CACHEABLE)
        result = any(p.result_job for p in points.values())
        if failed:
            first = min(failed, key=lambda p: p.index)
            return Observation(
                AttemptState.FAILED,
                reason=f"{len(failed)} of {len(points)} points failed (point {first.index}: {first.error}); "
                f"{done} done",
                held=end,
                result=result,
            )
        return Observation(AttemptState.SUCCEEDED, reason=f"all {len(points)} points done", held=end, result=result)

    def cancel(self, driver: Driver, ref: AttemptRef) -> None:
        with self.store.session() as session:
            rows = [r for r in self._arrays(session, ref) if r.backend_ref and not r.ended]
        for array in self.array_refs(driver, ref, rows):
            driver.cancel_array(array)


def _current(points: dict[int, SweepPoint], indexes: Iterable[int], number: int) -> list[SweepPoint]:
    """The points among `indexes` whose current try is array `number`'s and not settled."""
    rows = (points.get(i) for i in indexes)
    return [row for row in rows if row is not None and row.array == number and row.status not in SETTLED]


def _eta(points, first_start: float | None) -> float | None:
    """Seconds until every point is done, at the pace so far (done points per second since the
    first task started); None before the first point is done."""
    finished = sum(1 for p in points if p.status in (PointStatus.done, PointStatus.failed) and p.tries)
    left = sum(1 for p in points if p.status not in SETTLED)
    if not finished or first_start is None:
        return None
    rate = finished / max(1e-3, time.time() - first_start)
    return round(left / rate, 1)


def _summary(arrays: list[SweepArray]) -> str:
    refs = [a.backend_ref for a in arrays if a.backend_ref]
    text = ",".join(refs) if refs else "nothing to run"
    return text if len(text) <= 255 else f"{refs[0]} and {len(refs) - 1} more arrays"
