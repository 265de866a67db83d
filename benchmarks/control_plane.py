"""Speed where users feel it: the latency of every route the panel, the `%cluster` magic and the
admin page call, the control plane's memory, and its CPU when nothing changes, on a store of
1k / 10k / 100k jobs, on SQLite and on PostgreSQL (issue 20, item 1).

For each store x size x shape it:

1. builds the store: `Store(url).migrate()`, then SQLAlchemy bulk inserts (Core executemany,
   5,000 rows a statement batch) of jobs, attempts and events into the real schema. Seeded, so
   every run builds the same rows. 17 owners across the demo desks of config/tenants.yaml
   (alice 20%, bob 15%, carol 10%, 14 others; desk-a and desk-b); spec JSON made the way the
   API stores it (`JobSpec` -> `placement.place` -> `model_dump(mode="json")`, cells of
   0.3-0.7 KB); priorities 10% high / 80% normal / 10% low; 1, 2 or 4 GPUs. Two shapes:
   - *pending*: 90% PENDING (submitted over the last 2 days), 10% finished;
   - *finished*: min(1000, N/10) PENDING, the rest finished over the last 30 days
     (78% SUCCEEDED, 14% FAILED, 8% CANCELLED; 10% took two attempts), with their attempts
     and 5-9 events each, as the controller writes them.
   Two *blockers* (alice and bob, 2 GPUs each, priority high, `time.sleep(3600)`) are the oldest
   pending jobs: the controller admits and really launches them on the local backend, so they
   fill the 4 GPUs at their desks' nominal quotas, and every other job stays PENDING with a
   stable reason: the controller keeps cycling and nothing changes.
2. starts the real control plane in a child process (`serve` below): `Context`, `build_app`,
   the `Controller` (0.5 s cycles) with `LocalDriver(gpus=4, submit_as=[])`, the tenancy from
   config/tenants.yaml through `TenancyBook`, a table identity as in tests/controlplane,
   served by uvicorn as `ControlPlane.start` does, on the socket that
   `cellscale_hub.app.listening_socket` makes (or `ControlPlane.listen_socket` in a revision
   without it), so the product's socket options are measured. A child process, not a thread of
   this one, so that its RSS and CPU are the control plane's alone, and the client does not
   share its GIL.
3. waits until the blockers run and every pending job has its reason (the first cycle writes
   them all), then measures:
   - idle CPU: the child's utime+stime over `--idle-s` seconds with no request, as % of one
     core; on PostgreSQL also the CPU of the server backends of this database. The default
     window is the controller's admission interval (`admission_interval_s`, 30 s): admission
     runs at least that often when nothing changes, so every such window holds one, and a
     shorter one would show it or not by chance (20 s for a revision without the interval);
   - latency of each route, as alice (admin for the admin routes), with one kept-alive httpx
     client and with a new TCP connection per request: `--requests` (100) per route and mode, or
     fewer when `--route-s` (1.5 s) is spent (at least 10), after 3 warm-ups; p50, p99, max;
   - RSS (VmRSS after the requests, VmHWM the peak).
4. stops the control plane (SIGTERM) and the blockers' supervisors, and drops the database.

Goals (issue 20; idle CPU issue 33): p99 <= 50 ms on every route, kept-alive p50 <= 5 ms, idle CPU
<= 0.5% of a core, RSS <= 500 MB. The table prints each with its ratio to the goal (<= 1 meets it).

PostgreSQL is the server `scripts/postgres` starts (fsync=off), one new database per case,
dropped at the end. `--compare REV` runs every case a second time on the hub and kernels code of
git revision REV (`git archive`, put first on PYTHONPATH; the schema is REV's own migrations) and
prints ratios working tree / REV. `--sql-stats` also records, in the child, the time of every SQL
statement and prints the slowest ones per case (adds a little overhead).

    .venv/bin/python benchmarks/control_plane.py [--sizes 1000,10000,100000] [--stores sqlite,postgres]
        [--shapes pending,finished] [--idle-s 30] [--requests 100] [--route-s 1.5] [--compare REV] [--sql-stats]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from _common import REPO, ControlPlane, percentile, print_table, ratio, stop_control_plane, write_results

HERE = Path(__file__).resolve()
TENANTS_FILE = REPO / "config" / "tenants.yaml"
LOCAL_GPUS = 4  # the demo's local backend (CELLSCALE_LOCAL_GPUS)
SEED = 20

MIN_SAMPLES = 10  # per route and mode, even past --route-s

GOALS = {"p99_ms": 50.0, "keepalive_p50_ms": 5.0, "idle_cpu_pct": 0.5, "rss_mb": 500.0}  # idle CPU: issue 33 (was 2%)

# owner -> (desk, weight in %): the demo users and 14 more across the two demo desks
OWNERS = {"alice": ("desk-a", 20), "bob": ("desk-b", 15), "carol": ("desk-a", 10)}
OWNERS |= {f"a{i:02d}": ("desk-a", 4) for i in range(1, 8)}
OWNERS |= {f"b{i:02d}": ("desk-b", 32 / 7) for i in range(1, 8)}
TOKENS = {"tok-alice": ("alice", ("desk-a",), False), "tok-bob": ("bob", ("desk-b",), False)}
TOKENS["tok-admin"] = ("admin", (), True)

NAME_STEMS = [
    ("train-resnet", 14),
    ("finetune-llama", 10),
    ("sweep-lr", 12),
    ("eval-bert", 8),
    ("ddp-smoke", 6),
    ("ray-tune", 6),
    ("backtest", 10),
    ("risk-sim", 8),
    ("feature-gen", 8),
    ("cell", 12),
    ("preprocess", 5),
    ("ablation", 1),
]
SEARCH = "ablation"  # the name search: ~1% of the names
PRIORITY = [("high", 10), (None, 80), ("low", 10)]
GPUS = [(1, 50), (2, 35), (4, 15)]
LAUNCHER = [("torchrun", 60), ("plain", 25), ("ray", 15)]

CELLS = [
    """import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear({n}, 1))
