"""Checkpoints written from inside a job: atomic, verified, kept K deep, reported.

    from cellscale.checkpoint import Checkpointer

    ckpt = Checkpointer("s3://bucket/run1", keep=3)          # or a path, memory://, ...
    state = {"model": model, "optim": optimizer}             # DCP state: modules, optimizers, tensors
    resume = ckpt.load(state)                                # in place; resume.step is None on a fresh start
    for step in range(0 if resume.step is None else resume.step + 1, steps):
        ...
        if step % 100 == 0:
            ckpt.save(step, state, extra={"rng": rng.bit_generator.state})  # returns while it writes
    ckpt.wait()

Layout under the root URL (any fsspec URL every rank can reach):

    <root>/.tmp-step-<N>-<id>/          a save in progress: every rank writes here
    <root>/step-<N>/dcp/                torch.distributed.checkpoint files (a shard file per rank)
    <root>/step-<N>/extra-<rank>.pkl    each rank's `extra`, pickled
    <root>/step-<N>/MANIFEST.json       written last: the commit point

When every rank has written, rank 0 moves the temporary folder to step-<N> (a rename on a
POSIX filesystem; a copy on an object store, which cannot rename) and only then writes the
manifest. A folder without a manifest does not exist for readers, so a job killed mid-write
leaves nothing a resume could trip on; the next commit deletes such leftovers. The manifest
lists every file's size and sha256, and a checkpoint whose files no longer match it is
skipped, with the reason, in favour of the one before.

The bytes go out through cellscale.checkpoint_storage: each rank writes its shards into up to
4 files in parallel, hashing every byte on its way out (the commit reads nothing back), and on a
local disk with large aligned O_DIRECT writes, each file fsynced before the commit; the folders
are fsynced around the rename and the manifest, so a manifest never names data the disk has not
got. An async save copies the state into a host copy kept between saves (pinned when the state
is on a GPU): that copy is all the training loop waits for.

Tensor state goes through DCP, so the ranks of a process group each write their own shards
and a job may resume on another world size. `extra` is pickled for the job's own code; the
control plane never unpickles anything: it reads the notifier's JSON lines.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import platform
import re
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from pydantic import BaseModel

# DCP's fsspec storage is not re-exported from torch.distributed.checkpoint (torch 2.13)
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

import cellscale
from cellscale.checkpoint_storage import FsspecHashingWriter, LocalWriter, Staging
from cellscale.runtime.durable import fsync_dir
from cellscale.runtime.environment import JobEnvironment
from cellscale.runtime.jobdir import JobDir, write_atomic
from cellscale.runtime.records import Checkpoint, ResumeReport, Skipped

MANIFEST = "MANIFEST.json"
# Single-process saves and loads are a normal case here, not a mistake worth a warning per process.
warnings.filterwarnings(
    "ignore", message="torch.distributed is disabled, unavailable or uninitialized", category=UserWarning
)
TMP_PREFIX = ".tmp-step-"
_STEP_DIR = re.compile(r"step-(\d+)")
log = logging.getLogger(__name__)
T = TypeVar("T")


class FileEntry(BaseModel):
    size: int
    sha256: str


class Manifest(BaseModel):
    """MANIFEST.json: enough to verify every file of a checkpoint without trusting its writer."""

    step: int
    wall_time: float  # when it was committed, Unix seconds
    write_s: float  # from the save() call to the commit
    world_size: int
    files: dict[str, FileEntry]  # path relative to the checkpoint's folder
    versions: dict[str, str]


@dataclass(frozen=True)
class Resume:
    """What latest_verified() found and load() restored: the checkpoint (None: nothing to resume
    from), the newer ones passed over on the way with their reasons, and this rank's `extra`."""

    checkpoint: Checkpoint | None
    skipped: list[Skipped] = field(default_factory=list)
    extra: Any = None

    @property
    def step(self) -> int | None:
        return None if self.checkpoint is None else self.checkpoint.step


class CheckpointError(RuntimeError):
    """A save or load failed on some rank; raised on every rank alike."""


Notifier = Callable[[Checkpoint], None]


