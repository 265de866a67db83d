"""A process's I/O meter: the bytes each dataset read returned and the time the process was
blocked reading, per source ("cache" for a node's staged copies; the dataset's scheme and
bucket, e.g. "s3://md", for reads from the source itself). `cellscale.datasets` reads through
it; each rank writes what it measured over the cell's run to the job directory (`profiled`),
with the process's own /proc/self/io counters beside it as a check.

Light imports only: a cell imports this before its first read, and the rank imports pydantic
only after the cell, to write the record.
"""

from __future__ import annotations

import io
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cellscale.runtime.jobdir import JobDir

CACHE = "cache"
"""The source of reads served from a node's staged copy of a dataset."""
DATASETS_API = "cellscale.datasets"


class Source:
    """One source's counters. Its read seconds are wall time with at least one of its reads in
    flight: parallel reads (pyarrow reads a dataset's files from several threads) count once."""

    __slots__ = ("bytes", "reads", "read_s", "in_flight", "since")

    def __init__(self) -> None:
        self.bytes = 0
        self.reads = 0
        self.read_s = 0.0
        self.in_flight = 0
        self.since = 0.0


@dataclass(frozen=True)
class Totals:
    """What the meter counted so far: seconds blocked in reads (any source), and per source
    (bytes, reads, read seconds)."""

    blocked_s: float
    sources: dict[str, tuple[int, int, float]]

    def since(self, earlier: Totals) -> Totals:
        zero = (0, 0, 0.0)
        sources = {
            label: tuple(now - then for now, then in zip(counts, earlier.sources.get(label, zero), strict=True))
            for label, counts in self.sources.items()
        }
        return Totals(self.blocked_s - earlier.blocked_s, {k: v for k, v in sources.items() if v[1]})


class IoMeter:
    """Counts the reads of one process, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[str, Source] = {}
        self._in_flight = 0
        self._since = 0.0
        self._blocked_s = 0.0
        self.io_at_first_read: dict[str, int] | None = None  # /proc/self/io when the data path began

    def source(self, label: str) -> Source:
        with self._lock:
            return self._sources.setdefault(label, Source())

    def read(self, source: Source, call: Callable[[Any], Any], arg: Any) -> Any:
        """`call(arg)` (a read or readinto), timed and its bytes counted under `source`."""
        self._begin(source)
        result = None
        try:
            result = call(arg)
        finally:
            self._end(source, result if isinstance(result, int) else len(result or b""))
        return result

    def after_fork(self) -> None:
        """In a forked child (a DataLoader's worker): a new lock, since another thread may have
        held this one at the fork, and no reads in flight (their threads are not in the child)."""
        self._lock = threading.Lock()
        self._in_flight = 0
        for source in self._sources.values():
            source.in_flight = 0

    def totals(self) -> Totals:
        with self._lock:
            sources = {label: (s.bytes, s.reads, s.read_s) for label, s in self._sources.items()}
            return Totals(self._blocked_s, sources)

    def _begin(self, source: Source) -> None:
        if self.io_at_first_read is None:  # the baseline /proc checks the meter against: no imports in it
            self.io_at_first_read = proc_io()
        now = time.perf_counter()
        with self._lock:
            if source.in_flight == 0:
                source.since = now
            source.in_flight += 1
            if self._in_flight == 0:
                self._since = now
            self._in_flight += 1

    def _end(self, source: Source, nbytes: int) -> None:
        now = time.perf_counter()
        with self._lock:
            source.bytes += nbytes
            source.reads += 1
            source.in_flight -= 1
            if source.in_flight == 0:
                source.read_s += now - source.since
            self._in_flight -= 1
            if self._in_flight == 0:
                self._blocked_s += now - self._since


METER = IoMeter()
"""This process's meter."""
os.register_at_fork(after_in_child=lambda: METER.after_fork())


class MeteredFile(io.RawIOBase):
    """A raw binary file (under io.BufferedReader, or pyarrow's PythonFile) whose reads are
    timed and counted into the process's meter under one source."""

    def __init__(self, raw: Any, label: str):
        super().__init__()
        self._raw = raw
        self._meter = METER
        self._source = METER.source(label)

    def read(self, size: int = -1) -> bytes:
        return self._meter.read(self._source, self._raw.read, size)

    def readinto(self, buffer: Any) -> int:
        return self._meter.read(self._source, self._raw.readinto, buffer) or 0

    def readall(self) -> bytes:
        return self.read(-1)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._raw.seekable()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def proc_io() -> dict[str, int] | None:
    """This process's /proc/self/io counters (rchar: bytes its read calls returned, page cache
    included; read_bytes: bytes it caused to be fetched from storage); None where there is none."""
    try:
        with open("/proc/self/io", "rb") as handle:
            lines = handle.read().decode().splitlines()
    except OSError:
        return None
    fields = dict(line.split(": ", 1) for line in lines if ": " in line)
    return {key: int(fields[key]) for key in ("rchar", "read_bytes") if key in fields}


@contextmanager
def profiled(job: JobDir, attempt: int) -> Iterator[None]:
    """Around the cell's run: when it ends, however it ends, write this rank's I/O profile if
    the cell used its datasets (imported cellscale.datasets): a cell that did not pays nothing
    (writing a record imports pydantic, ~0.1 s). A profile that cannot be written is reported
    on the rank's output, never a failure."""
    before, io_before, started = METER.totals(), proc_io(), time.monotonic()
    try:
        yield
    finally:
        wall_s, io_after = time.monotonic() - started, proc_io()
        if DATASETS_API in sys.modules:
            baseline = METER.io_at_first_read or io_before
            _write_or_say(job, attempt, wall_s, METER.totals().since(before), _delta(baseline, io_after))


def _write_or_say(job: JobDir, attempt: int, wall_s: float, used: Totals, proc: dict[str, int]) -> None:
    try:
        _write_profile(job, attempt, wall_s, used, proc)
    except Exception as exc:  # noqa: BLE001 - the profile never fails the job
        print(f"[cellscale] I/O profile not written: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int]:
    if before is None or after is None:
        return {}
    return {key: after[key] - before[key] for key in after.keys() & before.keys()}


def _write_profile(job: JobDir, attempt: int, wall_s: float, used: Totals, proc: dict[str, int]) -> None:
    from cellscale.runtime.records import RankIoProfile, SourceReads  # pydantic: after the cell

    env = os.environ
    profile = RankIoProfile(
        rank=int(env.get("RANK", "0")),
        node=int(env.get("CELLSCALE_NODE", "0")),
        host=socket.gethostname(),
        wall_s=wall_s,
        blocked_s=used.blocked_s,
        sources={label: SourceReads(bytes=b, reads=n, read_s=s) for label, (b, n, s) in used.sources.items()},
        proc_rchar=proc.get("rchar"),
        proc_read_bytes=proc.get("read_bytes"),
        at=time.time(),
    )
    job.write_io(attempt, profile)