opt = torch.optim.SGD(model.parameters(), lr={lr})
for step in range({steps}):
    x = torch.randn(32, {n}); y = x.sum(1, keepdim=True)
    opt.zero_grad(); l = torch.nn.functional.mse_loss(model(x), y); l.backward(); opt.step()
    print(f"step {{step}} loss {{l.item():.3f}}")
loss = l.item()
""",
    """import ray
ray.init()
@ray.remote(num_gpus=1)
def score(seed):
    import random
    random.seed(seed)
    return sum(random.random() for _ in range({steps}))
result = ray.get([score.remote(s) for s in range({n})])
print(len(result), max(result), "lr", {lr})
""",
    """import pandas as pd, numpy as np
from cellscale.checkpoint import Checkpointer
ck = Checkpointer("file:///shared/ckpt/{name}")
df = pd.DataFrame(np.random.randn({steps}, {n}))
state = {{"mean": df.mean().tolist()}}
for step in range(10):
    df = df.rolling(5).mean().fillna(0) * {lr}
    ck.maybe_save(step, state, every=5)
summary = df.describe()
""",
]


def weighted(rng: random.Random, choices):
    values, weights = zip(*choices, strict=True)
    return rng.choices(values, weights)[0]


# ---------------------------------------------------------------------------------------------
# populate (runs in a child, on the code under test): bulk inserts into the real schema
# ---------------------------------------------------------------------------------------------
def queue_totals(jobs: list[dict], attempts: list[dict]) -> list[dict]:
    """The per-queue totals the transactions would have kept, for rows bulk-inserted around them."""
    totals: dict[str, dict] = {}
    gpus = {j["id"]: (j["cluster_queue"], j["gpus"]) for j in jobs}
    for j in jobs:
        t = totals.setdefault(j["cluster_queue"], dict.fromkeys(("pending_jobs", "pending_gpus", "pending_cpus"), 0))
        if str(j["phase"]) == "PENDING":
            t["pending_jobs"] += 1
            t["pending_gpus"] += j["gpus"]
            t["pending_cpus"] += j.get("cpus", 0)
    for a in attempts:
        if a.get("started_at") and a.get("ended_at"):
            cq, n = gpus[a["job_id"]]
            t = totals[cq]
            t["ended_gpu_seconds"] = (
                t.get("ended_gpu_seconds", 0.0) + n * (a["ended_at"] - a["started_at"]).total_seconds()
            )
    return [{"cluster_queue": cq, "ended_gpu_seconds": 0.0} | t for cq, t in totals.items()]


def populate(db_url: str, size: int, shape: str) -> dict:
    from sqlalchemy import insert

    from cellscale.spec import JobSpec
    from cellscale.vocabulary import AttemptState, EventKind, EventReason, Fault, Phase
    from cellscale_hub.auth import ALL_SCOPES, Principal
    from cellscale_hub.drivers.local import LocalDriver
    from cellscale_hub.routing import route
    from cellscale_hub.store import Store
    from cellscale_hub.store.models import Attempt, Base, Event, Job
    from cellscale_hub.tenancy import Tenancy

    t_start = time.perf_counter()
    store = Store(db_url)
    store.migrate()
    tenancy = Tenancy.from_yaml(TENANTS_FILE.read_text())
    drivers = {"local": LocalDriver(name="local", gpus=LOCAL_GPUS, submit_as=[])}
    rng = random.Random(SEED)
    now = datetime.now(UTC)
    owners = list(OWNERS)
    owner_weights = [OWNERS[o][1] for o in owners]
    cols = {t: {c.name for c in t.__table__.columns} for t in (Job, Attempt, Event)}
    rows: dict[type, list[dict]] = {Job: [], Attempt: [], Event: []}
    ids: set[str] = set()

    def new_id() -> str:
        while (job_id := f"cs-{rng.getrandbits(48):012x}") in ids:
            pass
        ids.add(job_id)
        return job_id

    placed: dict[tuple, tuple] = {}

    def placement(owner: str, gpus: int, launcher: str, priority: str | None, timeout_min: int):
        key = (owner, gpus, launcher, priority, timeout_min)
        if key not in placed:
            desk = OWNERS[owner][0]
            who = Principal(owner, (desk,), ALL_SCOPES, tenants=(desk,))
            spec = JobSpec(
                launcher=launcher,
                resources={"gpus_per_node": gpus, "timeout_min": timeout_min},
                priority=priority,
                source="x = 1\n",
                outputs=["loss"] if launcher == "torchrun" else [],
            )
            where = route(tenancy, drivers, who, spec)
            placed[key] = (where, where.spec.model_dump(mode="json"))
        return placed[key]

    def event(job_id, at, kind, reason, to_phase=None, from_phase=None, attempt=None, message=None, actor="controller"):
        rows[Event].append(
            dict(
                job_id=job_id,
                at=at,
                kind=kind,
                attempt=attempt,
                from_phase=from_phase,
                to_phase=to_phase,
                reason=reason,
                message=message,
                actor=actor,
            )
        )

    def job(
        phase: Phase,
        created: datetime,
        owner: str | None = None,
        gpus: int | None = None,
        priority: str | None = "draw",
        source: str | None = None,
        name: str | None = None,
    ) -> dict:
        owner = owner or rng.choices(owners, owner_weights)[0]
        gpus = gpus or weighted(rng, GPUS)
        launcher = "plain" if source else weighted(rng, LAUNCHER)
        priority = weighted(rng, PRIORITY) if priority == "draw" else priority
        # a blocker's --time (30 min) also ends it should this script be killed before it stops it
        where, spec = placement(owner, gpus, launcher, priority, 30 if source else rng.choice([30, 60, 120, 480]))
        stem = weighted(rng, NAME_STEMS)
        name = name or f"{stem}-{rng.randrange(1000)}"
        cell = source or rng.choice(CELLS).format(
            n=rng.choice([8, 64, 256]), lr=rng.choice([0.1, 0.01, 0.003]), steps=rng.randrange(20, 5000), name=name
        )
        job_id = new_id()
        row = dict(
            id=job_id,
            idempotency_key=uuid.UUID(int=rng.getrandbits(128)).hex,
            owner=owner,
            tenant=where.tenant,
            queue=where.queue,
            backend=where.backend,
            cluster_queue=where.cluster_queue,
            flavor=None,
            priority=where.priority,
            borrowed=0,
            name=name,
            spec={**spec, "name": name, "source": cell},
            gpus=gpus,
            phase=phase,
            reason="waiting for admission",
            preempt_deadline=None,
            preempt_reason=None,
            excluded_nodes=[],
            cancel_requested=False,
            result_available=False,
            result_key=f"{rng.getrandbits(256):064x}" if launcher == "torchrun" else None,
            created_at=created,
            updated_at=created,
            started_at=None,
            finished_at=None,
        )
        rows[Job].append(row)
        event(
            job_id,
            created,
            EventKind.PHASE,
            EventReason.Submitted,
            to_phase=Phase.PENDING,
            actor=owner,
            message=f"submitted to queue {where.queue} on backend {where.backend}",
        )
        return row

    def attempt(
        row: dict,
        number: int,
        admitted: datetime,
        state: AttemptState,
        end: datetime | None,
        fault: Fault | None = None,
        end_reason: str | None = None,
    ) -> None:
        job_id, gpu_ids = row["id"], sorted(rng.sample(range(LOCAL_GPUS), row["gpus"]))
        submitted = admitted + timedelta(milliseconds=rng.randrange(10, 60))
        started = submitted + timedelta(seconds=rng.uniform(1, 8))
        rows[Attempt].append(
            dict(
                job_id=job_id,
                number=number,
                backend="local",
                backend_ref=f"pid:{rng.randrange(2000, 60000)}",
                state=state,
                gpu_ids=gpu_ids,
                submitted_at=submitted,
                started_at=started,
                ended_at=end,
                exit_code=None if end is None else (0 if state is AttemptState.SUCCEEDED else 1),
                end_reason=end_reason,
                last_heartbeat=end or started,
                last_checkpoint_at=None,
                fault=fault,
                failed_nodes=[],
                last_step=rng.randrange(0, 5000) if end else None,
                last_step_at=end,
                resumed_step=None,
            )
        )
        from_phase = Phase.PENDING
        event(
            job_id,
            admitted,
            EventKind.PHASE,
            EventReason.QuotaReserved,
            Phase.ADMITTED,
            from_phase,
            number,
            f"{row['gpus']} local GPU(s) reserved in {row['cluster_queue']}",
        )
        event(
            job_id,
            submitted,
            EventKind.PHASE,
            EventReason.Submitted,
            Phase.STARTING,
            Phase.ADMITTED,
            number,
            f"submitted to local as pid:{rng.randrange(2000, 60000)}",
        )
        event(job_id, started, EventKind.PHASE, EventReason.Running, Phase.RUNNING, Phase.STARTING, number)
        row["started_at"] = row["started_at"] or started
        row["flavor"] = "local"

    def finished(created: datetime) -> None:
        phase = weighted(rng, [(Phase.SUCCEEDED, 78), (Phase.FAILED, 14), (Phase.CANCELLED, 8)])
        row = job(phase, created)
        job_id, t = row["id"], created + timedelta(seconds=rng.expovariate(1 / 600))
        if phase is Phase.CANCELLED and rng.random() < 0.4:  # cancelled while it waited
            event(job_id, t, EventKind.CANCEL, EventReason.CancelRequested, actor=row["owner"])
            event(
                job_id,
                t,
                EventKind.PHASE,
                EventReason.Cancelled,
                Phase.CANCELLED,
                Phase.PENDING,
                message="cancelled before it was admitted",
                actor=row["owner"],
            )
            row.update(
                phase=phase,
                reason="cancelled before it was admitted",
                cancel_requested=True,
                updated_at=t,
                finished_at=t,
            )
            return
        number = 1
        if rng.random() < 0.10:  # a lost attempt, retried
            end = t + timedelta(seconds=rng.uniform(30, 3600))
            why = "the supervisor died without writing an exit record"
            attempt(row, 1, t, AttemptState.LOST, end, Fault.INFRASTRUCTURE, why)
            event(job_id, end, EventKind.ATTEMPT, EventReason.Lost, attempt=1, message=why)
            event(
                job_id,
                end,
                EventKind.PHASE,
                EventReason.Retrying,
                Phase.RECOVERING,
                Phase.RUNNING,
                1,
                f"{why} (infrastructure fault, retry 1 of 3)",
            )
            event(
                job_id,
                end,
                EventKind.PHASE,
                EventReason.Requeued,
                Phase.PENDING,
                Phase.RECOVERING,
                1,
                "retry after an infrastructure fault; the next attempt resumes from the newest verified checkpoint",
            )
            t, number = end + timedelta(seconds=rng.uniform(0.5, 60)), 2
        end = t + timedelta(seconds=rng.expovariate(1 / 1800) + 5)
        if phase is Phase.SUCCEEDED:
            state, fault, why, reason = AttemptState.SUCCEEDED, None, "succeeded", EventReason.Finished
        elif phase is Phase.FAILED:
            state, fault, reason = AttemptState.FAILED, Fault.USER_ERROR, EventReason.Failed
            why = "rank 0: ValueError: shapes (32,64) and (8,1) not aligned"
        else:
            state, fault, why, reason = AttemptState.CANCELLED, None, "cancelled", EventReason.Cancelled
            event(job_id, end, EventKind.CANCEL, EventReason.CancelRequested, actor=row["owner"])
        attempt(row, number, t, state, end, fault, why)
        event(job_id, end, EventKind.ATTEMPT, EventReason.of_attempt_end(state), attempt=number, message=why)
        event(job_id, end, EventKind.PHASE, reason, phase, Phase.RUNNING, number, why)
        row.update(
            phase=phase,
            reason=why,
            updated_at=end,
            finished_at=end,
            result_available=phase is Phase.SUCCEEDED and row["result_key"] is not None,
            cancel_requested=phase is Phase.CANCELLED,
        )

    if shape == "pending":
        n_pending = size - size // 10
        finished_span, pending_span = timedelta(days=30), timedelta(days=2)
    else:
        n_pending = min(1000, size // 10)
        finished_span, pending_span = timedelta(days=30), timedelta(hours=6)
    n_finished = size - n_pending - 2
    first_pending = now - pending_span
    for created in sorted(
        now - finished_span + rng.random() * (finished_span - pending_span) for _ in range(n_finished)
    ):
        finished(created)
    blockers = [
        job(
            Phase.PENDING,
            first_pending - timedelta(minutes=1),
            owner=owner,
            gpus=2,
            priority="high",
            source="import time\ntime.sleep(3600)\n",
            name=f"bench-blocker-{owner}",
        )["id"]
        for owner in ("alice", "bob")
    ]
    for created in sorted(first_pending + rng.random() * pending_span for _ in range(n_pending)):
        job(Phase.PENDING, created)
    t_built = time.perf_counter()
    with store.engine.begin() as conn:
        for model in (Job, Attempt, Event):
            batch = [{k: v for k, v in r.items() if k in cols[model]} for r in rows[model]]
            for i in range(0, len(batch), 5000):
                conn.execute(insert(model.__table__), batch[i : i + 5000])
        if "queue_totals" in Base.metadata.tables:  # a revision that keeps per-queue totals on commit
            conn.execute(insert(Base.metadata.tables["queue_totals"]), queue_totals(rows[Job], rows[Attempt]))
    t_inserted = time.perf_counter()
    if store.engine.dialect.name == "postgresql":
        # statistics and the visibility map, as autovacuum keeps them on a live server; without
        # them the planner seq-scans (e.g. the warned-jobs query ignores its index), and autovacuum
        # would bring them mid-case, at a moment of its choosing
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    store.dispose()
    alice = [r for r in rows[Job] if r["owner"] == "alice" and r["id"] not in blockers]
    phases: dict[str, int] = {}
    for r in rows[Job]:
        phases[str(r["phase"])] = phases.get(str(r["phase"]), 0) + 1
    sample = random.Random(SEED + 1).sample(alice, min(50, len(alice)))
    return {
        "jobs": len(rows[Job]),
        "attempts": len(rows[Attempt]),
        "events": len(rows[Event]),
        "phases": phases,
        "alice_jobs": len(alice),
        "alice_failed": sum(1 for r in alice if r["phase"] == Phase.FAILED),
        "alice_name_matches": sum(1 for r in alice if SEARCH in r["name"]),
        "desk_a_jobs": sum(1 for r in rows[Job] if r["tenant"] == "desk-a"),
        "blockers": blockers,
        "sample_ids": [r["id"] for r in sample],
        "build_s": t_built - t_start,
        "insert_s": t_inserted - t_built,
        "vacuum_analyze_s": time.perf_counter() - t_inserted,
    }


# ---------------------------------------------------------------------------------------------
# serve (runs in a child, on the code under test): the control plane as ControlPlane.start builds it
# ---------------------------------------------------------------------------------------------
def product_socket(ip: str, port: int):
    """The product's own listening socket (its options are part of what is measured)."""
    from cellscale_hub import app as app_module

    make = getattr(app_module, "listening_socket", None)
    if make is not None:
        return make(ip, port), "cellscale_hub.app.listening_socket"
    return app_module.ControlPlane(ip=ip, port=port, personal=True).listen_socket(), "ControlPlane.listen_socket"


def serve(db_url: str, data_dir: Path, info_file: Path, sql_stats: bool) -> None:
    import logging

    import uvicorn

    from cellscale_hub.api import build_app
    from cellscale_hub.api.context import Context
    from cellscale_hub.auth import ALL_SCOPES, Identity, Principal, Unauthenticated
    from cellscale_hub.bundles import BundleStore
    from cellscale_hub.control.controller import Controller
    from cellscale_hub.drivers.local import LocalDriver
    from cellscale_hub.settings import Settings
    from cellscale_hub.store import Store
    from cellscale_hub.store.tenancy_book import TenancyBook
    from cellscale_hub.tenancy import Tenancy

    logging.basicConfig(level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")

    class TableIdentity(Identity):
        def principal(self, token: str) -> Principal:
            if token not in TOKENS:
                raise Unauthenticated("invalid token")
            user, groups, admin = TOKENS[token]
            return Principal(user, groups, ALL_SCOPES, admin=admin)

    os.umask(0o077)
    jobs_root, bundles_root = data_dir / "jobs", data_dir / "bundles"
    for path in (jobs_root, bundles_root):
        path.mkdir(parents=True, exist_ok=True)
    store = Store(db_url)
    store.migrate()
    statements = _sql_timer(store.engine) if sql_stats else None
    drivers = {"local": LocalDriver(name="local", gpus=LOCAL_GPUS, submit_as=[])}
    tenancy = TenancyBook(store)
    tenancy.seed(Tenancy.from_yaml(TENANTS_FILE.read_text()), actor=f"file:{TENANTS_FILE}")
    bundles = BundleStore(bundles_root, quota_bytes=1024 * 2**20, grace_s=3600.0)
    settings = Settings(interval=0.5, fair_share_half_life_s=3600.0, preemption_grace_s=30.0, heartbeat_timeout_s=60.0)
    controller = Controller(store, drivers, jobs_root, bundles, tenancy, settings)
    # (end wall time, seconds, CPU seconds of the controller's thread): its cycles, and the admission
    # cycles within them, timed from outside
    cycles: list[tuple[float, float, float]] = []
    admissions: list[tuple[float, float, float]] = []
    controller.cycle = _timed(controller.cycle, cycles)
    controller.admission.admit = _timed(controller.admission.admit, admissions)
    sock, socket_from = product_socket("127.0.0.1", 0)
    ctx = Context(
        store=store,
        wake=controller.wake,
        **({"waiting": controller.waiting} if hasattr(controller, "waiting") else {}),  # a revision with a WaitingBoard
        drivers=drivers,
        tenancy=tenancy,
        identity=TableIdentity(),
        jobs_root=jobs_root,
        bundles=bundles,
        prefix="/",
        settings=settings,
    )
    app = build_app(ctx, max_body_bytes=2 * 2**20)
    controller.start()
    host, port = sock.getsockname()[:2]
    info_file.write_text(
        json.dumps(
            {
                "url": f"http://{host}:{port}",
                "pid": os.getpid(),
                "socket_from": socket_from,
                # a revision with event-driven admission also admits every admission_interval_s when idle
                "admission_interval_s": settings.admission_interval_s,
            }
        )
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3, access_log=False))
    try:
        server.run(sockets=[sock])
    finally:
        controller.stop()
        store.dispose()
        out = {"cycles": cycles, "admissions": admissions, "sql": statements}
        (data_dir / "serve-stats.json").write_text(json.dumps(out))


