"""How cellscale.checkpoint's bytes reach storage: hashed as they are written, several files per
rank in parallel, large aligned writes straight to a local disk, and a reused host copy for async
saves.

DCP plans what each rank writes; `LocalWriter` (a POSIX path) or `FsspecHashingWriter` (any other
fsspec URL) writes it. The files are in DCP's own format (records in torch.save's zip format at
the offsets `.metadata` lists), so DCP's stock readers load them, and checkpoints written before
this module load alike. A writer's `files` gives the size and sha256 of every file it wrote,
computed from the bytes on their way out: the commit needs no read-back.

On a local disk each file is written in CHUNK-sized, page-aligned O_DIRECT writes from a reused
buffer (buffered writes where the filesystem refuses O_DIRECT) and fsynced when closed: the disk
works while the other files' threads hash, and no write is left in the page cache for a later
fsync to flush.
"""

from __future__ import annotations

import errno
import hashlib
import math
import mmap
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from itertools import repeat
from typing import Any

import numpy as np
import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

# DCP's fsspec storage is not re-exported from torch.distributed.checkpoint (torch 2.13)
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as FsspecFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, FileSystem, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.tensor import DTensor
from torch.futures import Future
from torch.utils.serialization import config as serialization_config

FILES_PER_RANK = 4  # at most; each written by its own thread
SPLIT_BYTES = 64 * 2**20  # a rank's state is split into another file per this many bytes
CHUNK = 8 * 2**20  # bytes per write to a local disk
PIECE = 2**20  # bytes copied into the write buffer, then hashed there, at a time (both GIL-free)
ALIGN = 4096  # O_DIRECT's alignment of memory, offsets and lengths; CHUNK is a multiple
FileDigest = tuple[int, str]  # (size in bytes, sha256 hex)


class _Buffers:
    """Page-aligned CHUNK-sized write buffers, kept from one file to the next. Private mappings:
    a forked child (a rank started by fork) must not write into its parent's buffers."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def give(self, buffer: mmap.mmap) -> None:
        with self._lock:
            self._free.append(buffer)


_BUFFERS = _Buffers()
os.register_at_fork(after_in_child=_BUFFERS.__init__)  # a fresh pool: the parent's lock may be held


def _open_for_writing(path: str) -> tuple[int, bool]:
    """A new file's descriptor, and whether it was opened with O_DIRECT (tmpfs and some others refuse it)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct, 0o666), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o666), False


def _write_all(fd: int, data: memoryview) -> None:
    written = 0
    while written < len(data):
        written += os.write(fd, data[written:])


class DiskFile:
    """A local file opened for writing: every byte copied into an aligned buffer and hashed there
    (the source is read once; the hash reads the cache), written out in CHUNK writes, the last
    one padded to ALIGN and the file truncated back to its size, then fsynced when the `with`
    block ends. One thread writes one file."""

    def __init__(self, path: str):
        self._fd, self._direct = _open_for_writing(path)
        self._buffer = _BUFFERS.take()
        self._array = np.frombuffer(self._buffer, np.uint8)
        self._view = memoryview(self._buffer)
        self._filled = 0
        self._size = 0
        self._sha256 = hashlib.sha256()

    def write(self, data: Any) -> int:
        source = np.frombuffer(memoryview(data).cast("B"), np.uint8)
        done = 0
        while done < len(source):
            take = min(len(source) - done, PIECE, CHUNK - self._filled)
            end = self._filled + take
            self._array[self._filled : end] = source[done : done + take]
            self._sha256.update(self._view[self._filled : end])  # what is written, while it is in cache
            self._filled, done = end, done + take
            if self._filled == CHUNK:
                self._flush(CHUNK)
        self._size += len(source)
        return len(source)

    def tell(self) -> int:
        return self._size

    def digest(self) -> FileDigest:
        return self._size, self._sha256.hexdigest()

    def __enter__(self) -> DiskFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        """On success: write what is buffered and fsync. Either way: close and return the buffer."""
        try:
            if kind is None:
                self._finish()
        finally:
            os.close(self._fd)
            _BUFFERS.give(self._buffer)

    def _finish(self) -> None:
        if self._filled:
            end = math.ceil(self._filled / ALIGN) * ALIGN if self._direct else self._filled
            self._array[self._filled : end] = 0
            self._flush(end)
            os.ftruncate(self._fd, self._size)  # drop the padding
        os.fsync(self._fd)

    def _flush(self, length: int) -> None:
        _write_all(self._fd, self._view[:length])
        self._filled = 0


