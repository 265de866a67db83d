"""The per-queue totals (store.totals) stay equal to what a scan of the jobs and attempts adds
up, through submits, phase changes, attempt ends, rollbacks and the migration's backfill."""

import random
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text

from cellscale.spec import JobSpec
from cellscale.vocabulary import EventReason, Phase
from cellscale_hub.lifecycle import ALLOWED
from cellscale_hub.store import jobs as q
from cellscale_hub.store import totals, usage
from cellscale_hub.store.models import Attempt, Job, utcnow
from tests.migrations import store_at

QUEUES = ("desk-a", "desk-b", "research")


def job(job_id: str, cq: str, gpus: int) -> Job:
    return Job(
        id=job_id,
        idempotency_key=job_id,
        owner="alice",
        tenant="desk-a",
        queue="default",
        backend="local",
        cluster_queue=cq,
        name="cell",
        spec=JobSpec(source="x = 1"),
        gpus=gpus,
        phase=Phase.PENDING,
    )


def scanned(session) -> dict[str, tuple[int, int, float]]:
    """What the totals must say, added up from every job and attempt."""
    out = {cq: [0, 0, 0.0] for cq in QUEUES}
    pending = select(Job.cluster_queue, func.count(), func.sum(Job.gpus)).where(Job.phase == Phase.PENDING)
    for cq, count, gpus in session.execute(pending.group_by(Job.cluster_queue)):
        out[cq][:2] = [count, gpus]
    ended = select(Job.cluster_queue, Job.gpus, Attempt.started_at, Attempt.ended_at).join(Attempt)
    for cq, gpus, started, ended_at in session.execute(ended.where(Attempt.ended_at.is_not(None))):
        out[cq][2] += gpus * (ended_at - started).total_seconds()
    return {cq: (a, b, pytest.approx(c, abs=1e-3)) for cq, (a, b, c) in out.items()}


def kept(session) -> dict[str, tuple[int, int, float]]:
    found = totals.read(session)
    return {
        cq: (found[cq].pending_jobs, found[cq].pending_gpus, found[cq].ended_gpu_seconds)
        if cq in found
        else (0, 0, 0.0)
        for cq in QUEUES
    }


def test_totals_follow_every_change_and_ignore_rolled_back_ones(store):
    rng = random.Random(7)
    ids = []
    for step in range(300):
        with store.session() as session:
            live = [session.get(Job, i) for i in ids]
            movable = [j for j in live if ALLOWED[j.phase]]
            if not movable or rng.random() < 0.3:
                new = job(f"cs-{step}", rng.choice(QUEUES), rng.choice((0, 1, 2, 4, 8)))
                q.insert_job(session, new)
                ids.append(new.id)
                continue
            target = rng.choice(movable)
            q.transition(session, target, rng.choice(sorted(ALLOWED[target.phase])), EventReason.Requeued)
            if rng.random() < 0.3:
                started = utcnow() - timedelta(seconds=rng.uniform(1, 7200))
                ended = utcnow()
                session.add(
                    Attempt(
                        job_id=target.id,
                        number=step,
                        backend="local",
                        state="SUCCEEDED",
                        started_at=started,
                        ended_at=ended,
                    )
                )
                totals.note_ended(session, target.cluster_queue, target.gpus * (ended - started).total_seconds())
        if step % 50 == 0:
            with pytest.raises(RuntimeError), store.session() as session:
                q.insert_job(session, job(f"cs-gone-{step}", "desk-a", 4))
                raise RuntimeError("the request failed after the job was added")
    with store.session() as session:
        assert kept(session) == scanned(session)


def test_a_retried_submit_counts_its_job_once(store):
    with store.session() as session:
        q.insert_job(session, job("cs-1", "desk-a", 2))
    with store.session() as session:
        _, created = q.insert_job(session, job("cs-1", "desk-a", 2))
    assert not created
    with store.session() as session:
        assert kept(session)["desk-a"] == (1, 2, 0.0)


