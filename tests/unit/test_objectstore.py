"""cellscale_hub.dev.objectstore: moto's S3 on loopback behind a simulated WAN (request log, latency, one
token bucket over all connections) and the synthetic bars dataset."""

from __future__ import annotations

import time

import pytest
import s3fs

from cellscale_hub.dev.objectstore import ObjectStore, S3Request, TokenBucket, write_synthetic_bars


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_token_bucket_paces_all_takers_together_at_its_rate():
    clock = Clock()
    bucket = TokenBucket(rate=100.0, burst=50.0, clock=clock)
    assert bucket.take(50) == 0.0  # the burst, from idle
    assert bucket.take(100) == pytest.approx(1.0)
    assert bucket.take(100) == pytest.approx(2.0)  # a second taker queues behind the first
    clock.now = 2.0
    assert bucket.take(10) == pytest.approx(0.1)
    clock.now = 100.0
    assert bucket.take(60) == pytest.approx(0.1)  # idle refills at most the burst


def test_s3fs_round_trip_and_every_request_is_counted():
    with ObjectStore(rate_mb_s=None, latency_ms=0) as store:
        fs = s3fs.S3FileSystem(**store.storage_options)
        fs.mkdir("bkt")
        fs.pipe_file("bkt/dir/obj", b"x" * 1000)
        store.reset_requests()
        assert fs.cat_file("bkt/dir/obj", start=10, end=20) == b"x" * 10
        assert fs.ls("bkt/dir", refresh=True) == ["bkt/dir/obj"]
        assert store.requests == [
            S3Request("GET", "bkt", "dir/obj", "bytes=10-19"),
            S3Request("GET", "bkt", None, None),
        ]
        assert store.gets("dir/") == store.requests[:1] and store.gets("other/") == []
        assert set(store.environment) == {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        with pytest.raises(RuntimeError, match="already running"):
            ObjectStore().start()


def test_responses_wait_the_latency_and_share_the_rate():
    """Lower bounds only (sleeps can only be longer under load): 20 MB/s over 1 MB needs 45 ms past the
    128 KiB burst, and each of the two requests waits 30 ms first."""
    with ObjectStore(rate_mb_s=20, latency_ms=30) as store:
        fs = s3fs.S3FileSystem(**store.storage_options)
        fs.mkdir("bkt")
        fs.pipe_file("bkt/obj", bytes(10**6))
        started = time.perf_counter()
        assert len(fs.cat_file("bkt/obj")) == 10**6
        assert fs.info("bkt/obj", refresh=True)["size"] == 10**6
        assert time.perf_counter() - started >= 2 * 0.030 + (10**6 - 128 * 2**10) / 20e6


def test_synthetic_bars_are_hive_partitioned_parquet_of_about_the_size_asked(tmp_path):
    import pyarrow.dataset as ds

    bars = write_synthetic_bars(f"file://{tmp_path}/bars", 2 * 10**6, files=4, seed=7)
    assert [path for path, _ in bars.files] == [f"day=2024-01-0{d}/part-0.parquet" for d in (2, 3, 4, 5)]
    assert 0.8 * 2 * 10**6 < bars.bytes < 1.2 * 2 * 10**6
    table = ds.dataset(tmp_path / "bars", partitioning="hive").to_table()
    assert table.num_rows == bars.rows
    assert {"symbol", "ts", "open", "high", "low", "close", "volume", "day"} == set(table.column_names)
    write_synthetic_bars(f"file://{tmp_path}/again", 2 * 10**6, files=4, seed=7)
    assert (tmp_path / "again" / bars.files[0][0]).read_bytes() == (tmp_path / "bars" / bars.files[0][0]).read_bytes()
