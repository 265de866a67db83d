"""A node's dataset cache: each dataset fetched once per node, shared by every rank and job on it, bounded.

Layout under the root. Every file is per entry, per label or per fetch: no metadata file is shared by
all entries (fsspec's caching filesystems keep one, rewritten by every process: fsspec #556, #471).

    entries/<key>/data/...        the dataset's files at their paths relative to the source URL, read-only
    entries/<key>/manifest.json   the source, its version, each file's size, tag (ETag or mtime) and md5
    entries/<key>/in-use          every user of the entry holds a shared flock on it; its mtime is the last use
    labels/<sha256 of url@version>.json   a pinned version's entry: staging it again asks the source nothing
    locks/<key>.fetch             the one process fetching <key> holds it exclusively; the others wait on it
    locks/room                    held exclusively while a process evicts and reserves room for a fetch
    tmp/<key>.<bytes>.<random>/   a fetch in progress, laid out as an entry, its files preallocated
    trash/<key>.<random>/         an evicted entry on its way out

Why this shape:
- Content-addressed: <key> is the sha256 of the manifest (relative paths, sizes, ETags or checksums; the URL
  too where a file has only a modification time), so the same bytes are one entry whatever job names them.
- Atomic publish (fsspec #639: "largely untested from multiple processes"): a fetch writes under tmp/,
  fsyncs, and one rename publishes it; a crashed fetch leaves nothing under entries/. Its tmp dir, whose
  fetch lock nobody holds any more, goes at the next fetch, and so does an evictor's leftover trash.
- One fetch per node: processes staging the same entry take its fetch lock; the first fetches, the others
  find the entry published when they get the lock.
- Never evicted in use: users hold a shared flock on the entry's in-use file, which the kernel drops when
  a holder dies; eviction needs the exclusive lock without waiting, so an entry in use is never evicted.
- Bounded (fsspec #510: no size limit since 2020; mountpoint-s3 #1389: the cache grows past its cap under
  concurrency): a `max_bytes` cap and a `min_free_ratio` floor like JuiceFS's --cache-size and
  --free-space-ratio. Room is made under one lock that also counts the fetches in flight (their tmp dirs,
  whose files are preallocated), evicting the least recently used entries not in use; CacheFull if that
  cannot make room. It then changes nothing.
- Verified: where the source gives an MD5 ETag (S3 single-part uploads), the fetched bytes must match it.
- Pinned: a label is the URL and the version only (not the storage options: endpoint, credentials). It
  outlives its entry's eviction, so a later listing that differs raises SourceChanged.

Sharing: the directories are created 0o777 and the data files 0o444, so that every Unix user's jobs on
the node share (and evict from) one cache. A node cache is therefore shared by every job that names the
same root, and any user on the node can delete or replace what is in it: admins keep desks apart by
giving each desk its own root.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import fsspec

from cellscale.runtime.durable import exclusive, fsync_dir, fsync_tree, lock, write_readonly

THREADS = 16  # pieces fetched at once; memory in flight is at most THREADS * PIECE
PIECE = 8 * 2**20  # bytes per GET: a larger file is fetched as parallel ranged reads of this size
PROGRESS_EVERY = 0.1  # seconds between progress calls
CONTENT_TAGS = ("ETag", "etag", "md5Hash", "crc32c", "checksum")  # info fields that change with the content
TIME_TAGS = ("mtime", "LastModified", "last_modified", "created")  # the fallback: when the file last changed
MD5_ETAG = re.compile(r"[0-9a-f]{32}")  # an S3 single-part ETag is the md5; a multipart one has "-<parts>"
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class DataSource:
    """A dataset a job names: a directory (or one file) at an fsspec URL, optionally pinned to a version."""

    name: str
    url: str
    version: str | None = None  # an ETag, manifest hash or snapshot id; None: whatever is there now
    storage_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StageResult:
    """Where a staged dataset is and what staging it cost. `path` holds the files at their paths relative
    to the source URL (for a one-file URL: the directory holding that file)."""

    name: str
    key: str
    path: Path
    bytes: int
    files: int
    hit: bool
    fetched_bytes: int
    seconds: float
    evicted: tuple[str, ...]


@dataclass(frozen=True)
class EntryInfo:
    """One cached dataset, as it was first staged."""

    key: str
    name: str
    url: str
    version: str | None
    bytes: int
    files: int
    last_used: float
    in_use: bool
    path: Path


class CacheFull(Exception):
    """No room for a fetch without evicting entries in use."""


class ChecksumMismatch(Exception):
    """Fetched bytes differ from what the source's listing promised (md5 ETag or size)."""