def test_quota_reports_read_the_totals_and_count_running_attempts_to_now(store):
    from cellscale_hub.tenancy import Tenancy

    now = utcnow()
    with store.session() as session:
        for job_id, cq, gpus, started_h, ended_h in [
            ("cs-a", "desk-a", 4, 3.0, 1.0),  # 4 GPUs for 2 h
            ("cs-b", "desk-a", 2, 1.5, None),  # still running: 2 GPUs for 1.5 h so far
            ("cs-c", "desk-b", 8, 0.5, 0.25),  # 8 GPUs for 15 min
        ]:
            q.insert_job(session, job(job_id, cq, gpus))
            started = now - timedelta(hours=started_h)
            ended = now - timedelta(hours=ended_h) if ended_h is not None else None
            state = "SUCCEEDED" if ended else "RUNNING"
            session.add(
                Attempt(job_id=job_id, number=1, backend="local", state=state, started_at=started, ended_at=ended)
            )
            if ended:
                totals.note_ended(session, cq, gpus * (ended - started).total_seconds())
    with store.session() as session:
        hours = usage.gpu_hours(session, now, totals.read(session))
        assert hours == pytest.approx({"desk-a": 4 * 2 + 2 * 1.5, "desk-b": 8 * 0.25}, rel=1e-4)
        tenancy = Tenancy.from_yaml(TENANCY)
        report = {u.cluster_queue: u for u in usage.queue_usage(session, tenancy, now, 3600.0)}
    assert (report["desk-a"].pending_jobs, report["desk-a"].pending_gpus) == (2, 6)
    assert report["desk-b"].gpu_hours == pytest.approx(2.0, rel=1e-4)


TENANCY = """
flavors: {gpu: {backend: local}}
cohorts: {firm: {}}
cluster_queues:
  desk-a: {cohort: firm, quotas: {gpu: {nominal: 8}}}
  desk-b: {cohort: firm, quotas: {gpu: {nominal: 8}}}
tenants:
  desk-a: {queues: {default: {cluster_queue: desk-a}}}
  desk-b: {queues: {default: {cluster_queue: desk-b}}}
"""


def test_the_migration_fills_the_totals_and_inputs_from_the_jobs_already_stored(store_url):
    store, config = store_at(store_url, "0004")
    now = utcnow()
    with store.engine.begin() as conn:
        for job_id, cq, gpus, phase in [
            ("a", "desk-a", 2, "PENDING"),
            ("b", "desk-a", 4, "PENDING"),
            ("c", "desk-b", 8, "SUCCEEDED"),
            ("d", "desk-b", 1, "PENDING"),
        ]:
            conn.execute(
                text(
                    "INSERT INTO jobs (id, idempotency_key, owner, tenant, queue, backend, cluster_queue, priority,"
                    " borrowed, name, spec, gpus, phase, excluded_nodes, cancel_requested, result_available,"
                    " created_at, updated_at) VALUES (:id, :id, 'alice', 'desk-a', 'default', 'local', :cq, 0, 0,"
                    " 'cell', :spec, :gpus, :phase, '[]', false, false, :now, :now)"
                ),
                {
                    "id": job_id,
                    "cq": cq,
                    "gpus": gpus,
                    "phase": phase,
                    "now": now,
                    "spec": f'{{"inputs_sha256": "{job_id}1"}}',
                },
            )
        conn.execute(
            text(
                "INSERT INTO attempts (job_id, number, backend, state, gpu_ids, failed_nodes, started_at, ended_at)"
                " VALUES ('c', 1, 'local', 'SUCCEEDED', '[]', '[]', :start, :end)"
            ),
            {"start": now - timedelta(hours=1), "end": now},
        )
    store.migrate()
    with store.session() as session:
        found = kept(session)
        inputs = q.bundles_in_use(session)
    store.dispose()
    assert inputs == {"alice": {"a1", "b1", "d1"}}  # the job that ended uses none any more
    assert found["desk-a"] == (2, 6, 0.0)
    assert found["desk-b"][:2] == (1, 1) and found["desk-b"][2] == pytest.approx(8 * 3600, abs=1)