class _HashedStream:
    """A writable stream (an fsspec file) that hashes what goes through it."""

    def __init__(self, raw: Any):
        self._raw = raw
        self._size = 0
        self._sha256 = hashlib.sha256()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._sha256.update(view)
        self._raw.write(view)
        self._size += len(view)
        return len(view)

    def tell(self) -> int:
        return self._size

    def digest(self) -> FileDigest:
        return self._size, self._sha256.hexdigest()


def _name(path: str | os.PathLike) -> str:
    return os.fspath(path).rsplit("/", 1)[-1]


class _Recording:
    """Mixed into a DCP FileSystem: files are only written, each through a hashing stream from
    `_hashed(path)`, and `files` maps each one's name (in the checkpoint's one folder) to its size
    and sha256, once it is closed."""

    _hashed: Callable[[str | os.PathLike], AbstractContextManager[DiskFile | _HashedStream]]

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, FileDigest] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[DiskFile | _HashedStream]:
        if mode != "wb":
            raise ValueError(f"a checkpoint writer's files are only written, not opened with {mode!r}")
        with self._hashed(path) as stream:
            yield stream
        self.files[_name(path)] = stream.digest()

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)  # type: ignore[misc]
        self.files[_name(new_path)] = self.files.pop(_name(path))


class _LocalFiles(_Recording, FileSystem):
    def _hashed(self, path: str | os.PathLike) -> DiskFile:
        return DiskFile(os.fspath(path))


class _FsspecFiles(_Recording, FsspecFileSystem):
    @contextmanager
    def _hashed(self, path: str | os.PathLike) -> Iterator[_HashedStream]:
        with FsspecFileSystem.create_stream(self, path, "wb") as raw:
            yield _HashedStream(raw)


def _item_bytes(item: WriteItem) -> int:
    if item.tensor_data is None:
        return 0  # a pickled value: small, and its size is not known before it is resolved
    return math.prod(item.tensor_data.size) * item.tensor_data.properties.dtype.itemsize


