"""Attained service is stored per job: each ended attempt adds its held seconds × the job's
GPU-equivalent weight (`jobs.attained_gpu_s`); admission's snapshot carries it with when the
job last joined the queue, its time limit and how often it was preempted; the API shows it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import text

from cellscale.spec import JobSpec
from cellscale.vocabulary import AttemptState, EventReason, Fault, Phase
from cellscale_hub.control.controller import Controller
from cellscale_hub.drivers import Observation
from cellscale_hub.store import Store, usage
from cellscale_hub.store import jobs as q
from cellscale_hub.store.models import Attempt, Job, utcnow
from cellscale_hub.store.tenancy_book import TenancyBook
from cellscale_hub.tenancy import Tenancy
from tests.migrations import store_at

TENANCY = Tenancy.from_yaml(
    """
flavors: {gpu: {backend: local}}
cohorts: {firm: {}}
cluster_queues:
  desk-a: {cohort: firm, quotas: {gpu: {nominal: 8}}}
tenants:
  desk-a: {queues: {default: {cluster_queue: desk-a}}}
resource_weights: {gpu: 1.0, cpu: 0.5, memory_gib: 0.25}
"""
)
WEIGHT = 2 * 1.0 + 4 * 0.5 + 2 * 0.25  # 2 GPUs, 4 CPUs, 2 GiB under those weights: 4.5 GPU-equivalents


def controller(store: Store, tmp_path: Path) -> Controller:
    book = TenancyBook(store)
    book.seed(TENANCY, actor="test")
    local = SimpleNamespace()  # admission asks no more of the backend here (it assigns no GPU ids)
    return Controller(store, {"local": local}, tmp_path / "jobs", bundles=None, tenancy=book)


def submit(store: Store, job_id: str = "cs-1", timeout_min: int = 30) -> None:
    spec = JobSpec.model_validate({"source": "pass", "resources": {"timeout_min": timeout_min}})
    with store.session() as s:
        q.insert_job(
            s,
            Job(
                id=job_id,
                idempotency_key=job_id,
                owner="alice",
                tenant="desk-a",
                queue="default",
                backend="local",
                cluster_queue="desk-a",
                name="cell",
                spec=spec,
                gpus=2,
                cpus=4,
                memory_mb=2048,
                phase=Phase.PENDING,
            ),
        )


def admit_and_run(ctl: Controller, job_id: str, started: datetime, held_from: datetime | None = None) -> None:
    """Admission as production does it, then the backend's start (as `_observe` records it)."""
    (grant,) = ctl.admission.admit({"gpu": 8})
    assert grant[0].id == job_id
    with ctl.store.session() as s:
        job = s.get(Job, job_id)
        attempt = job.attempts[-1]
        q.transition(s, job, Phase.STARTING, EventReason.Submitted, attempt=attempt.number)
        q.transition(s, job, Phase.RUNNING, EventReason.of_phase(Phase.RUNNING), attempt=attempt.number)
        attempt.state, attempt.started_at, attempt.held_from = AttemptState.RUNNING, started, held_from


def end(ctl: Controller, job_id: str, obs: Observation, preempt: bool = False) -> None:
    with ctl.store.session() as s:
        job = s.get(Job, job_id)
        if preempt:
            job.preempt_deadline, job.preempt_reason = utcnow(), "for a job with less service"
        ctl.attempts._end_attempt(s, job, job.attempts[-1], obs)


def stored(store: Store, job_id: str = "cs-1") -> Job:
    with store.session() as s:
        return s.get(Job, job_id)


def test_attained_service_accumulates_across_attempts_with_the_gpu_equivalent_weight(store, tmp_path):
    ctl = controller(store, tmp_path)
    submit(store)
    with store.session() as s:
        (waiting,), _ = usage.PendingFeed().full(s, TENANCY, ())
    assert (waiting.attained, waiting.queued_at, waiting.time_limit_s) == (0.0, None, 30 * 60)

    # attempt 1: the backend's own clock held it 100 s (the control plane saw it start later), preempted
    t0 = utcnow() - timedelta(seconds=500)
    admit_and_run(ctl, "cs-1", started=t0 + timedelta(seconds=7), held_from=t0)
    end(ctl, "cs-1", Observation(AttemptState.CANCELLED, held=(t0.timestamp(), t0.timestamp() + 100)), preempt=True)
    job = stored(store)
    assert job.phase is Phase.PENDING and job.attempts[0].fault is Fault.PREEMPTION
    assert job.attained_gpu_s == pytest.approx(100 * WEIGHT)

    # the waiting job, as the next cycle reads it (admission's engine let it go when it admitted it)
    assert "cs-1" not in ctl.admission._engine
    with store.session() as s:
        (waiting,), _ = usage.PendingFeed().full(s, TENANCY, ())
    assert waiting.attained == pytest.approx(100 * WEIGHT)
    assert waiting.queued_at == pytest.approx(job.attempts[0].ended_at.timestamp())
    assert waiting.time_limit_s == 30 * 60

    # attempt 2: no backend clock (held_from unknown): started_at → ended_at; it succeeds
    started = utcnow() - timedelta(seconds=200)
    admit_and_run(ctl, "cs-1", started=started)
    with store.session() as s:
        holder = usage.holder_of(s.get(Job, "cs-1"))
        view = q.job_view(s.get(Job, "cs-1"), weights=TENANCY.resource_weights)
    assert holder.attained == pytest.approx(100 * WEIGHT)  # before this attempt
    assert holder.preemptions == 1
    assert view.service_gpu_hours == pytest.approx((100 + 200) * WEIGHT / 3600, abs=1 * WEIGHT / 3600)

    end(ctl, "cs-1", Observation(AttemptState.SUCCEEDED, exit_code=0))
    job = stored(store)
    assert job.phase is Phase.SUCCEEDED
    second = (job.attempts[1].ended_at - started).total_seconds()
    assert job.attained_gpu_s == pytest.approx((100 + second) * WEIGHT)
    with store.session() as s:
        view = q.job_view(s.get(Job, "cs-1"), weights=TENANCY.resource_weights)
    assert view.service_gpu_hours == pytest.approx((100 + second) * WEIGHT / 3600)


