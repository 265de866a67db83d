"""A node's dataset cache (cellscale.runtime.datacache) against the physical limits, all measured in one run.

A synthetic bars dataset (hive-partitioned Parquet, --gb, 32 files) is uploaded to moto's S3 on loopback
behind the WAN SIMULATION of cellscale_hub.dev.objectstore (--rate-mb-s 100 aggregate, --latency-ms 20
first byte). Then, against a cache root under --dir:

(a) cold staging: NodeCache.stage() of the dataset into an empty root (listing, parallel ranged GETs,
    md5 check, fsync, publish), as a fraction of min(source, disk):
      source  raw parallel GETs of the same objects to nowhere (16 threads, one GET per object);
      disk    the same bytes (same file sizes) written to the cache's disk, each file fsynced.
    --reps rounds, the three alternating; medians. Goal >= 0.8.
(b), (c): ROUNDS (15) rounds of each warm measurement, --reps of each cold one, alternating; medians.
(b) warm re-read: every staged file read with 4 MiB reads (page cache), against
    `dd if=FILE of=/dev/null bs=4M` of one file holding the same bytes (dd's own reported time: a dd per
    file would pay its fixed cost per run, faulting in its 4 MiB buffer, on every file). Goal >= 0.8.
    Also cold: both after posix_fadvise(POSIX_FADV_DONTNEED) on their files (never drop_caches).
(c) scan: pyarrow.dataset.dataset(staged path, partitioning="hive").to_table() against
    pyarrow.parquet.read_table() of a local copy of the same files, both warm. Goal >= 0.8.
Also: a pinned hit's time to path and the requests it sent, and the GETs per object of a cold stage.

Each timed operation starts after os.sync(), so earlier writeback is not charged to it.
Asserts no timing; prints tables and writes benchmarks/results/data_paths.json (with --rate-mb-s 0,
unshaped: data_paths_unshaped.json, where the source is moto's CPU in this process).

    .venv/bin/python benchmarks/data_paths.py [--gb 0.5] [--reps 3] [--rate-mb-s 100] [--latency-ms 20] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import s3fs
from _common import median, print_table, ratio, write_results

from cellscale.runtime.datacache import THREADS, DataSource, NodeCache
from cellscale_hub.dev.objectstore import ObjectStore, SyntheticBars, write_synthetic_bars

FILES = 32
ROUNDS = 15  # of each sub-second measurement (warm re-read, scan): one run of each moves by +-30% here
READ = 4 * 2**20
WRITE = 8 * 2**20
GOAL = 0.8
DD_SECONDS = re.compile(r"copied, ([0-9.]+) s")


def mb_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def timed(operation, *args) -> float:
    os.sync()
    started = time.perf_counter()
    operation(*args)
    return time.perf_counter() - started


# -- (a) cold staging ------------------------------------------------------------------------------
def raw_gets(fs: s3fs.S3FileSystem, root: str, bars: SyntheticBars) -> None:
    """Every object once, THREADS at a time, one ranged GET each (no HEAD first), the bytes dropped."""
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda f: len(fs.cat_file(f"{root}/{f[0]}", start=0, end=f[1])), bars.files))


def disk_writes(directory: Path, bars: SyntheticBars) -> None:
    """The dataset's file sizes written to `directory` from a random buffer, each file fsynced."""
    directory.mkdir()
    block = os.urandom(WRITE)
    for i, (_, size) in enumerate(bars.files):
        with open(directory / f"f{i}", "wb", buffering=0) as file:
            for start in range(0, size, WRITE):
                file.write(memoryview(block)[: min(WRITE, size - start)])
            os.fsync(file.fileno())


