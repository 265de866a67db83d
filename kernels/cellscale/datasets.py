"""The datasets a job reads, by the names its `%%cluster --data NAME=URL@VERSION` gave them.

    path = cellscale.data("bars")                     # the node's staged copy (or the URL, streamed)
    with cellscale.datasets.open("bars", "2024/01/02.csv", "r") as f: ...
    table = cellscale.datasets.arrow_dataset("bars").to_table(columns=["px"])

Before the ranks start, each node's supervisor stages every dataset into the node's cache and
sets, in each rank's environment, CELLSCALE_DATA_<NAME> (NAME upper-cased, anything but
letters and digits as "_") to the staged copy's directory, CELLSCALE_DATA_<NAME>_SOURCE to the
dataset's URL and, where it has some, CELLSCALE_DATA_<NAME>_STORAGE_OPTIONS to fsspec's storage
options (JSON). Streamed (`--data-mode stream`), CELLSCALE_DATA_<NAME> is the URL itself.

Reads through `open` and `arrow_dataset` are timed and counted into the process's I/O meter
(`cellscale.runtime.ioprofile`): reads of a staged copy as "cache", the others by their
source ("s3://md"). Each rank's profile goes to the job directory when its cell ends, and the
job's I/O verdict is built from them.
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cellscale.runtime.ioprofile import CACHE, MeteredFile

if TYPE_CHECKING:
    import fsspec
    import pyarrow.dataset

PREFIX = "CELLSCALE_DATA_"
SOURCE_SUFFIX = "_SOURCE"
OPTIONS_SUFFIX = "_STORAGE_OPTIONS"


class UnknownDataset(LookupError):
    """The job has no dataset of that name."""


@dataclass(frozen=True)
class Dataset:
    """One dataset as this rank sees it: where to read it, and the source its reads count under."""

    name: str
    location: str  # the staged copy's directory, or the source's URL when streamed
    source: str  # the dataset's URL
    storage_options: dict[str, Any]

    @property
    def staged(self) -> bool:
        return "://" not in self.location and self.location != self.source

    @property
    def label(self) -> str:
        return CACHE if self.staged else source_label(self.source)

    def open_raw(self, relpath: str) -> Any:
        """One of its files, unbuffered: a staged copy's straight from the OS (no fsspec import)."""
        if self.staged:
            return io.FileIO(_join(self.location, relpath))
        fs, root = self.filesystem()
        return fs.open(_join(root, relpath), "rb")

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        """The fsspec filesystem its files are read from, and its root there."""
        from fsspec.core import url_to_fs

        if self.staged:
            from fsspec.implementations.local import LocalFileSystem

            return LocalFileSystem(), self.location
        return url_to_fs(self.location, **self.storage_options)


def data(name: str) -> str:
    """The dataset's directory on this node (its staged copy), or its fsspec URL when streamed."""
    return dataset(name).location


def open(name: str, relpath: str, mode: str = "rb") -> io.IOBase:  # noqa: A001 - cellscale.datasets.open, as the builtin
    """A file of the dataset, for reading ("rb" or "r"); its reads count into the I/O profile."""
    if mode not in ("rb", "r", "rt"):
        raise ValueError(f"a dataset is read-only: open {relpath!r} with mode 'rb' or 'r', not {mode!r}")
    found = dataset(name)
    binary = io.BufferedReader(MeteredFile(found.open_raw(relpath), found.label))
    return binary if mode == "rb" else io.TextIOWrapper(binary)


def arrow_dataset(name: str, **kwargs: Any) -> pyarrow.dataset.Dataset:
    """`pyarrow.dataset.dataset` over the dataset (hive partitioning unless `partitioning=`
    says otherwise; other arguments as pyarrow's), its file reads counted into the I/O profile."""
    import pyarrow.dataset as ds
    from pyarrow.fs import PyFileSystem

    from cellscale.arrowfs import MeteredHandler

    found = dataset(name)
    fs, root = found.filesystem()
    kwargs.setdefault("partitioning", "hive")
    return ds.dataset(root, filesystem=PyFileSystem(MeteredHandler(fs, found.label, found.staged)), **kwargs)


def dataset(name: str) -> Dataset:
    """The job's dataset of that name, from the environment the supervisor set."""
    env = os.environ
    key = env_key(name)
    if key not in job_datasets(env):
        have = ", ".join(sorted(job_datasets(env).values())) or "none"
        raise UnknownDataset(
            f"no dataset {name!r} in this job; it has: {have}. Add --data {name}=URL@VERSION to the %%cluster line"
        )
    options = env.get(f"{key}{OPTIONS_SUFFIX}")
    return Dataset(name, env[key], env[f"{key}{SOURCE_SUFFIX}"], json.loads(options) if options else {})


def job_datasets(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The job's datasets, {environment variable: name as written, lower-case}: a
    CELLSCALE_DATA_<NAME> with its CELLSCALE_DATA_<NAME>_SOURCE beside it (so that the control
    plane's own CELLSCALE_DATA_DIR, inherited by a local job, is none)."""
    return {
        key: key.removeprefix(PREFIX).lower()
        for key in env
        if key.startswith(PREFIX) and f"{key}{SOURCE_SUFFIX}" in env
    }


def env_key(name: str) -> str:
    """The environment variable of a dataset: "bars-2024" -> CELLSCALE_DATA_BARS_2024."""
    return PREFIX + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def source_label(url: str) -> str:
    """What a source's reads count under: its scheme and bucket ("s3://md/bars/2024" -> "s3://md"),
    a local path's first directory ("/mnt/nfs/bars" -> "file:///mnt")."""
    url = url.rsplit("::", 1)[-1]  # a chained fsspec URL ("simplecache::s3://...") reads its last one
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "file", url
    if scheme in ("file", "local"):
        return "file:///" + rest.lstrip("/").split("/", 1)[0]
    return f"{scheme}://{rest.split('/', 1)[0]}"


def _join(root: str, relpath: str) -> str:
    return root.rstrip("/") + "/" + relpath.lstrip("/")
