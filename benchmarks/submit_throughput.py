"""Jobs per second accepted by POST /api/jobs and their latency, on SQLite and on PostgreSQL,
over an empty queue or a big one (`--pending N`), with the controller's admission on or off.

Each case (store x pending x admission, and the code of `--compare REV` after the working
tree's) is one personal control plane with `--gpus 1`, started in a child process (`serve`
below: `cellscale_hub.app.main`, the entry point of `python -m cellscale_hub --personal`) over a
store that `populate` (another child, on the same code) filled first with bulk inserts, as
benchmarks/control_plane.py fills its own (5,000 rows a statement, the per-queue totals its
`queue_totals` computes, VACUUM ANALYZE on PostgreSQL):
- a blocker (`time.sleep(600)`, 1 GPU), the oldest pending job: the controller admits and
  launches it, so the GPU is held and every other job (1 GPU each) stays PENDING;
- N pending jobs of the same user (submitted over the last 2 days, with their Submitted events);
- `--history` (1,000) succeeded jobs of that user with one attempt each: what a submit's cost
  estimate reads (its newest 200 successful runs).

Then K client threads (`--threads`, 4) each with their own client submit M jobs in all
(`--submits`, 500; 100 with `--quick`) after 8 warm-ups; the script checks they are all PENDING,
cancels them and the blocker, and stops the control plane. Every submit wakes the controller,
as in production. Reported: jobs/s, latency p50/p99/max (client side), p50 over the first and
last 10%, the control plane's CPU per submit (utime+stime of its process), and the controller's
cycles during the flood and the seconds they took (`cellscale_controller_cycle_seconds` of
/api/metrics).

Admission off (`--admission off` or `both`): the child makes `Admitter.needed` answer False, so
no admission cycle runs (the blocker stays PENDING too, nothing is launched) while the rest of
each cycle does: the difference to `on` is what admission's cycles cost the submits (at 100k
pending each one holds the GIL for a good part of a second).

PostgreSQL is the server `scripts/postgres` starts (fsync=off there), with a fresh database per
case, dropped at the end.

    .venv/bin/python benchmarks/submit_throughput.py [--quick] [--submits 500] [--threads 4]
        [--pending 0,100000] [--stores sqlite,postgres] [--admission on|off|both] [--compare REV]
"""

from __future__ import annotations

import argparse
import getpass
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import httpx
from _common import (
    PYTHON,
    REPO,
    ControlPlane,
    median,
    percentile,
    print_table,
    stop_control_plane,
    write_results,
)
from control_plane import checkout, child_env, queue_totals
from sqlalchemy.engine import make_url

from cellscale.client import Client
from cellscale.spec import JobSpec, Launcher, Phase, Resources

HERE = Path(__file__).resolve()
WARMUP = 8
BATCH = 5000  # rows per insert statement
BLOCKER_SOURCE = "import time\ntime.sleep(600)\n"


def job_spec(i: int) -> JobSpec:
    return JobSpec(
        name=f"bench-{i}",
        launcher=Launcher.plain,
        resources=Resources(gpus_per_node=1),
        source=f"print('job {i} never runs: it waits behind the blocker')\n",
    )


