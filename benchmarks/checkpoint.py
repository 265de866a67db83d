"""How long a checkpoint keeps training waiting, and how fast it persists, against the raw disk.

States of 0.5 GB and 5 GB (float32 tensors of 32 MiB each; --sizes in MiB) are checkpointed with
cellscale.checkpoint to a folder on one disk, in one process, each size in turn:

  sync    Checkpointer.save(async_=False): the caller waits until the checkpoint is committed
          (files written, hashed as they go out and fsynced, rename, manifest, pruning).
  async   Checkpointer.save(): the caller waits only for the copy into the host copy; the write
          and the commit go on in the background until future.result().
  dcp     plain dcp.save to a FileSystemWriter, no manifest: DCP alone, with its defaults.
  dd      dd if=/dev/zero of=FILE bs=1M count=<MiB> oflag=direct on the same disk
          (conv=fdatasync where direct I/O is refused): the disk's raw write bandwidth.

(a) blocking: seconds save() keeps the caller, async against sync.
(b) persist bandwidth: state bytes / (save() called -> committed), as a fraction of dd's.

Each timed operation starts after os.sync(), so the writeback of the one before (and this
disk's discard of the files it deleted) is not charged to it. A size is cut to the largest
that fits when memory cannot hold it twice (the state and the async save's host copy) or the
disk three times; the results say so.

    .venv/bin/python benchmarks/checkpoint.py [--quick] [--dir DIR] [--sizes 512,5120]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from _common import median, print_table, ratio, write_results

from cellscale.checkpoint import Checkpointer

TENSOR_MB = 32
MEMORY_MARGIN = 2 * 2**30  # bytes left for the process, the page cache and everyone else


def make_state(mb: int) -> dict[str, torch.Tensor]:
    count = max(1, mb // TENSOR_MB)
    return {f"layer{i}": torch.rand(TENSOR_MB * 2**20 // 4) for i in range(count)}


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def available_memory() -> int:
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) * 1024


def fit(mb: int, work: Path) -> tuple[int, str | None]:
    """The size to run (MiB) and, if it is not `mb`, why."""
    memory = (available_memory() - MEMORY_MARGIN) // 2
    disk = shutil.disk_usage(work).free // 3
    largest = min(memory, disk) // 2**20 // TENSOR_MB * TENSOR_MB
    if mb <= largest:
        return mb, None
    return largest, (
        f"{mb} MiB asked; {largest} MiB fit (memory for 2 copies: {memory / 2**30:.1f} GiB each, "
        f"disk for 3: {disk / 2**30:.1f} GiB each)"
    )


def timed_save(ckpt: Checkpointer, step: int, state: dict, async_: bool) -> tuple[float, float]:
    """(seconds save() blocked, seconds until the checkpoint was committed)."""
    os.sync()
    started = time.perf_counter()
    future = ckpt.save(step, state, async_=async_)
    blocked = time.perf_counter() - started
    future.result()
    return blocked, time.perf_counter() - started


def timed_plain_dcp(root: Path, step: int, state: dict) -> float:
    target = root / f"plain-{step}"
    os.sync()
    started = time.perf_counter()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(target)))
    elapsed = time.perf_counter() - started
    shutil.rmtree(target)
    return elapsed


def dd_argv(path: Path, mb: int, mode: str) -> list[str]:
    return ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mb}", mode]


def timed_dd(path: Path, mb: int) -> tuple[float, str]:
    """Seconds to write `mb` MiB with direct I/O, or with an fdatasync at the end where the
    filesystem refuses O_DIRECT (tmpfs, some overlays); and which of the two ran."""
    for mode in ("oflag=direct", "conv=fdatasync"):
        os.sync()
        started = time.perf_counter()
        done = subprocess.run(dd_argv(path, mb, mode), capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        path.unlink(missing_ok=True)
        if done.returncode == 0:
            return elapsed, mode
        print(f"dd {mode} refused ({done.stderr.strip().splitlines()[-1]}); trying the next mode")
    raise RuntimeError("dd failed with both oflag=direct and conv=fdatasync")


def summary(seconds: list[float], nbytes: int) -> dict:
    return {"seconds": seconds, "median_s": median(seconds), "mb_per_s": nbytes / median(seconds) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 repetition instead of 5")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="a folder on the disk to measure")
    parser.add_argument("--sizes", default="512,5120", help="state sizes in MiB, comma-separated")
    args = parser.parse_args()
    reps = 1 if args.quick else 5
    results = []
    for mb in map(int, args.sizes.split(",")):
        work = Path(tempfile.mkdtemp(prefix="cellscale-bench-ckpt-", dir=args.dir))
        try:
            size, cut = fit(mb, work)
            if cut:
                print(cut)
            results.append({**run(work, size, reps), "requested_mb": mb, "cut": cut})
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report(results[-1])
    write_results("checkpoint", args.quick, {"sizes": results})


def run(work: Path, mb: int, reps: int) -> dict:
    state = make_state(mb)
    nbytes = state_bytes(state)
    ckpt = Checkpointer(str(work / "ckpt"), keep=1, notifier=lambda _: None)
    print(f"\nstate {nbytes / 1e6:.0f} MB in {len(state)} tensors; disk under {work} ({reps} reps)")
    steps = itertools.count()
    timed_save(ckpt, next(steps), state, async_=False)  # warm-up: first DCP call, first files
    first_async_block, _ = timed_save(ckpt, next(steps), state, async_=True)  # allocates the host copy
    times: dict[str, list[float]] = {
        k: [] for k in ("sync_block", "sync_commit", "async_block", "async_commit", "dcp", "dd")
    }
    modes: set[str] = set()
    for rep in range(reps):
        order = (False, True) if rep % 2 == 0 else (True, False)  # alternate which save goes first
        for async_ in order:
            blocked, committed = timed_save(ckpt, next(steps), state, async_)
            kind = "async" if async_ else "sync"
            times[f"{kind}_block"].append(blocked)
            times[f"{kind}_commit"].append(committed)
        times["dcp"].append(timed_plain_dcp(work, rep, state))
        seconds, mode = timed_dd(work / "dd.bin", mb)
        times["dd"].append(seconds)
        modes.add(mode)
    return {**analyse(times, nbytes, mb, modes, reps, work), "first_async_block_s": first_async_block}


def analyse(times: dict[str, list[float]], nbytes: int, mb: int, modes: set[str], reps: int, work: Path) -> dict:
    persist = {
        "sync": summary(times["sync_commit"], nbytes),
        "async": summary(times["async_commit"], nbytes),
        "plain_dcp": summary(times["dcp"], nbytes),
        "raw_dd": summary(times["dd"], mb * 2**20),
    }
    raw = persist["raw_dd"]["mb_per_s"]
    return {
        "state_bytes": nbytes,
        "reps": reps,
        "disk": str(work.parent),
        "dd_mode": " / ".join(sorted(modes)),
        "blocking_s": {
            kind: {"seconds": times[f"{kind}_block"], "median_s": median(times[f"{kind}_block"])}
            for kind in ("sync", "async")
        },
        "ratio_async_sync_blocking": ratio(median(times["async_block"]), median(times["sync_block"])),
        "async_copy_gb_per_s": nbytes / median(times["async_block"]) / 1e9,
        "persist": persist,
        "persist_fraction_of_raw": {kind: ratio(p["mb_per_s"], raw) for kind, p in persist.items() if kind != "raw_dd"},
    }


def report(results: dict) -> None:
    blocking, persist, fraction = results["blocking_s"], results["persist"], results["persist_fraction_of_raw"]
    print(f"\n{results['state_bytes'] / 1e6:.0f} MB state")
    print(f"(a) time save() blocks the caller, median of {results['reps']} (s)")
    print_table(
        ["save", "blocking_s"],
        [[kind, blocking[kind]["median_s"]] for kind in ("sync", "async")]
        + [
            ["async/sync", results["ratio_async_sync_blocking"]],
            ["first async (allocates the host copy)", results["first_async_block_s"]],
        ],
    )
    print(f"async blocking = a copy at {results['async_copy_gb_per_s']:.1f} GB/s")
    print(f"(b) persist bandwidth until committed, against raw dd ({results['dd_mode']})")
    rows = [("cellscale sync", "sync"), ("cellscale async", "async"), ("plain dcp.save", "plain_dcp")]
    print_table(
        ["path", "seconds", "MB/s", "fraction of dd"],
        [[label, persist[key]["median_s"], persist[key]["mb_per_s"], fraction[key]] for label, key in rows]
        + [["dd (raw disk)", persist["raw_dd"]["median_s"], persist["raw_dd"]["mb_per_s"], 1.0]],
    )


if __name__ == "__main__":
    main()