def cold_staging(store: ObjectStore, bars: SyntheticBars, work: Path, reps: int) -> dict:
    fs = s3fs.S3FileSystem(**store.storage_options)
    root = bars.url.removeprefix("s3://")
    source = DataSource("bars", bars.url, storage_options=store.storage_options)
    seconds: dict[str, list[float]] = {"stage": [], "source": [], "disk": []}
    gets_per_range: Counter = Counter()
    for rep in range(reps):
        shutil.rmtree(work / "cache", ignore_errors=True)
        shutil.rmtree(work / "disk", ignore_errors=True)
        arms = {
            "source": lambda: raw_gets(fs, root, bars),
            "disk": lambda: disk_writes(work / "disk", bars),
            "stage": lambda: NodeCache(work / "cache").stage(source),
        }
        for name in list(arms)[rep % 3 :] + list(arms)[: rep % 3]:
            store.reset_requests()
            seconds[name].append(timed(arms[name]))
            if name == "stage":
                gets_per_range = Counter((r.key, r.range) for r in store.gets())
    rates = {name: mb_s(bars.bytes, median(values)) for name, values in seconds.items()}
    limit = min(rates["source"], rates["disk"])
    return {
        "seconds": seconds,
        "mb_per_s": rates,
        "limit_mb_per_s": limit,
        "limit_is": "source" if rates["source"] <= rates["disk"] else "disk",
        "ratio_stage_limit": ratio(rates["stage"], limit),
        "stage_gets": sum(gets_per_range.values()),
        "stage_most_gets_of_one_range": max(gets_per_range.values()),
        "goal_met": ratio(rates["stage"], limit) >= GOAL,
    }


# -- (b) re-reads ----------------------------------------------------------------------------------
def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def python_read(files: list[Path]) -> float:
    """Seconds reading every file with READ-sized readinto (summed per file, like dd's)."""
    buffer, total = bytearray(READ), 0.0
    for path in files:
        started = time.perf_counter()
        with open(path, "rb", buffering=0) as file:
            while file.readinto(buffer):
                pass
        total += time.perf_counter() - started
    return total


def dd_read(files: list[Path]) -> float:
    """Seconds dd reports for `dd if=FILE of=/dev/null bs=4M`, summed over the files (no process starts)."""
    total = 0.0
    for path in files:
        done = subprocess.run(
            ["dd", f"if={path}", "of=/dev/null", "bs=4M"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "LC_ALL": "C"},
        )
        total += float(DD_SECONDS.search(done.stderr).group(1))
    return total