# ---------------------------------------------------------------------------------------------
# populate and serve (run in children, on the code under test)
# ---------------------------------------------------------------------------------------------
def populate(db_url: str, pending: int, history: int) -> dict:
    """The blocker, `pending` waiting jobs and `history` succeeded ones of this user, bulk-inserted."""
    from cellscale.vocabulary import AttemptState, EventKind, EventReason
    from cellscale_hub.app import PERSONAL_TENANT
    from cellscale_hub.auth import ALL_SCOPES, Principal
    from cellscale_hub.drivers.local import LocalDriver
    from cellscale_hub.routing import route
    from cellscale_hub.store import Store
    from cellscale_hub.store.models import Attempt, Event, Job, utcnow
    from cellscale_hub.tenancy import Tenancy

    t0 = time.perf_counter()
    store = Store(db_url)
    store.migrate()
    user = getpass.getuser()
    who = Principal(user, (PERSONAL_TENANT,), ALL_SCOPES, admin=True, tenants=(PERSONAL_TENANT,))
    drivers = {"local": LocalDriver(name="local", gpus=1, submit_as=[])}
    where = route(Tenancy.single(PERSONAL_TENANT, {"local": 1}), drivers, who, job_spec(0))
    spec = where.spec.model_dump(mode="json")
    rng, now = random.Random(20), utcnow()
    rows: dict[type, list[dict]] = {Job: [], Attempt: [], Event: []}

    def job(name: str, source: str, created, phase: Phase) -> dict:
        row = dict(
            id=f"cs-{rng.getrandbits(48):012x}",
            idempotency_key=uuid.UUID(int=rng.getrandbits(128)).hex,
            owner=user,
            tenant=where.tenant,
            queue=where.queue,
            backend=where.backend,
            cluster_queue=where.cluster_queue,
            placement=where.stored(),
            priority=where.priority,
            borrowed=0,
            name=name,
            spec={**spec, "name": name, "source": source},
            gpus=1,
            phase=phase,
            reason="waiting for admission" if phase is Phase.PENDING else "succeeded",
            excluded_nodes=[],
            cancel_requested=False,
            result_available=False,
            created_at=created,
            updated_at=created,
            started_at=None,
            finished_at=None,
        )
        rows[Job].append(row)
        message = f"submitted to queue {where.queue} on backend {where.backend}"
        event = dict(job_id=row["id"], at=created, kind=EventKind.PHASE, to_phase=Phase.PENDING, actor=user)
        rows[Event].append(event | dict(reason=EventReason.Submitted, message=message))
        return row

    for i in range(history):  # over the 30 days before the pending ones
        created = now - timedelta(days=32) + timedelta(days=30) * i / max(history, 1)
        row = job(f"done-{i}", f"print({rng.randrange(50)})\n", created, Phase.SUCCEEDED)
        held_from, held_until = created + timedelta(seconds=5), created + timedelta(seconds=rng.uniform(60, 3600))
        row.update(finished_at=held_until, started_at=held_from, updated_at=held_until)
        attempt = dict(job_id=row["id"], number=1, backend="local", state=AttemptState.SUCCEEDED, gpu_ids=[0])
        times = dict(submitted_at=created, started_at=held_from, ended_at=held_until, last_heartbeat=held_until)
        rows[Attempt].append(
            attempt | times | dict(held_from=held_from, held_until=held_until, exit_code=0, failed_nodes=[], nodes=[])
        )
    blocker = job("bench-blocker", BLOCKER_SOURCE, now - timedelta(days=2, minutes=1), Phase.PENDING)["id"]
    for created in sorted(now - rng.random() * timedelta(days=2) for _ in range(pending)):
        job(f"queued-{rng.randrange(10**6)}", f"print({rng.randrange(10**6)})\n", created, Phase.PENDING)
    built = time.perf_counter()
    bulk_insert(store, rows)
    store.dispose()
    return {"blocker": blocker, "jobs": len(rows[Job]), "build_s": built - t0, "insert_s": time.perf_counter() - built}


def bulk_insert(store, rows: dict[type, list[dict]]) -> None:
    """The rows, BATCH a statement, with the per-queue totals they imply; then statistics on
    PostgreSQL, as autovacuum keeps them on a live server."""
    from sqlalchemy import insert

    from cellscale_hub.store.models import Attempt, Base, Job

    with store.engine.begin() as conn:
        for model, of_model in rows.items():
            columns = {c.name for c in model.__table__.columns}
            batch = [{k: v for k, v in r.items() if k in columns} for r in of_model]
            for i in range(0, len(batch), BATCH):
                conn.execute(insert(model.__table__), batch[i : i + BATCH])
        if "queue_totals" in Base.metadata.tables:
            conn.execute(insert(Base.metadata.tables["queue_totals"]), queue_totals(rows[Job], rows[Attempt]))
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")


def serve(argv: list[str], admission: bool) -> None:
    """The personal control plane, as `python -m cellscale_hub` runs it; without admission, a
    controller whose admission never finds anything to do."""
    from cellscale_hub import app
    from cellscale_hub.control.admit import Admitter

    if not admission:
        Admitter.needed = lambda self, *args, **kwargs: False
    app.main(argv)


# ---------------------------------------------------------------------------------------------
# the driver: one case = one store, queue size, admission mode and code tree
# ---------------------------------------------------------------------------------------------
def wait_for(client: Client, job_id: str, phases: set[Phase], timeout: float = 300) -> Phase:
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


