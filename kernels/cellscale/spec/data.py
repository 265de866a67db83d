"""Datasets on the wire: the datasets a job reads (`DatasetRef`), and how its reads went
(its staging and I/O profile views)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from cellscale.spec.fields import Name, Strict

DataUrl = Annotated[str, StringConstraints(max_length=1024, pattern=r"^([a-z][a-z0-9+.-]*://|/)[^\s\x00-\x1f\x7f]*$")]
"""An fsspec URL (`s3://bucket/prefix`, `gs://...`, `file:///path`) or an absolute path: one line."""
DataVersion = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")]
"""An etag, manifest hash or snapshot id (`v42`, `sha256:ab12...`, `2026-12-01`)."""


class DatasetRef(Strict):
    """A dataset a job reads: a name registered in the tenancy (which gives its URL, version and
    home site), or a name with its own URL (`bars=s3://md/bars/2024@v42`). The control plane
    stores it resolved, so a job records the exact version it read."""

    name: Name
    url: DataUrl | None = Field(None, description="fsspec URL of its directory or file; absent: the tenancy's.")
    version: DataVersion | None = Field(
        None,
        description="Its version (etag, manifest hash or snapshot id): a node's cached copy of it is used without "
        "asking the source again. Absent: what is there when it is staged (listed each time).",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        description="fsspec options that are not secrets (an endpoint_url); the tenancy's for a registered name.",
    )

    @classmethod
    def parse(cls, text: str) -> DatasetRef:
        """`name`, or `name=URL` with an optional `@version` after the URL's last slash."""
        name, _, location = text.partition("=")
        if not location:
            return cls(name=name)
        url, at, version = location.rpartition("@")
        if not at or "/" in version:
            return cls(name=name, url=location)
        return cls(name=name, url=url, version=version)

    def words(self) -> str:
        """How the magic spells it."""
        if self.url is None:
            return self.name
        return f"{self.name}={self.url}" + (f"@{self.version}" if self.version else "")


class IoSourceView(BaseModel):
    """What a job's ranks read from one source."""

    source: str = Field(
        description='"cache": the nodes\' staged copies; else the source\'s scheme and bucket ("s3://md").'
    )
    bytes: int
    reads: int = Field(description="Read calls.")
    read_s: float = Field(description="Seconds the ranks were blocked reading it, summed over the ranks.")
    mb_per_s: float | None = Field(description="bytes / read_s in MB/s (10^6): one rank's read rate (null: no time).")


class IoRankView(BaseModel):
    """One rank's reads over its cell's run."""

    rank: int
    host: str
    wall_s: float = Field(description="Seconds the cell ran.")
    blocked_s: float = Field(description="Seconds with a dataset read in flight.")
    blocked_fraction: float = Field(description="blocked_s / wall_s.")
    bytes: int = Field(description="Bytes it read through cellscale.datasets.")
    proc_rchar: int | None = Field(None, description="Bytes every read of the process returned (/proc/self/io).")
    proc_read_bytes: int | None = Field(None, description="Bytes the process fetched from storage (/proc/self/io).")


class StageView(BaseModel):
    """How one dataset was staged on the job's nodes before the ranks started."""

    name: str
    url: str
    nodes: int = Field(description="Nodes that staged it.")
    hits: int = Field(description="Of those, the nodes whose cache had it already (nothing fetched).")
    bytes: int = Field(description="The staged copy's size.")
    fetched_bytes: int = Field(description="Bytes fetched from the source, all nodes together.")
    seconds: float = Field(description="The slowest node's staging time.")


class IoProfileView(BaseModel):
    """Where a job's reads came from and what they cost it: its newest attempt's profile (each
    rank's reads through cellscale.datasets), with a verdict in words."""

    attempt: int
    verdict: str = Field(
        description='e.g. "I/O-bound: 38% of step time waiting on s3://md; staging would cut it to <2%", '
        '"not I/O-bound: 1% of step time in reads (92% from the node cache)".'
    )
    io_bound: bool = Field(description="Its ranks spent at least 20% of their time blocked in reads.")
    blocked_fraction: float = Field(description="Seconds blocked in reads / seconds the cells ran, over all ranks.")
    bytes: int = Field(description="Bytes its ranks read through cellscale.datasets.")
    cache_hit_ratio: float | None = Field(description="Of those bytes, the share served by staged copies (null: none).")
    sources: list[IoSourceView] = Field(default_factory=list, description="By bytes read, most first.")
    rank_count: int = Field(0, description="Ranks that wrote a profile.")
    ranks: list[IoRankView] = Field(
        default_factory=list, description="The most blocked ranks first, at most 16 (a big job's list stays short)."
    )
    staging: list[StageView] = Field(default_factory=list, description="Each dataset's staging, over the nodes.")