def evict_from_page_cache(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def concatenate(files: list[Path], into: Path) -> None:
    with open(into, "wb") as out:
        for path in files:
            with open(path, "rb") as part:
                shutil.copyfileobj(part, out, READ)


def rereads(staged: Path, work: Path, nbytes: int, reps: int) -> dict:
    """Python reading the staged files against dd reading one file of the same bytes, warm then cold."""
    files, joined = files_of(staged), [work / "joined"]
    concatenate(files, joined[0])
    arms = {"python": lambda: python_read(files), "dd": lambda: dd_read(joined)}
    warm: dict[str, list[float]] = {name: [] for name in arms}
    cold: dict[str, list[float]] = {name: [] for name in arms}
    for arm in arms.values():  # warm-up: both in the page cache
        arm()
    for rep in range(ROUNDS):
        for name in list(arms)[rep % 2 :] + list(arms)[: rep % 2]:
            warm[name].append(arms[name]())
    for rep in range(reps):
        for name in list(arms)[rep % 2 :] + list(arms)[: rep % 2]:
            os.sync()
            evict_from_page_cache(files + joined)
            cold[name].append(arms[name]())
    joined[0].unlink()
    out = {}
    for label, seconds in (("warm", warm), ("cold", cold)):
        rates = {name: mb_s(nbytes, median(values)) for name, values in seconds.items()}
        out[label] = {"seconds": seconds, "mb_per_s": rates, "ratio_python_dd": ratio(rates["python"], rates["dd"])}
    out["warm"]["goal_met"] = out["warm"]["ratio_python_dd"] >= GOAL
    return out


# -- (c) scan --------------------------------------------------------------------------------------
def scan(staged: Path, work: Path) -> dict:
    copy = work / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(staged, copy)
    arms = {
        "dataset_of_staged": lambda: ds.dataset(staged, format="parquet", partitioning="hive").to_table(),
        "read_table_of_copy": lambda: pq.read_table(copy),
    }
    rows = {name: arm().num_rows for name, arm in arms.items()}  # warm-up, and both see the same rows
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for rep in range(ROUNDS):
        for name in list(arms)[rep % 2 :] + list(arms)[: rep % 2]:
            seconds[name].append(timed(arms[name]))
    shutil.rmtree(copy)
    speed = ratio(median(seconds["read_table_of_copy"]), median(seconds["dataset_of_staged"]))
    return {"rows": rows, "seconds": seconds, "ratio_staged_copy": speed, "goal_met": speed >= GOAL}


# -- a pinned hit ------------------------------------------------------------------------------------
def pinned_hit(store: ObjectStore, bars: SyntheticBars, work: Path) -> dict:
    cache = NodeCache(work / "cache")
    pinned = DataSource("bars", bars.url, "v1", store.storage_options)
    cache.stage(pinned)  # the label's first staging (a hit on the entry the cold runs left)
    store.reset_requests()
    seconds = [cache.stage(pinned).seconds for _ in range(20)]
    return {"median_ms": median(seconds) * 1e3, "max_ms": max(seconds) * 1e3, "requests": len(store.requests)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=0.5, help="dataset size in GB (1e9 bytes)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rate-mb-s", type=float, default=100.0, help="the simulated WAN's aggregate rate; 0: none")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the simulated WAN's first-byte latency")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="a folder on the disk the cache uses")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cellscale-bench-data-", dir=args.dir))
    try:
        with ObjectStore(rate_mb_s=args.rate_mb_s or None, latency_ms=args.latency_ms) as store:
            started = time.perf_counter()
            bars = write_synthetic_bars(
                "s3://bench/bars", int(args.gb * 1e9), files=FILES, storage_options=store.storage_options
            )
            upload_s = time.perf_counter() - started
            print(f"uploaded {bars.bytes / 1e6:.0f} MB in {len(bars.files)} files, {upload_s:.1f} s")
            results = {
                "dataset": {"bytes": bars.bytes, "files": len(bars.files), "rows": bars.rows},
                "wan": {"rate_mb_s": args.rate_mb_s, "latency_ms": args.latency_ms},
                "reps": args.reps,
                "cold": cold_staging(store, bars, work, args.reps),
            }
            results["pinned_hit"] = pinned_hit(store, bars, work)
        staged = NodeCache(work / "cache").entries()[0].path
        results["reread"] = rereads(staged, work, bars.bytes, args.reps)
        results["scan"] = scan(staged, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results)
    write_results("data_paths" if args.rate_mb_s else "data_paths_unshaped", False, results)


def report(results: dict) -> None:
    cold, reread, scanned = results["cold"], results["reread"], results["scan"]
    print(f"\n(a) cold staging, {results['dataset']['bytes'] / 1e6:.0f} MB (limit: {cold['limit_is']})")
    print_table(
        ["path", "MB/s", "fraction of limit"],
        [
            ["NodeCache.stage", cold["mb_per_s"]["stage"], cold["ratio_stage_limit"]],
            [
                "source: raw parallel GETs",
                cold["mb_per_s"]["source"],
                ratio(cold["mb_per_s"]["source"], cold["limit_mb_per_s"]),
            ],
            ["disk: write + fsync", cold["mb_per_s"]["disk"], ratio(cold["mb_per_s"]["disk"], cold["limit_mb_per_s"])],
        ],
    )
    print(f"a cold stage's GETs: {cold['stage_gets']}, at most {cold['stage_most_gets_of_one_range']} per byte range")
    print("\n(b) re-read of the staged files")
    print_table(
        ["", "python MB/s", "dd MB/s", "python/dd"],
        [
            [
                label,
                reread[label]["mb_per_s"]["python"],
                reread[label]["mb_per_s"]["dd"],
                reread[label]["ratio_python_dd"],
            ]
            for label in ("warm", "cold")
        ],
    )
    print("\n(c) scan")
    print_table(
        ["path", "median s", "rows"],
        [[name, median(values), scanned["rows"][name]] for name, values in scanned["seconds"].items()],
    )
    print(f"staged / copy speed: {scanned['ratio_staged_copy']:.3f}")
    hit = results["pinned_hit"]
    print(f"\npinned hit: {hit['median_ms']:.2f} ms median, {hit['max_ms']:.2f} ms max, {hit['requests']} requests")
    print(f"goals (>= {GOAL}): cold {cold['goal_met']}, warm {reread['warm']['goal_met']}, scan {scanned['goal_met']}")


if __name__ == "__main__":
    main()