class SourceChanged(Exception):
    """A pinned version's listing no longer matches what was cached under that version."""


@dataclass(frozen=True)
class _File:
    path: str  # relative to the dataset's directory
    source: str  # the path fsspec reads
    size: int
    tag: str | None
    etag_md5: str | None  # the md5 the source's ETag gives, if it does


@dataclass(frozen=True)
class _Listing:
    fs: fsspec.AbstractFileSystem
    files: tuple[_File, ...]
    key: str

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class _Entry:
    """An entry this process holds in use: the lock's descriptor and the entry's manifest."""

    fd: int
    manifest: dict


class NodeCache:
    """The dataset cache under `root`. Any number of processes and threads may use one root at once."""

    def __init__(self, root: str | os.PathLike, max_bytes: int | None = None, min_free_ratio: float = 0.0):
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.min_free_ratio = min_free_ratio
        for sub in ("entries", "labels", "locks", "tmp", "trash"):
            _make_shared_dirs(self.root / sub)

    def stage(self, source: DataSource, progress: Progress | None = None) -> StageResult:
        """Fetch the dataset into the cache unless it is there; return without holding it in use.
        `progress(done_bytes, total_bytes)` is called as a fetch's bytes land (not on a hit)."""
        with self.use(source, progress) as result:
            return result

    @contextmanager
    def use(self, source: DataSource, progress: Progress | None = None) -> Iterator[StageResult]:
        """Stage the dataset if needed and hold it in use for the with-block: it is never evicted meanwhile."""
        started = time.monotonic()
        entry, fetched, evicted = self._acquire(source, progress)
        try:
            yield StageResult(
                name=source.name,
                key=entry.manifest["key"],
                path=self._entry_dir(entry.manifest["key"]) / "data",
                bytes=entry.manifest["bytes"],
                files=len(entry.manifest["files"]),
                hit=fetched is None,
                fetched_bytes=fetched or 0,
                seconds=time.monotonic() - started,
                evicted=evicted,
            )
        finally:
            os.close(entry.fd)

    def entries(self) -> list[EntryInfo]:
        """Every published entry, the most recently used first."""
        infos = []
        for directory in (self.root / "entries").iterdir():
            try:
                manifest = _read_json(directory / "manifest.json")
                last_used = os.stat(directory / "in-use").st_mtime
            except FileNotFoundError:  # evicted while we looked
                continue
            infos.append(
                EntryInfo(
                    key=manifest["key"],
                    name=manifest["name"],
                    url=manifest["url"],
                    version=manifest["version"],
                    bytes=manifest["bytes"],
                    files=len(manifest["files"]),
                    last_used=last_used,
                    in_use=self._in_use(manifest["key"]),
                    path=directory / "data",
                )
            )
        return sorted(infos, key=lambda info: info.last_used, reverse=True)

    # -- staging ---------------------------------------------------------------------------------------
    def _acquire(self, source: DataSource, progress: Progress | None) -> tuple[_Entry, int | None, tuple[str, ...]]:
        """The entry held in use, the bytes fetched for it (None: it was there), the keys evicted."""
        label = self.root / "labels" / f"{_label_hash(source)}.json" if source.version is not None else None
        pinned = _read_json(label)["key"] if label and label.exists() else None
        if pinned and (entry := self._hold(pinned)):
            return entry, None, ()
        listing = _list(source)
        if pinned and listing.key != pinned:
            raise SourceChanged(
                f"{source.url}@{source.version} was cached as {pinned[:12]}, "
                f"but the source now lists {listing.key[:12]} ({len(listing.files)} files, {listing.bytes} bytes)"
            )
        entry = self._hold(listing.key)
        fetched, evicted = None, ()
        if entry is None:
            entry, fetched, evicted = self._fetch(source, listing, progress)
        if label and not pinned:
            write_readonly(label, json.dumps({"url": source.url, "version": source.version, "key": listing.key}))
        return entry, fetched, evicted

    def _hold(self, key: str) -> _Entry | None:
        """The published entry `key` locked in use, its last use now; None if it is not published."""
        fd = lock(self._entry_dir(key) / "in-use", fcntl.LOCK_SH, create=False)
        if fd is None:
            return None
        _touch(fd)
        return _Entry(fd, _read_json(self._entry_dir(key) / "manifest.json"))

    def _fetch(
        self, source: DataSource, listing: _Listing, progress: Progress | None
    ) -> tuple[_Entry, int | None, tuple[str, ...]]:
        with exclusive(self.root / "locks" / f"{listing.key}.fetch"):
            if entry := self._hold(listing.key):  # fetched by another process while we waited
                return entry, None, ()
            tmp = self.root / "tmp" / f"{listing.key}.{listing.bytes}.{secrets.token_hex(4)}"
            try:
                with exclusive(self.root / "locks" / "room", remove=False):
                    evicted = self._make_room(listing, source)
                    _preallocate(tmp / "data", listing.files)
                md5s = _transfer(listing, tmp / "data", progress)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)  # absent when no room was made
                raise
            return self._publish(tmp, source, listing, md5s), listing.bytes, evicted

    def _publish(self, tmp: Path, source: DataSource, listing: _Listing, md5s: list[str]) -> _Entry:
        manifest = {
            "key": listing.key,
            "name": source.name,
            "url": source.url,
            "version": source.version,
            "bytes": listing.bytes,
            "files": [
                {"path": f.path, "size": f.size, "tag": f.tag, "md5": md5, "verified": f.etag_md5 is not None}
                for f, md5 in zip(listing.files, md5s, strict=True)
            ],
            "fetched_at": time.time(),
        }
        write_readonly(tmp / "manifest.json", json.dumps(manifest))
        fd = os.open(tmp / "in-use", os.O_RDONLY | os.O_CREAT | os.O_EXCL)
        os.fchmod(fd, 0o666)  # every user's jobs touch it (last use)
        fcntl.flock(fd, fcntl.LOCK_SH)  # held from birth: nobody evicts it between the rename and our use
        fsync_tree(tmp)
        os.rename(tmp, self._entry_dir(listing.key))
        fsync_dir(self.root / "entries")
        return _Entry(fd, manifest)

    # -- room ------------------------------------------------------------------------------------------
    def _make_room(self, listing: _Listing, source: DataSource) -> tuple[str, ...]:
        """Evict least recently used entries not in use until `listing` fits; the caller holds the room
        lock. Either it fits, or CacheFull and nothing was evicted."""
        self._remove_leftovers(listing.key)
        entries = sorted(self._published(), key=lambda e: e[2])  # (key, bytes, last_used), oldest first
        used = sum(size for _, size, _ in entries) + self._in_flight()
        free, total = _disk_space(self.root)
        chosen: list[tuple[str, int, int]] = []  # (key, bytes, fd of its exclusive lock)
        in_use: list[tuple[str, int]] = []
        for key, size, _ in entries:
            if self._fits(listing.bytes, used, free, total):
                break
            fd = lock(self._entry_dir(key) / "in-use", fcntl.LOCK_EX | fcntl.LOCK_NB, create=False)
            if fd is None:
                in_use.append((key, size))
                continue
            chosen.append((key, size, fd))
            used, free = used - size, free + size
        if not self._fits(listing.bytes, used, free, total):
            for _, _, fd in chosen:
                os.close(fd)
            raise CacheFull(self._full_message(listing, source, used, free, in_use))
        for key, _, fd in chosen:
            self._evict(key, fd)
        return tuple(key for key, _, _ in chosen)

    def _fits(self, need: int, used: int, free: int, total: int) -> bool:
        under_cap = self.max_bytes is None or used + need <= self.max_bytes
        return under_cap and free - need >= self.min_free_ratio * total

    def _full_message(
        self, listing: _Listing, source: DataSource, used: int, free: int, in_use: list[tuple[str, int]]
    ) -> str:
        """`used` and `free`: as they would be with every entry not in use evicted."""
        held = ", ".join(f"{key[:12]} ({size} bytes)" for key, size in in_use) or "none"
        return (
            f"no room for {source.name} ({source.url}, {listing.bytes} bytes) in {self.root}: "
            f"cap {self.max_bytes} bytes ({used} would still be cached), free-space floor "
            f"{self.min_free_ratio:.0%} ({free} bytes would be free); {len(in_use)} entries in use "
            f"cannot be evicted: {held}"
        )

    def _evict(self, key: str, fd: int) -> None:
        """Unpublish the entry we hold exclusively (one rename), then delete it."""
        trash = self.root / "trash" / f"{key}.{secrets.token_hex(4)}"
        os.rename(self._entry_dir(key), trash)
        os.close(fd)
        shutil.rmtree(trash)

    def _published(self) -> list[tuple[str, int, float]]:
        out = []
        for directory in (self.root / "entries").iterdir():
            manifest = _read_json(directory / "manifest.json")
            out.append((directory.name, manifest["bytes"], os.stat(directory / "in-use").st_mtime))
        return out

    def _in_flight(self) -> int:
        """Bytes reserved by live fetches (their tmp dirs are named <key>.<bytes>.<random>)."""
        return sum(int(tmp.name.split(".")[1]) for tmp in (self.root / "tmp").iterdir())

    def _remove_leftovers(self, own_key: str) -> None:
        """Delete dead writers' tmp dirs and evictors' trash; the caller holds the room lock (so no trash
        is being deleted) and `own_key`'s fetch lock (so a tmp dir of `own_key` is a dead writer's)."""
        for trash in (self.root / "trash").iterdir():
            shutil.rmtree(trash)
        for tmp in (self.root / "tmp").iterdir():
            key = tmp.name.split(".")[0]
            if key == own_key:
                shutil.rmtree(tmp)
                continue
            lock = self.root / "locks" / f"{key}.fetch"
            fd = lock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is not None:  # nobody fetches `key`: the writer died
                shutil.rmtree(tmp)
                os.unlink(lock)
                os.close(fd)

    def _in_use(self, key: str) -> bool:
        fd = lock(self._entry_dir(key) / "in-use", fcntl.LOCK_EX | fcntl.LOCK_NB, create=False)
        if fd is None:
            return True
        os.close(fd)
        return False

    def _entry_dir(self, key: str) -> Path:
        return self.root / "entries" / key