def notify_job_dir(checkpoint: Checkpoint) -> None:
    """The default notifier: append the checkpoint as one JSON line to this attempt's
    checkpoints.jsonl in the job directory, where the control plane picks it up. Outside a
    cellscale job (no CELLSCALE_JOB_DIR) it does nothing."""
    env = JobEnvironment.current()
    if not env.job_dir:
        return
    JobDir(env.job_dir).append_checkpoint(env.attempt, checkpoint)


def record_resume(resume: Resume) -> None:
    """The default resume reporter: write what this attempt resumed from (and the newer
    checkpoints passed over, with reasons) to the job directory, where the control plane
    turns it into an event. Outside a cellscale job it does nothing."""
    env = JobEnvironment.current()
    if not env.job_dir or resume.checkpoint is None:
        return
    report = ResumeReport(
        step=resume.checkpoint.step, url=resume.checkpoint.url, at=time.time(), skipped=resume.skipped
    )
    JobDir(env.job_dir).write_resume(env.attempt, report)


class _Group:
    """The processes that write one checkpoint together: this one alone, or every rank of the
    default process group over a gloo group of their own (DCP's async save runs collectives on a
    background thread, and sharing the training group with it can hang)."""

    def __init__(self) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 and not distributed:
            raise CheckpointError(
                f"this job has {world} ranks but torch.distributed is not initialized: call "
                "torch.distributed.init_process_group() before creating the Checkpointer, so the "
                "ranks write one checkpoint together instead of each its own"
            )
        self.pg = dist.new_group(backend="gloo") if distributed else None
        # maybe_save's per-step agreement runs on the training thread while an async save's
        # collectives run on the background thread: on one group their messages interleave
        # (a hang, or gloo's "Received data size doesn't match expected size"), so it has its own
        self.step_pg = dist.new_group(backend="gloo") if distributed else None
        self.rank = dist.get_rank() if distributed else 0
        self.size = dist.get_world_size() if distributed else 1

    def agree(self, fn: Callable[[], T], group: Any = None) -> list[T]:
        """Run fn on every rank and return every rank's result; if it failed anywhere, raise on
        every rank, so no rank waits in a later collective for one that has given up."""
        group = self.pg if group is None else group
        if group is None:
            return [fn()]
        failure: Exception | None = None
        try:
            mine = (fn(), None)
        except Exception as exc:
            failure, mine = exc, (None, f"{type(exc).__name__}: {exc}")
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, mine, group=group)
        errors = [f"rank {rank}: {error}" for rank, (_, error) in enumerate(gathered) if error]
        if errors:
            raise CheckpointError("; ".join(errors)) from failure
        return [result for result, _ in gathered]


