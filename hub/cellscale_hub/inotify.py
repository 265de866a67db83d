"""Being told when a directory's files change: Linux inotify, through ctypes (no dependency).

Only writes made on this host are reported: a file on a shared filesystem (NFS, Lustre) that
another host appends to changes without an event. Callers that care keep a slow check of
their own for those (see `cellscale_hub.api.logwatch`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from pathlib import Path

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000

CHANGES = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF
"""What a watch reports: a file in the directory written, made or moved in; the directory gone."""

OVERFLOW = -1
"""The watch of an event that says events were dropped (the queue was full): anything may have changed."""

_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name, NUL-padded)


class Inotify:
    """One inotify instance (one file descriptor, non-blocking): watches on directories, and
    the events they queued, as (watch, mask, name) triples."""

    def __init__(self):
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify is Linux only")
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._check(self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC), "inotify_init1")

    def watch(self, directory: Path) -> int:
        """Watch a directory's files; the same directory twice gives the same watch. Raises
        FileNotFoundError when it does not exist, OSError(ENOSPC) past the user's watch limit."""
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(directory), CHANGES | IN_ONLYDIR)
        return self._check(wd, str(directory))

    def unwatch(self, wd: int) -> None:
        """Stop a watch (nothing happens if it is already gone with its directory)."""
        self._libc.inotify_rm_watch(self.fd, wd)

    def read(self) -> list[tuple[int, int, str]]:
        """Every event queued so far, oldest first; [] when there is none."""
        events = []
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return events
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = os.fsdecode(data[offset : offset + length].rstrip(b"\0"))
                offset += length
                events.append((wd, mask, name))

    def close(self) -> None:
        os.close(self.fd)

    @staticmethod
    def _check(result: int, what: str) -> int:
        if result < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), what)
        return result