# -- the source ----------------------------------------------------------------------------------------
def _list(source: DataSource) -> _Listing:
    """The source's files now, and the entry key their manifest makes."""
    fs, root = fsspec.core.url_to_fs(source.url, **source.storage_options)
    root = root.rstrip("/")
    fs.invalidate_cache(root)  # a listing of now, not one fsspec remembers
    found = fs.find(root, detail=True)
    if list(found) == [root]:  # a one-file URL (fsspec's find may give such a file no details)
        found, base = {root: fs.info(root)}, root.rpartition("/")[0]
    else:
        base = root
    files = tuple(_file(name, info, base) for name, info in sorted(found.items()) if info["type"] == "file")
    if not files:
        raise FileNotFoundError(errno.ENOENT, "no files at the source", source.url)
    return _Listing(fs, files, _manifest_key(source, files))


def _file(name: str, info: Mapping[str, Any], base: str) -> _File:
    relative = PurePosixPath(name).relative_to(base)
    if ".." in relative.parts:
        raise ValueError(f"{name}: a file outside its dataset's directory")
    return _File(str(relative), name, int(info["size"]), _tag(info), _md5_etag(info))


def _tag(info: Mapping[str, Any]) -> str | None:
    for name in (*CONTENT_TAGS, *TIME_TAGS):
        if info.get(name) is not None:
            return f"{name}={info[name]}"
    return None


