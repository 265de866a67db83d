"""What reading a staged dataset through the I/O meter costs: `cellscale.datasets.arrow_dataset`
against pyarrow reading the same local Parquet set directly.

A hive-partitioned Parquet set (8 days x --rows rows of 5 columns, snappy; ~470 MB at the
default) is written to a temporary directory and announced as a staged dataset, as a node's
supervisor does (CELLSCALE_DATA_BARS). Each way reads the whole set into a table --reps times
(the page cache warm after the first: a staged copy on a node's disk is read at memory speed,
the hardest case for an overhead); the best and median seconds and the metered way's rate
against each baseline are reported. Then one column of the set, where reads are small.

    .venv/bin/python benchmarks/dataset_reads.py [--quick] [--rows 2000000] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from _common import median, print_table, write_results

from cellscale import datasets
from cellscale.runtime.ioprofile import CACHE, METER

DAYS = 8


def write_set(root: Path, rows: int) -> int:
    """The Parquet set; its size in bytes."""
    rng = np.random.default_rng(0)
    for day in range(DAYS):
        (root / f"day={day}").mkdir(parents=True)
        table = pa.table(
            {
                "ts": np.arange(rows, dtype=np.int64) + day * rows,
                "sym": rng.integers(0, 5000, rows).astype(np.int32),
                "px": rng.standard_normal(rows),
                "qty": rng.standard_normal(rows),
                "bid": rng.standard_normal(rows),
            }
        )
        pq.write_table(table, root / f"day={day}" / "part-0.parquet", compression="snappy")
    return sum(p.stat().st_size for p in root.rglob("*.parquet"))


def seconds(read: Callable[[], pa.Table], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        read()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a quarter of the rows, 5 reps")
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows per day")
    parser.add_argument("--reps", type=int, default=7, help="reads of each way")
    args = parser.parse_args()
    rows, reps = (args.rows // 4, 5) if args.quick else (args.rows, args.reps)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bars"
        size = write_set(root, rows)
        os.environ["CELLSCALE_DATA_BARS"] = str(root)
        os.environ["CELLSCALE_DATA_BARS_SOURCE"] = "s3://md/bars/2024"
        ways = {
            "pyarrow.parquet.read_table": lambda: pq.read_table(root),
            "pyarrow.dataset.dataset": lambda: ds.dataset(root, partitioning="hive").to_table(),
            "cellscale arrow_dataset": lambda: datasets.arrow_dataset("bars").to_table(),
            "one column: pyarrow.dataset": lambda: ds.dataset(root, partitioning="hive").to_table(columns=["px"]),
            "one column: arrow_dataset": lambda: datasets.arrow_dataset("bars").to_table(columns=["px"]),
        }
        for read in ways.values():
            read()  # warm: the page cache, and each way's imports
        before = METER.totals()
        times = {name: seconds(read, reps) for name, read in ways.items()}
        metered = METER.totals().since(before).sources[CACHE]

    best = {name: min(t) for name, t in times.items()}
    mid = {name: median(t) for name, t in times.items()}
    ours, col = "cellscale arrow_dataset", "one column: arrow_dataset"
    print_table(
        ["way", "best s", "median s", "MB/s (best)"],
        [[name, best[name], mid[name], size / best[name] / 1e6] for name in times],
    )
    ratios = {
        "vs_read_table_best": best["pyarrow.parquet.read_table"] / best[ours],
        "vs_read_table_median": mid["pyarrow.parquet.read_table"] / mid[ours],
        "vs_dataset_best": best["pyarrow.dataset.dataset"] / best[ours],
        "vs_dataset_median": mid["pyarrow.dataset.dataset"] / mid[ours],
        "one_column_vs_dataset_median": mid["one column: pyarrow.dataset"] / mid[col],
    }
    print()
    for name, value in ratios.items():
        print(f"arrow_dataset's speed {name.replace('_', ' ')}: {value:.0%}")
    write_results(
        "dataset_reads",
        args.quick,
        {
            "rows": rows * DAYS,
            "parquet_bytes": size,
            "reps": reps,
            "seconds": times,
            "speed_ratios": ratios,
            "metered": {"bytes": metered[0], "reads": metered[1], "read_s": metered[2]},
        },
    )


if __name__ == "__main__":
    main()
