"""What keeps the control plane's cost with what changes: an idle cycle writes nothing,
reasons for waiting live in the controller's memory (and come back after a restart with its
first cycle), and admission reads the waiting jobs incrementally."""

from __future__ import annotations

import time

from sqlalchemy import event

from cellscale.spec import Phase
from cellscale_hub.store import usage
from cellscale_hub.store.models import Job
from tests.controlplane.conftest import two_desks

SLEEPER = "import time\ntime.sleep(60)"


def writes_during(plane, cycles: int, pause: float = 0.0) -> list[str]:
    statements: list[str] = []

    def record(conn, cursor, statement, *args):
        if statement.lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            statements.append(statement)

    event.listen(plane.store.engine, "before_cursor_execute", record)
    try:
        for _ in range(cycles):
            plane.controller.cycle()
            time.sleep(pause)
    finally:
        event.remove(plane.store.engine, "before_cursor_execute", record)
    return statements


def test_cycles_that_find_nothing_new_write_nothing(plane):
    running = plane.submit(source=SLEEPER, resources={"gpus_per_node": 2}).json()
    waiting = plane.submit(source=SLEEPER, resources={"gpus_per_node": 3}).json()  # 2 of 4 free to it
    plane.run_until(running["id"], {Phase.RUNNING})
    writes_during(plane, 3)  # the start's own changes
    plane.controller.wake()  # admission too, as after a submit: its reasons are not stored
    # over 5 s the running attempt beats twice or more (every 2 s): its heartbeat is stored at
    # most once (at most one 15 s storage window starts), and the waiting job costs no write
    assert len(writes_during(plane, 17, pause=0.3)) <= 1
    assert plane.http.get(f"/api/jobs/{waiting['id']}", headers=plane.as_("alice")).json()["pending"]["code"]
    plane.http.post(f"/api/jobs/{running['id']}/cancel", headers=plane.as_("alice"))
    plane.run_until(running["id"], {Phase.CANCELLED})


def test_after_a_restart_reasons_return_with_the_first_cycle(plane):
    holder = plane.submit(source=SLEEPER, resources={"gpus_per_node": 2}).json()
    plane.run_until(holder["id"], {Phase.RUNNING})
    first = plane.submit(resources={"gpus_per_node": 3}).json()  # 2 of 4 free to it: waits
    second = plane.submit(resources={"gpus_per_node": 1}).json()  # would fit, but would borrow what first waits for
    plane.controller.cycle()
    before = plane.http.get(f"/api/jobs/{second['id']}", headers=plane.as_("alice")).json()
    assert before["pending"]["code"] == "HeldForAhead" and before["pending"]["ahead"][0]["job_id"] == first["id"]
    assert before["reason"] == before["pending"]["message"]

    plane.restart()
    shown = plane.http.get(f"/api/jobs/{second['id']}", headers=plane.as_("alice")).json()
    assert shown["phase"] == "PENDING" and shown["pending"] is None  # not decided yet: no stale reason
    plane.controller.cycle()
    after = plane.http.get(f"/api/jobs/{second['id']}", headers=plane.as_("alice")).json()
    assert after["pending"] == before["pending"]
    listed = plane.http.get("/api/jobs?phase=PENDING", headers=plane.as_("alice")).json()["items"]
    assert {j["id"]: j["pending"]["position"] for j in listed} == {first["id"]: 1, second["id"]: 2}
    plane.http.post(f"/api/jobs/{holder['id']}/cancel", headers=plane.as_("alice"))
    plane.run_until(holder["id"], {Phase.CANCELLED})


def test_waiting_jobs_are_read_once_and_again_when_they_may_have_changed(plane):
    ids = [plane.submit(resources={"gpus_per_node": 1}).json()["id"] for _ in range(3)]
    cache = usage.PendingWorkloads()
    tenancy = plane.tenancy.current
    with plane.store.session() as session:
        assert {w.job_id for w in cache.read(session, tenancy, revision=1)} == set(ids)
        session.get(Job, ids[0]).backend = "elsewhere"  # as if admitted there and requeued
        known = {w.job_id: w.flavors for w in cache.read(session, tenancy, revision=1)}
        assert known[ids[0]] == ("local",)  # a waiting job's workload is not read again...
        cache.forget(ids[0])  # ...unless admission let it go
        assert {w.job_id: w.flavors for w in cache.read(session, tenancy, revision=1)}[ids[0]] == ()
        session.get(Job, ids[1]).phase = Phase.CANCELLED
        assert {w.job_id for w in cache.read(session, tenancy, revision=1)} == {ids[0], ids[2]}
        wider = two_desks({"local": 2, "elsewhere": 2}, backends={"elsewhere": "elsewhere"})
        flavors = {w.job_id: w.flavors for w in cache.read(session, wider, revision=2)}
        assert flavors == {ids[0]: ("elsewhere",), ids[2]: ("local",)}  # a new tenancy: all read again
        session.rollback()