def _md5_etag(info: Mapping[str, Any]) -> str | None:
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    return etag if MD5_ETAG.fullmatch(etag) else None


def _manifest_key(source: DataSource, files: tuple[_File, ...]) -> str:
    """sha256 of the sorted (path, size, tag) list. Where a file's tag says only when it changed (or
    nothing), the URL joins the manifest: identical names, sizes and times elsewhere are not the same bytes."""
    by_content = all(f.tag and f.tag.split("=", 1)[0] in CONTENT_TAGS for f in files)
    manifest = {"files": [[f.path, f.size, f.tag] for f in files], "url": None if by_content else source.url}
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def _label_hash(source: DataSource) -> str:
    return hashlib.sha256(f"{source.url.rstrip('/')}@{source.version}".encode()).hexdigest()


# -- the transfer --------------------------------------------------------------------------------------
class _Progress:
    """Reports bytes landed to the caller's callback, at most every PROGRESS_EVERY seconds and at the end."""

    def __init__(self, callback: Progress | None, total: int):
        self.callback, self.total, self.done, self.last = callback, total, 0, 0.0

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if self.callback and nbytes and (now - self.last >= PROGRESS_EVERY or self.done == self.total):
            self.last = now
            self.callback(self.done, self.total)


def _preallocate(data: Path, files: tuple[_File, ...]) -> None:
    """The entry's files at their full sizes, so free space already counts them (see _make_room)."""
    for f in files:
        path = data / f.path
        _make_shared_dirs(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if f.size:
                os.posix_fallocate(fd, 0, f.size)
            else:  # nothing to fetch: final now
                os.fchmod(fd, 0o444)
        finally:
            os.close(fd)


def _pieces(f: _File) -> list[tuple[int, int]]:
    return [(start, min(start + PIECE, f.size)) for start in range(0, f.size, PIECE)]


def _transfer(listing: _Listing, data: Path, progress: Progress | None) -> list[str]:
    """Fetch every file's pieces in parallel into its preallocated file; the files' md5s, each checked
    against the source's md5 ETag as soon as it is known. Pieces are hashed from memory as they land, so
    no file is read back: when the transfer ends, only its last piece is left to hash."""
    report = _Progress(progress, listing.bytes)
    md5s = [hashlib.md5(b"").hexdigest()] * len(listing.files)  # an empty file needs no fetch
    hashers = [_InOrderMd5() for _ in listing.files]
    with ThreadPoolExecutor(THREADS, thread_name_prefix="datacache") as pool:
        pending: dict[Future, int] = {
            pool.submit(_fetch_piece, listing.fs, f, data / f.path, start, end, hashers[i]): i
            for i, f in enumerate(listing.files)
            for start, end in _pieces(f)
        }
        try:
            for future in as_completed(pending):
                nbytes, digest = future.result()
                report.add(nbytes)
                if digest is not None:
                    i = pending[future]
                    _check(listing.files[i], digest)
                    md5s[i] = digest
        except BaseException:
            for future in pending:
                future.cancel()
            for hasher in hashers:
                hasher.abort()
            raise
    return md5s


class _InOrderMd5:
    """A file's md5 from pieces that land in any order: each waits for its turn (the piece before it
    hashed). Pieces are queued in file order, so the one a piece waits for was started before it."""

    def __init__(self) -> None:
        self._md5 = hashlib.md5()
        self._next = 0
        self._aborted = False
        self._turn = threading.Condition()

    def add(self, start: int, data: bytes) -> None:
        with self._turn:
            self._turn.wait_for(lambda: self._next == start or self._aborted)
            if self._aborted:
                raise CancelledError("another piece of the transfer failed")
        self._md5.update(data)  # outside the lock: only the piece whose turn it is gets here
        with self._turn:
            self._next = start + len(data)
            self._turn.notify_all()

    def abort(self) -> None:
        with self._turn:
            self._aborted = True
            self._turn.notify_all()

    def hexdigest(self) -> str:
        return self._md5.hexdigest()


def _check(f: _File, md5: str) -> None:
    if f.etag_md5 and md5 != f.etag_md5:
        raise ChecksumMismatch(f"{f.source}: fetched md5 {md5}, the source's ETag says {f.etag_md5}")


def _fetch_piece(
    fs: fsspec.AbstractFileSystem, f: _File, path: Path, start: int, end: int, md5: _InOrderMd5
) -> tuple[int, str | None]:
    """One ranged read written at its offset and hashed: (bytes, the file's md5 if this is its last piece,
    which then seals the file)."""
    data = fs.cat_file(f.source, start=start, end=end)  # keywords: s3fs's second parameter is version_id
    if len(data) != end - start:
        raise ChecksumMismatch(f"{f.source}: {len(data)} bytes at {start}, the listing promised {end - start}")
    fd = os.open(path, os.O_WRONLY)
    try:
        view, offset = memoryview(data), start
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
        md5.add(start, data)
        if end < f.size:
            return len(data), None
        _seal(fd)  # every earlier piece was written before it was hashed
        return len(data), md5.hexdigest()
    finally:
        os.close(fd)


def _seal(fd: int) -> None:
    os.fsync(fd)
    os.fchmod(fd, 0o444)


# -- files and locks -----------------------------------------------------------------------------------
def _make_shared_dirs(path: Path) -> None:
    """mkdir -p, each new directory 0o777 whatever the umask (see the module's note on sharing)."""
    if path.is_dir():
        return
    _make_shared_dirs(path.parent)
    try:
        path.mkdir()
    except FileExistsError:  # made by another process meanwhile
        return
    path.chmod(0o777)


def _touch(fd: int) -> None:
    """Last use = now. Setting an exact time needs ownership; anyone may set "now" (coarser: the clock tick)."""
    if os.fstat(fd).st_uid == os.geteuid():
        now = time.time_ns()
        os.utime(fd, ns=(now, now))
    else:
        os.utime(fd)


def _disk_space(root: Path) -> tuple[int, int]:
    """(free bytes available to us, the filesystem's size) at `root`."""
    stats = os.statvfs(root)
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize


def _read_json(path: Path) -> dict:
    return json.loads(path.read_bytes())