def cancel_all(url: str, token: str, job_ids: list[str], threads: int) -> float:
    clients = [Client(url, token) for _ in range(threads)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda a: clients[a[0] % threads].cancel(a[1]), enumerate(job_ids)))
    wall = time.perf_counter() - t0
    for c in clients:
        c.close()
    return wall


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cycles(cp: ControlPlane) -> tuple[float, float]:
    """(controller cycles so far, seconds they took), from /api/metrics."""
    text = httpx.get(f"{cp.url}api/metrics", headers={"Authorization": f"token {cp.token}"}, timeout=120).text
    found = dict(re.findall(r"^cellscale_controller_cycle_seconds_(count|sum) (\S+)$", text, re.M))
    return float(found.get("count", "nan")), float(found.get("sum", "nan"))


def start(home: Path, db_url: str, admission: bool, env: dict) -> ControlPlane:
    data_dir = home / "personal"
    data_dir.mkdir(parents=True, mode=0o700)
    argv = [PYTHON, str(HERE), "serve", "--admission", "on" if admission else "off"]
    argv += ["--personal", "--data-dir", str(data_dir), "--db-url", db_url, "--gpus", "1"]
    with open(data_dir / "control-plane.log", "ab") as log:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    cp = ControlPlane("", "", child.pid, data_dir)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and child.poll() is None:
        try:
            info = json.loads((data_dir / "server.json").read_text())
            cp = ControlPlane(info["url"], info["token"], child.pid, data_dir)
            if httpx.get(cp.url + "api/health", timeout=5).status_code == 200:
                return cp
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            pass
        time.sleep(0.2)
    stop_control_plane(cp)
    raise RuntimeError(f"control plane did not start:\n{(data_dir / 'control-plane.log').read_text()[-4000:]}")


