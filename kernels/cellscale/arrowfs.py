"""A pyarrow filesystem whose file reads go through the process's I/O meter, for
`cellscale.datasets.arrow_dataset`: listing and metadata as fsspec has them, every opened file
an `ArrowFile` (a staged copy's opened unbuffered, so Parquet's ranged reads go straight to the
OS, into pyarrow's own memory, as through pyarrow's local filesystem).

pyarrow's I/O threads hold these Python objects (the handler, its files, the buffers read) and
let go of them a moment after a scan returns. A thread that takes the GIL once the interpreter
is finalizing ends the process ("terminate called without an active exception", exit 134,
apache/arrow#34314): `settle`, at exit, waits until they have let go.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import time
import weakref
from typing import Any

import pyarrow as pa
from pyarrow import PythonFile
from pyarrow.fs import FSSpecHandler

from cellscale.runtime.ioprofile import MeteredFile

SETTLE_S = 2.0
"""The longest the process waits at exit for pyarrow's threads to let go of its Python objects
(they take milliseconds; a dataset still referenced at exit keeps its handler to the end)."""
_HELD: dict[int, weakref.ref[Any]] = {}
"""The Python objects pyarrow's threads may hold (handlers, files, buffers), by their weak
reference's id (a handler is not hashable)."""


class ArrowFile(MeteredFile):
    """A metered file as pyarrow reads it: `read_buffer` fills a buffer of pyarrow's memory pool
    (no bytes object per read, and memory pyarrow reuses)."""

    def read_buffer(self, size: int = -1) -> pa.Buffer:
        if size < 0:
            size = self._size() - self.tell()
        buffer = pa.allocate_buffer(size)
        view, got = memoryview(buffer), 0
        while got < size and (n := self.readinto(view[got:])):
            got += n
        return _held(buffer if got == size else buffer.slice(0, got))

    def _size(self) -> int:
        here = self.tell()
        end = self.seek(0, os.SEEK_END)
        self.seek(here)
        return end


class MeteredHandler(FSSpecHandler):
    def __init__(self, fs: Any, label: str, local: bool):
        super().__init__(fs)
        self.label = label
        self.local = local
        _held(self)

    def open_input_stream(self, path: str) -> PythonFile:
        return PythonFile(self._open(path), mode="r")

    def open_input_file(self, path: str) -> PythonFile:
        if not self.local and not self.fs.isfile(path):  # a local open says so itself
            raise FileNotFoundError(path)
        return PythonFile(self._open(path), mode="r")

    def _open(self, path: str) -> ArrowFile:
        raw = io.FileIO(path) if self.local else self.fs.open(path, mode="rb")
        return _held(ArrowFile(raw, self.label))


def _held(thing: Any) -> Any:
    ref = weakref.ref(thing, lambda gone: _HELD.pop(id(gone), None))
    _HELD[id(ref)] = ref
    return thing


@atexit.register
def settle() -> None:
    """Before the interpreter finalizes: free what only cycles keep (a cell's namespace), then
    wait, at most SETTLE_S, until pyarrow's threads have let go of every object of ours."""
    gc.collect()
    deadline = time.monotonic() + SETTLE_S
    while _HELD and time.monotonic() < deadline:
        time.sleep(0.005)
