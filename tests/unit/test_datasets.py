"""The researcher's dataset API (cellscale.datasets) and the I/O meter its reads go through."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cellscale
from cellscale import datasets
from cellscale.runtime import ioprofile
from cellscale.runtime.ioprofile import CACHE, IoMeter, MeteredFile, profiled
from cellscale.runtime.jobdir import JobDir
from cellscale.runtime.records import RankIoProfile, SourceReads, StageRecord

from .test_runtime import job_dir, supervise


@pytest.fixture
def meter(monkeypatch) -> IoMeter:
    """A fresh meter as the process's own: each test counts only its reads."""
    fresh = IoMeter()
    monkeypatch.setattr(ioprofile, "METER", fresh)
    return fresh


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """A dataset "bars" staged at tmp_path/cache/bars, as the supervisor announces it."""
    root = tmp_path / "cache" / "bars"
    root.mkdir(parents=True)
    monkeypatch.setenv("CELLSCALE_DATA_BARS", str(root))
    monkeypatch.setenv("CELLSCALE_DATA_BARS_SOURCE", "s3://md/bars/2024")
    return root


def test_data_is_the_staged_copy_and_an_unknown_name_says_what_the_job_has(staged, monkeypatch):
    monkeypatch.setenv("CELLSCALE_DATA_DIR", "/var/cellscale")  # the control plane's own, inherited: no dataset
    assert cellscale.data("bars") == str(staged)
    with pytest.raises(LookupError) as refused:
        cellscale.data("bar")
    assert str(refused.value) == (
        "no dataset 'bar' in this job; it has: bars. Add --data bar=URL@VERSION to the %%cluster line"
    )


def test_a_names_variable_is_upper_case_with_anything_else_as_underscores():
    assert datasets.env_key("bars-2024.v1") == "CELLSCALE_DATA_BARS_2024_V1"


@pytest.mark.parametrize(
    ("url", "label"),
    [
        ("s3://md/bars/2024", "s3://md"),
        ("gs://bucket", "gs://bucket"),
        ("simplecache::s3://md/bars", "s3://md"),
        ("/mnt/nfs/bars", "file:///mnt"),
        ("file:///mnt/nfs/bars", "file:///mnt"),
    ],
)
def test_a_sources_reads_count_under_its_scheme_and_bucket(url, label):
    assert datasets.source_label(url) == label


def test_timed_reads_count_every_byte_under_the_cache(staged, meter):
    payload = os.urandom(3 * 2**20 + 17)
    (staged / "day=1").mkdir()
    (staged / "day=1" / "ticks.bin").write_bytes(payload)
    with datasets.open("bars", "day=1/ticks.bin") as handle:
        assert handle.read(10) == payload[:10]
        assert handle.read() == payload[10:]
    sources = meter.totals().sources
    assert list(sources) == [CACHE] and sources[CACHE][0] == len(payload)
    assert sources[CACHE][1] >= 2 and sources[CACHE][2] > 0


def test_text_mode_reads_lines_and_a_write_mode_is_refused(staged, meter):
    (staged / "symbols.csv").write_text("sym,px\nAAPL,1\n")
    with datasets.open("bars", "symbols.csv", "r") as handle:
        assert handle.readlines() == ["sym,px\n", "AAPL,1\n"]
    assert meter.totals().sources[CACHE][0] == 14
    with pytest.raises(ValueError, match="read-only"):
        datasets.open("bars", "symbols.csv", "wb")


def test_parallel_reads_block_the_process_once(meter):
    """Two threads each blocked 0.2 s at the same time: 0.2 s blocked, not 0.4."""

    class Slow:
        def read(self, size):
            time.sleep(0.2)
            return b"x" * size

    files = [MeteredFile(Slow(), CACHE) for _ in range(2)]
    threads = [threading.Thread(target=f.read, args=(100,)) for f in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    totals = meter.totals()
    assert totals.sources[CACHE][:2] == (200, 2)
    assert 0.19 < totals.blocked_s < 0.35 and 0.19 < totals.sources[CACHE][2] < 0.35


def test_a_forked_child_reads_though_a_thread_held_the_meter_at_the_fork(staged, meter):
    (staged / "a.bin").write_bytes(b"abc")
    with meter._lock:  # as a reading thread holds it, for a moment, at a DataLoader's fork
        pid = os.fork()
        if pid == 0:
            with datasets.open("bars", "a.bin") as handle:
                os._exit(0 if handle.read() == b"abc" else 1)
    deadline = time.monotonic() + 10
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if ended[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert ended[0] == pid and os.waitstatus_to_exitcode(ended[1]) == 0


def write_bars(root, days=3, rows=20_000) -> int:
    """A hive-partitioned Parquet set; its size in bytes."""
    for day in range(days):
        (root / f"day={day}").mkdir()
        table = pa.table({"ts": pa.array(range(rows), pa.int64()), "px": pa.array([day * 0.5] * rows)})
        pq.write_table(table, root / f"day={day}" / "part-0.parquet")
    return sum(p.stat().st_size for p in root.rglob("*.parquet"))


def test_an_arrow_dataset_reads_through_the_meter_with_hive_partitions(staged, meter):
    """Every byte pyarrow read came through the meter: the process's own count (/proc) agrees."""
    size = write_bars(staged, rows=200_000)
    datasets.arrow_dataset("bars").schema  # noqa: B018 - what it imports is read before the count starts
    start = meter.totals()
    before = ioprofile.proc_io()
    table = datasets.arrow_dataset("bars").to_table()
    rchar = ioprofile.proc_io()["rchar"] - before["rchar"]
    assert table.num_rows == 600_000 and sorted(set(table.column("day").to_pylist())) == [0, 1, 2]
    nbytes, reads, _ = meter.totals().since(start).sources[CACHE]
    assert reads > 0 and nbytes > 0.9 * size and abs(nbytes - rchar) < 0.05 * rchar
    datasets.arrow_dataset("bars").to_table(columns=["px"], filter=pa.compute.field("day") == 1)
    assert meter.totals().since(start).sources[CACHE][0] - nbytes < size / 3  # one column of one day: part of a file


def test_a_process_that_scanned_a_dataset_exits_cleanly(staged):
    """pyarrow's threads let go of the handler, files and buffers a moment after a scan returns;
    one that does it while the interpreter finalizes aborts the process (6 exits in 10 did, before
    `cellscale.arrowfs.settle` waited for them at exit)."""
    write_bars(staged, rows=200_000)
    script = "import cellscale.datasets as d\ntable = d.arrow_dataset('bars').to_table()\n"
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True) for _ in range(5)]
    assert [(run.returncode, run.stderr) for run in runs] == [(0, "")] * 5


