"""Copy a job's datasets into this node's cache: `python -m cellscale.runtime.stage JOB_DIR`.

The control plane starts one per node a waiting job is expected to start on (on Slurm, a
small job in the staging partition pinned to those nodes; locally, a process), so that when
the job starts its datasets are already there and each node's supervisor finds them in the
cache (`stage_for_ranks`) with no request to the source. The same functions stage at start
for a job whose nodes were not known ahead (or whose staging had not finished).

Progress goes to `<job>/staging/<node>.json` as bytes land: the control plane turns it into
"staging bars: 3.1 of 8.0 GB" in the job's why-pending.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from cellscale.runtime.datacache import DataSource, NodeCache, SourceChanged, StageResult
from cellscale.runtime.jobdir import JobDir
from cellscale.runtime.records import DataCacheSettings, DatasetProgress, ExitRecord, StageProgress, StageRecord
from cellscale.spec import DatasetRef
from cellscale.vocabulary import ExitReason

PROGRESS_EVERY_S = 0.5
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def node_name() -> str:
    """This node's name as the scheduler knows it (Slurm's, which emulated nodes sharing one
    host tell apart), else the host's."""
    return _UNSAFE.sub("_", os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0])


def node_cache(settings: DataCacheSettings, node: str | None = None) -> NodeCache:
    root = Path(settings.root.replace("{node}", node or node_name()))
    return NodeCache(root, max_bytes=settings.max_bytes, min_free_ratio=settings.min_free_ratio)


def source_of(ref: DatasetRef) -> DataSource:
    if ref.url is None:
        raise ValueError(f"dataset {ref.name!r} has no URL: register one in the tenancy or use --data NAME=URL")
    return DataSource(name=ref.name, url=ref.url, version=ref.version, storage_options=dict(ref.storage_options))


def env_name(name: str) -> str:
    """`CELLSCALE_DATA_<NAME>`: the variable a rank finds a dataset's local path in."""
    return "CELLSCALE_DATA_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


class ProgressFile:
    """One node's StageProgress, rewritten at most every PROGRESS_EVERY_S and at each change
    of state (started, listed, finished, failed)."""

    def __init__(self, job: JobDir, node: str, names: list[str]):
        self.job, self.lock = job, threading.Lock()
        now = time.time()
        self.record = StageProgress(
            node=node, pid=os.getpid(), started=now, at=now, datasets=[DatasetProgress(name=n) for n in names]
        )
        self._written = 0.0
        self.write()

    def callback(self, index: int) -> Callable[[int, int], None]:
        def progress(done: int, total: int) -> None:
            entry = self.record.datasets[index]
            entry.done_bytes, entry.total_bytes = done, total
            if time.monotonic() - self._written >= PROGRESS_EVERY_S:
                self.write()

        return progress

    def finish(self, index: int, result: StageResult | None = None, error: str | None = None) -> None:
        entry = self.record.datasets[index]
        if result is not None:
            entry.done_bytes = entry.total_bytes = result.bytes
            entry.hit, entry.finished = result.hit, True
        entry.error = error
        self.write()

    def write(self) -> None:
        with self.lock:
            self.record.at = time.time()
            self._written = time.monotonic()
            self.job.write_stage_progress(self.record)


def stage_ahead(job: JobDir) -> int:
    """Stage the job's planned datasets on this node; 0 when every one is in the cache."""
    plan = job.read_stage_plan()
    if plan is None:
        print(f"no staging plan in {job.staging}", file=sys.stderr)
        return 2
    os.environ.update(plan.env)  # what the job's ranks would have: the source's credentials
    cache = node_cache(plan.cache)
    progress = ProgressFile(job, node_name(), [d.name for d in plan.datasets])
    failed = 0
    for index, ref in enumerate(plan.datasets):
        try:
            result = cache.stage(source_of(ref), progress.callback(index))
        except Exception as exc:  # the job stages it again at start, and says why there
            progress.finish(index, error=f"{type(exc).__name__}: {exc}")
            failed += 1
        else:
            progress.finish(index, result)
    return 1 if failed else 0


