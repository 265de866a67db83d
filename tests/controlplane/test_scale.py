"""What keeps the control plane's cost with what changes: an idle cycle writes nothing,
reasons for waiting live in the controller's memory (and come back after a restart with its
first cycle), and admission reads the waiting jobs incrementally."""

from __future__ import annotations

import time

from sqlalchemy import event

from cellscale.spec import Phase
from cellscale.vocabulary import EventKind
from cellscale_hub.store import jobs as q
from cellscale_hub.store import usage
from cellscale_hub.store.models import Event, Job, utcnow

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


def test_waiting_jobs_are_read_in_one_pass_then_by_what_changed(plane):
    ids = [plane.submit(resources={"gpus_per_node": 1}).json()["id"] for _ in range(3)]
    feed = usage.PendingFeed()
    tenancy = plane.tenancy.current
    with plane.store.session() as session:
        new, gone = feed.since(session, tenancy, ())  # the first read is a full one
        assert {w.job_id for w in new} == set(ids) and gone == set()
        known = set(ids)
        assert feed.since(session, tenancy, known) == ([], set())  # nothing changed: nothing new, nothing gone
        job = session.get(Job, ids[1])
        job.phase = Phase.CANCELLED
        q.add_event(session, job, kind=EventKind.PHASE, to_phase=Phase.CANCELLED)
        session.flush()
        new, gone = feed.since(session, tenancy, known)
        assert new == [] and gone == {ids[1]}
        session.get(Job, ids[2]).phase = Phase.FAILED  # a change with no event: the full read (resync) sees it
        assert feed.full(session, tenancy, known - {ids[1]}) == ([], {ids[2]})
        session.rollback()


def test_an_event_that_commits_late_behind_a_newer_one_is_still_read(plane):
    """PostgreSQL hands out event ids before commit: a writer may commit id N after another
    committed N+1 and a read saw it. The feed looks back MARGIN ids, and reads each event once."""
    ids = [plane.submit(resources={"gpus_per_node": 1}).json()["id"] for _ in range(2)]
    feed = usage.PendingFeed()
    tenancy = plane.tenancy.current
    with plane.store.session() as session:
        known = {w.job_id for w in feed.since(session, tenancy, ())[0]}
        assert known == set(ids)
        early = Event(job_id=ids[0], at=utcnow(), kind=EventKind.PHASE, to_phase=Phase.CANCELLED)
        session.add(early)
        session.flush()
        early_id = early.id
        q.add_event(session, session.get(Job, ids[1]), kind=EventKind.DATA, message="a newer event, read first")
        session.flush()
        session.delete(early)  # the late writer's id, not yet visible
        session.flush()
        assert feed.since(session, tenancy, known) == ([], set())
        session.get(Job, ids[0]).phase = Phase.CANCELLED
        session.add(Event(id=early_id, job_id=ids[0], at=utcnow(), kind=EventKind.PHASE, to_phase=Phase.CANCELLED))
        session.flush()  # ...commits now, behind the one already read
        assert feed.since(session, tenancy, known) == ([], {ids[0]})
        assert feed.since(session, tenancy, known) == ([], set())  # each event is read once
        session.rollback()