def test_a_streamed_dataset_reads_from_its_source(monkeypatch, meter):
    import fsspec

    fs = fsspec.filesystem("memory")
    with fs.open("/md/ticks/day=1/part-0.parquet", "wb") as out:
        pq.write_table(pa.table({"px": [1.0, 2.0]}), out)
    written = fs.cat("/md/ticks/day=1/part-0.parquet")
    monkeypatch.setenv("CELLSCALE_DATA_TICKS", "memory://md/ticks")
    monkeypatch.setenv("CELLSCALE_DATA_TICKS_SOURCE", "memory://md/ticks")
    monkeypatch.setenv("CELLSCALE_DATA_TICKS_STORAGE_OPTIONS", "{}")
    try:
        assert cellscale.data("ticks") == "memory://md/ticks"
        with datasets.open("ticks", "day=1/part-0.parquet") as handle:
            assert handle.read() == written
        assert meter.totals().sources["memory://md"][0] == len(written)
        table = datasets.arrow_dataset("ticks").to_table()
        assert table.column("px").to_pylist() == [1.0, 2.0] and table.column("day").to_pylist() == [1, 1]
        assert meter.totals().sources["memory://md"][0] > len(written) and CACHE not in meter.totals().sources
    finally:
        fs.rm("/md", recursive=True)


def test_a_ranks_profile_matches_what_proc_says_it_read(tmp_path, staged, meter):
    payload = os.urandom(8 * 2**20)
    (staged / "big.bin").write_bytes(payload)
    job = JobDir(tmp_path / "job")
    job.attempt_dir(1).mkdir(parents=True)
    with profiled(job, 1), datasets.open("bars", "big.bin") as handle:
        while handle.read(2**20):
            pass
    [profile] = job.read_io(1)
    assert profile.sources[CACHE].bytes == len(payload) and profile.wall_s >= profile.blocked_s > 0
    assert abs(profile.proc_rchar - len(payload)) < 0.05 * len(payload)


def test_a_jobs_rank_writes_its_profile_when_its_cell_ends(tmp_path):
    """Through the real supervisor, rank and fork: the cell reads 4 MiB of a staged copy."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "ticks.bin").write_bytes(os.urandom(4 * 2**20))
    source = "import cellscale.datasets as d\nwith d.open('ticks', 'ticks.bin') as f:\n    n = len(f.read())\n"
    env = {"CELLSCALE_DATA_TICKS": str(cache), "CELLSCALE_DATA_TICKS_SOURCE": "s3://md/ticks"}
    jd = job_dir(tmp_path, source, env=env)
    supervise(jd)
    assert jd.read_exit(1).reason == "succeeded", jd.log.read_text()
    [profile] = jd.read_io(1)
    assert profile.rank == 0 and profile.sources[CACHE].bytes == 4 * 2**20
    assert abs(profile.proc_rchar - 4 * 2**20) < 0.05 * 4 * 2**20


def test_a_cell_that_never_uses_its_datasets_writes_no_profile(tmp_path):
    jd = job_dir(tmp_path, "x = 1")
    supervise(jd)
    assert jd.read_exit(1).reason == "succeeded" and jd.read_io(1) == []


def test_stage_and_io_records_read_back_what_was_written(tmp_path):
    job = JobDir(tmp_path)
    job.node_dir(1, 0).mkdir(parents=True)
    assert job.read_stage(1, 0) == [] and job.read_io(1) == []
    stages = [
        StageRecord(node=0, name="bars", url="s3://md/bars/2024", hit=False, bytes=10, fetched_bytes=10, seconds=1.5),
        StageRecord(node=0, name="refs", url="s3://md/refs", hit=True, bytes=4, fetched_bytes=0, seconds=0.01),
    ]
    job.write_stage(1, 0, stages)
    assert job.read_stage(1, 0) == stages
    profiles = [
        RankIoProfile(
            rank=rank,
            node=0,
            host="n1",
            wall_s=2.0,
            blocked_s=0.5,
            sources={CACHE: SourceReads(bytes=9, reads=1, read_s=0.5)},
            at=1.0,
        )
        for rank in (1, 0)
    ]
    for profile in profiles:
        job.write_io(1, profile)
    assert job.read_io(1) == profiles[::-1]
    (job.node_dir(1, 0) / "stage.json").write_text('[{"node": 0, "na')  # torn: reads as none, never raises
    assert job.read_stage(1, 0) == []
