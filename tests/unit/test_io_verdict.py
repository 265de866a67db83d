"""A job's I/O profile from its ranks' and nodes' records, and its verdict in words."""

from __future__ import annotations

import pytest

from cellscale.runtime.ioprofile import CACHE
from cellscale.runtime.records import RankIoProfile, SourceReads, StageRecord
from cellscale.spec import IoSourceView
from cellscale_hub.drivers.ioprofile import RANKS_SHOWN, estimate, io_profile, percent, verdict

MB = 10**6


def source(label: str, mb: float, read_s: float) -> IoSourceView:
    nbytes = int(mb * MB)
    return IoSourceView(source=label, bytes=nbytes, reads=1, read_s=read_s, mb_per_s=mb / read_s if read_s else None)


@pytest.mark.parametrize(
    ("wall_s", "blocked_s", "sources", "io_bound", "words"),
    [
        (100, 0, [], False, "no dataset reads measured (cellscale.datasets.open and arrow_dataset are)"),
        (
            100,
            1,
            [source(CACHE, 920, 0.9), source("s3://md", 80, 0.1)],
            False,
            "not I/O-bound: 1% of step time in reads (92% from the node cache)",
        ),
        (100, 5, [source(CACHE, 500, 5)], False, "not I/O-bound: 5% of step time in reads (all from the node cache)"),
        (
            100,
            19.4,
            [source("s3://md", 50, 19.4)],
            False,
            "not I/O-bound: 19% of step time in reads (all from s3://md)",
        ),
        (
            100,
            10,
            [source("s3://md", 50, 5), source("gs://x", 50, 5)],
            False,
            "not I/O-bound: 10% of step time in reads (none from the node cache)",
        ),
        (
            1000,
            0.2,
            [source(CACHE, 200, 0.2)],
            False,
            "not I/O-bound: <1% of step time in reads (all from the node cache)",
        ),
        # 38 s of 100 waiting on S3 for 1 GB; staged at 1000 MB/s: 1 s of 63 s
        (
            100,
            38,
            [source("s3://md", 1000, 38)],
            True,
            "I/O-bound: 38% of step time waiting on s3://md; staging would cut it to <2%",
        ),
        # 30 GB at 500 MB/s from S3, staged at 1000 MB/s: 30 s of 70 s
        (
            100,
            60,
            [source("s3://md", 30_000, 60)],
            True,
            "I/O-bound: 60% of step time waiting on s3://md; staging would cut it to about 43%",
        ),
        # the cache read enough to measure its own rate (100 MB/s), slower than S3 (263 MB/s)
        (
            100,
            40,
            [source("s3://md", 10_000, 38), source(CACHE, 200, 2)],
            True,
            "I/O-bound: 40% of step time waiting on s3://md; staging would not cut it (the node cache reads at "
            "100 MB/s): read fewer bytes (columns, filters) or overlap reads with compute",
        ),
        (
            100,
            50,
            [source("gs://a", 100, 10), source("s3://md", 100, 40)],
            True,
            "I/O-bound: 50% of step time waiting on s3://md; staging would cut it to <1%",
        ),
        (
            100,
            45,
            [source(CACHE, 9000, 44), source("s3://md", 10, 1)],
            True,
            "I/O-bound: 45% of step time reading the node cache at 205 MB/s; "
            "read fewer bytes (columns, filters) or overlap reads with compute",
        ),
    ],
)
def test_the_verdict(wall_s, blocked_s, sources, io_bound, words):
    found = verdict(wall_s, blocked_s, sources)
    assert (found.io_bound, found.words) == (io_bound, words)


@pytest.mark.parametrize(
    ("fraction", "measured", "estimated"),
    [
        (0.0, "0%", "<1%"),
        (0.004, "<1%", "<1%"),
        (0.013, "1%", "<2%"),
        (0.02, "2%", "<3%"),
        (0.099, "10%", "<10%"),
        (0.1, "10%", "about 10%"),
        (0.376, "38%", "about 38%"),
        (0.996, ">99%", "about 100%"),
        (1.0, "100%", "about 100%"),
    ],
)
def test_shares_in_words(fraction, measured, estimated):
    assert (percent(fraction), estimate(fraction)) == (measured, estimated)


def rank(number: int, blocked_s: float, **sources: tuple[int, float]) -> RankIoProfile:
    reads = {
        label.replace("_", "://", 1) if label != CACHE else CACHE: SourceReads(bytes=b, reads=2, read_s=s)
        for label, (b, s) in sources.items()
    }
    return RankIoProfile(
        rank=number,
        node=number // 2,
        host=f"n{number // 2}",
        wall_s=10.0,
        blocked_s=blocked_s,
        sources=reads,
        proc_rchar=100,
        proc_read_bytes=50,
        at=0.0,
    )


def test_the_profile_sums_its_ranks_and_its_nodes_staging():
    ranks = [rank(0, 1.0, cache=(600, 0.5), s3_md=(200, 0.5)), rank(1, 3.0, cache=(200, 3.0))]
    stages = [
        StageRecord(node=0, name="bars", url="s3://md/bars", hit=True, bytes=800, fetched_bytes=0, seconds=0.1),
        StageRecord(node=1, name="bars", url="s3://md/bars", hit=False, bytes=800, fetched_bytes=800, seconds=4.0),
    ]
    profile = io_profile(2, ranks, stages)
    assert profile.attempt == 2 and profile.bytes == 1000 and profile.cache_hit_ratio == 0.8
    assert profile.blocked_fraction == pytest.approx(0.2) and profile.io_bound
    assert [(s.source, s.bytes, s.reads, s.read_s) for s in profile.sources] == [
        (CACHE, 800, 4, 3.5),
        ("s3://md", 200, 2, 0.5),
    ]
    assert [(r.rank, r.blocked_fraction, r.bytes, r.proc_rchar) for r in profile.ranks] == [
        (1, 0.3, 200, 100),
        (0, 0.1, 800, 100),
    ]
    [bars] = profile.staging
    assert (bars.nodes, bars.hits, bars.bytes, bars.fetched_bytes, bars.seconds) == (2, 1, 800, 800, 4.0)


def test_a_big_jobs_profile_lists_its_most_blocked_ranks_only():
    profile = io_profile(1, [rank(n, n / 100, cache=(10, n / 100)) for n in range(64)], [])
    assert profile.rank_count == 64 and len(profile.ranks) == RANKS_SHOWN
    assert [r.rank for r in profile.ranks[:2]] == [63, 62]


def test_an_attempt_without_records_has_no_profile():
    assert io_profile(1, [], []) is None
