from datetime import timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from cellscale.spec import JobSpec, Phase
from cellscale_hub.lifecycle import IllegalTransition
from cellscale_hub.store import jobs as q
from cellscale_hub.store.jobs import IdempotencyConflict
from cellscale_hub.store.models import Base, Job, utcnow


def make_job(job_id="cs-1", owner="alice", key="k1", source="x = 1", tenant="desk-a", at=None):
    spec = JobSpec(source=source)
    return Job(
        id=job_id,
        idempotency_key=key,
        owner=owner,
        tenant=tenant,
        queue="default",
        backend="local",
        name="cell",
        spec=spec,
        gpus=0,
        phase="PENDING",
        created_at=at or utcnow(),
    )


def test_migration_creates_the_schema(store):
    tables = set(inspect(store.engine).get_table_names())
    assert {"jobs", "attempts", "events", "alembic_version"} <= tables
    store.migrate()  # idempotent on every start


def test_insert_records_a_submitted_event(store):
    with store.session() as s:
        job, created = q.insert_job(s, make_job())
    assert created
    with store.session() as s:
        (event,) = q.events_of(s, "cs-1")
        assert (event.to_phase, event.reason, event.actor) == ("PENDING", "Submitted", "alice")


def test_same_key_returns_the_same_job(store):
    with store.session() as s:
        q.insert_job(s, make_job())
    with store.session() as s:
        job, created = q.insert_job(s, make_job(job_id="cs-2"))
    assert (job.id, created) == ("cs-1", False)
    with store.session() as s:
        assert s.get(Job, "cs-2") is None


def test_same_key_different_spec_is_a_conflict(store):
    with store.session() as s:
        q.insert_job(s, make_job())
    with pytest.raises(IdempotencyConflict, match="already used"), store.session() as s:
        q.insert_job(s, make_job(job_id="cs-2", source="y = 2"))


def test_keys_are_per_owner(store):
    with store.session() as s:
        q.insert_job(s, make_job())
        _, created = q.insert_job(s, make_job(job_id="cs-2", owner="bob", tenant="desk-b"))
    assert created


def test_transitions_write_events_and_refuse_illegal_moves(store):
    with store.session() as s:
        job, _ = q.insert_job(s, make_job())
        q.transition(s, job, Phase.ADMITTED, "QuotaReserved")
        q.transition(s, job, Phase.STARTING, "Submitted")
        q.transition(s, job, Phase.RUNNING, "Running")
        q.transition(s, job, Phase.SUCCEEDED, "Finished")
        assert job.started_at and job.finished_at
        with pytest.raises(IllegalTransition):
            q.transition(s, job, Phase.RUNNING, "again")
    with store.session() as s:
        phases = [e.to_phase for e in q.events_of(s, "cs-1")]
    assert phases == ["PENDING", "ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"]


def test_a_jobs_end_is_announced_once_committed_and_only_then(store):
    ended: list[str] = []
    store.on_job_end(ended.append)
    with store.session() as s:
        job, _ = q.insert_job(s, make_job())
        q.transition(s, job, Phase.ADMITTED, "QuotaReserved")
    assert ended == []  # not an end
    with pytest.raises(RuntimeError), store.session() as s:
        q.transition(s, s.get(Job, "cs-1"), Phase.CANCELLED, "Cancelled")
        assert ended == []  # not before the commit
        raise RuntimeError("rolled back")
    assert ended == []  # never committed
    with store.session() as s:
        q.transition(s, s.get(Job, "cs-1"), Phase.CANCELLED, "Cancelled")
    assert ended == ["cs-1"]


def test_list_filters_and_paginates(store):
    base = utcnow()
    with store.session() as s:
        for i in range(7):
            owner = "alice" if i % 2 == 0 else "carol"
            q.insert_job(s, make_job(job_id=f"cs-{i}", owner=owner, key=f"k{i}", at=base + timedelta(seconds=i)))
        q.insert_job(s, make_job(job_id="cs-b", owner="bob", key="kb", tenant="desk-b"))
    seen, cursor = [], None
    while True:
        with store.session() as s:
            rows, cursor = q.list_jobs(
                s, owners=None, tenants=["desk-a"], phase=None, name=None, limit=3, cursor=cursor
            )
            seen += [r.id for r in rows]
        if cursor is None:
            break
    assert seen == [f"cs-{i}" for i in reversed(range(7))]
    with store.session() as s:
        mine, _ = q.list_jobs(s, owners=["alice"], tenants=None, phase="PENDING", name=None, limit=50, cursor=None)
    assert [r.id for r in mine] == ["cs-6", "cs-4", "cs-2", "cs-0"]


def test_bad_cursor_is_a_clear_error(store):
    with pytest.raises(ValueError, match="cursor"), store.session() as s:
        q.list_jobs(s, owners=None, tenants=None, phase=None, name=None, limit=5, cursor="garbage!")


def test_timestamps_are_utc_aware(store):
    with store.session() as s:
        q.insert_job(s, make_job())
    with store.session() as s:
        assert s.get(Job, "cs-1").created_at.utcoffset() == timedelta(0)


def test_the_migrations_build_the_schema_the_models_describe(store):
    """Every model change has its Alembic migration (columns, types, nullability, indexes)."""
    with store.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_the_stored_spec_is_read_typed_and_validated_once_per_job():
    """Job.spec is a JobSpec, kept per job id while its JSON is the same; the same id with
    another JSON (another database's job) is validated anew, never taken for the kept one."""
    first, again = make_job(job_id="cs-typed"), make_job(job_id="cs-typed")
    assert first.spec.source == "x = 1" and first.spec.resources.gpus_per_node == 0
    assert again.spec is first.spec  # the JSON is the same: not validated again
    other = make_job(job_id="cs-typed", source="y = 2")
    assert other.spec.source == "y = 2" and first.spec.source == "x = 1"
