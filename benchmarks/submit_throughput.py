"""Jobs per second accepted by POST /api/jobs, on SQLite and on PostgreSQL.

For each store a personal control plane runs with `--gpus 1`. One job that sleeps holds
that GPU, so the M benchmark jobs (1 GPU each) are accepted and stay PENDING behind it:
nothing runs, and only the API path and the store are measured (the controller still
wakes on every submit and re-reads the pending queue, as it does in production).
K client threads submit M jobs; then every job is cancelled and the control plane stopped.

PostgreSQL is the server `scripts/postgres` starts (fsync=off there), with a fresh
database per run, dropped at the end.

    .venv/bin/python benchmarks/submit_throughput.py [--quick] [--submits 500] [--threads 4]
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from _common import REPO, control_plane, median, percentile, print_table, ratio, write_results
from sqlalchemy.engine import make_url

from cellscale.client import Client
from cellscale.spec import JobSpec, Launcher, Phase, Resources

WARMUP = 8
BLOCKER = JobSpec(
    name="bench-blocker",
    launcher=Launcher.plain,
    resources=Resources(gpus_per_node=1),
    source="import time\ntime.sleep(600)\n",
)


def job_spec(i: int) -> JobSpec:
    return JobSpec(
        name=f"bench-{i}",
        launcher=Launcher.plain,
        resources=Resources(gpus_per_node=1),
        source=f"print('job {i} never runs: it waits behind the blocker')\n",
    )


def wait_for(client: Client, job_id: str, phases: set[Phase], timeout: float = 60) -> Phase:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phase = client.get(job_id).phase
        if phase in phases:
            return phase
        time.sleep(0.2)
    raise TimeoutError(f"{job_id} did not reach {sorted(p.value for p in phases)} in {timeout:.0f}s (is {phase.value})")


def flood(url: str, token: str, submits: int, threads: int) -> tuple[float, list[tuple[float, str, Phase]]]:
    """K threads, each with its own client, submit `submits` jobs in all: (wall s, [(latency, id, phase)])."""
    counter, done, lock = itertools.count(), [], threading.Lock()

    def worker() -> None:
        client = Client(url, token)
        while (i := next(counter)) < submits:
            t0 = time.perf_counter()
            job = client.submit(job_spec(i))
            with lock:
                done.append((time.perf_counter() - t0, job.id, job.phase))
        client.close()

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - t0, done


def count_pending(client: Client) -> int:
    count, cursor = 0, None
    while True:
        page = client.list(phase="PENDING", limit=500, cursor=cursor)
        count += len(page.items)
        if not (cursor := page.next_cursor):
            return count


def cancel_all(url: str, token: str, job_ids: list[str], threads: int) -> float:
    clients = [Client(url, token) for _ in range(threads)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda a: clients[a[0] % threads].cancel(a[1]), enumerate(job_ids)))
    wall = time.perf_counter() - t0
    for c in clients:
        c.close()
    return wall


def bench_store(db_url: str, submits: int, threads: int) -> dict:
    with control_plane("--db-url", db_url, "--gpus", "1") as cp:
        client = Client(cp.url, cp.token)
        blocker = client.submit(BLOCKER)
        wait_for(client, blocker.id, {Phase.RUNNING})
        _, warm = flood(cp.url, cp.token, WARMUP, threads)
        wall, done = flood(cp.url, cp.token, submits, threads)
        still_pending = count_pending(client)
        flood_ids = [job_id for _, job_id, _ in warm + done]
        cancel_wall = cancel_all(cp.url, cp.token, flood_ids, threads)
        client.cancel(blocker.id)
        blocker_phase = wait_for(client, blocker.id, {Phase.CANCELLED, Phase.FAILED, Phase.SUCCEEDED})
        client.close()
    latencies = [lat for lat, _, _ in done]
    not_pending = sum(1 for _, _, phase in done if phase is not Phase.PENDING)
    tenth = max(1, submits // 10)
    return {
        "submits": submits,
        "threads": threads,
        "wall_s": wall,
        "jobs_per_s": submits / wall,
        "latency_p50_s": median(latencies),
        "latency_p99_s": percentile(latencies, 99),
        "latency_max_s": max(latencies),
        "latency_p50_first_10pct_s": median(latencies[:tenth]),
        "latency_p50_last_10pct_s": median(latencies[-tenth:]),
        "accepted_not_pending": not_pending,
        "pending_after_flood": still_pending,
        "cancels_per_s": len(flood_ids) / cancel_wall,
        "blocker_final_phase": blocker_phase.value,
    }


def postgres_database() -> tuple[str, Callable[[], object]]:
    """A fresh database on the test PostgreSQL server: (url, drop)."""
    base = make_url(
        subprocess.run([str(REPO / "scripts" / "postgres")], capture_output=True, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    name = f"cellscale_bench_{uuid.uuid4().hex[:8]}"
    where = ["-h", base.host or "127.0.0.1", "-p", str(base.port or 5432), "-U", base.username or "postgres"]
    subprocess.run(["createdb", *where, name], check=True)
    url = base.set(database=name).render_as_string(hide_password=False)
    return url, lambda: subprocess.run(["dropdb", *where, "--if-exists", name], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 submits instead of 500")
    parser.add_argument("--submits", type=int)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    submits = args.submits or (100 if args.quick else 500)

    results = {}
    with tempfile.TemporaryDirectory(prefix="cellscale-bench-sqlite-") as tmp:
        print(f"sqlite: {submits} submits, {args.threads} threads")
        results["sqlite"] = bench_store(f"sqlite:///{tmp}/cellscale.sqlite", submits, args.threads)
    pg_url, drop = postgres_database()
    try:
        print(f"postgresql: {submits} submits, {args.threads} threads")
        results["postgresql"] = bench_store(pg_url, submits, args.threads)
    finally:
        drop()

    ratios = {
        k: ratio(results["postgresql"][k], results["sqlite"][k])
        for k in ("jobs_per_s", "latency_p50_s", "latency_p99_s", "cancels_per_s")
    }
    print(f"\nPOST /api/jobs: {submits} submits from {args.threads} threads, all accepted as PENDING")
    keys = [
        "jobs_per_s",
        "latency_p50_s",
        "latency_p99_s",
        "latency_p50_first_10pct_s",
        "latency_p50_last_10pct_s",
        "cancels_per_s",
    ]
    print_table(
        ["metric", "sqlite", "postgresql", "pg/sqlite"],
        [[k, results["sqlite"][k], results["postgresql"][k], ratios.get(k, "")] for k in keys],
    )
    write_results("submit_throughput", args.quick, {"results": results, "ratio_postgresql_sqlite": ratios})


if __name__ == "__main__":
    main()
