"""The admission engine (`scheduling.engine`): with no backfill bound it decides what the
from-scratch oracle (`cycle.schedule`) decides, cycle after cycle, as jobs come, start, are
preempted and end; its kept order follows promotions by time stamp; backfill is bounded and
resumes where it stopped; holders and the fair-share memory are kept by deltas."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from cellscale.vocabulary import PendingCode
from cellscale_hub.scheduling.cycle import schedule
from cellscale_hub.scheduling.engine import Engine
from cellscale_hub.scheduling.fairshare import Memory, decayed_gpu_seconds
from cellscale_hub.scheduling.types import Holder, Snapshot, Workload
from cellscale_hub.scheduling.usage import held_per_queue
from cellscale_hub.tenancy import Ordering, Tenancy

HOUR = 3600.0
ORDERING = Ordering(service_levels_gpu_hours=[1.0, 10.0], promote_after_hours=2.0, reserve_after_minutes=20)


def firm(ordering: Ordering = ORDERING) -> Tenancy:
    """Two divisions of three desks, skewed quotas (24 GPUs), one desk that lends half."""
    quotas = {"a": 8, "b": 4, "c": 2, "d": 6, "e": 2, "f": 2}
    queues = {}
    for name, nominal in quotas.items():
        quota = {"nominal": nominal, "lending_limit": nominal // 2} if name == "d" else {"nominal": nominal}
        queues[name] = {"cohort": "div1" if name in "abc" else "div2", "weight": nominal, "quotas": {"gpu": quota}}
    t = Tenancy.model_validate(
        {
            "flavors": {"gpu": {"backend": "local"}},
            "cohorts": {"firm": {}, "div1": {"parent": "firm"}, "div2": {"parent": "firm"}},
            "cluster_queues": queues,
            "tenants": {name: {"queues": {"default": {"cluster_queue": name}}} for name in queues},
        }
    )
    return t.model_copy(update={"ordering": ordering})


def without_short_share(t: Tenancy) -> Tenancy:
    """The same firm with no short-work share (a test of something else)."""
    cohorts = {name: c.model_copy(update={"short_work_share": 0.0}) for name, c in t.cohorts.items()}
    return t.model_copy(update={"cohorts": cohorts})


class Churn:
    """Random arrivals, starts, checkpoints, preemptions and ends, fed alike to the engine and
    to the oracle's snapshot; `step` runs one cycle of each."""

    def __init__(self, seed: int, tenancy: Tenancy, depth: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.t = tenancy
        self.engine = Engine(tenancy, backfill_depth=depth, half_life_s=HOUR)
        self.pending: dict[str, Workload] = {}
        self.holders: dict[str, Holder] = {}
        self.leaving: dict[str, float] = {}  # preempted job -> when it leaves
        self.now = 10 * HOUR
        self.n = 0

    def arrive(self) -> None:
        rng = self.rng
        self.n += 1
        job = Workload(
            f"j{self.n:04d}",
            rng.choice("abcdef"),
            rng.choice([1, 1, 1, 2, 2, 4, 8]),
            rng.choice([0, 0, 0, 100, -100]),
            self.now - rng.uniform(0, 3 * HOUR),
            tenant="t",
            attained=rng.choice([0.0, 0.0, 2 * HOUR, 20 * HOUR]),
            time_limit_s=rng.choice([None, 600.0, 7200.0]),
        )
        self.pending[job.job_id] = job
        self.engine.add(job)

    def step(self) -> tuple:
        history = self.engine.memory.averages(self.now)
        capacity = {"gpu": 24}
        oracle = schedule(
            Snapshot(self.t, capacity, tuple(self.holders.values()), tuple(self.pending.values()), history, self.now)
        )
        kept = self.engine.cycle(self.now, capacity, history=history)
        self.apply(kept)
        return oracle, kept

    def apply(self, decision) -> None:
        rng = self.rng
        for a in decision.admit:
            job = self.pending.pop(a.job_id)
            self.engine.remove(a.job_id)
            h = Holder(
                job.job_id,
                job.cluster_queue,
                a.flavor,
                job.gpus,
                job.priority,
                self.now,
                tenant="t",
                short_share=a.short_share,
            )
            h = dataclasses.replace(h, attained=job.attained, ends_by=self.now + (job.time_limit_s or 1e9))
            self.holders[h.job_id] = h
            self.engine.hold(h)
        for p in decision.preempt:
            if p.job_id not in self.leaving:
                self.holders[p.job_id] = dataclasses.replace(self.holders[p.job_id], preempting=True)
                self.engine.hold(self.holders[p.job_id])
                self.leaving[p.job_id] = self.now + 30
        self.now += rng.uniform(60, 1800)
        for job_id, h in list(self.holders.items()):
            if job_id in self.leaving and self.leaving[job_id] <= self.now:
                self.end(job_id, requeue=True)
            elif rng.random() < 0.15:
                self.end(job_id)
            elif rng.random() < 0.5:  # it checkpointed
                self.holders[job_id] = dataclasses.replace(h, last_checkpoint=self.now - rng.uniform(0, 300))
                self.engine.hold(self.holders[job_id])
        for _ in range(rng.randint(0, 6)):
            self.arrive()

    def end(self, job_id: str, requeue: bool = False) -> None:
        h = self.holders.pop(job_id)
        self.leaving.pop(job_id, None)
        self.engine.release(job_id, self.now)
        if requeue:
            attained = h.attained + h.gpus * (self.now - h.started)
            job = Workload(job_id, h.cluster_queue, h.gpus, h.priority, 0.0, tenant="t", attained=attained)
            job = dataclasses.replace(job, queued_at=self.now, submitted=self.now - 2 * HOUR)
            self.pending[job_id] = job
            self.engine.add(job)


@pytest.mark.parametrize("seed", range(6))
def test_with_no_bound_the_engine_decides_what_the_oracle_decides_cycle_after_cycle(seed):
    churn = Churn(seed, firm())
    for _ in range(60):
        churn.arrive()
    decided = 0
    for _ in range(40):
        oracle, kept = churn.step()
        assert kept.admit == oracle.admit
        assert kept.preempt == oracle.preempt
        assert kept.pending.codes() == oracle.pending.codes()
        for job_id in list(oracle.pending)[:20]:
            assert kept.pending[job_id] == oracle.pending[job_id]
        decided += len(kept.admit) + len(kept.preempt)
    assert decided > 40  # the churn really admitted and preempted


def test_submit_order_and_no_history_decide_alike_too():
    churn = Churn(7, firm(Ordering.submit_order()))
    churn.engine = Engine(churn.t, backfill_depth=None, half_life_s=0.0)
    for _ in range(40):
        churn.arrive()
    for _ in range(20):
        oracle, kept = churn.step()
        assert (kept.admit, kept.preempt) == (oracle.admit, oracle.preempt)


def test_a_job_above_level_0_moves_to_the_front_when_promoted_by_time_stamp():
    t = firm()
    engine = Engine(t, backfill_depth=None)
    old = Workload("old", "a", 8, 0, 0.0, tenant="t", attained=20 * HOUR, queued_at=0.0)  # level 2
    new = Workload("new", "a", 8, 0, 1000.0, tenant="t")  # level 0
    engine.add_many([old, new])
    capacity = {"gpu": 8}
    assert [a.job_id for a in engine.cycle(1.0 * HOUR, capacity).admit] == ["new"]
    assert [a.job_id for a in engine.cycle(2.0 * HOUR, capacity).admit] == ["old"]  # waited 2 h: level 0, older


def test_backfill_looks_at_a_bounded_number_of_jobs_and_resumes_where_it_stopped():
    t = without_short_share(firm(Ordering(reserve_after_minutes=0)))
    engine = Engine(t, backfill_depth=2)
    head = Workload("head", "a", 16, 0, 0.0, tenant="t")  # its quota and the pool: 21; 4 free: it reserves
    behind = [Workload(f"b{i}", "a", 2, 0, float(i + 1), tenant="t", time_limit_s=HOUR) for i in range(6)]
    engine.add_many([head, *behind])
    engine.hold(Holder("x", "b", "gpu", 20, 0, 0.0, ends_by=HOUR * 0.5, tenant="t"))
    first = engine.cycle(100.0, {"gpu": 24})
    assert first.admit == []  # each behind it would end after the head's start: none backfills
    assert set(first.pending.codes()) == {"head", *(b.job_id for b in behind)}  # every job has its reason
    assert first.pending["b5"].code is PendingCode.Queued
    assert "behind head" in first.pending["b5"].message  # not reached: waits in order behind the head
    engine.release("x", 200.0)  # 24 free: the head starts, then what fits behind it (21 in all)
    second = engine.cycle(200.0, {"gpu": 24})
    assert [a.job_id for a in second.admit] == ["head", "b0", "b1"]


def test_the_resumed_walk_reaches_jobs_a_bounded_cycle_did_not():
    t = firm(Ordering(reserve_after_minutes=0))
    engine = Engine(t, backfill_depth=2)
    head = Workload("head", "a", 16, 0, 0.0, tenant="t")
    too_long = [Workload(f"L{i}", "a", 1, 0, float(i + 1), tenant="t", time_limit_s=10 * HOUR) for i in range(4)]
    short = Workload("s", "a", 1, 0, 10.0, tenant="t", time_limit_s=600.0)  # ends before the head's start
    engine.add_many([head, *too_long, short])
    engine.hold(Holder("x", "b", "gpu", 20, 0, 0.0, ends_by=HOUR, tenant="t"))
    cycles = [[a.job_id for a in engine.cycle(100.0 + k, {"gpu": 24}).admit] for k in range(3)]
    assert cycles == [[], [], ["s"]]  # looked at L0-L1, then L2-L3, then reached and backfilled


def test_holders_are_kept_by_deltas():
    engine = Engine(firm())
    rng = random.Random(3)
    live: dict[str, Holder] = {}
    for n in range(200):
        job_id = f"h{rng.randrange(40)}"
        if job_id in live and rng.random() < 0.5:
            engine.release(job_id, float(n))
            del live[job_id]
        else:
            live[job_id] = Holder(job_id, rng.choice("abc"), "gpu", rng.randint(1, 8), 0, float(n), tenant="t")
            engine.hold(live[job_id])
    assert engine._held == held_per_queue(live.values())
    assert engine.holders == live


def test_the_memory_decays_lazily_to_what_summing_every_attempt_gives():
    half_life = HOUR
    memory = Memory(half_life)
    rng = random.Random(5)
    attempts = []
    running: list[tuple[str, float, float]] = []
    now = 0.0
    for _ in range(300):
        now += rng.uniform(0, 4000)  # long gaps: the base moves more than once
        if running and rng.random() < 0.5:
            queue, size, started = running.pop(rng.randrange(len(running)))
            memory.stop(queue, size, started, now)
            attempts.append((queue, size, started, now))
        else:
            running.append((rng.choice("ab"), float(rng.randint(1, 8)), now))
            memory.start(*running[-1])
    expected: dict[str, float] = {}
    for queue, size, started, ended in attempts + [(q, s, a, now) for q, s, a in running]:
        expected[queue] = expected.get(queue, 0.0) + decayed_gpu_seconds(size, started, ended, now, half_life)
    got = memory.averages(now)
    for queue, value in expected.items():
        assert got[queue] == pytest.approx(value * math.log(2) / half_life, rel=1e-9, abs=1e-9)


def test_a_new_tenancy_re_keys_every_waiting_job():
    engine = Engine(firm())
    engine.add(Workload("j", "a", 1, 0, 0.0, tenant="t", attained=5 * HOUR))  # level 1
    engine.retenancy(firm(Ordering.submit_order()))
    assert "j" in engine and engine._keys["j"][1] == 0  # no levels in submit order
