"""Files that outlive a crash and that several processes share: flocks held on the file still at
their path, read-only files written whole by rename, and folders fsynced so what was renamed or made
in them is on disk. The node's dataset cache (datacache) and local checkpoints (cellscale.checkpoint)
write through these."""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def lock(path: Path, operation: int, create: bool = True) -> int | None:
    """A descriptor holding flock `operation` on the file now at `path`; None if LOCK_NB and another holds
    it, or if `path` does not exist and not `create`. Lock files are removed by their exclusive holders, so
    a lock won on a file no longer at `path` is dropped and taken again."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            os.close(fd)
            return None
        if _is_at(fd, path):
            return fd
        os.close(fd)


def _is_at(fd: int, path: Path) -> bool:
    try:
        at = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (at.st_dev, at.st_ino) == (held.st_dev, held.st_ino)


@contextmanager
def exclusive(path: Path, remove: bool = True) -> Iterator[None]:
    """Hold `path` locked exclusively; unless not `remove`, delete it before letting go (see lock)."""
    fd = lock(path, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if remove:
            os.unlink(path)
        os.close(fd)


def write_readonly(path: Path, text: str) -> None:
    """Write a read-only file by rename, so readers see all of it or nothing."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444), "wb") as file:
        file.write(text.encode())
        file.flush()
        os.fsync(file.fileno())
    os.rename(tmp, path)


def fsync_tree(top: Path) -> None:
    for directory, _, _ in os.walk(top, topdown=False):
        fsync_dir(Path(directory))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