class Checkpointer:
    """Saves and loads one job's checkpoints under a root URL.

    Construct it on every rank, after init_process_group if there is one: save(), load() and
    latest_verified() are collective. Only rank 0 commits, prunes and notifies.
    """

    def __init__(
        self,
        url: str,
        keep: int | None = 3,
        notifier: Notifier = notify_job_dir,
        storage_options: dict[str, Any] | None = None,
        on_resume: Callable[[Resume], None] = record_resume,
    ):
        """keep: how many committed checkpoints to keep (None: all). notifier: called on rank 0
        with each committed Checkpoint (on the background thread, for an async save).
        storage_options: passed to fsspec (credentials, endpoint). on_resume: called on rank 0
        with what load() resumed from."""
        if keep is not None and keep < 1:
            raise ValueError("keep must be at least 1, or None to keep every checkpoint")
        self.keep = keep
        self.notifier = notifier
        self.on_resume = on_resume
        self.storage_options = storage_options or {}
        self.fs, root = url_to_fs(url, **self.storage_options)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.root = os.path.abspath(root) if self.local else root.rstrip("/")
        self._group = _Group()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cellscale-checkpoint")
        self._pending: Future[Checkpoint] | None = None
        self._staging = Staging()

    # -- saving ----------------------------------------------------------------------------
    def save(self, step: int, state_dict: dict[str, Any], extra: Any = None, async_: bool = True) -> Future[Checkpoint]:
        """Checkpoint `state_dict` (DCP: tensors, modules, optimizers) and this rank's `extra`
        (pickled) as `step`. Async (the default) returns once the state is copied to host memory,
        so training goes on while it is written; the future resolves when it is committed. One
        save is in flight at a time (one host copy, kept for the next save): a save first waits
        for the one before."""
        if step < 0:
            raise ValueError(f"step must be >= 0, not {step}")
        self._settle()
        started = time.time()
        tmp = f"{self.root}/{TMP_PREFIX}{step}-{self._group.agree(lambda: uuid.uuid4().hex)[0]}"
        blob = None if extra is None else pickle.dumps(extra, protocol=pickle.HIGHEST_PROTOCOL)
        if not async_:
            done: Future[Checkpoint] = Future()
            done.set_result(self._persist(state_dict, step, tmp, blob, started))
            return done
        staged = self._staging.stage(state_dict)
        self._pending = self._executor.submit(self._persist, staged, step, tmp, blob, started)
        self._pending.add_done_callback(_log_failure)
        return self._pending

    def wait(self) -> Checkpoint | None:
        """Block until the save in flight, if any, is committed; return it, or raise why it failed."""
        return None if self._pending is None else self._pending.result()

    def _settle(self) -> None:
        """Wait for the save in flight without raising (its own future reports its failure), so
        this thread's collectives never interleave with the background thread's."""
        if self._pending is not None:
            wait_for([self._pending])

    def _persist(self, state: dict[str, Any], step: int, tmp: str, blob: bytes | None, started: float) -> Checkpoint:
        """Write this rank's shards and `extra` into `tmp`, learn every rank's files, and let
        rank 0 commit. Every rank returns the committed checkpoint."""
        writer = self._writer(f"{tmp}/dcp")
        dcp.save(state, storage_writer=writer, process_group=self._group.pg)
        shares = self._group.agree(lambda: self._written(writer, tmp, blob))
        files = {name: entry for share in shares for name, entry in share.items()}
        commit = (lambda: self._commit(step, tmp, files, started)) if self._group.rank == 0 else (lambda: None)
        return self._group.agree(commit)[0]

    def _written(self, writer: LocalWriter | FsspecHashingWriter, tmp: str, blob: bytes | None) -> dict[str, FileEntry]:
        """This rank's files, hashed as they were written: its shards (and on rank 0 DCP's
        .metadata), and its `extra`, written now."""
        files = {f"dcp/{name}": FileEntry(size=size, sha256=sha256) for name, (size, sha256) in writer.files.items()}
        if blob is not None:
            name = f"extra-{self._group.rank}.pkl"
            self._write(f"{tmp}/{name}", blob)
            files[name] = FileEntry(size=len(blob), sha256=hashlib.sha256(blob).hexdigest())
        return files

    def _commit(self, step: int, tmp: str, files: dict[str, FileEntry], started: float) -> Checkpoint:
        self._check_complete(tmp, files)
        final = self._dir(step)
        self._remove(final)  # a crashed write's leftover, or an older save of this same step
        self.fs.mv(tmp, final, recursive=True)
        self._sync_folders(final, f"{final}/dcp", self.root)
        now = time.time()
        manifest = Manifest(
            step=step,
            wall_time=now,
            write_s=now - started,
            world_size=self._group.size,
            files=files,
            versions=_versions(),
        )
        self._write(f"{final}/{MANIFEST}", manifest.model_dump_json(indent=1).encode())
        self._sync_folders(final)  # before pruning: a crash must not keep the deletions and lose the commit
        checkpoint = self._describe(manifest)
        self._prune()
        self._notify(checkpoint)
        return checkpoint

    def _check_complete(self, tmp: str, files: dict[str, FileEntry]) -> None:
        """The manifest must name every file of the checkpoint, and only those: a file written past
        the hashing writer would never be verified."""
        self.fs.invalidate_cache(tmp)
        found = {path[len(tmp) + 1 :] for path in self.fs.find(tmp)}
        if found != files.keys():
            raise CheckpointError(
                f"{tmp} does not hold the files its ranks wrote: unhashed {sorted(found - files.keys())}, "
                f"missing {sorted(files.keys() - found)}"
            )

    def _sync_folders(self, *folders: str) -> None:
        """fsync local folders, so the renames and new files in them are on disk (an object store
        has no folders to sync)."""
        if not self.local:
            return
        for folder in folders:
            fsync_dir(Path(folder))

    def _prune(self) -> None:
        """After a commit: delete checkpoints beyond the newest `keep`, and crashed writes."""
        steps = self._steps()
        stale = steps[: -self.keep] if self.keep else []
        for step in stale:
            self._remove(self._dir(step))
        for name in self._names():
            match = _STEP_DIR.fullmatch(name)
            if name.startswith(TMP_PREFIX) or (match and int(match.group(1)) not in steps):
                self._remove(f"{self.root}/{name}")

    def _notify(self, checkpoint: Checkpoint) -> None:
        try:
            self.notifier(checkpoint)
        except Exception:  # the checkpoint is committed; a broken notifier must not fail the save
            log.exception("checkpoint notifier failed for step %d", checkpoint.step)

    # -- reading ---------------------------------------------------------------------------
    def list(self, verify: bool = False) -> list[Checkpoint]:
        """The committed checkpoints, oldest first. verify=True hashes every file (slow for
        large checkpoints); otherwise `verified` is None. Not collective."""
        checkpoints = []
        for step in self._steps():
            try:
                manifest = self._manifest(step)
            except (OSError, ValueError):
                continue  # latest_verified() reports it
            verified = not self._problems(step, all_files=True) if verify else None
            checkpoints.append(self._describe(manifest).model_copy(update={"verified": verified}))
        return checkpoints

    def latest_verified(self) -> Resume:
        """The newest checkpoint whose files all match its manifest, and the newer ones skipped on
        the way, with reasons (also logged), for the caller to report. Collective: each rank
        hashes a share of the files."""
        self._settle()
        skipped: list[Skipped] = []
        for step in reversed(self._group.agree(self._steps)[0]):
            shares = self._group.agree(partial(self._problems, step))
            problems = list(dict.fromkeys(problem for share in shares for problem in share))  # a bad manifest: once
            if not problems:
                found = self._describe(self._manifest(step)).model_copy(update={"verified": True})
                return Resume(found, skipped)
            skipped.append(Skipped(step=step, url=self._url(self._dir(step)), reason="; ".join(problems)))
            if self._group.rank == 0:
                log.warning("checkpoint step %d skipped: %s", step, skipped[-1].reason)
        return Resume(None, skipped)

    def load(self, state_dict: dict[str, Any]) -> Resume:
        """Load the newest verified checkpoint into `state_dict` in place (DCP semantics: its
        tensors, modules and optimizers are the template and receive the values) and return it
        with this rank's `extra`. With nothing to resume from, `state_dict` is left as it was and
        the Resume's step is None. Collective."""
        found = self.latest_verified()
        if found.checkpoint is None:
            return found
        directory = self._dir(found.checkpoint.step)
        dcp.load(state_dict, storage_reader=self._reader(f"{directory}/dcp"), process_group=self._group.pg)
        if self._group.rank == 0:
            try:
                self.on_resume(found)
            except Exception:  # the state is loaded; a broken reporter must not fail the resume
                log.exception("resume reporter failed")
        return replace(found, extra=self._get_extra(directory))

    def maybe_save(self, step: int, state_dict: dict[str, Any], every: int, extra: Any = None) -> None:
        """The training loop's one call per step: report the step (it rides the heartbeat),
        save asynchronously every `every` steps, and after a preemption warning save now,
        wait for the commit and stop this attempt so the job is requeued and resumes here.
        Collective: the ranks agree on the warning, since each may see it at another step."""
        env = JobEnvironment.current()
        env.report_step(step)
        if any(self._group.agree(env.preempt_requested, group=self._group.step_pg)):
            self.save(step, state_dict, extra, async_=False).result()
            env.stop_for_preemption()
        if every > 0 and step % every == 0:
            self.save(step, state_dict, extra)

    def _problems(self, step: int, all_files: bool = False) -> list[str]:
        """Why checkpoint `step` cannot be trusted, from this rank's share of its files (all of
        them with all_files): nothing when it verifies."""
        try:
            manifest = self._manifest(step)
        except (OSError, ValueError) as exc:
            return [f"unreadable manifest ({type(exc).__name__})"]
        if manifest.step != step:
            return [f"its manifest is for step {manifest.step}"]
        names = sorted(manifest.files)
        share = names if all_files else names[self._group.rank :: self._group.size]
        return [problem for name in share if (problem := self._problem(step, name, manifest.files[name]))]

    def _problem(self, step: int, name: str, expected: FileEntry) -> str | None:
        path = f"{self._dir(step)}/{name}"
        try:
            size = self.fs.size(path)
        except FileNotFoundError:
            return f"{name} is missing"
        if size != expected.size:
            return f"{name} has {size} bytes, the manifest says {expected.size}"
        if self._sha256(path) != expected.sha256:
            return f"{name} does not match its sha256"
        return None

    def _get_extra(self, directory: str) -> Any:
        path = f"{directory}/extra-{self._group.rank}.pkl"
        return pickle.loads(self.fs.cat_file(path)) if self.fs.exists(path) else None

    # -- storage ---------------------------------------------------------------------------
    def _dir(self, step: int) -> str:
        return f"{self.root}/step-{step}"

    def _url(self, path: str) -> str:
        return path if self.local else self.fs.unstrip_protocol(path)

    def _writer(self, directory: str) -> LocalWriter | FsspecHashingWriter:
        if self.local:
            return LocalWriter(directory)
        return FsspecHashingWriter(self._url(directory), **self.storage_options)

    def _reader(self, directory: str) -> dcp.StorageReader:
        if self.local:
            return dcp.FileSystemReader(directory)
        return FsspecReader(self._url(directory), **self.storage_options)

    def _names(self) -> list[str]:
        """The entries directly under the root; none before the first save."""
        self.fs.invalidate_cache(self.root)
        try:
            return [path.rstrip("/").rsplit("/", 1)[-1] for path in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []

    def _steps(self) -> list[int]:
        """The committed steps (a manifest file exists; not yet verified), oldest first."""
        steps = (int(match.group(1)) for match in map(_STEP_DIR.fullmatch, self._names()) if match)
        return sorted(step for step in steps if self.fs.exists(f"{self._dir(step)}/{MANIFEST}"))

    def _manifest(self, step: int) -> Manifest:
        return Manifest.model_validate_json(self.fs.cat_file(f"{self._dir(step)}/{MANIFEST}"))

    def _describe(self, manifest: Manifest) -> Checkpoint:
        return Checkpoint(
            step=manifest.step,
            url=self._url(self._dir(manifest.step)),
            size_bytes=sum(entry.size for entry in manifest.files.values()),
            wall_time=manifest.wall_time,
            write_s=manifest.write_s,
        )

    def _write(self, path: str, data: bytes) -> None:
        """Write a whole file: locally through a temporary name and fsync, so a crash leaves the
        old content or the new, never a torn file (an object store's PUT already is all or nothing)."""
        if self.local:
            write_atomic(Path(path), data)
        else:
            self.fs.pipe_file(path, data)

    def _remove(self, directory: str) -> None:
        """Uncommit (drop the manifest), then delete: no reader sees a half-deleted checkpoint."""
        for path, recursive in ((f"{directory}/{MANIFEST}", False), (directory, True)):
            if self.fs.exists(path):
                self.fs.rm(path, recursive=recursive)

    def _sha256(self, path: str) -> str:
        with self.fs.open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()


def _versions() -> dict[str, str]:
    return {
        "cellscale": cellscale.__version__,
        "torch": torch.__version__,
        "fsspec": fsspec.__version__,
        "python": platform.python_version(),
    }


def _log_failure(future: Future) -> None:
    if future.exception() is not None:
        log.error("checkpoint save failed: %s", future.exception())