@contextmanager
def stage_for_ranks(
    datasets: list[DatasetRef], settings: DataCacheSettings, log: Callable[[str], None]
) -> Iterator[tuple[dict[str, str], list[tuple[DatasetRef, StageResult]]]]:
    """Each dataset in this node's cache and held in use until the block ends (the ranks'
    lifetime): yields the ranks' environment (`CELLSCALE_DATA_<NAME>` → the local copy) and
    what staging did. A dataset staged ahead is a hit: no request reaches its source."""
    env: dict[str, str] = {}
    results = []
    with ExitStack() as held:
        for ref in datasets:
            if ref.url is None:
                continue  # a placement hint only: nothing to stage
            try:
                result = held.enter_context(node_cache(settings).use(source_of(ref)))
            except Exception as exc:
                raise DataUnavailable(failure_record(ref, exc)) from exc
            results.append((ref, result))
            env.update(data_env(ref, str(result.path)))
            log(_staged_words(ref, result))
        yield env, results


def record_of(node: int, ref: DatasetRef, result: StageResult) -> StageRecord:
    """What the node's supervisor did for one dataset, for the job's I/O profile."""
    return StageRecord(
        node=node,
        name=ref.name,
        url=ref.url or "",
        hit=result.hit,
        bytes=result.bytes,
        fetched_bytes=result.fetched_bytes,
        seconds=round(result.seconds, 3),
    )


def streamed_env(datasets: list[DatasetRef]) -> dict[str, str]:
    """The ranks' environment when they read each dataset from its source (--data-mode stream)."""
    return {key: value for ref in datasets if ref.url for key, value in data_env(ref, ref.url).items()}


class DataUnavailable(Exception):
    """A dataset could not be put on this node: the ranks never start."""

    def __init__(self, record: ExitRecord):
        super().__init__(record.message)
        self.record = record


USER_ERRORS = (FileNotFoundError, PermissionError, SourceChanged, ValueError)
"""What the job's own --data got wrong (a wrong URL or version, no access): not retried."""


def failure_record(ref: DatasetRef, exc: Exception) -> ExitRecord:
    """The node's exit record when a dataset could not be staged: the job's fault for a
    source that is not there, changed under its version or refused it; else the
    infrastructure's (a full cache, a checksum mismatch, a network error), retried."""
    words = f"dataset {ref.name} ({ref.words()}) could not be staged: {type(exc).__name__}: {exc}"
    if isinstance(exc, USER_ERRORS):
        return ExitRecord(code=2, reason=ExitReason.USER_ERROR, message=words)
    return ExitRecord(code=1, reason=ExitReason.LAUNCH_FAILED, message=words)


def data_env(ref: DatasetRef, location: str) -> dict[str, str]:
    """What a rank reads a dataset by: its location (a local copy, or the source's URL when
    streamed), its source and the source's fsspec options."""
    key = env_name(ref.name)
    env = {key: location, f"{key}_SOURCE": ref.url or ""}
    if ref.storage_options:
        env[f"{key}_STORAGE_OPTIONS"] = json.dumps(ref.storage_options)
    return env


def _staged_words(ref: DatasetRef, result: StageResult) -> str:
    size = f"{result.bytes / 1e9:.2f} GB in {result.files} file(s)"
    if result.hit:
        return f"dataset {ref.name}: {size} from this node's cache (staged before the job started)"
    rate = result.fetched_bytes / 1e6 / result.seconds if result.seconds > 0 else 0.0
    return (
        f"dataset {ref.name}: {size} fetched from {ref.url} in {result.seconds:.1f} s ({rate:.0f} MB/s): "
        "it was not staged ahead on this node"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m cellscale.runtime.stage JOB_DIR", file=sys.stderr)
        return 2
    return stage_ahead(JobDir(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
