"""A scripted day on the real Slurm dev cluster, metered, billed, scraped by a real Prometheus.

Two desks with their own Slurm accounts (made for this test, so Slurm's reports hold only its
jobs): desk A runs a 16-GPU job whose GPUs are busy 40% of the time, desk B an 8-GPU job at 90%
(the runtime's simulated GPUs: no GPU here). Then: each job's allocation is its gang × Slurm's
own Start→End; its used fraction is its duty; Prometheus' sums equal the API's; `sreport`
agrees per account; the ledger reconciles with the fleet's cost; every dashboard query returns
series; desk B's spent budget holds its next job with the reason; and a rerun of desk A's cell
is estimated, from the first run, within 10% of what it then costs.
"""

from __future__ import annotations

import secrets
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import uvicorn

from cellscale.spec import Phase
from cellscale_hub.auth import ALL_SCOPES, Principal
from cellscale_hub.drivers.slurm import SlurmDriver
from cellscale_hub.store.db import Store
from cellscale_hub.tenancy import Tenancy
from tests.controlplane.conftest import USERS, Plane
from tests.dashboards import dashboard_queries
from tests.integration.slurm_fixtures import slurm_cluster  # noqa: F401 - the fixture
from tests.prometheus import free_port

pytestmark = pytest.mark.integration

PRICE = 2.0  # dollars per GPU-hour on the dev cluster's GPUs
WORK = "import time, os\ntime.sleep(float(os.environ['WORK_S']))"


def tenancy(a: str, b: str) -> Tenancy:
    queue = {"cohort": "firm", "quotas": {"slurm": {"nominal": 16}}}
    return Tenancy.model_validate(
        {
            "flavors": {"slurm": {"backend": "dca", "gpu_hour_usd": PRICE}},
            "cohorts": {"firm": {}},
            "cluster_queues": {a: queue, b: queue},
            "tenants": {
                a: {"queues": {"default": {"cluster_queue": a}}},
                # 0.02 GPU-hours: spent by its first job; the budget then holds new work
                b: {
                    "queues": {"default": {"cluster_queue": b}},
                    "budget": {"usd": 1.0, "gpu_hours": 0.02, "period": "day", "hard_stop": True},
                },
            },
            "cost": {"idle": "proportional"},
        }
    )


@pytest.fixture
def accounts(slurm_cluster, monkeypatch):
    """Two fresh Slurm accounts, alice in the first and bob in the second, and tokens for them."""
    tag = secrets.token_hex(3)
    a, b = f"ledger-a-{tag}", f"ledger-b-{tag}"
    for account, user in ((a, "alice"), (b, "bob")):
        slurm_cluster.run(["sacctmgr", "-i", "add", "account", account, "cluster=dca"])
        slurm_cluster.run(["sacctmgr", "-i", "add", "user", user, f"account={account}", "cluster=dca"])
        monkeypatch.setitem(USERS, f"{user}-{tag}", Principal(user, (account,), ALL_SCOPES))
    yield a, b, tag


@pytest.fixture
def plane(tmp_path, slurm_cluster, accounts):
    a, b, _ = accounts
    store = Store(f"sqlite:///{tmp_path / 'cellscale.sqlite'}")
    store.migrate()
    jobs_root = slurm_cluster.jobs_dir / f"ledger-{secrets.token_hex(3)}"
    jobs_root.mkdir()
    jobs_root.chmod(0o711)
    conf = slurm_cluster.env["SLURM_CONF"]
    driver = SlurmDriver(name="dca", partition="gpu", slurm_conf=conf, master_addr="127.0.0.1")
    the_plane = Plane(tmp_path, store, drivers={"dca": driver}, tenancy=tenancy(a, b), jobs_root=jobs_root)
    the_plane.tune(meter_interval_s=1.0)
    yield the_plane
    for job in the_plane.http.get("/api/jobs?scope=all&limit=100", headers=the_plane.as_("admin")).json()["items"]:
        if not Phase(job["phase"]).terminal:
            the_plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=the_plane.as_("admin"))
    for _ in range(10):
        the_plane.controller.cycle()
        time.sleep(0.2)


@pytest.fixture
def served(plane):
    """The plane's API on a real socket, for Prometheus to scrape."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(plane.http.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def submit(plane, token: str, nodes: int, seconds: float, duty: float) -> str:
    resources = {"nodes": nodes, "gpus_per_node": 8, "timeout_min": 5}
    env = {"WORK_S": str(seconds), "CELLSCALE_SIMULATED_GPU_DUTY": str(duty)}
    response = plane.submit(token, source=WORK, resources=resources, env=env)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def run_all(plane, ids: list[str], timeout: float = 240) -> dict[str, dict]:
    """Cycle until every job ended and its ledger rows are final."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        plane.controller.cycle()
        jobs = {i: plane.http.get(f"/api/jobs/{i}", headers=plane.as_("admin")).json() for i in ids}
        if all(Phase(j["phase"]).terminal for j in jobs.values()):
            time.sleep(1.1)  # one more metering interval: the ended attempts' last rows
            plane.controller.cycle()
            return {i: plane.http.get(f"/api/jobs/{i}", headers=plane.as_("admin")).json() for i in ids}
        time.sleep(0.3)
    raise AssertionError({i: (j["phase"], j["reason"]) for i, j in jobs.items()})


def slurm_held_s(slurm_cluster, backend_ref: str) -> float:
    out = slurm_cluster.run(["sacct", "-M", "dca", "-X", "-n", "-P", "-j", backend_ref, "-o", "Start,End"]).stdout
    start, end = (datetime.fromisoformat(t) for t in out.split()[0].split("|"))
    return (end - start).total_seconds()


