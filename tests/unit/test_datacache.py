"""cellscale.runtime.datacache: one fetch per node, atomic publish, LRU within a cap and a free-space floor,
never evicting an entry in use, verified checksums, pinned versions served without asking the source."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import shutil
import signal
import stat
import time
from collections import Counter
from pathlib import Path

import pytest

from cellscale.runtime import datacache
from cellscale.runtime.datacache import CacheFull, ChecksumMismatch, DataSource, NodeCache, SourceChanged
from cellscale_hub.dev.objectstore import ObjectStore

FORK = multiprocessing.get_context("fork")  # children start in milliseconds and inherit the test's patches


def write_files(directory: Path, sizes: dict[str, int], seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    contents = {name: rng.randbytes(size) for name, size in sizes.items()}
    for name, data in contents.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return contents


def source(tmp_path: Path, name: str, sizes: dict[str, int], version: str | None = None, seed: int = 0):
    directory = tmp_path / "sources" / name
    contents = write_files(directory, sizes, seed)
    return DataSource(name, f"file://{directory}", version), contents


def assert_holds(path: Path, contents: dict[str, bytes]) -> None:
    found = {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert found == contents


def test_a_miss_fetches_once_and_a_hit_returns_the_same_read_only_entry(tmp_path):
    src, contents = source(tmp_path, "bars", {"a.bin": 3000, "sub/b.bin": 10, "empty": 0})
    cache = NodeCache(tmp_path / "cache")
    first = cache.stage(src)
    assert (first.hit, first.fetched_bytes, first.bytes, first.files) == (False, 3010, 3010, 3)
    assert_holds(first.path, contents)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in first.path.rglob("*") if p.is_file())
    manifest = datacache._read_json(first.path.parent / "manifest.json")
    assert {f["path"]: f["md5"] for f in manifest["files"]} == {
        name: hashlib.md5(data).hexdigest() for name, data in contents.items()
    }
    again = cache.stage(src)
    assert (again.hit, again.fetched_bytes, again.key, again.path) == (True, 0, first.key, first.path)
    assert [e.key for e in cache.entries()] == [first.key]


def test_a_one_file_url_stages_the_directory_holding_that_file(tmp_path):
    src, contents = source(tmp_path, "one", {"x.parquet": 100})
    result = NodeCache(tmp_path / "cache").stage(DataSource("x", f"{src.url}/x.parquet"))
    assert_holds(result.path, contents)


def test_a_pinned_version_is_served_without_touching_the_source(tmp_path):
    src, contents = source(tmp_path, "bars", {"a": 100, "b": 200}, version="v1")
    cache = NodeCache(tmp_path / "cache")
    first = cache.stage(src)
    shutil.rmtree(tmp_path / "sources")  # any listing or read would now fail
    again = cache.stage(src)
    assert (again.hit, again.key) == (True, first.key)
    with pytest.raises(FileNotFoundError):  # unpinned, the source is listed each time
        cache.stage(DataSource("bars", src.url))


def test_a_pinned_version_whose_source_changed_is_refused_once_its_entry_is_gone(tmp_path):
    src, _ = source(tmp_path, "bars", {"a": 1000}, version="v1")
    other, _ = source(tmp_path, "other", {"a": 1000}, seed=1)
    cache = NodeCache(tmp_path / "cache", max_bytes=1500)
    pinned = cache.stage(src)
    assert cache.stage(other).evicted == (pinned.key,)
    write_files(tmp_path / "sources" / "bars", {"a": 1000}, seed=2)
    with pytest.raises(SourceChanged, match="v1"):
        cache.stage(src)


def test_least_recently_used_entries_are_evicted_first(tmp_path):
    a, b, c = (source(tmp_path, name, {"f": 100_000}, seed=i)[0] for i, name in enumerate("abc"))
    cache = NodeCache(tmp_path / "cache", max_bytes=250_000)
    key_a, key_b = cache.stage(a).key, cache.stage(b).key
    assert cache.stage(a).hit  # a is now more recent than b
    third = cache.stage(c)
    assert third.evicted == (key_b,)
    assert [e.key for e in cache.entries()] == [third.key, key_a]


def test_an_entry_in_use_is_never_evicted(tmp_path):
    a, b, c = (source(tmp_path, name, {"f": 100_000}, seed=i)[0] for i, name in enumerate("abc"))
    cache = NodeCache(tmp_path / "cache", max_bytes=150_000)
    with cache.use(a) as held:
        assert [e.in_use for e in cache.entries()] == [True]
        with pytest.raises(CacheFull, match=r"1 entries in use cannot be evicted: " + held.key[:12]):
            cache.stage(b)
        assert (held.path / "f").exists()
    cache = NodeCache(tmp_path / "cache", max_bytes=250_000)
    with cache.use(a) as held:
        key_b = cache.stage(b).key
        assert cache.stage(c).evicted == (key_b,)  # a is the least recently used, but in use: b goes
        assert (held.path / "f").exists()


def _hold_until_killed(cache_root: Path, src: DataSource, queue) -> None:
    with NodeCache(cache_root).use(src):
        queue.put("held")
        signal.pause()


def test_a_crashed_holder_no_longer_keeps_its_entry(tmp_path):
    a, b = (source(tmp_path, name, {"f": 100_000}, seed=i)[0] for i, name in enumerate("ab"))
    cache = NodeCache(tmp_path / "cache", max_bytes=150_000)
    key_a = cache.stage(a).key
    queue = FORK.Queue()
    holder = FORK.Process(target=_hold_until_killed, args=(tmp_path / "cache", a, queue))
    holder.start()
    try:
        assert queue.get(timeout=10) == "held"
        with pytest.raises(CacheFull):
            cache.stage(b)
    finally:
        holder.kill()
        holder.join()
    assert cache.stage(b).evicted == (key_a,)


def test_the_free_space_floor_evicts_and_a_cache_that_cannot_make_room_changes_nothing(tmp_path, monkeypatch):
    a, b, c = (source(tmp_path, name, {"f": 100_000}, seed=i)[0] for i, name in enumerate("abc"))
    cache = NodeCache(tmp_path / "cache", min_free_ratio=0.5)
    disk = {"free": 700_000}
    monkeypatch.setattr(datacache, "_disk_space", lambda root: (disk["free"], 1_000_000))
    key_a = cache.stage(a).key
    disk["free"] = 550_000  # b would leave 450 kB free, under the floor of 500 kB: a goes
    staged_b = cache.stage(b)
    assert staged_b.evicted == (key_a,)
    disk["free"] = 450_000  # even without b, c would leave 450 kB
    with pytest.raises(CacheFull, match="free-space floor 50%"):
        cache.stage(c)
    assert [e.key for e in cache.entries()] == [staged_b.key]


def test_a_file_larger_than_a_piece_arrives_by_parallel_ranged_reads_intact(tmp_path, monkeypatch):
    monkeypatch.setattr(datacache, "PIECE", 64 * 2**10)
    monkeypatch.setattr(datacache, "PROGRESS_EVERY", 0)
    src, contents = source(tmp_path, "big", {"big": 2**20 + 13, "small": 5})
    reads = []
    real_fetch = datacache._fetch_piece

    def fetch_piece(fs, f, path, start, end, md5):
        reads.append((start, end))
        return real_fetch(fs, f, path, start, end, md5)

    monkeypatch.setattr(datacache, "_fetch_piece", fetch_piece)
    progress = []
    result = NodeCache(tmp_path / "cache").stage(src, progress=lambda done, total: progress.append((done, total)))
    assert_holds(result.path, contents)
    assert len(reads) == 17 + 1 and (2**20, 2**20 + 13) in reads
    assert progress[-1] == (result.bytes, result.bytes) and progress == sorted(progress)
    manifest = datacache._read_json(result.path.parent / "manifest.json")
    assert {f["path"]: f["md5"] for f in manifest["files"]}["big"] == hashlib.md5(contents["big"]).hexdigest()


def test_a_failed_piece_fails_the_stage_and_publishes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(datacache, "PIECE", 64 * 2**10)
    src, _ = source(tmp_path, "bars", {"big": 600_000})
    real_fetch = datacache._fetch_piece

    def fail_the_fourth(fs, f, path, start, end, md5):
        if start == 3 * datacache.PIECE:
            raise OSError("connection reset")
        return real_fetch(fs, f, path, start, end, md5)

    monkeypatch.setattr(datacache, "_fetch_piece", fail_the_fourth)
    cache = NodeCache(tmp_path / "cache")
    with pytest.raises(OSError, match="connection reset"):  # and the pieces after it, waiting their turn, end
        cache.stage(src)
    assert not cache.entries() and not list((tmp_path / "cache" / "tmp").iterdir())


def _stage_and_check(cache_root: Path, src: DataSource, contents: dict, barrier, queue) -> None:
    barrier.wait()
    result = NodeCache(cache_root).stage(src)
    intact = all((result.path / name).read_bytes() == data for name, data in contents.items())
    queue.put((result.hit, result.key, intact))


def test_processes_staging_one_dataset_at_once_fetch_it_once(tmp_path, monkeypatch):
    monkeypatch.setattr(datacache, "PIECE", 64 * 2**10)
    real_fetch = datacache._fetch_piece
    monkeypatch.setattr(datacache, "_fetch_piece", lambda *args: time.sleep(0.05) or real_fetch(*args))  # overlap
    src, contents = source(tmp_path, "bars", {f"day={i}/part.bin": 50_000 + i for i in range(16)}, version="v1")
    barrier, queue = FORK.Barrier(6), FORK.Queue()
    workers = [
        FORK.Process(target=_stage_and_check, args=(tmp_path / "cache", src, contents, barrier, queue))
        for _ in range(6)
    ]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=20) for _ in workers]
    for worker in workers:
        worker.join()
    assert Counter(hit for hit, _, _ in results) == {True: 5, False: 1}
    assert len({key for _, key, _ in results}) == 1 and all(intact for _, _, intact in results)
    assert [p.name for p in (tmp_path / "cache" / "locks").iterdir()] == ["room"]
    assert not list((tmp_path / "cache" / "tmp").iterdir())


def _crash_mid_fetch(cache_root: Path, src: DataSource) -> None:
    real_fetch = datacache._fetch_piece
    calls = []

    def fetch_then_die(*args):
        calls.append(1)
        if len(calls) == 3:
            os._exit(3)  # no cleanup of any kind, as a SIGKILL or an OOM kill
        return real_fetch(*args)

    datacache._fetch_piece = fetch_then_die
    datacache.THREADS = 1
    NodeCache(cache_root).stage(src)


def test_a_crashed_fetch_publishes_nothing_and_its_leftovers_go_at_the_next_fetch(tmp_path, monkeypatch):
    monkeypatch.setattr(datacache, "PIECE", 64 * 2**10)
    src, contents = source(tmp_path, "bars", {"big": 300_000})
    cache = NodeCache(tmp_path / "cache")
    child = FORK.Process(target=_crash_mid_fetch, args=(tmp_path / "cache", src))
    child.start()
    child.join()
    assert child.exitcode == 3
    assert not cache.entries() and len(list((tmp_path / "cache" / "tmp").iterdir())) == 1
    result = cache.stage(src)
    assert not result.hit
    assert_holds(result.path, contents)
    assert not list((tmp_path / "cache" / "tmp").iterdir())


# -- against a real S3 API (moto on loopback) ---------------------------------------------------------
@pytest.fixture(scope="module")
def store():
    with ObjectStore(rate_mb_s=None, latency_ms=0) as running:
        yield running


@pytest.fixture
def s3_dataset(store, monkeypatch):
    import s3fs

    monkeypatch.setattr(datacache, "PIECE", 256 * 2**10)
    fs = s3fs.S3FileSystem(**store.storage_options)
    bucket = f"ds-{random.randrange(10**9)}"
    fs.mkdir(bucket)
    contents = {"a.bin": random.randbytes(200_000), "sub/b.bin": b"0123456789", "big.bin": random.randbytes(2**20)}
    for name, data in contents.items():
        fs.pipe_file(f"{bucket}/bars/{name}", data)
    store.reset_requests()
    return fs, DataSource("bars", f"s3://{bucket}/bars", "v1", store.storage_options), contents


def test_from_s3_each_piece_is_fetched_once_verified_and_a_pinned_hit_sends_no_request(tmp_path, store, s3_dataset):
    _, src, contents = s3_dataset
    cache = NodeCache(tmp_path / "cache")
    result = cache.stage(src)
    assert_holds(result.path, contents)
    gets = Counter((r.key.removeprefix("bars/"), r.range) for r in store.gets("bars/"))
    assert set(gets.values()) == {1}
    assert Counter(key for key, _ in gets) == {"a.bin": 1, "sub/b.bin": 1, "big.bin": 4}
    manifest = datacache._read_json(result.path.parent / "manifest.json")
    assert all(f["verified"] for f in manifest["files"])
    store.reset_requests()
    assert cache.stage(src).hit
    assert store.requests == []
    assert cache.stage(DataSource("bars", src.url, storage_options=src.storage_options)).hit
    assert store.gets() == [] and store.requests  # unpinned: listed again, nothing fetched


def test_from_s3_an_object_replaced_after_the_listing_is_refused(tmp_path, monkeypatch, s3_dataset):
    fs, src, contents = s3_dataset
    real_list = datacache._list

    def list_then_replace(source):
        listing = real_list(source)
        fs.pipe_file(f"{src.url.removeprefix('s3://')}/a.bin", random.randbytes(len(contents["a.bin"])))
        return listing

    monkeypatch.setattr(datacache, "_list", list_then_replace)
    cache = NodeCache(tmp_path / "cache")
    with pytest.raises(ChecksumMismatch, match="a.bin"):
        cache.stage(src)
    assert not cache.entries() and not list((tmp_path / "cache" / "tmp").iterdir())
