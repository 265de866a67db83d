"""A job's I/O profile: what its ranks read through cellscale.datasets (each rank's profile)
and what its nodes staged, summed into the view the notebook and the panel show, with a
verdict in words from `verdict` (pure: the thresholds and estimates are here)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cellscale.runtime.ioprofile import CACHE
from cellscale.runtime.records import RankIoProfile, StageRecord
from cellscale.spec import IoProfileView, IoRankView, IoSourceView, StageView

IO_BOUND = 0.20
"""A job whose ranks spend this share of their time blocked in reads is I/O-bound."""
LOCAL_READ_MB_S = 1000.0
"""A staged copy's read rate (one reader, MB/s) for the estimate of what staging would save,
when the job read too little from its node cache to measure its own."""
MEASURED_CACHE_BYTES = 64 * 2**20
"""Cache reads of at least this many bytes give the job's own local read rate."""
READ_LESS = "read fewer bytes (columns, filters) or overlap reads with compute"
RANKS_SHOWN = 16
"""The view lists this many ranks, the most blocked first: a 1000-rank job's view stays small."""


@dataclass(frozen=True)
class Verdict:
    io_bound: bool
    words: str


def io_profile(attempt: int, ranks: Sequence[RankIoProfile], stages: Sequence[StageRecord]) -> IoProfileView | None:
    """The attempt's profile from its ranks' and nodes' records; None when it has neither."""
    if not ranks and not stages:
        return None
    sources = source_views(ranks)
    wall_s, blocked_s = sum(r.wall_s for r in ranks), sum(r.blocked_s for r in ranks)
    read = sum(s.bytes for s in sources)
    cached = sum(s.bytes for s in sources if s.source == CACHE)
    found = verdict(wall_s, blocked_s, sources)
    return IoProfileView(
        attempt=attempt,
        verdict=found.words,
        io_bound=found.io_bound,
        blocked_fraction=_fraction(blocked_s, wall_s),
        bytes=read,
        cache_hit_ratio=cached / read if read else None,
        sources=sources,
        rank_count=len(ranks),
        ranks=sorted(map(rank_view, ranks), key=lambda r: (-r.blocked_fraction, r.rank))[:RANKS_SHOWN],
        staging=stage_views(stages),
    )


def source_views(ranks: Sequence[RankIoProfile]) -> list[IoSourceView]:
    """Each source's reads summed over the ranks, most bytes first."""
    sums: dict[str, list[float]] = {}
    for rank in ranks:
        for label, reads in rank.sources.items():
            total = sums.setdefault(label, [0, 0, 0.0])
            total[0] += reads.bytes
            total[1] += reads.reads
            total[2] += reads.read_s
    views = [
        IoSourceView(
            source=label,
            bytes=int(nbytes),
            reads=int(count),
            read_s=read_s,
            mb_per_s=nbytes / read_s / 1e6 if read_s > 0 else None,
        )
        for label, (nbytes, count, read_s) in sums.items()
    ]
    return sorted(views, key=lambda v: -v.bytes)


def stage_views(stages: Sequence[StageRecord]) -> list[StageView]:
    """Each dataset's staging over the nodes, in the order they staged them."""
    by_name: dict[str, list[StageRecord]] = {}
    for stage in stages:
        by_name.setdefault(stage.name, []).append(stage)
    return [
        StageView(
            name=name,
            url=records[0].url,
            nodes=len(records),
            hits=sum(r.hit for r in records),
            bytes=max(r.bytes for r in records),
            fetched_bytes=sum(r.fetched_bytes for r in records),
            seconds=max(r.seconds for r in records),
        )
        for name, records in by_name.items()
    ]


def rank_view(rank: RankIoProfile) -> IoRankView:
    return IoRankView(
        rank=rank.rank,
        host=rank.host,
        wall_s=rank.wall_s,
        blocked_s=rank.blocked_s,
        blocked_fraction=_fraction(rank.blocked_s, rank.wall_s),
        bytes=sum(s.bytes for s in rank.sources.values()),
        proc_rchar=rank.proc_rchar,
        proc_read_bytes=rank.proc_read_bytes,
    )


def verdict(wall_s: float, blocked_s: float, sources: Sequence[IoSourceView]) -> Verdict:
    """Whether the job waited on its reads, where, and what would help, in one line. `wall_s` and
    `blocked_s` are summed over the ranks, as are the sources' bytes and read seconds."""
    read = sum(s.bytes for s in sources)
    if not read:
        return Verdict(False, "no dataset reads measured (cellscale.datasets.open and arrow_dataset are)")
    fraction = _fraction(blocked_s, wall_s)
    if fraction < IO_BOUND:
        return Verdict(False, f"not I/O-bound: {percent(fraction)} of step time in reads ({_whence(sources)})")
    remote = [s for s in sources if s.source != CACHE]
    cache = [s for s in sources if s.source == CACHE]
    remote_s = sum(s.read_s for s in remote)
    if cache and remote_s <= sum(s.read_s for s in cache):
        rate = f" at {cache[0].mb_per_s:.0f} MB/s" if cache[0].mb_per_s else ""
        return Verdict(True, f"I/O-bound: {percent(fraction)} of step time reading the node cache{rate}; {READ_LESS}")
    waiting = f"I/O-bound: {percent(fraction)} of step time waiting on {max(remote, key=lambda s: s.read_s).source}"
    local_mb_s = _local_rate(cache)
    staged_s = max(0.0, blocked_s - remote_s) + sum(s.bytes for s in remote) / 1e6 / local_mb_s
    staged = _fraction(staged_s, wall_s - blocked_s + staged_s)
    if staged >= fraction:
        return Verdict(
            True, f"{waiting}; staging would not cut it (the node cache reads at {local_mb_s:.0f} MB/s): {READ_LESS}"
        )
    return Verdict(True, f"{waiting}; staging would cut it to {estimate(staged)}")


def percent(fraction: float) -> str:
    """A measured share: "38%", "<1%" (some, but under half a percent), ">99%"."""
    rounded = round(fraction * 100)
    if rounded == 0 and fraction > 0:
        return "<1%"
    if rounded == 100 and fraction < 1:
        return ">99%"
    return f"{rounded}%"


def estimate(fraction: float) -> str:
    """An estimated share, as a bound under 10% ("<2%" for 1.3%), else roughly ("about 24%")."""
    pct = fraction * 100
    return f"<{math.floor(pct) + 1}%" if pct < 10 else f"about {round(pct)}%"


def _whence(sources: Sequence[IoSourceView]) -> str:
    read = sum(s.bytes for s in sources)
    cached = sum(s.bytes for s in sources if s.source == CACHE)
    if cached == read:
        return "all from the node cache"
    if cached == 0:
        return f"all from {sources[0].source}" if len(sources) == 1 else "none from the node cache"
    return f"{percent(cached / read)} from the node cache"


def _local_rate(cache: Sequence[IoSourceView]) -> float:
    """MB/s a staged copy reads at: the job's own cache reads' rate when they were enough to tell."""
    measured = cache[0] if cache else None
    if measured and measured.bytes >= MEASURED_CACHE_BYTES and measured.mb_per_s:
        return measured.mb_per_s
    return LOCAL_READ_MB_S


def _fraction(part: float, whole: float) -> float:
    return min(1.0, part / whole) if whole > 0 else 0.0