def run_case(db_url: str, pending: int, admission: bool, tree: Path | None, args) -> dict:
    env = child_env(tree) | {"CELLSCALE_HOME": tempfile.mkdtemp(prefix="cellscale-bench-")}
    home = Path(env["CELLSCALE_HOME"])
    try:
        argv = [PYTHON, str(HERE), "populate", "--db-url", db_url, "--pending", str(pending)]
        done = subprocess.run(argv + ["--history", str(args.history)], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"populate failed:\n{done.stderr[-4000:]}")
        pop = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  populated {pop['jobs']} jobs in {pop['build_s'] + pop['insert_s']:.1f} s", flush=True)
        cp = start(home, db_url, admission, env)
        try:
            return measure(cp, pop, admission, args) | {"populate": pop}
        finally:
            stop_control_plane(cp)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def measure(cp: ControlPlane, pop: dict, admission: bool, args) -> dict:
    client = Client(cp.url, cp.token)
    t0 = time.perf_counter()
    wait_for(client, pop["blocker"], {Phase.RUNNING} if admission else {Phase.PENDING})
    started_s = time.perf_counter() - t0
    _, warm = flood(cp.url, cp.token, WARMUP, args.threads)
    n0, s0 = cycles(cp)
    cpu0 = cpu_seconds(cp.pid)
    wall, done = flood(cp.url, cp.token, args.submits, args.threads)
    cpu1 = cpu_seconds(cp.pid)
    n1, s1 = cycles(cp)
    flood_ids = [job_id for _, job_id, _ in warm + done]
    cancel_wall = cancel_all(cp.url, cp.token, flood_ids, args.threads)
    client.cancel(pop["blocker"])
    blocker_phase = wait_for(client, pop["blocker"], {Phase.CANCELLED, Phase.FAILED, Phase.SUCCEEDED})
    client.close()
    latencies = [lat for lat, _, _ in done]
    tenth = max(1, args.submits // 10)
    return {
        "submits": args.submits,
        "threads": args.threads,
        "blocker_admitted_s": started_s,
        "wall_s": wall,
        "jobs_per_s": args.submits / wall,
        "latency_p50_s": median(latencies),
        "latency_p99_s": percentile(latencies, 99),
        "latency_max_s": max(latencies),
        "latency_p50_first_10pct_s": median(latencies[:tenth]),
        "latency_p50_last_10pct_s": median(latencies[-tenth:]),
        "server_cpu_ms_per_submit": 1000 * (cpu1 - cpu0) / args.submits,
        "controller_cycles": n1 - n0,
        "controller_cycle_s": s1 - s0,
        "accepted_not_pending": sum(1 for _, _, phase in done if phase is not Phase.PENDING),
        "cancels_per_s": len(flood_ids) / cancel_wall,
        "blocker_final_phase": blocker_phase.value,
    }


def postgres_database(base) -> tuple[str, Callable[[], object]]:
    """A fresh database on the test PostgreSQL server: (url, drop)."""
    name = f"cellscale_bench_{uuid.uuid4().hex[:8]}"
    where = ["-h", base.host or "127.0.0.1", "-p", str(base.port or 5432), "-U", base.username or "postgres"]
    subprocess.run(["createdb", *where, name], check=True)
    url = base.set(database=name).render_as_string(hide_password=False)
    return url, lambda: subprocess.run(["dropdb", *where, "--if-exists", "--force", name], check=True)


def case_url(store: str, tmp: Path, pg_base) -> tuple[str, Callable[[], object]]:
    if store == "sqlite":
        path = tmp / f"cellscale-{uuid.uuid4().hex[:8]}.sqlite"
        return f"sqlite:///{path}", lambda: [p.unlink(missing_ok=True) for p in tmp.glob(path.name + "*")]
    return postgres_database(pg_base)


def label(case: dict) -> str:
    rev = "" if case["rev"] == "working tree" else f" @{case['rev']}"
    return f"{case['store']} pending={case['pending']} admission={case['admission']}{rev}"


def print_cases(cases: list[dict]) -> None:
    print(
        f"\nPOST /api/jobs: {cases[0]['submits']} submits from {cases[0]['threads']} threads, all accepted as PENDING"
    )
    keys = ["jobs_per_s", "latency_p50_s", "latency_p99_s", "latency_max_s", "server_cpu_ms_per_submit"]
    rows = [
        [label(c), *(c[k] for k in keys), f"{c['controller_cycles']:.0f} / {c['controller_cycle_s']:.1f} s"]
        for c in cases
    ]
    print_table(["case", "jobs/s", "p50 s", "p99 s", "max s", "server CPU ms/submit", "cycles / their s"], rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("populate", "serve"):
        return child_main()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 submits instead of 500")
    parser.add_argument("--submits", type=int)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--pending", default="0", help="jobs already waiting, comma-separated sizes (e.g. 0,100000)")
    parser.add_argument("--history", type=int, default=1000, help="succeeded jobs of the user already stored")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--admission", choices=["on", "off", "both"], default="on")
    parser.add_argument("--compare", metavar="REV", help="also run each store and size on REV's code, admission on")
    args = parser.parse_args()
    args.submits = args.submits or (100 if args.quick else 500)
    stores, sizes = args.stores.split(","), [int(n) for n in args.pending.split(",")]
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.admission]
    pg_base = None
    if "postgres" in stores:
        out = subprocess.run([str(REPO / "scripts" / "postgres")], capture_output=True, text=True, check=True)
        pg_base = make_url(out.stdout.strip().splitlines()[-1])
    trees: list[tuple[Path | None, list[bool]]] = [(None, modes)]
    if args.compare:
        trees.append((checkout(args.compare), [True]))
    cases, tmp = [], Path(tempfile.mkdtemp(prefix="cellscale-bench-submit-"))
    try:
        for store, size, (tree, tree_modes) in itertools.product(stores, sizes, trees):
            for admission in tree_modes:
                case = {"store": store, "pending": size, "admission": "on" if admission else "off"}
                case["rev"] = args.compare if tree else "working tree"
                print(f"\n== {label(case)}", flush=True)
                db_url, drop = case_url(store, tmp, pg_base)
                try:
                    case |= run_case(db_url, size, admission, tree, args)
                finally:
                    drop()
                cases.append(case)
                print_cases([case])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for tree, _ in trees[1:]:
            shutil.rmtree(tree, ignore_errors=True)
    print_cases(cases)
    settings = {
        k: getattr(args, k) for k in ("submits", "threads", "pending", "history", "stores", "admission", "compare")
    }
    write_results("submit_throughput", args.quick, {"settings": settings, "cases": cases})


def child_main() -> None:
    mode = sys.argv[1]
    if mode == "serve":  # serve --admission on|off, then the control plane's own arguments
        admission = sys.argv[3] == "on"
        return serve(sys.argv[4:], admission)
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--pending", type=int, required=True)
    parser.add_argument("--history", type=int, required=True)
    args = parser.parse_args()
    print(json.dumps(populate(args.db_url, args.pending, args.history)))


if __name__ == "__main__":
    main()
