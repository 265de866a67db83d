"""A sweep's files in its job directory: what the control plane writes for its tasks and what
they write back, one file per event so that tasks on many nodes never share a file but the
combined log (`JobDir`'s layout otherwise).

    <job>/points.json                 the points manifest (cellscale.points), JSON
    <job>/arrays/<n>.json             ArrayPlan: the points each index of array n runs
    <job>/arrays/<n>.throttle         a local pool's current throttle (Slurm's is in slurmctld)
    <job>/arrays/<n>.lock             flock held by a local pool while it lives
    <job>/runs/<n>.<i>                TaskStarted: index i of array n started
    <job>/runs/<n>.<i>.end            TaskEnded
    <job>/outcomes/<p>.<n>.json       PointOutcome: point p's try in array n
    <job>/results/<p>.<n>.pkl         its outputs (opaque to the control plane), <p>.<n>.tag: their HMAC
    <job>/logs/<p>.log                point p's own output, every try
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from cellscale.runtime.jobdir import JobDir, _read, _write, lock_held, sign, write_atomic
from cellscale.runtime.records import ArrayPlan, PointOutcome, TaskEnded, TaskStarted


class SweepDir(JobDir):
    points = property(lambda self: self.root / "points.json")
    arrays = property(lambda self: self.root / "arrays")
    runs = property(lambda self: self.root / "runs")
    outcomes = property(lambda self: self.root / "outcomes")
    results = property(lambda self: self.root / "results")
    logs = property(lambda self: self.root / "logs")

    def make_dirs(self) -> None:
        for folder in (self.arrays, self.runs, self.outcomes, self.results, self.logs):
            folder.mkdir(parents=True, exist_ok=True)

    # -- arrays: written by the control plane -----------------------------------------------------
    def array_file(self, number: int) -> Path:
        return self.arrays / f"{number}.json"

    def write_array(self, plan: ArrayPlan) -> None:
        _write(self.array_file(plan.number), plan)
        self.write_throttle(plan.number, plan.throttle)

    def read_array(self, number: int) -> ArrayPlan | None:
        return _read(self.array_file(number), ArrayPlan)

    def throttle_file(self, number: int) -> Path:
        return self.arrays / f"{number}.throttle"

    def write_throttle(self, number: int, throttle: int) -> None:
        write_atomic(self.throttle_file(number), str(throttle).encode(), mode=0o644)

    def read_throttle(self, number: int, default: int) -> int:
        try:
            return max(0, int(self.throttle_file(number).read_text()))
        except (OSError, ValueError):
            return default

    def pool_lock(self, number: int) -> Path:
        return self.arrays / f"{number}.lock"

    def pool_started(self, number: int) -> Path:
        return self.arrays / f"{number}.started"

    def pool_alive(self, number: int) -> bool:
        """True while a local pool holds the array's lock (the kernel drops it on death)."""
        return lock_held(self.pool_lock(number))

    # -- tasks: written by each task (or its pool) ------------------------------------------------
    def write_task_started(self, number: int, index: int, record: TaskStarted) -> None:
        _write(self.runs / f"{number}.{index}", record)

    def write_task_end(self, number: int, index: int, record: TaskEnded) -> None:
        _write(self.runs / f"{number}.{index}.end", record)

    def read_task_end(self, number: int, index: int) -> TaskEnded | None:
        return _read(self.runs / f"{number}.{index}.end", TaskEnded)

    def started_tasks(self) -> Iterator[tuple[int, int, TaskStarted]]:
        """(array, index, record) of every task that started (one directory listing)."""
        for name in _names(self.runs):
            number, _, index = name.partition(".")
            if number.isdigit() and index.isdigit():
                record = _read(self.runs / name, TaskStarted)
                if record is not None:
                    yield int(number), int(index), record

    def ended_tasks(self, number: int) -> set[int]:
        prefix, suffix = f"{number}.", ".end"
        return {
            int(name[len(prefix) : -len(suffix)])
            for name in _names(self.runs)
            if name.startswith(prefix) and name.endswith(suffix) and name[len(prefix) : -len(suffix)].isdigit()
        }

    # -- points -----------------------------------------------------------------------------------
    def outcome_names(self) -> list[str]:
        return [name for name in _names(self.outcomes) if name.endswith(".json") and not name.startswith(".")]

    def read_outcome(self, name: str) -> tuple[int, int, PointOutcome] | None:
        """(point, array, outcome) of outcomes/<point>.<array>.json, None if not (yet) whole."""
        point, _, array = name.removesuffix(".json").partition(".")
        if not (point.isdigit() and array.isdigit()):
            return None
        record = _read(self.outcomes / name, PointOutcome)
        return (int(point), int(array), record) if record is not None else None

    def write_outcome(self, point: int, number: int, outcome: PointOutcome) -> None:
        _write(self.outcomes / f"{point}.{number}.json", outcome)

    def result_file(self, point: int, number: int) -> Path:
        return self.results / f"{point}.{number}.pkl"

    def write_point_result(self, point: int, number: int, data: bytes) -> None:
        try:
            key = self.result_key_file.read_bytes()
        except FileNotFoundError:
            key = None
        if key is not None:
            write_atomic(self.results / f"{point}.{number}.tag", sign(key, data).encode())
        write_atomic(self.result_file(point, number), data)

    def point_result_tag(self, point: int, number: int) -> str | None:
        try:
            return (self.results / f"{point}.{number}.tag").read_text().strip()
        except FileNotFoundError:
            return None

    def point_log(self, point: int) -> Path:
        return self.logs / f"{point}.log"


def _names(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []
