"""What telemetry costs the control plane (issue "Telemetry and cost", section "Measured"):

1. **Cycle time, metering on vs off.** One in-process `Controller` over a SQLite store (the
   default) with D desks, R running attempts and P pending jobs. Its only backend is
   `FakeRunningDriver` (below): a fake that reports every attempt RUNNING with a held start
   (`Observation.held`, as Slurm's Start), so reconcile and metering do their full work with no
   process or scheduler behind them; its `usage` is the base Driver's (each attempt's
   `node0/usage.json`, written here). `controller.cycle()` is timed N times per arm, with
   (a) `meter_interval_s=0`: the ledger meters every running attempt in every cycle (R rows a
   cycle, the worst case) and (b) `meter_interval_s=1e12`: metering off. The arms are
   interleaved in ABBA blocks to cancel drift. Admission runs once before (it publishes the
   waiting reasons) and not during the timed cycles (`admission_interval_s` is pushed out and
   nothing it decides on changes), so the cycles are reconcile (+ metering), as most are.
   The default interval (60 s, cycles every 0.5 s) spreads one metering pass over 120 cycles:
   the script also reports that amortized share.
2. **Scrape time.** `Metrics` as `app.py` builds it (`seed` from the ledger, `watch` with the
   store, tenancy, drivers and the controller's WaitingBoard), over the same store: the median
   and p95 of `Metrics.render()` over S scrapes, the exposition's size and its series count,
   and `GET /api/metrics` as an admin through FastAPI's TestClient. The ledger holds H hours of
   60 s rows of every running attempt before the cycles (plus what the metered cycles add); every
   desk has a weekly budget that covers all spend, so the budget gauges read the ledger, as they
   would in production. With several `--ledger-hours` the scrape is measured once per size,
   growing the ledger in between.

    .venv/bin/python benchmarks/telemetry.py [--quick] [--desks 100] [--running 1000] [--pending 10000]
        [--cycles 30] [--scrapes 20] [--ledger-hours 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import median, percentile, print_table, ratio, write_results

from cellscale.runtime.jobdir import JobDir
from cellscale.runtime.records import NodeUsage
from cellscale.spec import BackendView, JobSpec, Launcher
from cellscale.vocabulary import AttemptState, Phase
from cellscale_hub.drivers import AttemptRef, Driver, Observation

SEED = 7
FLAVOR = BACKEND = "sim"
GOAL_CYCLE_RATIO = 1.05  # metering every cycle adds < 5%
GOAL_SCRAPE_S = 1.0
DEFAULT_METER_INTERVAL_S = 60.0  # the product's defaults (app.py): meter every 60 s, cycle every 0.5 s
DEFAULT_CYCLE_S = 0.5
METER_OFF = 1e12


class FakeRunningDriver(Driver):
    """A fake backend for benchmarks: every attempt it is asked about is RUNNING, held since
    its submit time (the store's `submitted_at`, set by `populate`); submit, cancel and warn do
    nothing. Capacity is exactly the GPUs the running attempts hold, so nothing more is admitted."""

    kind = "fake"

    def __init__(self, gpus: int, **kwargs):
        super().__init__(**kwargs)
        self.gpus = gpus

    def capacity(self) -> BackendView:
        return BackendView(
            name=self.name,
            kind=self.kind,
            capacity_gpus=self.gpus,
            max_nodes=1,
            gpus_per_node=8,
            launchers=list(Launcher),
        )

    def render(self, ref: AttemptRef) -> str:
        return f"# fake: {ref.job_id} attempt {ref.number}\n"

    def submit(self, ref: AttemptRef) -> str:
        return f"fake:{ref.job_id}.{ref.number}"

    def poll(self, refs: list[AttemptRef]) -> dict[tuple[str, int], Observation]:
        return {
            ref.key: Observation(
                AttemptState.RUNNING,
                held=(ref.submitted_at.timestamp() if ref.submitted_at else time.time(), None),
                nodes=("sim-node",),
            )
            for ref in refs
        }

    def cancel(self, ref: AttemptRef) -> None:
        pass

    def warn(self, ref: AttemptRef) -> None:
        pass


def tenancy_of(desks: int, nominal: int):
    from cellscale_hub.tenancy import Tenancy

    names = [f"desk-{i:03d}" for i in range(desks)]
    return Tenancy.model_validate(
        {
            "sites": {"dc": {"gpu_hour_usd": 1.10}},
            "flavors": {FLAVOR: {"backend": BACKEND, "site": "dc"}},
            "cohorts": {"firm": {}},
            "cluster_queues": {d: {"cohort": "firm", "quotas": {FLAVOR: {"nominal": nominal}}} for d in names},
            "tenants": {
                d: {"queues": {"default": {"cluster_queue": d}}, "budget": {"usd": 5000.0, "period": "week"}}
                for d in names
            },
            "priority_classes": {"low": -100, "normal": 0, "high": 100},
        }
    )


def populate(store, tenancy, drivers, jobs_root: Path, desks: int, running: int, pending: int, hours: float) -> dict:
    """Bulk inserts into the real schema: `running` jobs RUNNING on the fake backend (one GPU
    each, spread evenly over the desks, held since `hours` ago, metered in 60 s rows up to a
    minute ago, each with a usage record in its job dir), `pending` PENDING jobs (1 or 2 GPUs),
    and the per-queue totals."""
    from control_plane import queue_totals
    from sqlalchemy import insert

    from cellscale_hub.auth import ALL_SCOPES, Principal
    from cellscale_hub.routing import route
    from cellscale_hub.store.models import Attempt, Job, QueueTotal

    t0 = time.perf_counter()
    rng = random.Random(SEED)
    now = datetime.now(UTC)
    names = sorted(tenancy.tenants)
    placed = {}

    def where(desk: str, gpus: int):
        if (desk, gpus) not in placed:
            who = Principal(f"{desk}-u0", (desk,), ALL_SCOPES, tenants=(desk,))
            spec = JobSpec(launcher="plain", resources={"gpus_per_node": gpus, "timeout_min": 480}, source="x = 1\n")
            p = route(tenancy, drivers, who, spec)
            placed[desk, gpus] = (p, p.spec.model_dump(mode="json"))
        return placed[desk, gpus]

    jobs, attempts = [], []
    for i in range(running + pending):
        run = i < running
        desk = names[i % len(names)]
        gpus = 1 if run else rng.choice([1, 1, 2])
        p, spec = where(desk, gpus)
        job_id = f"cs-{i:012x}"
        created = now - timedelta(hours=hours, minutes=5) if run else now - timedelta(seconds=rng.uniform(0, 86400))
        jobs.append(
            dict(
                id=job_id,
                idempotency_key=job_id,
                owner=f"{desk}-u{rng.randrange(5)}",
                tenant=p.tenant,
                queue=p.queue,
                backend=p.backend,
                cluster_queue=p.cluster_queue,
                flavor=FLAVOR if run else None,
                priority=p.priority,
                borrowed=0,
                name=f"bench-{i}",
                spec={**spec, "name": f"bench-{i}"},
                gpus=gpus,
                cpus=p.spec.resources.cpus,
                memory_mb=0,
                phase=Phase.RUNNING if run else Phase.PENDING,
                reason="running" if run else "waiting for admission",
                excluded_nodes=[],
                cancel_requested=False,
                result_available=False,
                created_at=created,
                updated_at=created,
                started_at=now - timedelta(hours=hours) if run else None,
            )
        )
        if run:
            held_from = now - timedelta(hours=hours)
            attempts.append(
                dict(
                    job_id=job_id,
                    number=1,
                    backend=BACKEND,
                    backend_ref=f"fake:{job_id}.1",
                    state=AttemptState.RUNNING,
                    gpu_ids=[],
                    submitted_at=held_from,
                    started_at=held_from,
                    flavor=FLAVOR,
                    held_from=held_from,
                    failed_nodes=[],
                    nodes=["sim-node"],
                )
            )
            jd = JobDir(jobs_root / job_id)
            jd.node_dir(1, 0).mkdir(parents=True)
            jd.write_usage(
                1,
                0,
                NodeUsage(
                    since=held_from.timestamp(),
                    at=now.timestamp(),
                    gpus=gpus,
                    source="simulated",
                    gpu_used_s=0.6 * gpus * hours * 3600,
                    gpu_sampled_s=gpus * hours * 3600,
                    cpu_s=100.0,
                    memory_peak_bytes=2**30,
                ),
            )
    with store.engine.begin() as conn:
        for i in range(0, len(jobs), 5000):
            conn.execute(insert(Job.__table__), jobs[i : i + 5000])
        conn.execute(insert(Attempt.__table__), attempts)
        conn.execute(insert(QueueTotal.__table__), queue_totals(jobs, []))
    ledger_rows = extend_ledger(store, tenancy, hours)
    return {
        "jobs": len(jobs),
        "running_attempts": len(attempts),
        "pending_jobs": pending,
        "ledger_rows": ledger_rows,
        "populate_s": time.perf_counter() - t0,
    }


def extend_ledger(store, tenancy, hours: float) -> int:
    """Give every running attempt 60 s ledger rows back to `hours` ago (before what it has):
    what `hours` of metering at the default interval leave. Returns the rows added."""
    from sqlalchemy import insert, select, update

    from cellscale_hub.store.models import Attempt, Job, LedgerRow

    price = tenancy.price_of(FLAVOR)
    now = datetime.now(UTC).replace(microsecond=0)
    added = 0
    with store.engine.begin() as conn:
        rows_of = conn.execute(
            select(
                Attempt.id, Attempt.job_id, Attempt.held_from, Attempt.metered_until, Job.tenant, Job.owner, Job.gpus
            )
            .join(Job, Job.id == Attempt.job_id)
            .where(Attempt.state == AttemptState.RUNNING)
        ).all()
        start_all = now - timedelta(hours=hours)
        batch = []
        for attempt_id, job_id, held_from, metered_until, tenant, owner, gpus in rows_of:
            first = min(held_from, start_all)
            # rows from `first` to the oldest row the attempt has (or to a minute ago)
            stop = _oldest_row(conn, attempt_id) or (now - timedelta(minutes=1))
            t = first
            while t < stop:
                end = min(t + timedelta(seconds=60), stop)
                batch.append(
                    dict(
                        attempt_id=attempt_id,
                        job_id=job_id,
                        attempt=1,
                        tenant=tenant,
                        owner=owner,
                        backend=BACKEND,
                        flavor=FLAVOR,
                        start=t,
                        end=end,
                        gpus=gpus,
                        gpu_s=gpus * (end - t).total_seconds(),
                        gpu_used_s=0.6 * gpus * (end - t).total_seconds(),
                        cpu_s=1.0,
                        usd_per_gpu_hour=price,
                        usd=gpus * (end - t).total_seconds() / 3600 * price,
                    )
                )
                t = end
            if len(batch) >= 20000:
                conn.execute(insert(LedgerRow.__table__), batch)
                added += len(batch)
                batch = []
            held_s = (now - first).total_seconds()
            conn.execute(
                update(Attempt)
                .where(Attempt.id == attempt_id)
                .values(
                    held_from=first,
                    submitted_at=first,
                    metered_until=metered_until or stop,
                    usd=gpus * held_s / 3600 * price,
                )
            )
        if batch:
            conn.execute(insert(LedgerRow.__table__), batch)
            added += len(batch)
        _rebuild_hours(conn)
    return added


def _rebuild_hours(conn) -> None:
    """The ledger's hourly sums from its rows (metering keeps them as it writes rows; rows
    inserted here directly need them rebuilt)."""
    from collections import defaultdict

    from sqlalchemy import delete, insert, select

    from cellscale_hub.store.models import LedgerHour, LedgerRow

    sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    columns = (LedgerRow.tenant, LedgerRow.owner, LedgerRow.backend, LedgerRow.flavor, LedgerRow.start, LedgerRow.end)
    for tenant, owner, backend, flavor, start, end, gpu_s, used, usd in conn.execute(
        select(*columns, LedgerRow.gpu_s, LedgerRow.gpu_used_s, LedgerRow.usd)
    ):
        start, end = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (start, end))
        span, t = (end - start).total_seconds(), start
        while t < end:
            hour = t.replace(minute=0, second=0, microsecond=0)
            upto = min(end, hour + timedelta(hours=1))
            share = (upto - t).total_seconds() / span
            acc = sums[tenant, hour, owner, backend, flavor]
            acc[0] += gpu_s * share
            acc[1] += (used or 0.0) * share
            acc[2] += usd * share
            t = upto
    conn.execute(delete(LedgerHour))
    rows = [
        dict(tenant=k[0], hour=k[1], owner=k[2], backend=k[3], flavor=k[4], gpu_s=v[0], gpu_used_s=v[1], usd=v[2])
        for k, v in sums.items()
    ]
    for i in range(0, len(rows), 20000):
        conn.execute(insert(LedgerHour.__table__), rows[i : i + 20000])


def _oldest_row(conn, attempt_id: int) -> datetime | None:
    from sqlalchemy import func, select

    from cellscale_hub.store.models import LedgerRow

    return conn.execute(select(func.min(LedgerRow.start)).where(LedgerRow.attempt_id == attempt_id)).scalar()


def ledger_count(store) -> int:
    from sqlalchemy import func, select

    from cellscale_hub.store.models import LedgerRow

    with store.session() as session:
        return session.execute(select(func.count()).select_from(LedgerRow)).scalar_one()


def stats(xs: list[float]) -> dict:
    return {"n": len(xs), "median_s": median(xs), "p95_s": percentile(xs, 95), "max_s": max(xs), "min_s": min(xs)}


def time_cycles(controller, cycles: int) -> dict:
    """ABBA blocks of (metering every cycle, metering off), `cycles` of each in all."""
    times: dict[str, list[float]] = {"on": [], "off": []}
    arms = {"on": 0.0, "off": METER_OFF}
    order = ["on", "off", "off", "on"]
    i = 0
    while min(len(v) for v in times.values()) < cycles:
        arm = order[i % 4]
        i += 1
        if len(times[arm]) >= cycles:
            continue
        controller.settings = dataclasses.replace(controller.settings, meter_interval_s=arms[arm])
        t0 = time.perf_counter()
        controller.cycle()
        times[arm].append(time.perf_counter() - t0)
    return {arm: stats(xs) for arm, xs in times.items()} | {"raw": times}


def profile_cycle(controller, arm: float, out: Path) -> list[str]:
    import cProfile
    import io
    import pstats

    controller.settings = dataclasses.replace(controller.settings, meter_interval_s=arm)
    prof = cProfile.Profile()
    prof.enable()
    controller.cycle()
    prof.disable()
    prof.dump_stats(out)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
    return s.getvalue().splitlines()


def scrape(metrics, scrapes: int) -> dict:
    times, body = [], b""
    for _ in range(scrapes):
        t0 = time.perf_counter()
        body = metrics.render()
        times.append(time.perf_counter() - t0)
    lines = body.decode().splitlines()
    series = [line for line in lines if line and not line.startswith("#")]
    families: dict[str, int] = {}
    for line in series:
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for suffix in ("_bucket", "_count", "_sum", "_created", "_total"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        families[name] = families.get(name, 0) + 1
    return stats(times) | {"bytes": len(body), "series": len(series), "series_by_family": families}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 cycles per arm, 10 scrapes")
    parser.add_argument("--desks", type=int, default=100)
    parser.add_argument("--running", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=10000)
    parser.add_argument("--cycles", type=int, help="timed cycles per arm (default 30; 10 with --quick)")
    parser.add_argument("--scrapes", type=int, help="timed scrapes per ledger size (default 20; 10 with --quick)")
    parser.add_argument(
        "--ledger-hours",
        default="1",
        help="hours of 60 s ledger rows per running attempt; several (1,24): the scrape once per size",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one cycle per arm and the scrape")
    args = parser.parse_args()
    cycles = args.cycles or (10 if args.quick else 30)
    scrapes = args.scrapes or (10 if args.quick else 20)
    hours = [float(h) for h in args.ledger_hours.split(",")]

    from fastapi.testclient import TestClient

    from cellscale_hub.api import build_app
    from cellscale_hub.api.context import Context
    from cellscale_hub.auth import ALL_SCOPES, Identity, Principal, Unauthenticated
    from cellscale_hub.bundles import BundleStore
    from cellscale_hub.control.controller import Controller
    from cellscale_hub.metrics import Metrics, State
    from cellscale_hub.settings import Settings
    from cellscale_hub.store import Store
    from cellscale_hub.store.tenancy_book import TenancyBook

    class AdminIdentity(Identity):
        def principal(self, token: str) -> Principal:
            if token != "admin":
                raise Unauthenticated("invalid token")
            return Principal("admin", (), ALL_SCOPES, admin=True)

    tmp = Path(tempfile.mkdtemp(prefix="cellscale-bench-telemetry-"))
    try:
        store = Store(f"sqlite:///{tmp}/cellscale.sqlite")
        store.migrate()
        jobs_root = tmp / "jobs"
        jobs_root.mkdir()
        nominal = max(1, args.running // args.desks)
        drivers = {BACKEND: FakeRunningDriver(name=BACKEND, gpus=nominal * args.desks)}
        tenancy = TenancyBook(store)
        tenancy.seed(tenancy_of(args.desks, nominal), actor="bench")
        print(
            f"populating: {args.desks} desks, {args.running} running attempts, {args.pending} pending jobs, "
            f"{hours[0]:g} h of ledger",
            flush=True,
        )
        built = populate(store, tenancy.current, drivers, jobs_root, args.desks, args.running, args.pending, hours[0])
        print(f"  {built['ledger_rows']} ledger rows, {built['populate_s']:.1f} s", flush=True)

        t0 = time.perf_counter()
        metrics = Metrics()
        metrics.seed(store)
        seed_s = time.perf_counter() - t0
        bundles = BundleStore(tmp / "bundles", quota_bytes=2**20, grace_s=3600)
        controller = Controller(
            store,
            drivers,
            jobs_root,
            bundles,
            tenancy,
            Settings(admission_interval_s=1e12, meter_interval_s=METER_OFF),
            metrics=metrics,
        )
        metrics.watch(State(store, tenancy, drivers, controller.waiting))

        # warm-up: the first cycle admits (publishing every pending job's reason) and stores the
        # first observation of every attempt; the next ones are the steady state
        t0 = time.perf_counter()
        controller.cycle()
        first_cycle_s = time.perf_counter() - t0
        codes = controller.waiting.codes()
        t0 = time.perf_counter()
        controller.admission.admit()
        admit_s = time.perf_counter() - t0
        for _ in range(2):
            controller.settings = dataclasses.replace(controller.settings, meter_interval_s=0.0)
            controller.cycle()
            controller.settings = dataclasses.replace(controller.settings, meter_interval_s=METER_OFF)
            controller.cycle()
        reasons: dict[str, int] = {}
        for code in codes.values():
            reasons[code] = reasons.get(code, 0) + 1
        print(
            f"first cycle (admission of {args.pending}, first observations) {first_cycle_s:.2f} s; "
            f"admit() alone {admit_s:.2f} s; reasons {reasons}",
            flush=True,
        )

        print(f"\n1. controller.cycle(), {cycles} per arm, ABBA", flush=True)
        ledger_before = ledger_count(store)
        cyc = time_cycles(controller, cycles)
        rows_per_metered_cycle = (ledger_count(store) - ledger_before) / cycles
        on, off = cyc["on"]["median_s"], cyc["off"]["median_s"]
        per_default = DEFAULT_METER_INTERVAL_S / DEFAULT_CYCLE_S
        amortized = (off + (on - off) / per_default) / off
        cycle_result = {
            "meter_every_cycle": cyc["on"],
            "meter_off": cyc["off"],
            "ratio_median": ratio(on, off),
            "ratio_p95": ratio(cyc["on"]["p95_s"], cyc["off"]["p95_s"]),
            "added_median_s": on - off,
            "ledger_rows_per_metered_cycle": rows_per_metered_cycle,
            "ratio_amortized_at_default_interval": amortized,
            "default_meter_interval_s": DEFAULT_METER_INTERVAL_S,
            "default_cycle_s": DEFAULT_CYCLE_S,
            "raw_s": cyc["raw"],
        }
        print_table(
            ["arm", "median s", "p95 s", "max s"],
            [
                ["metering every cycle", on, cyc["on"]["p95_s"], cyc["on"]["max_s"]],
                ["metering off", off, cyc["off"]["p95_s"], cyc["off"]["max_s"]],
                ["on/off", ratio(on, off), cycle_result["ratio_p95"], ""],
            ],
        )
        print(
            f"{rows_per_metered_cycle:.0f} ledger rows per metered cycle; at the default interval "
            f"({DEFAULT_METER_INTERVAL_S:.0f} s, {DEFAULT_CYCLE_S} s cycles) the mean cycle is {amortized:.4f}x "
            f"(goal < {GOAL_CYCLE_RATIO})"
        )

        profiles = {}
        if args.profile:
            profiles["cycle_meter_on"] = profile_cycle(controller, 0.0, tmp / "on.prof")
            profiles["cycle_meter_off"] = profile_cycle(controller, METER_OFF, tmp / "off.prof")

        print(f"\n2. Metrics.render(), {scrapes} scrapes per ledger size", flush=True)
        client = TestClient(
            build_app(
                Context(
                    store=store,
                    wake=controller.wake,
                    waiting=controller.waiting,
                    metrics=metrics,
                    drivers=drivers,
                    tenancy=tenancy,
                    identity=AdminIdentity(),
                    jobs_root=jobs_root,
                    bundles=bundles,
                    prefix="/",
                )
            )
        )
        scrape_results = []
        for n, h in enumerate(hours):
            if n:
                print(f"  growing the ledger to {h:g} h ...", flush=True)
                extend_ledger(store, tenancy.current, h)
            rows = ledger_count(store)
            s = scrape(metrics, scrapes)
            api = []
            for _ in range(3):
                t0 = time.perf_counter()
                response = client.get("/api/metrics", headers={"Authorization": "token admin"})
                api.append(time.perf_counter() - t0)
                response.raise_for_status()
            t0 = time.perf_counter()
            Metrics().seed(store)
            seed_at = time.perf_counter() - t0
            s |= {
                "ledger_hours": h,
                "ledger_rows": rows,
                "api_metrics": stats(api) | {"status": response.status_code, "bytes": len(response.content)},
                "metrics_seed_s": seed_at,
            }
            scrape_results.append(s)
            if args.profile:
                import cProfile
                import io
                import pstats

                prof = cProfile.Profile()
                prof.enable()
                metrics.render()
                prof.disable()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
                profiles[f"scrape_{h:g}h"] = out.getvalue().splitlines()
        print_table(
            ["ledger", "rows", "render median s", "p95 s", "/1 s", "bytes", "series", "GET /api/metrics s", "seed s"],
            [
                [
                    f"{s['ledger_hours']:g} h",
                    s["ledger_rows"],
                    s["median_s"],
                    s["p95_s"],
                    ratio(s["p95_s"], GOAL_SCRAPE_S),
                    s["bytes"],
                    s["series"],
                    s["api_metrics"]["median_s"],
                    s["metrics_seed_s"],
                ]
                for s in scrape_results
            ],
        )
        print("series per family:", scrape_results[-1]["series_by_family"])
        for name, lines in profiles.items():
            print(f"\n-- cProfile: {name}")
            print("\n".join(lines[:45]))
        store.dispose()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    write_results(
        "telemetry",
        args.quick,
        {
            "goals": {"cycle_ratio": GOAL_CYCLE_RATIO, "scrape_s": GOAL_SCRAPE_S},
            "settings": {
                "desks": args.desks,
                "running": args.running,
                "pending": args.pending,
                "cycles_per_arm": cycles,
                "scrapes": scrapes,
                "ledger_hours": hours,
                "store": "sqlite",
                "seed": SEED,
            },
            "store": built,
            "warmup": {
                "first_cycle_s": first_cycle_s,
                "admit_s": admit_s,
                "pending_reasons": reasons,
                "metrics_seed_s": seed_s,
            },
            "cycle": cycle_result,
            "scrape": scrape_results,
            "profiles": profiles,
        },
    )


if __name__ == "__main__":
    main()