def _timed(call, into: list):
    """`call`, appending (end wall time, seconds, CPU seconds of the calling thread) to `into`."""

    def timed(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            into.append((time.time(), time.perf_counter() - t0, time.thread_time() - c0))

    return timed


def _sql_timer(engine) -> dict:
    """statement text -> [count, total s, max s] of cursor.execute, filled by engine events (on
    PostgreSQL that includes receiving the rows; on SQLite rows after the first are produced while
    they are fetched, which is not counted). SIGUSR1 empties it: the driver sends it before the
    requests, so that what is left is the requests' and the idle controller's."""
    from sqlalchemy import event

    stats: dict[str, list] = {}
    signal.signal(signal.SIGUSR1, lambda *_: stats.clear())

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn, cursor, statement, parameters, context, executemany):
        conn.info.setdefault("t0", []).append(time.perf_counter())

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn, cursor, statement, parameters, context, executemany):
        took = time.perf_counter() - conn.info["t0"].pop()
        entry = stats.setdefault(_compact(statement), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += took
        entry[2] = max(entry[2], took)

    return stats


def _compact(statement: str) -> str:
    """One line, a long select list shown as `…`."""
    return re.sub(r"^SELECT (.{40,}?) FROM ", "SELECT … FROM ", " ".join(statement.split()))


# ---------------------------------------------------------------------------------------------
# the driver: one case = one store, size, shape and code tree
# ---------------------------------------------------------------------------------------------
def code_version(tree: Path | None) -> str:
    """The commit the case ran on, `+dirty` when hub/ or kernels/ had uncommitted changes."""
    if tree is not None:
        return f"rev {tree.name}"
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "hub", "kernels"], cwd=REPO, capture_output=True, text=True)
    return head.strip() + ("+dirty" if dirty.stdout.strip() else "")


