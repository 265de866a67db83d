"""Admission, as the controller applies it: one scheduling cycle of the admission engine
(`scheduling.engine`, which keeps the waiting jobs between cycles, fed what changed), then
admitted jobs get a new attempt (and their GPU ids where the backend assigns them), victims
get their preemption warning, and why the
rest wait is published for the API.

Admission runs when something it decides on changed (a submit, cancel or admin change
through the controller's wake(); an attempt that started, ended or was requeued; the
tenancy; a backend's capacity), else every admission_interval_s (fair share decays,
estimates age): an idle control plane with a long queue does not re-score it twice a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

from cellscale.vocabulary import AttemptState, EventKind, EventReason, Phase, Resource
from cellscale_hub.control.sitehealth import SiteBoard
from cellscale_hub.control.steps import isolated
from cellscale_hub.drivers import AttemptRef, Driver, flavor_capacities
from cellscale_hub.drivers.capabilities import AssignsGpuIds
from cellscale_hub.metrics import Metrics
from cellscale_hub.refs import attempt_ref
from cellscale_hub.scheduling.capacity import allocate
from cellscale_hub.scheduling.engine import Engine
from cellscale_hub.scheduling.resources import amount_words
from cellscale_hub.scheduling.types import Admission, Preemption, Reasons
from cellscale_hub.scheduling.why import SHORT_SHARE_WHY
from cellscale_hub.settings import Settings
from cellscale_hub.store import Store, usage
from cellscale_hub.store import jobs as q
from cellscale_hub.store.models import Attempt, Job, utcnow
from cellscale_hub.store.tenancy_book import TenancyBook
from cellscale_hub.tenancy import Tenancy
from cellscale_hub.waiting import WaitingBoard


class Admitter:
    def __init__(
        self,
        store: Store,
        drivers: dict[str, Driver],
        jobs_root: Path,
        tenancy: TenancyBook,
        sites: SiteBoard,
        waiting: WaitingBoard,
        metrics: Metrics,
        settings: Settings,
        wake: Callable[[], None],
    ):
        self.store = store
        self.drivers = drivers
        self.jobs_root = jobs_root
        self.tenancy = tenancy
        self.sites = sites
        self.waiting = waiting  # why each pending job waits, for the API
        self.metrics = metrics
        self.settings = settings
        self.wake = wake  # the controller's: another cycle at once
        self.due = True
        self._inputs: tuple | None = None
        self._admitted_at = 0.0
        self._feed = usage.PendingFeed()
        self._engine: Engine | None = None  # built on the first cycle, and again on a tenancy change
        self._engine_revision: int | None = None
        self._resynced_at = 0.0

    def request(self) -> None:
        """Admit in the next cycle: something admission decides on changed."""
        self.due = True

    def needed(self, capacities: dict[str, int]) -> bool:
        inputs = (self.tenancy.revision, tuple(sorted(capacities.items())))
        changed = inputs != self._inputs
        self._inputs = inputs
        return self.due or changed or time.monotonic() - self._admitted_at > self.settings.admission_interval_s

    def admit(self, capacities: dict[str, int] | None = None) -> list[tuple[Job, Attempt]]:
        """One scheduling cycle: admit, warn victims, and record why the rest wait. Returns
        the attempts to launch (at most `launches_per_cycle`; the rest next cycle)."""
        tenancy = self.tenancy.current
        now = utcnow()
        self.due, self._admitted_at = False, time.monotonic()
        with self.store.session() as session:
            engine = self._kept(session, tenancy)
            if not len(engine):
                self.waiting.publish(Reasons())
                return []
            self._sync_holders(session, engine, now.timestamp())
            decision = engine.cycle(
                now.timestamp(),
                capacities if capacities is not None else flavor_capacities(tenancy, self.drivers),
                self.sites.states(tenancy, self.drivers),
                usage.budget_spend(session, tenancy, now),
                usage.history(session, now, self.settings.fair_share_half_life_s, tenancy.resource_weights),
            )
        before = self.waiting.reasons  # a lender's last reason says whether it waited behind a short-work share
        self.waiting.publish(decision.pending)
        grants = decision.admit[: self.settings.launches_per_cycle]
        if len(decision.admit) > len(grants):
            self.wake()  # the rest in the next cycle, right after a poll
        launches, warnings = [], []
        with self.store.session() as session:
            in_use = self._gpu_ids_in_use(session)
            for grant in grants:
                launch = self._admit_one(session, tenancy, grant, in_use, before)
                if launch:
                    launches.append(launch)
                else:
                    self.due = True  # granted but not placed now (its GPUs still busy): next cycle
            for preemption in decision.preempt:
                warning = self.start_preemption(session, preemption, now)
                if warning:
                    warnings.append(warning)
        for backend, ref in warnings:
            isolated("warn", backend, partial(self.drivers[backend].warn, ref))
        return launches

    def _kept(self, session, tenancy: Tenancy) -> Engine:
        """The engine, brought up to date: built in one pass on the first cycle and after a
        tenancy change; else fed the waiting jobs that changed since the last cycle, with a
        full diff every pending_resync_s as a safety net."""
        if self._engine is None or self._engine_revision != self.tenancy.revision:
            self._engine = Engine(tenancy, self.settings.backfill_depth)
            self._engine_revision = self.tenancy.revision
            self._feed = usage.PendingFeed()
        engine = self._engine
        resync = time.monotonic() - self._resynced_at > self.settings.pending_resync_s
        read = self._feed.full if resync else self._feed.since
        new, gone = read(session, tenancy, engine.waiting_ids())
        if resync:
            self._resynced_at = time.monotonic()
        for job_id in gone:
            engine.remove(job_id)
        engine.add_many(new)
        return engine

    @staticmethod
    def _sync_holders(session, engine: Engine, now: float) -> None:
        """The holders, by deltas: re-read each cycle (bounded by the fleet; a checkpoint writes
        no event), and only those that changed are passed on."""
        holders = {h.job_id: h for h in usage.holders(session)}
        for job_id in engine.holders.keys() - holders.keys():
            engine.release(job_id, now)
        for job_id, holder in holders.items():
            if engine.holders.get(job_id) != holder:
                engine.hold(holder)

    def _lender_waited(self, tree: str, waited: float) -> None:
        """A job within its desk's quota started after waiting behind a short-work share's loan."""
        cohort = tree.partition(":")[2]
        self.metrics.lender_wait.labels(cohort).observe(waited)
        self.metrics.lender_wait_max[cohort] = max(waited, self.metrics.lender_wait_max.get(cohort, 0.0))

    def _gpu_ids_in_use(self, session) -> dict[str, list[int]]:
        return {
            name: [g for a in q.active_attempts(session, name) for g in (a.gpu_ids or [])]
            for name, driver in self.drivers.items()
            if isinstance(driver, AssignsGpuIds)
        }

    def _admit_one(self, session, tenancy: Tenancy, grant: Admission, in_use: dict[str, list[int]], before: Reasons):
        job = session.get(Job, grant.job_id)
        if job is None or job.phase is not Phase.PENDING or job.cancel_requested:
            self._engine.remove(grant.job_id)  # it left the queue since the feed's read
            return None
        backend = tenancy.flavors[grant.flavor].backend
        driver = self.drivers[backend]
        gpu_ids: list[int] = []
        if isinstance(driver, AssignsGpuIds):
            gpu_ids = allocate(driver.capacity().capacity_gpus, in_use[backend], job.gpus) or []
            if len(gpu_ids) < job.gpus:
                return None  # quota says yes, the machine is still busy: next cycle
            in_use[backend].extend(gpu_ids)
        self._engine.remove(job.id)  # if it comes back to the queue, it may be on another backend
        job.backend, job.flavor, job.borrowed, job.short_share = (
            backend,
            grant.flavor,
            grant.borrowed,
            grant.short_share,
        )
        attempt = Attempt(
            job_id=job.id,
            number=len(job.attempts) + 1,
            backend=backend,
            flavor=grant.flavor,
            state=AttemptState.SUBMITTING,
            gpu_ids=gpu_ids,
        )
        waited_since = job.attempts[-1].ended_at if job.attempts else job.created_at
        job.attempts.append(attempt)
        waited = max(0.0, (utcnow() - waited_since).total_seconds())
        self.metrics.admission_wait.labels(job.tenant).observe(waited)
        if not grant.borrowed and not grant.short_share and _behind_short_share(before, job.id):
            self._lender_waited(tenancy.root_of(job.cluster_queue), waited)
        borrowing = f", {grant.borrowed} borrowed from the cohort" if grant.borrowed else ""
        if grant.short_share:
            borrowing = f", on the short-work share of its cohort ({_short_share_words(tenancy)})"
        placed = f"; {grant.placed}" if grant.placed else ""
        q.transition(
            session,
            job,
            Phase.ADMITTED,
            EventReason.QuotaReserved,
            attempt=attempt.number,
            message=f"{_reserved(job, grant.flavor)} reserved in {job.cluster_queue}{borrowing}{placed}",
        )
        return job, attempt

    def start_preemption(self, session, preemption: Preemption, now) -> tuple[str, AttemptRef] | None:
        """Give the job its grace period and say so; returns (backend, ref) of a running
        attempt to warn (with the checkpoint signal), None when there is none to warn."""
        job = session.get(Job, preemption.job_id)
        if job is None or job.preempt_deadline is not None or job.phase.terminal:
            return None
        grace_s = self.settings.preemption_grace_s
        job.preempt_deadline = now + timedelta(seconds=grace_s)
        job.preempt_reason = preemption.reason
        attempt = job.attempts[-1]
        running = attempt.state is AttemptState.RUNNING
        q.add_event(
            session,
            job,
            kind=EventKind.PREEMPTION,
            attempt=attempt.number,
            reason=EventReason.Preempting,
            message=f"{preemption.reason}; "
            + (
                f"warned, stopping in {grace_s:.0f} s (checkpoint now to lose nothing)"
                if running
                else f"stopping in {grace_s:.0f} s (it had not started: nothing to checkpoint)"
            ),
        )
        # only running ranks are warned: a supervisor still starting has no handler for the signal yet;
        # a sweep's tasks are not warned: its unfinished points run again in its next attempt
        if running and not job.spec.sweep:
            return job.backend, attempt_ref(self.jobs_root, job, attempt)
        return None


def _reserved(job: Job, flavor: str) -> str:
    """What admission reserved for it: its GPUs, or a CPU job's cores (not "0 GPU(s)")."""
    if job.gpus:
        return f"{job.gpus} {flavor} GPU(s)"
    return amount_words(Resource.cpu, job.cpus, flavor)


def _short_share_words(tenancy: Tenancy) -> str:
    """When a job admitted on a short-work share becomes reclaimable, in words."""
    levels = tenancy.ordering.service_levels_gpu_hours
    if not levels:
        return "reclaimable like borrowed work"
    return f"not reclaimed until it has received {levels[0]:g} GPU-hours"


def _behind_short_share(reasons: Reasons, job_id: str) -> bool:
    """The job's last reason named a holder a short-work share lends GPUs to (`why._why`)."""
    reason = reasons.get(job_id)
    return reason is not None and any(a.why.startswith(SHORT_SHARE_WHY) for a in reason.ahead)
