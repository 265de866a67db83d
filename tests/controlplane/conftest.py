"""A control plane in-process (FastAPI TestClient) over a real store and a real local backend.

Tokens map to principals through a small identity table (the hub-backed identity is tested
in tests/integration against a real JupyterHub)."""

from __future__ import annotations

import dataclasses
import time

import pytest
from fastapi.testclient import TestClient

from cellscale.spec import Phase
from cellscale_hub.api import build_app
from cellscale_hub.api.context import Context
from cellscale_hub.auth import ALL_SCOPES, SCOPE_READ, Identity, Principal, Unauthenticated
from cellscale_hub.bundles import BundleStore
from cellscale_hub.control.controller import Controller
from cellscale_hub.drivers.local import LocalDriver
from cellscale_hub.metrics import Metrics, State
from cellscale_hub.settings import Settings
from cellscale_hub.store.tenancy_book import TenancyBook
from cellscale_hub.tenancy import Tenancy
from cellscale_hub.waiting import WaitingBoard

USERS = {
    "alice": Principal("alice", ("desk-a",), ALL_SCOPES),
    "carol": Principal("carol", ("desk-a",), ALL_SCOPES),
    "bob": Principal("bob", ("desk-b", "chess-club"), ALL_SCOPES),
    "dave": Principal("dave", (), ALL_SCOPES),
    "reader": Principal("reader", ("desk-a",), frozenset({SCOPE_READ})),
    "admin": Principal("admin", (), ALL_SCOPES, admin=True),
}


def two_desks(nominal: dict[str, int], backends: dict[str, str] | None = None) -> Tenancy:
    """desk-a (queues default, research) and desk-b in one cohort, with these nominal
    quotas per flavor (a flavor's backend is its name unless `backends` says otherwise)."""
    quotas = {flavor: {"nominal": gpus} for flavor, gpus in nominal.items()}
    return Tenancy.model_validate(
        {
            "flavors": {flavor: {"backend": (backends or {}).get(flavor, flavor)} for flavor in nominal},
            "cohorts": {"firm": {}},
            "cluster_queues": {desk: {"cohort": "firm", "quotas": quotas} for desk in ("desk-a", "desk-b")},
            "tenants": {
                "desk-a": {"queues": {"default": {"cluster_queue": "desk-a"}, "research": {"cluster_queue": "desk-a"}}},
                "desk-b": {"queues": {"default": {"cluster_queue": "desk-b"}}},
            },
        }
    )


TENANCY = two_desks({"local": 2})


def local_driver(gpus: int) -> LocalDriver:
    """The local backend running jobs as this process's user: these tests are about the
    control plane (tests/integration runs jobs as their owners' Unix users)."""
    return LocalDriver(name="local", gpus=gpus, submit_as=[])


class TableIdentity(Identity):
    def principal(self, token: str) -> Principal:
        if token not in USERS:
            raise Unauthenticated("invalid token")
        return USERS[token]


class Plane:
    def __init__(self, tmp_path, store, gpus=4, drivers=None, tenancy=TENANCY, jobs_root=None):
        self.jobs_root = jobs_root or tmp_path / "jobs"
        self.jobs_root.mkdir(exist_ok=True)
        self.bundles = BundleStore(tmp_path / "bundles", quota_bytes=256 * 2**20, grace_s=3600)
        self.store = store
        self.driver = local_driver(gpus)
        self.drivers = drivers or {"local": self.driver}
        self.tenancy = TenancyBook(store)
        self.tenancy.seed(tenancy, actor="test")
        self.waiting = WaitingBoard()
        self.metrics = Metrics()
        self.metrics.watch(State(store, self.tenancy, self.drivers, self.waiting))
        self.controller = self.make_controller(self.drivers)
        ctx = Context(
            store=store,
            wake=lambda: self.controller.wake(),
            drivers=self.drivers,
            tenancy=self.tenancy,
            identity=TableIdentity(),
            jobs_root=self.jobs_root,
            bundles=self.bundles,
            prefix="/",
            waiting=self.waiting,
            metrics=self.metrics,
        )
        self.http = TestClient(build_app(ctx))

    def make_controller(self, drivers, **settings):
        return Controller(
            self.store,
            drivers,
            self.jobs_root,
            self.bundles,
            self.tenancy,
            Settings(**settings),
            waiting=self.waiting,
            metrics=self.metrics,
        )

    def tune(self, **settings):
        """Retune the running controller: its settings are one frozen object, replaced whole."""
        self.controller.settings = dataclasses.replace(self.controller.settings, **settings)

    def as_(self, user: str) -> dict:
        return {"Authorization": f"token {user}"}

    def submit(self, user="alice", source="print('hi')", key=None, **spec):
        headers = self.as_(user) | ({"Idempotency-Key": key} if key else {})
        body = {"spec": {"source": source, "launcher": "plain"} | spec}
        return self.http.post("/api/jobs", json=body, headers=headers)

    def restart(self):
        """A new controller and driver over the same store and job dirs: what kill -9 leaves."""
        self.driver = local_driver(self.driver.gpus)
        self.waiting = WaitingBoard()  # reasons are the controller's memory: gone until its first cycle
        self.controller = self.make_controller({"local": self.driver})
        self.http.app.state.ctx.drivers = {"local": self.driver}
        self.http.app.state.ctx.waiting = self.waiting

    def run_until(self, job_id, phases, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.controller.cycle()
            job = self.http.get(f"/api/jobs/{job_id}", headers=self.as_("admin")).json()
            if Phase(job["phase"]) in phases:
                return job
            time.sleep(0.2)
        raise AssertionError(f"{job_id} stayed {job['phase']} ({job['reason']})")


@pytest.fixture
def plane(tmp_path, store):
    return Plane(tmp_path, store)