def child_env(tree: Path | None) -> dict:
    env = dict(os.environ)
    if tree is not None:
        paths = [str(tree / "hub"), str(tree / "kernels"), str(tree / "extension")]
        env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (all threads)


def pg_backend_ticks(dbname: str) -> int:
    """CPU of the PostgreSQL server processes serving this database (their title names it)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f" {dbname} ".encode() in (proc / "cmdline").read_bytes().replace(b"\0", b" "):
                total += cpu_ticks(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return total


def memory(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024  # kB -> MiB
    return out


def routes(pop: dict, cursor: str | None) -> list[tuple[str, str, callable]]:
    """(label, token, i -> request): a request is a GET path, or (path, JSON body) to POST."""
    ids = pop["sample_ids"]
    run = uuid.uuid4().hex[:8]
    return [
        ("whoami", "tok-alice", lambda i: "/api/whoami"),
        ("quota", "tok-alice", lambda i: "/api/quota"),
        ("jobs mine", "tok-alice", lambda i: "/api/jobs?scope=mine&limit=50"),
        ("jobs tenant", "tok-alice", lambda i: "/api/jobs?scope=tenant&limit=50"),
        ("jobs mine phase=FAILED", "tok-alice", lambda i: "/api/jobs?scope=mine&phase=FAILED&limit=50"),
        (f"jobs mine name~{SEARCH}", "tok-alice", lambda i: f"/api/jobs?scope=mine&name={SEARCH}&limit=50"),
        ("jobs mine page 2", "tok-alice", lambda i: f"/api/jobs?scope=mine&limit=50&cursor={cursor}"),
        ("job", "tok-alice", lambda i: f"/api/jobs/{ids[i % len(ids)]}"),
        ("job events", "tok-alice", lambda i: f"/api/jobs/{ids[i % len(ids)]}/events"),
        ("admin tenancy", "tok-admin", lambda i: "/api/admin/tenancy"),
        ("admin audit", "tok-admin", lambda i: "/api/admin/audit?limit=200"),
        # a new job each time: it waits behind the blockers, and wakes admission over the whole queue
        ("submit", "tok-alice", lambda i: ("/api/jobs", submit_body(f"{run}-{i}-{time.monotonic_ns()}"))),
    ]


def submit_body(name: str) -> dict:
    return {"spec": {"source": "pass", "launcher": "plain", "name": name[:63], "resources": {"gpus_per_node": 1}}}


def time_route(client: httpx.Client, token: str, request, requests: int, budget_s: float) -> dict:
    headers = {"Authorization": f"token {token}"}

    def send(i: int) -> httpx.Response:
        what = request(i)
        if isinstance(what, str):
            return client.get(what, headers=headers)
        path, body = what
        return client.post(path, json=body, headers=headers)

    for i in range(3):  # warm-up
        send(i).raise_for_status()
    latencies, errors, t_end = [], 0, time.perf_counter() + budget_s
    for i in range(requests):
        t0 = time.perf_counter()
        response = send(i + 3)
        response.read()
        latencies.append(time.perf_counter() - t0)
        errors += not response.is_success
        if time.perf_counter() > t_end and len(latencies) >= MIN_SAMPLES:
            break
    ms = [x * 1000 for x in latencies]
    return {
        "n": len(ms),
        "errors": errors,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
        "mean_ms": sum(ms) / len(ms),
    }


def reasons(client: httpx.Client) -> dict[str, str]:
    """The reasons of the newest 500 pending jobs as the API shows them (the admin's view):
    the same check for a revision that stores reasons and one that keeps them in memory."""
    page = client.get(
        "/api/jobs?scope=all&phase=PENDING&limit=500", headers={"Authorization": "token tok-admin"}
    ).json()
    return {job["id"]: json.dumps(job["pending"], sort_keys=True) for job in page["items"]}


def wait_settled(url: str, blockers: list[str], timeout: float = 600) -> tuple[float, dict]:
    """Until both blockers run, every pending job shown has its reason, and no reason changed
    over 3 s (the admission that follows the blockers' start rewrites them): (seconds it took,
    the reasons)."""
    t0 = time.monotonic()
    with httpx.Client(base_url=url, timeout=60) as client:
        while True:
            phases = [
                client.get(f"/api/jobs/{b}", headers={"Authorization": "token tok-admin"}).json()["phase"]
                for b in blockers
            ]
            shown = reasons(client)
            unexplained = sum(1 for r in shown.values() if r == "null")
            if phases == ["RUNNING", "RUNNING"] and unexplained == 0:
                time.sleep(3)
                if (after := reasons(client)) == shown:
                    return time.monotonic() - t0, after
                continue
            if "FAILED" in phases or time.monotonic() - t0 > timeout:
                raise RuntimeError(
                    f"control plane did not settle: blockers {phases}, {unexplained} pending unexplained"
                )
            time.sleep(1)


def run_case(store: str, size: int, shape: str, tree: Path | None, args, pg_base) -> dict:
    from sqlalchemy import create_engine, text

    tmp = Path(tempfile.mkdtemp(prefix="cellscale-bench-cp-"))
    os.chmod(tmp, 0o711)
    dbname = None
    if store == "sqlite":
        db_url = f"sqlite:///{tmp}/cellscale.sqlite"
    else:
        dbname = f"cellscale_bench_{uuid.uuid4().hex[:8]}"
        admin = create_engine(pg_base.render_as_string(hide_password=False), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{dbname}"'))
        db_url = pg_base.set(database=dbname).render_as_string(hide_password=False)
    env = child_env(tree)
    data_dir, info_file = tmp / "cp", tmp / "serve.json"
    cp = None
    try:
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(HERE), "populate", "--db-url", db_url, "--size", str(size), "--shape", shape],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"populate failed:\n{done.stderr[-4000:]}")
        pop = json.loads(done.stdout.strip().splitlines()[-1])
        pop["populate_s"] = time.perf_counter() - t0
        print(
            f"  populated {pop['jobs']} jobs, {pop['attempts']} attempts, {pop['events']} events "
            f"in {pop['populate_s']:.1f} s (insert {pop['insert_s']:.1f} s)",
            flush=True,
        )

        data_dir.mkdir()
        argv = [
            sys.executable,
            str(HERE),
            "serve",
            "--db-url",
            db_url,
            "--data-dir",
            str(data_dir),
            "--info",
            str(info_file),
        ] + (["--sql-stats"] if args.sql_stats else [])
        with open(tmp / "control-plane.log", "ab") as log:
            child = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 120
        while not info_file.exists() or not _healthy(json.loads(info_file.read_text())["url"]):
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"control plane did not start:\n{(tmp / 'control-plane.log').read_text()[-4000:]}")
            time.sleep(0.2)
        info = json.loads(info_file.read_text())
        cp = ControlPlane(info["url"], "", child.pid, data_dir)
        started = time.time()

        settle_s, before = wait_settled(cp.url, pop["blockers"])
        print(f"  settled in {settle_s:.1f} s (blockers running, every pending job has its reason)", flush=True)
        hz = os.sysconf("SC_CLK_TCK")
        w0, c0 = time.time(), cpu_ticks(child.pid)
        p0 = pg_backend_ticks(dbname) if dbname else 0
        idle_s = args.idle_s or info.get("admission_interval_s") or 20.0
        time.sleep(idle_s)
        w1, c1 = time.time(), cpu_ticks(child.pid)
        p1 = pg_backend_ticks(dbname) if dbname else 0
        idle_cpu = 100 * (c1 - c0) / hz / (w1 - w0)
        pg_cpu = 100 * (p1 - p0) / hz / (w1 - w0) if dbname else None
        with httpx.Client(base_url=cp.url, timeout=60) as client:
            after = reasons(client)
        changed = [i for i in after if after[i] != before.get(i)]
        example = {"job": changed[0], "before": before.get(changed[0]), "after": after[changed[0]]} if changed else None
        mem_idle = memory(child.pid)
        print(
            f"  idle CPU {idle_cpu:.2f}% of a core"
            + (f" (+ PostgreSQL {pg_cpu:.2f}%)" if dbname else "")
            + f", RSS {mem_idle['VmRSS']:.0f} MiB",
            flush=True,
        )

        if args.sql_stats:
            os.kill(child.pid, signal.SIGUSR1)  # statement times from here on: the requests'
        with httpx.Client(base_url=cp.url, timeout=120) as client:
            first = client.get("/api/jobs?scope=mine&limit=50", headers={"Authorization": "token tok-alice"}).json()
        table = routes(pop, first["next_cursor"])
        results = {}
        keep = httpx.Client(base_url=cp.url, timeout=120)
        fresh = httpx.Client(base_url=cp.url, timeout=120, limits=httpx.Limits(max_keepalive_connections=0))
        try:
            for label, token, path in table:
                results[label] = {
                    "keepalive": time_route(keep, token, path, args.requests, args.route_s),
                    "new_connection": time_route(fresh, token, path, args.requests, args.route_s),
                }
        finally:
            keep.close()
            fresh.close()
        mem = memory(child.pid)
    finally:
        if cp is not None:
            stop_control_plane(cp)  # SIGTERM, wait; then the blockers' supervisors
        if dbname:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
            admin.dispose()
        stats = _read_json(data_dir / "serve-stats.json") or {}
        shutil.rmtree(tmp, ignore_errors=True)
    idle_cycles = [(s, cpu) for end, s, cpu in stats.get("cycles", []) if w0 <= end <= w1]
    idle_admissions = [cpu for end, _, cpu in stats.get("admissions", []) if w0 <= end <= w1]
    all_cycles = [s for end, s, _ in stats.get("cycles", []) if end >= started]
    cycle_s = [s for s, _ in idle_cycles]
    out = {
        "store": store,
        "size": size,
        "shape": shape,
        "rev": args.compare if tree else "working tree",
        "socket_from": info["socket_from"],
        "admission_interval_s": info.get("admission_interval_s"),
        "populate": pop,
        "settle_s": settle_s,
        "idle": {
            "seconds": w1 - w0,
            "cpu_pct_of_core": idle_cpu,
            "postgres_backends_cpu_pct": pg_cpu,
            "pending_reasons_changed": len(changed),
            "pending_reason_change_example": example,
            "controller_cycles": len(idle_cycles),
            "cycle_median_s": percentile(cycle_s, 50) if cycle_s else None,
            "cycle_max_s": max(cycle_s) if cycle_s else None,
            # the controller thread's CPU in its cycles, and in the admission cycles among them (the
            # rest of cpu_pct_of_core is the server's event loop and the other threads)
            "controller_cpu_pct": 100 * sum(cpu for _, cpu in idle_cycles) / (w1 - w0),
            "admission_cycles": len(idle_admissions),
            "admission_cpu_pct": 100 * sum(idle_admissions) / (w1 - w0),
            "first_cycle_s": all_cycles[0] if all_cycles else None,
        },
        "rss_mb": {"idle": mem_idle["VmRSS"], "after_requests": mem["VmRSS"], "peak": mem["VmHWM"]},
        "routes": results,
        "loadavg": os.getloadavg(),
        "code": code_version(tree),
    }
    if args.sql_stats and stats.get("sql"):
        top = sorted(stats["sql"].items(), key=lambda kv: -kv[1][1] / kv[1][0])[:8]
        out["slowest_sql"] = [
            {"statement": s[:400], "count": c, "mean_ms": 1000 * t / c, "max_ms": 1000 * m} for s, (c, t, m) in top
        ]
    out["goals"] = judge(out)
    return out


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/api/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def judge(case: dict) -> dict:
    """Each goal: the worst measured value (and where), and its ratio to the goal."""
    routes_ = case["routes"]
    p99 = max(((r[m]["p99_ms"], f"{name} ({m})") for name, r in routes_.items() for m in r), key=lambda x: x[0])
    p50 = max(((r["keepalive"]["p50_ms"], name) for name, r in routes_.items()), key=lambda x: x[0])
    cpu, rss = case["idle"]["cpu_pct_of_core"], case["rss_mb"]["peak"]
    return {
        "p99_ms": {"worst": p99[0], "where": p99[1], "ratio": ratio(p99[0], GOALS["p99_ms"])},
        "keepalive_p50_ms": {"worst": p50[0], "where": p50[1], "ratio": ratio(p50[0], GOALS["keepalive_p50_ms"])},
        "idle_cpu_pct": {"worst": cpu, "ratio": ratio(cpu, GOALS["idle_cpu_pct"])},
        "rss_mb": {"worst": rss, "ratio": ratio(rss, GOALS["rss_mb"])},
    }


def print_case(case: dict) -> None:
    print(f"\n{case['store']} {case['shape']} {case['size']} ({case['rev']}): ms, kept-alive | new connection")
    rows = []
    for name, r in case["routes"].items():
        ka, nc = r["keepalive"], r["new_connection"]
        rows.append(
            [
                name,
                ka["n"],
                ka["p50_ms"],
                ka["p99_ms"],
                nc["p50_ms"],
                nc["p99_ms"],
                ratio(max(ka["p99_ms"], nc["p99_ms"]), GOALS["p99_ms"]),
                ratio(ka["p50_ms"], GOALS["keepalive_p50_ms"]),
                ka["errors"] + nc["errors"],
            ]
        )
    print_table(["route", "n", "ka p50", "ka p99", "nc p50", "nc p99", "p99/50ms", "ka p50/5ms", "errors"], rows)
    idle = case["idle"]
    cyc = (
        f", controller cycle median {idle['cycle_median_s']:.3f} s, max {idle['cycle_max_s']:.3f} s"
        if idle["cycle_median_s"] is not None
        else ""
    )
    pg = (
        f" + PostgreSQL {idle['postgres_backends_cpu_pct']:.1f}%"
        if idle["postgres_backends_cpu_pct"] is not None
        else ""
    )
    print(
        f"idle CPU {idle['cpu_pct_of_core']:.2f}% of a core{pg} over {idle['seconds']:.0f} s "
        f"(controller {idle['controller_cpu_pct']:.2f}%, of which {idle['admission_cycles']} admission cycle(s) "
        f"{idle['admission_cpu_pct']:.2f}%) "
        f"({idle['controller_cycles']} cycles{cyc}; pending reasons changed: {idle['pending_reasons_changed']}); "
        f"RSS {case['rss_mb']['after_requests']:.0f} MiB (peak {case['rss_mb']['peak']:.0f})"
    )
    for s in case.get("slowest_sql", [])[:5]:
        print(f"  sql mean {s['mean_ms']:.1f} ms, max {s['max_ms']:.1f} ms, {s['count']}x: {s['statement'][:200]}")


def print_summary(cases: list[dict]) -> None:
    print(
        "\nGoals (issue 20; idle CPU issue 33): p99 <= 50 ms on every route, kept-alive p50 <= 5 ms, "
        "idle CPU <= 0.5% of a core, "
        "RSS <= 500 MB; ratio = measured / goal (<= 1 meets it)"
    )
    rows = []
    for c in cases:
        g = c["goals"]
        rows.append(
            [
                f"{c['store']} {c['shape']} {c['size']}" + ("" if c["rev"] == "working tree" else f" @{c['rev']}"),
                g["p99_ms"]["worst"],
                g["p99_ms"]["ratio"],
                g["keepalive_p50_ms"]["worst"],
                g["keepalive_p50_ms"]["ratio"],
                g["idle_cpu_pct"]["worst"],
                g["idle_cpu_pct"]["ratio"],
                g["rss_mb"]["worst"],
                g["rss_mb"]["ratio"],
                g["p99_ms"]["where"],
            ]
        )
    print_table(
        ["case", "worst p99 ms", "/50", "worst ka p50", "/5", "idle CPU %", "/0.5", "RSS MiB", "/500", "worst p99 at"],
        rows,
    )


def print_compare(cases: list[dict]) -> None:
    ours = {(c["store"], c["shape"], c["size"]): c for c in cases if c["rev"] == "working tree"}
    theirs = {(c["store"], c["shape"], c["size"]): c for c in cases if c["rev"] != "working tree"}
    for key in ours.keys() & theirs.keys():
        a, b = ours[key], theirs[key]
        print(f"\n{' '.join(map(str, key))}: working tree / {b['rev']}")
        rows = [
            [
                name,
                ratio(r["keepalive"]["p50_ms"], b["routes"][name]["keepalive"]["p50_ms"]),
                ratio(r["keepalive"]["p99_ms"], b["routes"][name]["keepalive"]["p99_ms"]),
                ratio(r["new_connection"]["p99_ms"], b["routes"][name]["new_connection"]["p99_ms"]),
            ]
            for name, r in a["routes"].items()
            if name in b["routes"]
        ]
        rows.append(["idle CPU", ratio(a["idle"]["cpu_pct_of_core"], b["idle"]["cpu_pct_of_core"]), "", ""])
        admission = ratio(a["idle"]["admission_cpu_pct"], b["idle"]["admission_cpu_pct"])
        rows.append(["idle CPU in admission", admission, "", ""])
        rows.append(["RSS peak", ratio(a["rss_mb"]["peak"], b["rss_mb"]["peak"]), "", ""])
        print_table(["route", "ka p50", "ka p99", "nc p99"], rows)


def checkout(rev: str) -> Path:
    """REV's hub/, kernels/ and extension/ in a temporary directory (git archive: no worktree)."""
    where = Path(tempfile.mkdtemp(prefix="cellscale-bench-rev-"))
    archive = subprocess.run(
        ["git", "archive", rev, "hub", "kernels", "extension"], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("populate", "serve"):
        return child_main()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--shapes", default="pending,finished")
    parser.add_argument(
        "--idle-s",
        type=float,
        help="seconds of idle CPU measurement (default: the controller's admission interval, so that the window "
        "holds one periodic admission, as every such window does; 20 s for a controller without one)",
    )
    parser.add_argument("--requests", type=int, default=100, help="requests per route and connection mode")
    parser.add_argument(
        "--route-s", type=float, default=1.5, help=f"time budget per route and mode (at least {MIN_SAMPLES} requests)"
    )
    parser.add_argument("--compare", metavar="REV", help="also run every case on the hub code of git revision REV")
    parser.add_argument("--sql-stats", action="store_true", help="time every SQL statement in the control plane")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    stores = args.stores.split(",")
    shapes = args.shapes.split(",")
    pg_base = None
    if "postgres" in stores:
        from sqlalchemy.engine import make_url

        out = subprocess.run([str(REPO / "scripts" / "postgres")], capture_output=True, text=True, check=True)
        pg_base = make_url(out.stdout.strip().splitlines()[-1])
    trees: list[Path | None] = [None]
    if args.compare:
        trees.append(checkout(args.compare))
    cases, t0 = [], time.perf_counter()
    try:
        for store in stores:
            for shape in shapes:
                for size in sizes:
                    for tree in trees:
                        what = "working tree" if tree is None else args.compare
                        print(f"\n== {store} {shape} {size} ({what})", flush=True)
                        case = run_case(store, size, shape, tree, args, pg_base)
                        cases.append(case)
                        print_case(case)
    finally:
        for tree in trees[1:]:
            shutil.rmtree(tree, ignore_errors=True)
    print_summary(cases)
    if args.compare:
        print_compare(cases)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    write_results(
        "control_plane",
        False,
        {
            "goals": GOALS,
            "settings": {
                "sizes": sizes,
                "stores": stores,
                "shapes": shapes,
                "idle_s": args.idle_s,
                "requests": args.requests,
                "route_s": args.route_s,
                "compare": args.compare,
                "sql_stats": args.sql_stats,
                "local_gpus": LOCAL_GPUS,
                "seed": SEED,
            },
            "cases": cases,
        },
    )


def _die_with_parent() -> None:
    """SIGTERM this control plane when the benchmark that started it dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        raise SystemExit("the benchmark that started this control plane is gone")


def child_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["populate", "serve"])
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--size", type=int)
    parser.add_argument("--shape")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--info", type=Path)
    parser.add_argument("--sql-stats", action="store_true")
    args = parser.parse_args()
    if args.mode == "populate":
        print(json.dumps(populate(args.db_url, args.size, args.shape)))
    else:
        # uvicorn re-raises the SIGTERM it handled once it has shut down; a no-op handler lets
        # serve() record its statistics before the process exits
        signal.signal(signal.SIGTERM, lambda *_: None)
        _die_with_parent()
        serve(args.db_url, args.data_dir, args.info, args.sql_stats)


if __name__ == "__main__":
    main()