def _split(items: list[WriteItem]) -> list[list[WriteItem]]:
    """A rank's items in files of about equal bytes: one per SPLIT_BYTES, 1 to FILES_PER_RANK."""
    count = max(1, min(FILES_PER_RANK, sum(map(_item_bytes, items)) // SPLIT_BYTES))
    files: list[list[WriteItem]] = [[] for _ in range(count)]
    loads = [0] * count
    for item in sorted(items, key=_item_bytes, reverse=True):
        emptiest = loads.index(min(loads))
        files[emptiest].append(item)
        loads[emptiest] += _item_bytes(item)
    return [file for file in files if file] or [[]]


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor on the CPU, with a storage of its own size (torch.save writes a whole storage)."""
    tensor = tensor.detach().cpu()
    return tensor.clone() if tensor.untyped_storage().nbytes() != tensor.nbytes else tensor


def _serialize(tensor: torch.Tensor, stream: Any) -> None:
    """torch.save(tensor, stream) without the CRC32 of each record: the file's sha256, computed as
    it is written, covers every byte, and the CRC would cost a core ~0.3 s per 512 MB.
    torch.load reads it the same (the CRC is not checked on load)."""
    writer = torch._C.PyTorchFileWriter(stream, False, serialization_config.save.storage_alignment)
    torch.serialization._save(tensor, writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    writer.write_end_of_file()


class _HashingWrites:
    """Mixed into a DCP filesystem writer: write_data writes a rank's items into up to
    FILES_PER_RANK files in parallel threads, through the hashing `fs`."""

    fs: _Recording
    path: Any

    @property
    def files(self) -> dict[str, FileDigest]:
        """Every file written (shards and, on the coordinator, `.metadata`): its size and sha256."""
        return dict(self.fs.files)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix = plan.storage_data.prefix
        files = _split(plan.items)
        names = [f"{prefix}{n}{DEFAULT_SUFFIX}" for n in range(len(files))]
        with ThreadPoolExecutor(len(files), thread_name_prefix="cellscale-checkpoint-write") as pool:
            written = list(pool.map(self._write_file, names, files, repeat(planner)))
        done: Future[list[WriteResult]] = Future()
        done.set_result([result for results in written for result in results])
        return done

    def _write_file(self, name: str, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "wb") as stream:  # type: ignore[attr-defined]
            return [_write_item(stream, name, item, planner) for item in items]


def _write_item(stream: Any, name: str, item: WriteItem, planner: SavePlanner) -> WriteResult:
    data = planner.resolve_data(item)
    offset = stream.tell()
    if item.type == WriteItemType.BYTE_IO:
        stream.write(data.getbuffer())
    else:
        _serialize(_host(data), stream)
    length = stream.tell() - offset
    return WriteResult(index=item.index, size_in_bytes=length, storage_data=_StorageInfo(name, offset, length))


class LocalWriter(_HashingWrites, FileSystemWriter):
    """DCP writer for a local (POSIX) folder. DCP's own fsync is off: DiskFile fsyncs each file
    after its last write."""

    def __init__(self, path: str):
        super().__init__(path, sync_files=False)
        self.fs = _LocalFiles()
        self.path = self.fs.init_path(path)


class FsspecHashingWriter(_HashingWrites, FsspecWriter):
    """DCP writer for any fsspec URL. DCP's own fsync is off: it cannot reach an object store (it
    would sync this machine's disks instead), where a file is durable once its upload completes."""

    def __init__(self, url: str, **storage_options: Any):
        super().__init__(url, sync_files=False, **storage_options)
        self.fs = _FsspecFiles()
        self.path = self.fs.init_path(url, **storage_options)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _layout(value: Any) -> Any:
    """What a host copy fits: the nesting, the keys and each tensor's kind, shape, dtype and
    device. Other values are not part of it: they are taken as they are at each save."""
    if isinstance(value, DTensor):
        return DTensor, value.placements, tuple(value.to_local().shape), value.dtype, value.device.type
    if isinstance(value, torch.Tensor):
        return type(value), tuple(value.shape), value.dtype, value.device
    if isinstance(value, dict):
        return dict, tuple((key, _layout(item)) for key, item in value.items())
    if isinstance(value, list | tuple):
        return type(value), tuple(_layout(item) for item in value)
    return None


class Staging:
    """The host copy of a state dict that an async save writes from, kept from one save to the
    next, so the training loop waits only for the copy out of the model, not for allocating (and
    first touching) a state's worth of memory. It is pinned when the state is on a GPU, so the
    copies run at full speed; it is rebuilt when the state's layout changes (an optimizer's state
    appears at its first step). The caller must not stage again while a write still reads it."""

    def __init__(self) -> None:
        self._layout: Any = None
        self._copy: dict[str, Any] | None = None

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        state = {key: value.state_dict() if isinstance(value, Stateful) else value for key, value in state_dict.items()}
        layout = _layout(state)
        if self._copy is None or layout != self._layout:
            self._copy = None  # the old copy goes before the new one is allocated
            pin = torch.cuda.is_available() and any(tensor.is_cuda for tensor in _tensors(state))
            self._copy = _create_cpu_state_dict(state, pin_memory=pin)
            self._layout = layout
        # blocking copies: back in the training loop, the state may change at once
        return _copy_state_dict(state, self._copy, non_blocking=False, type_check=False)