def sreport_gpu_s(slurm_cluster, account: str, since: datetime, until: datetime) -> float:
    """The account's GPU-seconds as Slurm's own report has them, after forcing the rollup."""
    hour = since.replace(minute=0, second=0, microsecond=0)
    end = until.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    fmt = "%Y-%m-%dT%H:%M:%S"
    slurm_cluster.run(["sacctmgr", "-i", "roll", hour.strftime(fmt), end.strftime(fmt)])
    query = ["sreport", "-n", "-P", "-t", "seconds", "-T", "gres/gpu", "cluster", "AccountUtilizationByUser"]
    window = [f"start={hour.strftime(fmt)}", f"end={end.strftime(fmt)}"]
    out = slurm_cluster.run([*query, "cluster=dca", f"accounts={account}", *window])
    rows = [line.split("|") for line in out.stdout.splitlines()]
    return float(next(r[-1] for r in rows if r[1] == account and not r[2]))  # the account's own line


def test_a_scripted_day_is_metered_scraped_reconciled_and_agrees_with_slurm(
    plane, served, accounts, slurm_cluster, prometheus
):
    a, b, tag = accounts
    prometheus.add_target(f"{served}/api/metrics", token="admin")
    began = datetime.now(UTC)
    first_a = submit(plane, f"alice-{tag}", nodes=2, seconds=45, duty=0.4)
    first_b = submit(plane, f"bob-{tag}", nodes=1, seconds=20, duty=0.9)
    done = run_all(plane, [first_a, first_b])

    # per job: allocation = gang × Slurm's own Start→End; used fraction = its duty
    for job_id, duty, gpus in ((first_a, 0.4, 16), (first_b, 0.9, 8)):
        job = done[job_id]
        assert job["phase"] == "SUCCEEDED", job["reason"]
        held = slurm_held_s(slurm_cluster, job["attempts"][-1]["backend_ref"])
        cost = job["cost"]
        attempt = job["attempts"][-1]
        print(
            f"{job_id}: Slurm held {held:.0f} s ({attempt['held_from']} → {attempt['held_until']}); "
            f"ledger: {cost['words']}"
        )
        assert abs(cost["gpu_hours"] * 3600 - gpus * held) <= gpus * 1.0, (cost, held)  # wall ± 1 s
        assert cost["used_fraction"] == pytest.approx(duty, abs=0.05), cost
        assert cost["usd"] == pytest.approx(cost["gpu_hours"] * PRICE, rel=1e-6)

    # desk B spent its 0.02 GPU-hour budget: its next job is held, saying so (and waits to the end)
    held_job = submit(plane, f"bob-{tag}", nodes=1, seconds=1, duty=0.5)
    for _ in range(5):
        plane.controller.cycle()
    view = plane.http.get(f"/api/jobs/{held_job}", headers=plane.as_("admin")).json()
    assert view["phase"] == "PENDING" and view["pending"]["code"] == "BudgetSpent", view
    assert f"held: {b} has spent its budget" in view["reason"], view["reason"]
    budgets = plane.http.get("/api/budgets", headers=plane.as_(f"bob-{tag}")).json()
    assert [x["tenant"] for x in budgets] == [b] and budgets[0]["holding"], budgets

    # desk A runs its cell again: estimated from the first run, within 10% of what it costs
    again = submit(plane, f"alice-{tag}", nodes=2, seconds=45, duty=0.4)
    estimate = plane.http.get(f"/api/jobs/{again}", headers=plane.as_("admin")).json()["estimate"]
    assert estimate["basis"] == "history" and estimate["runs"] == 1, estimate
    second = run_all(plane, [again])[again]
    print(f"estimate: {estimate['words']}; actual: {second['cost']['words']}")
    assert estimate["usd"] == pytest.approx(second["cost"]["usd"], rel=0.10), (estimate, second["cost"])
    until = datetime.now(UTC)

    # the ledger reconciles, and the API's sums are what Prometheus scraped
    report = plane.http.get(
        "/api/cost", params={"since": began.isoformat(), "until": until.isoformat()}, headers=plane.as_("admin")
    ).json()
    assert report["fleet"]["identity_error"] <= 0.001, report["fleet"]
    desks = {d["tenant"]: d for d in report["desks"]}
    api_gpu_s = {t: desks[t]["gpu_hours"] * 3600 for t in (a, b)}
    expr = f'sum by (tenant) (cellscale_gpu_allocated_seconds_total{{tenant=~"ledger-.-{tag}"}})'
    deadline = time.monotonic() + 30
    while True:
        scraped = {s["metric"]["tenant"]: float(s["value"][1]) for s in prometheus.query(expr)}
        close = scraped.keys() == api_gpu_s.keys() and all(
            scraped[t] == pytest.approx(api_gpu_s[t], rel=0.01) for t in api_gpu_s
        )
        if close or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert close, (scraped, api_gpu_s)

    # Slurm's own accounting agrees per account
    for account in (a, b):
        slurm = sreport_gpu_s(slurm_cluster, account, began, until)
        print(f"{account}: sreport {slurm:.0f} GPU-s, ledger {api_gpu_s[account]:.0f} GPU-s")
        assert slurm == pytest.approx(api_gpu_s[account], rel=0.01)

    # every dashboard query returns series from what was scraped
    empty = [f"{file}: {title}: {expr}" for file, title, expr in dashboard_queries() if not prometheus.query(expr)]
    assert not empty, "\n".join(empty)