def test_an_attempt_that_never_started_adds_no_service(store, tmp_path):
    ctl = controller(store, tmp_path)
    submit(store)
    ctl.admission.admit({"gpu": 8})  # admitted; its submit fails before the backend started anything
    end(ctl, "cs-1", Observation(AttemptState.FAILED, reason="submit failed: sbatch: error"))
    job = stored(store)
    assert job.attempts[0].started_at is None and job.attained_gpu_s == 0.0
    with store.session() as s:
        assert q.job_view(s.get(Job, "cs-1")).service_gpu_hours == 0.0


def test_queued_at_is_the_newest_attempts_end_and_holders_count_only_preemptions(store):
    submit(store, "cs-a")
    submit(store, "cs-b", timeout_min=90)
    t0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    with store.session() as s:
        a = s.get(Job, "cs-a")
        a.attained_gpu_s = 1234.5
        for number, ended, fault in [(1, t0, Fault.PREEMPTION), (2, t0 + timedelta(hours=1), Fault.INFRASTRUCTURE)]:
            a.attempts.append(
                Attempt(number=number, backend="local", state=AttemptState.FAILED, ended_at=ended, fault=fault)
            )
        a.attempts.append(Attempt(number=3, backend="local", state=AttemptState.RUNNING, started_at=t0))
        a.flavor = "gpu"
    with store.session() as s:
        found = {w.job_id: w for w in usage._by_ids(s, TENANCY, ["cs-a", "cs-b"])}
        holder = usage.holder_of(s.get(Job, "cs-a"))
    assert found["cs-a"].attained == 1234.5
    assert found["cs-a"].queued_at == (t0 + timedelta(hours=1)).timestamp()  # the running one has no end yet
    assert (found["cs-b"].attained, found["cs-b"].queued_at, found["cs-b"].time_limit_s) == (0.0, None, 90 * 60)
    assert (holder.attained, holder.preemptions) == (1234.5, 1)


def test_the_migration_fills_attained_service_from_the_attempts_already_stored(store_url):
    store, config = store_at(store_url, "0007")
    now = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    ago = {"now": now, **{f"m{m}": now - timedelta(minutes=m) for m in (10, 30, 40, 60)}}
    with store.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO tenancy_revisions (at, actor, document) VALUES (:now, 'test', :doc)"),
            {"now": now, "doc": '{"resource_weights": {"gpu": 1.0, "cpu": 0.5}}'},  # memory: the default
        )
        for job_id, gpus, cpus, memory_mb in [("a", 2, 4, 2048), ("b", 1, 0, 0)]:
            conn.execute(
                text(
                    "INSERT INTO jobs (id, idempotency_key, owner, tenant, queue, backend, cluster_queue, priority,"
                    " borrowed, name, spec, gpus, cpus, memory_mb, phase, excluded_nodes, cancel_requested,"
                    " result_available, created_at, updated_at) VALUES (:id, :id, 'alice', 'desk-a', 'default',"
                    " 'local', 'desk-a', 0, 0, 'cell', '{}', :gpus, :cpus, :memory_mb, 'PENDING', '[]', false,"
                    " false, :now, :now)"
                ),
                {"id": job_id, "gpus": gpus, "cpus": cpus, "memory_mb": memory_mb, "now": now},
            )
        attempt = text(
            "INSERT INTO attempts (job_id, number, backend, state, gpu_ids, failed_nodes, started_at, ended_at,"
            " held_from, held_until) VALUES ('a', :n, 'local', 'CANCELLED', '[]', '[]', :started, :ended,"
            " :held_from, :held_until)"
        )
        # held 20 min by the backend's clock; started→ended 20 min (no held times); never started; running
        conn.execute(attempt, {"n": 1, "started": ago["m60"], "ended": ago["m30"]} | held(ago["m60"], ago["m40"]))
        conn.execute(attempt, {"n": 2, "started": ago["m30"], "ended": ago["m10"]} | held(None, None))
        conn.execute(attempt, {"n": 3, "started": None, "ended": ago["m10"]} | held(None, None))
        conn.execute(attempt, {"n": 4, "started": ago["m10"], "ended": None} | held(ago["m10"], None))
    store.migrate()
    with store.session() as s:
        a, b = s.get(Job, "a"), s.get(Job, "b")
        attained = (a.attained_gpu_s, b.attained_gpu_s)
    store.dispose()
    weight = 2 * 1.0 + 4 * 0.5 + 2 * 0.0078125
    assert attained[0] == pytest.approx(40 * 60 * weight, rel=1e-6)
    assert attained[1] == 0.0


def held(start, end) -> dict:
    return {"held_from": start, "held_until": end}
