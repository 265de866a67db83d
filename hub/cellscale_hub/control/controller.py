"""The reconcile loop: admits pending jobs, starts attempts, and drives every job's phase
from what its backend reports, with one batched poll per backend per cycle.

It keeps no state of its own that matters: after a restart (kill -9 included) the next
cycle finds the active attempts in the store and asks their backends about them, so no
job is lost, and drivers' idempotent submit means none is run twice.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from cellscale.spec import JobSpec
from cellscale.vocabulary import ACTIVE_ATTEMPT_STATES, AttemptState, EventKind, EventReason, Fault, Phase, Resource
from cellscale_hub.bundles import BundleStore
from cellscale_hub.cost.cloudbill import attribute
from cellscale_hub.drivers import AttemptRef, BackendUnreachable, Driver, Observation, flavor_capacities
from cellscale_hub.faults import decide
from cellscale_hub.lifecycle import outcome_of
from cellscale_hub.refs import attempt_ref
from cellscale_hub.scheduling.admission import Admission, Preemption, Reasons, schedule
from cellscale_hub.scheduling.capacity import allocate
from cellscale_hub.scheduling.resources import Amounts, amount_words
from cellscale_hub.control.sitehealth import SiteBoard
from cellscale_hub.control.staging import StageAhead
from cellscale_hub.store import Store, totals, usage
from cellscale_hub.store import jobs as q
from cellscale_hub.store.models import Attempt, Job, utcnow
from cellscale_hub.store.tenancy_book import TenancyBook
from cellscale_hub.control.sweeps import SweepRunner
from cellscale_hub.store.points import settle_points
from cellscale_hub.cost import metering
from cellscale_hub.metrics import Metrics
from cellscale_hub.tenancy import Tenancy
from cellscale_hub.waiting import WaitingBoard

log = logging.getLogger("cellscale.controller")


class Controller:
    def __init__(
        self,
        store: Store,
        drivers: dict[str, Driver],
        jobs_root: Path,
        bundles: BundleStore,
        tenancy: TenancyBook,
        interval: float = 0.5,
        launches_per_cycle: int = 16,
        preemption_grace_s: float = 30.0,
        fair_share_half_life_s: float = 3600.0,
        heartbeat_timeout_s: float = 60.0,
        bundle_sweep_s: float = 600.0,
        bundle_keep_succeeded_s: float = 86400.0,
        admission_interval_s: float = 30.0,
        waiting: WaitingBoard | None = None,
        site_lost_timeout_s: float = 120.0,
        cloud_backoff_s: float = 600.0,
        cloud_bill_interval_s: float = 30.0,
        meter_interval_s: float = 60.0,
        metrics: Metrics | None = None,
    ):
        self.store = store
        self.drivers = drivers
        self.jobs_root = jobs_root
        self.bundles = bundles
        self.bundle_sweep_s = bundle_sweep_s
        self.bundle_keep_succeeded_s = bundle_keep_succeeded_s
        self._swept_at = 0.0
        self.tenancy = tenancy
        self.interval = interval
        self.launches_per_cycle = launches_per_cycle  # a burst of submits must not starve polls and cancels
        self.preemption_grace_s = preemption_grace_s
        self.fair_share_half_life_s = fair_share_half_life_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cancel_sent: set[tuple[str, int]] = set()
        self._mirrored: dict[str, int] = {}  # backend -> tenancy revision it last accepted
        # admission runs when something it decides on changed (a submit, cancel or admin change
        # through wake(); an attempt that started, ended or was requeued; the tenancy; a backend's
        # capacity), else every admission_interval_s (fair share decays, estimates age): an idle
        # control plane with a long queue does not re-score it twice a second
        self.admission_interval_s = admission_interval_s
        self._admission_due = True
        self._admission_inputs: tuple | None = None
        self._admitted_at = 0.0
        self._pending = usage.PendingWorkloads()
        self._seen: dict[str, dict[int, tuple]] = {}  # backend -> attempt -> what its last stored observation was
        self.waiting = waiting or WaitingBoard()  # why each pending job waits, for the API
        # sites: a backend whose scheduler stops answering keeps its attempts UNKNOWN; those
        # that never started move elsewhere after site_lost_timeout_s (fenced first, so they
        # can never start there), and are cancelled there once it answers again; a cloud pool
        # that had no capacity or reclaimed a node gets no new work for cloud_backoff_s
        self.sites = SiteBoard()
        self.site_lost_timeout_s = site_lost_timeout_s
        self.cloud_backoff_s = cloud_backoff_s
        self._abandoned: dict[str, list[AttemptRef]] = {}  # backend -> moved attempts to cancel there
        self.cloud_bill_interval_s = cloud_bill_interval_s
        self._billed_at: dict[str, float] = {}
        # the cost ledger: running attempts get a row every meter_interval_s, ended ones at once
        self.meter_interval_s = meter_interval_s
        self._metered_at: dict[str, float] = {}
        self._alive_at: dict[str, dict[int, datetime]] = {}  # backend -> attempt -> when it last polled running
        self._capacity_metered_at = 0.0
        self.metrics = metrics or Metrics()
        self.sweeps = SweepRunner(store)  # runs a sweep's points inside its one admission
        self.stage_ahead = StageAhead(store, drivers, jobs_root, self.waiting)  # datasets onto the next jobs' nodes
        self._thread: threading.Thread | None = None
        for driver in drivers.values():
            driver.notify = self.wake  # e.g. a local supervisor exited: reconcile its end now

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=10)

    def wake(self) -> None:
        """Run a cycle now, with admission (after a submit, cancel or admin change), instead of
        at the next tick."""
        self._admission_due = True
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the cycle: a wake() during it runs the next one at once
            began = time.perf_counter()
            try:
                self.cycle()
            except Exception:  # one bad cycle must not stop the control plane
                log.exception("reconcile cycle failed")
            self.metrics.cycle.observe(time.perf_counter() - began)
            self._wake.wait(self.interval)

    # -- one cycle -------------------------------------------------------------------------
    def cycle(self) -> None:
        if time.monotonic() - self._swept_at > self.bundle_sweep_s:
            self._swept_at = time.monotonic()
            self._isolated("bundle clean-up", "-", self.sweep_bundles)
        for name, driver in self.drivers.items():
            for step in (self.mirror_tenancy, self.send_cancels, self.reconcile, self.bill_cloud, self.meter):
                self._isolated(step.__name__, name, partial(step, name, driver))
        try:
            capacities = flavor_capacities(self.tenancy.current, self.drivers)
            self._isolated("capacity metering", "-", partial(self.meter_capacity, capacities))
            launches = self.admit(capacities) if self._admission_needed(capacities) else []
        except Exception:
            log.exception("admission failed; nothing was admitted this cycle")
            self._admission_due = True
            launches = []
        for job, attempt in launches:
            self._isolated("launch", job.backend, partial(self.launch, self.drivers[job.backend], job, attempt))
        self._isolated("staging ahead", "-", self.stage_ahead.cycle)

    @staticmethod
    def _isolated(what: str, backend: str, call: Callable[[], object]) -> None:
        try:
            call()
        except Exception:  # a backend that does not answer must not stall the others
            log.exception("%s on backend %s failed; its attempts keep their last known state", what, backend)

    def ref(self, job: Job, attempt: Attempt) -> AttemptRef:
        return attempt_ref(self.jobs_root, job, attempt)

    def sweep_bundles(self) -> None:
        """Remove input bundles no waiting or running job uses (nor one that succeeded lately),
        once past their grace period."""
        since = utcnow() - timedelta(seconds=self.bundle_keep_succeeded_s) if self.bundle_keep_succeeded_s else None
        with self.store.session() as session:
            in_use = q.bundles_in_use(session, since)
        removed = self.bundles.sweep(in_use)
        if removed:
            log.info("removed %d input bundle(s) no job uses any more", removed)

    def mirror_tenancy(self, backend: str, driver: Driver) -> None:
        """Tell the backend's own scheduler about quotas and shares, once per tenancy change
        (retried each cycle until the backend accepts it)."""
        revision = self.tenancy.revision
        if self._mirrored.get(backend) != revision:
            driver.apply_tenancy(self.tenancy.current)
            self._mirrored[backend] = revision

    # -- admission ---------------------------------------------------------------------------
    def _admission_needed(self, capacities: dict[str, int]) -> bool:
        inputs = (self.tenancy.revision, tuple(sorted(capacities.items())))
        changed = inputs != self._admission_inputs
        self._admission_inputs = inputs
        return self._admission_due or changed or time.monotonic() - self._admitted_at > self.admission_interval_s

    def admit(self, capacities: dict[str, int] | None = None) -> list[tuple[Job, Attempt]]:
        """One scheduling cycle: admit, warn victims, and record why the rest wait. Returns
        the attempts to launch (at most `launches_per_cycle`; the rest next cycle)."""
        tenancy = self.tenancy.current
        now = utcnow()
        self._admission_due, self._admitted_at = False, time.monotonic()
        with self.store.session() as session:
            pending = self._pending.read(session, tenancy, self.tenancy.revision)
            if not pending:
                self.waiting.publish(Reasons())
                return []
            snap = usage.snapshot(
                session,
                tenancy,
                pending,
                capacities if capacities is not None else flavor_capacities(tenancy, self.drivers),
                now,
                self.fair_share_half_life_s,
                self.sites.states(tenancy, self.drivers),
            )
        decision = schedule(snap)
        self.waiting.publish(decision.pending)
        grants = decision.admit[: self.launches_per_cycle]
        if len(decision.admit) > len(grants):
            self.wake()  # the rest in the next cycle, right after a poll
        launches, warnings = [], []
        with self.store.session() as session:
            in_use = self._gpu_ids_in_use(session)
            for grant in grants:
                launch = self._admit_one(session, tenancy, grant, in_use)
                if launch:
                    launches.append(launch)
                else:
                    self._admission_due = True  # granted but not placed now (its GPUs still busy): next cycle
            for preemption in decision.preempt:
                warning = self._start_preemption(session, preemption, now)
                if warning:
                    warnings.append(warning)
        for backend, ref in warnings:
            self._isolated("warn", backend, partial(self.drivers[backend].warn, ref))
        return launches

    def _gpu_ids_in_use(self, session) -> dict[str, list[int]]:
        return {
            name: [g for a in q.active_attempts(session, name) for g in (a.gpu_ids or [])]
            for name, driver in self.drivers.items()
            if driver.assigns_gpu_ids
        }

    def _admit_one(self, session, tenancy: Tenancy, grant: Admission, in_use: dict[str, list[int]]):
        job = session.get(Job, grant.job_id)
        if job is None or job.phase is not Phase.PENDING or job.cancel_requested:
            return None
        self._pending.forget(job.id)  # if it comes back to the queue, it may be on another backend
        backend = tenancy.flavors[grant.flavor].backend
        driver = self.drivers[backend]
        gpu_ids: list[int] = []
        if driver.assigns_gpu_ids:
            gpu_ids = allocate(driver.capacity().capacity_gpus, in_use[backend], job.gpus) or []
            if len(gpu_ids) < job.gpus:
                return None  # quota says yes, the machine is still busy: next cycle
            in_use[backend].extend(gpu_ids)
        job.backend, job.flavor, job.borrowed = backend, grant.flavor, grant.borrowed
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
        self.metrics.admission_wait.labels(job.tenant).observe(max(0.0, (utcnow() - waited_since).total_seconds()))
        borrowing = f", {grant.borrowed} borrowed from the cohort" if grant.borrowed else ""
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

    def _start_preemption(self, session, preemption: Preemption, now):
        job = session.get(Job, preemption.job_id)
        if job is None or job.preempt_deadline is not None or job.phase.terminal:
            return None
        job.preempt_deadline = now + timedelta(seconds=self.preemption_grace_s)
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
                f"warned, stopping in {self.preemption_grace_s:.0f} s (checkpoint now to lose nothing)"
                if running
                else f"stopping in {self.preemption_grace_s:.0f} s (it had not started: nothing to checkpoint)"
            ),
        )
        # only running ranks are warned: a supervisor still starting has no handler for the signal yet;
        # a sweep's tasks are not warned: its unfinished points run again in its next attempt
        return (job.backend, self.ref(job, attempt)) if running and not job.spec.sweep else None

    def launch(self, driver: Driver, job: Job, attempt: Attempt, resubmit: bool = False) -> None:
        if not resubmit and self._cancelled_before_submit(job, attempt):
            return  # (a resubmit may find what an earlier launch submitted: adopted, then cancelled)
        ref = dataclasses.replace(self.ref(job, attempt), resubmit=resubmit)
        spec = ref.spec
        bundle = self.bundles.path(job.owner, spec.inputs_sha256) if spec.inputs_sha256 else None
        try:
            if spec.sweep is not None:
                driver.prepare(ref, bundle, self._points_manifest(job.owner, spec))
                backend_ref = self.sweeps.launch(driver, ref)
            else:
                driver.prepare(ref, bundle)
                backend_ref = driver.submit(ref)
            error = None
        except Exception as exc:
            log.exception("submit of %s attempt %d failed", job.id, attempt.number)
            backend_ref, error = None, f"{type(exc).__name__}: {exc}"
        with self.store.session() as session:
            job = session.get(Job, job.id)
            attempt = session.get(Attempt, attempt.id)
            attempt.backend_ref, attempt.submitted_at = backend_ref, utcnow()
            if error:
                self._end_attempt(
                    session, job, attempt, Observation(AttemptState.FAILED, reason=f"submit failed: {error}")
                )
                return
            attempt.state = AttemptState.STARTING
            q.transition(
                session,
                job,
                Phase.STARTING,
                EventReason.Submitted,
                attempt=attempt.number,
                message=f"submitted to {driver.name} as {backend_ref}",
            )

    def _cancelled_before_submit(self, job: Job, attempt: Attempt) -> bool:
        """An attempt admitted, then cancelled before its launch (a later cycle's, when launches
        were many) ends here, never submitted: `send_cancels` leaves unsubmitted attempts alone."""
        with self.store.session() as session:
            job = session.get(Job, job.id)
            if not job.cancel_requested:
                return False
            attempt = session.get(Attempt, attempt.id)
            self._end_attempt(
                session, job, attempt, Observation(AttemptState.CANCELLED, reason="cancelled before it was submitted")
            )
            return True

    def _points_manifest(self, owner: str, spec: JobSpec) -> Path:
        manifest = self.bundles.path(owner, spec.sweep.points_sha256)
        if manifest is None:
            raise RuntimeError(f"the sweep's points manifest {spec.sweep.points_sha256} is gone from the bundles")
        return manifest

    def _observe_all(self, driver: Driver, refs: dict[int, AttemptRef], attempts: list[Attempt]):
        """`driver.observe_attempts` for plain attempts, the sweep runner for sweeps' (raises
        BackendUnreachable when the backend does not answer)."""
        sweeps = [ref for ref in refs.values() if ref.spec.sweep is not None]
        plain = [ref for ref in refs.values() if ref.spec.sweep is None]
        observed = driver.observe_attempts(plain) if plain else {}
        if sweeps:
            now = utcnow()
            stopping = {
                a.job_id
                for a in attempts
                if a.job.cancel_requested or (a.job.preempt_deadline is not None and a.job.preempt_deadline <= now)
            }
            observed |= self.sweeps.observe(driver, sweeps, stopping)
        return observed

    def reconcile(self, backend: str, driver: Driver) -> None:
        """Poll the backend's active attempts (one batched query) and store what changed: an
        attempt whose observation is the same as last cycle's costs no write."""
        with self.store.session() as session:
            attempts = q.active_attempts(session, backend)
            refs = {a.id: self.ref(a.job, a) for a in attempts}
        seen = self._seen.setdefault(backend, {})
        for gone in seen.keys() - refs.keys():
            del seen[gone]
        if not attempts:
            if self.sites.unavailable(backend):
                driver.capacity()  # raises while it still does not answer
                self._answers_again(backend, driver)
            return
        polled_at = utcnow()  # what the poll says running was running at this time (or later)
        try:
            observations = self._observe_all(driver, refs, attempts)
        except BackendUnreachable as exc:
            observations = self._while_lost(backend, attempts, refs, str(exc))
        else:
            self._answers_again(backend, driver)
            self._heed_notices(backend, driver, attempts, refs, observations)
        relaunch, hung, changed = [], [], {}
        alive = self._alive_at.setdefault(backend, {})
        for gone in alive.keys() - refs.keys():
            del alive[gone]
        for attempt in attempts:
            ref = refs[attempt.id]
            obs = observations.get(ref.key, Observation(AttemptState.UNKNOWN))
            if obs.held and obs.held[1] is None and not obs.state.ended:
                alive[attempt.id] = polled_at - timedelta(seconds=METER_LAG_S)
            if obs.state is AttemptState.SUBMITTING and attempt.submitted_at is None:
                relaunch.append((attempt.job, attempt))  # the control plane died between admit and submit
                continue
            why = self._hung(obs, attempt, ref.spec.stall_timeout_s)
            if why is not None:
                hung.append(ref)
                obs = Observation(AttemptState.LOST, fault=Fault.INFRASTRUCTURE, heartbeat=obs.heartbeat, reason=why)
            mark = (_mark(obs), attempt.job.cancel_requested)
            if seen.get(attempt.id) != mark:
                changed[attempt.id] = (obs, mark)
        if changed:
            with self.store.session() as session:
                for attempt_id, (obs, _) in changed.items():
                    attempt = session.get(Attempt, attempt_id)
                    self._observe(session, attempt.job, attempt, obs)
            seen.update({attempt_id: mark for attempt_id, (_, mark) in changed.items()})
        for ref in hung:
            driver.cancel(ref)  # stop what is left of it; its retry is a new attempt
        for job, attempt in relaunch:
            self.launch(driver, job, attempt, resubmit=True)

    # -- sites that go away --------------------------------------------------------------------
    def _while_lost(
        self, backend: str, attempts: list[Attempt], refs: dict[int, AttemptRef], why: str
    ) -> dict[tuple[str, int], Observation]:
        """Observations while a backend does not answer: UNKNOWN (never gone); an attempt that
        never started moves after `site_lost_timeout_s`, once fenced (it can never start there)."""
        lost_for = self.sites.lost(backend, why)
        self._admission_due = True  # placement now avoids it
        out = {}
        for attempt in attempts:
            ref = refs[attempt.id]
            unknown = f"{backend} does not answer ({why}): the attempt's state is unknown, not lost"
            obs = Observation(AttemptState.UNKNOWN, reason=unknown)
            if lost_for >= self.site_lost_timeout_s and attempt.started_at is None and self.drivers[backend].fence(ref):
                obs = Observation(
                    AttemptState.LOST,
                    fault=Fault.CAPACITY,
                    reason=f"moved: {backend} has not answered for {lost_for:.0f} s and the attempt had not started; "
                    f"it is fenced (it can never start there) and cancelled there when {backend} answers again",
                )
                self._abandoned.setdefault(backend, []).append(ref)
            out[ref.key] = obs
        return out

    def _answers_again(self, backend: str, driver: Driver) -> None:
        if self.sites.reached(backend):
            self._admission_due = True
        for ref in self._abandoned.pop(backend, []):
            self._isolated("cancel of a moved attempt", backend, partial(driver.cancel, ref))

    def _heed_notices(
        self,
        backend: str,
        driver: Driver,
        attempts: list[Attempt],
        refs: dict[int, AttemptRef],
        observations: dict[tuple[str, int], Observation],
    ) -> None:
        """A node announced to go away (a spot reclaim): preempt what runs there, with the
        checkpoint warning, and place nothing new on that backend for a while."""
        notices = driver.node_notices()
        if not notices:
            return
        now = utcnow()
        warnings = []
        with self.store.session() as session:
            for attempt in attempts:
                obs = observations.get(refs[attempt.id].key)
                doomed = sorted(set(obs.nodes) & notices.keys()) if obs else []
                if not doomed:
                    continue
                why = f"{doomed[0]} is being reclaimed ({notices[doomed[0]]})"
                warning = self._start_preemption(session, Preemption(attempt.job_id, "", why), now)
                if warning:
                    warnings.append(warning[1])
        if warnings:
            self.sites.close(backend, self.cloud_backoff_s, f"it reclaimed {', '.join(sorted(notices))}")
        for ref in warnings:
            self._isolated("warn", backend, partial(driver.warn, ref))

    def bill_cloud(self, backend: str, driver: Driver) -> None:
        """Attribute a cloud pool's bill to the attempts that held its nodes (`cloudbill`), every
        `cloud_bill_interval_s`: each attempt's share (boot, run, idle tail) in `cloud_usd`."""
        if time.monotonic() - self._billed_at.get(backend, 0.0) < self.cloud_bill_interval_s:
            return
        self._billed_at[backend] = time.monotonic()
        now = time.time()
        recent = [i for i in driver.cloud_instances() if i.stopped is None or i.stopped > now - BILL_WINDOW_S]
        if not recent:
            return
        since = datetime.fromtimestamp(min(i.requested for i in recent), UTC) - timedelta(hours=1)
        with self.store.session() as session:
            attempts = q.attempts_since(session, backend, since)
            refs = [self.ref(a.job, a) for a in attempts]
        bill = attribute(recent, driver.node_runs(refs), now)
        with self.store.session() as session:
            for attempt in attempts:
                usd = bill.usd.get((attempt.job_id, attempt.number))
                if usd is not None and (attempt.cloud_usd is None or abs(attempt.cloud_usd - usd) > 1e-6):
                    session.get(Attempt, attempt.id).cloud_usd = round(usd, 6)

    def meter(self, backend: str, driver: Driver) -> None:
        """The ledger's next rows for the backend's attempts (`cost.metering`): every
        `meter_interval_s` while they run, and right after one ends."""
        if time.monotonic() - self._metered_at.get(backend, 0.0) < self.meter_interval_s:
            return
        self._metered_at[backend] = time.monotonic()
        now = utcnow()
        with self.store.session() as session:
            attempts = metering.unmetered(session, backend, now - timedelta(days=1))
            refs = {a.id: self.ref(a.job, a) for a in attempts}
        if not attempts:
            return
        used = {a.id: metering.used_of(driver.usage(refs[a.id]), refs[a.id].spec.resources.nodes) for a in attempts}
        tenancy = self.tenancy.current
        alive = self._alive_at.get(backend, {})
        rows, hours = [], {}
        with self.store.session() as session, session.no_autoflush:  # one flush for all the rows
            for attempt in metering.attempts(session, list(used)):
                use, alive_at = used[attempt.id], alive.get(attempt.id)
                rows += metering.meter_attempt(session, tenancy, attempt.job, attempt, use, alive_at, hours)
        for row in rows:  # counted once stored
            self.metrics.metered(row)

    def meter_capacity(self, capacities: dict[str, Amounts]) -> None:
        """Extend the on-prem flavors' capacity spans (what the fleet costs) every `meter_interval_s`."""
        if time.monotonic() - self._capacity_metered_at < self.meter_interval_s:
            return
        self._capacity_metered_at = time.monotonic()
        with self.store.session() as session:
            metering.meter_capacity(session, self.tenancy.current, capacities, utcnow())

    def _hung(self, obs: Observation, attempt: Attempt, stall_timeout_s: float | None) -> str | None:
        """Why a live attempt counts as hung: no heartbeat beyond the timeout (a frozen
        process or an unreachable node), or, when the job asked for it, a training step that
        stopped advancing (a deadlock in a collective, with the heartbeat still going)."""
        if obs.state not in (AttemptState.RUNNING, AttemptState.STARTING):
            return None
        now = utcnow()
        if obs.heartbeat is not None and (silent := (now - obs.heartbeat).total_seconds()) > self.heartbeat_timeout_s:
            return f"no heartbeat for {silent:.0f} s: the attempt hung or a node is unreachable"
        if stall_timeout_s and attempt.last_step_at is not None and obs.step == attempt.last_step:
            stalled = (now - attempt.last_step_at).total_seconds()
            if stalled > stall_timeout_s:
                return f"step {obs.step} did not advance for {stalled:.0f} s (--stall-timeout): the attempt hung"
        return None

    def _observe(self, session, job: Job, attempt: Attempt, obs: Observation) -> None:
        if obs.heartbeat:
            attempt.last_heartbeat = obs.heartbeat
        if obs.step is not None and obs.step != attempt.last_step:
            attempt.last_step, attempt.last_step_at = obs.step, utcnow()
        self._note_resume(session, job, attempt, obs)
        if obs.nodes and list(obs.nodes) != (attempt.nodes or []):
            attempt.nodes = list(obs.nodes)
        if obs.checkpoint:  # victims are chosen by the work they would lose since their last checkpoint
            attempt.last_checkpoint_at = datetime.fromtimestamp(obs.checkpoint.wall_time, UTC)
            attempt.checkpoint_bytes = obs.checkpoint.size_bytes
        if obs.state is AttemptState.UNKNOWN:
            if attempt.state is not AttemptState.UNKNOWN:
                q.add_event(
                    session,
                    job,
                    kind=EventKind.ATTEMPT,
                    attempt=attempt.number,
                    reason=EventReason.BackendUnknown,
                    message=obs.reason or "the backend did not report this attempt; keeping it",
                )
            attempt.state = AttemptState.UNKNOWN
            return
        if obs.state.ended:
            self._end_attempt(session, job, attempt, obs)
            return
        if obs.state is AttemptState.SUBMITTING:
            return
        if obs.state is AttemptState.RUNNING and attempt.started_at is None:
            attempt.started_at = utcnow()
        if attempt.held_from is None and (obs.held or obs.state is AttemptState.RUNNING):
            attempt.held_from = _at(obs.held[0]) if obs.held else attempt.started_at
        attempt.state = obs.state
        outcome = outcome_of(obs.state, obs.reason, job.cancel_requested)
        if outcome is None or job.phase.terminal:
            return
        if job.phase is outcome.phase:
            job.reason = outcome.reason  # e.g. Slurm's own reason for waiting changed
        else:
            self._admission_due = True  # a holder started: estimated starts change
            q.transition(
                session,
                job,
                outcome.phase,
                EventReason.of_phase(outcome.phase),
                attempt=attempt.number,
                message=outcome.reason,
            )

    def _end_attempt(self, session, job: Job, attempt: Attempt, obs: Observation) -> None:
        self._admission_due = True  # its GPUs are free, or it is back in the queue
        attempt.state, attempt.exit_code, attempt.end_reason = obs.state, obs.exit_code, obs.reason
        attempt.ended_at = utcnow()
        if obs.held:  # the ledger's clock: the backend's own start and end of the allocation
            attempt.held_from = attempt.held_from or _at(obs.held[0])
            attempt.held_until = _at(obs.held[1]) if obs.held[1] else attempt.ended_at
        elif attempt.held_from is not None:
            attempt.held_until = attempt.ended_at
        self._metered_at.pop(attempt.backend, None)  # its last row now, not at the next interval
        self._note_service(job, attempt)
        if attempt.started_at:
            held_s = (attempt.ended_at - attempt.started_at).total_seconds()
            totals.note_ended(session, job.cluster_queue, job.gpus * held_s)
        attempt.failed_nodes = list(obs.failed_nodes)
        if obs.io is not None:
            attempt.io = obs.io.model_dump(mode="json")
        if job.spec.sweep:  # points its attempt left unsettled: cancelled, or run by the next attempt
            settle_points(session, job, cancelled=job.cancel_requested)
        preempted = (
            job.preempt_deadline is not None and not job.cancel_requested and obs.state is not AttemptState.SUCCEEDED
        )
        fault = Fault.PREEMPTION if preempted else (None if job.cancel_requested else obs.fault)
        attempt.fault = fault
        if fault is Fault.CAPACITY and not self.sites.unavailable(attempt.backend):
            self.sites.close(attempt.backend, self.cloud_backoff_s, f"it had no capacity ({obs.reason})")
        q.add_event(
            session,
            job,
            kind=EventKind.ATTEMPT,
            attempt=attempt.number,
            reason=EventReason.Preempted if preempted else EventReason.of_attempt_end(obs.state),
            message=obs.reason,
        )
        if preempted:
            self.metrics.evicted.labels(job.tenant, EventReason.Preempted.value).inc()
            attempt.end_reason = f"preempted: {job.preempt_reason}"
            self._requeue(
                session,
                job,
                attempt,
                EventReason.Preempted,
                job.preempt_reason,
                "requeued after preemption; the next attempt resumes from its checkpoint",
            )
            return
        verdict = (
            decide(job.spec.retries, fault, [a.fault for a in job.attempts if a is not attempt]) if fault else None
        )
        if verdict and verdict.retry and not job.phase.terminal:
            self.metrics.evicted.labels(job.tenant, fault.value).inc()
            job.excluded_nodes = sorted(set(job.excluded_nodes or []) | set(obs.failed_nodes))
            avoid = f"; avoiding {', '.join(job.excluded_nodes)}" if obs.failed_nodes else ""
            self._requeue(
                session,
                job,
                attempt,
                EventReason.Retrying,
                f"{obs.reason} ({verdict.words(fault)})",
                f"retry after {fault.words}{avoid}; the next attempt resumes from the newest verified checkpoint",
            )
            return
        outcome = outcome_of(obs.state, obs.reason, job.cancel_requested)
        if outcome is None or job.phase.terminal:
            return
        if outcome.phase is Phase.SUCCEEDED:
            job.result_available = obs.result
        reason = obs.reason if job.spec.sweep and obs.reason else outcome.reason  # "all 250 points done"
        message = f"{reason} ({verdict.words(fault)})" if verdict else reason
        q.transition(
            session, job, outcome.phase, EventReason.of_job_end(obs.state), attempt=attempt.number, message=message
        )

    def _note_service(self, job: Job, attempt: Attempt) -> None:
        """Add the attempt that just ended to the service its job received (`jobs.attained_gpu_s`,
        what least-attained-service ordering reads): its held seconds × the job's GPU-equivalent
        weight under the tenancy's resource weights now (`q.attempt_service_s`); none if it
        never started. Every ending counts, preempted, failed or cancelled alike."""
        weights = self.tenancy.current.resource_weights
        job.attained_gpu_s = (job.attained_gpu_s or 0.0) + q.attempt_service_s(job, attempt, weights)

    @staticmethod
    def _note_resume(session, job: Job, attempt: Attempt, obs: Observation) -> None:
        """Once per attempt: which checkpoint it resumed from, and the newer ones it passed
        over because they failed verification (cellscale.checkpoint reports both)."""
        resume = obs.resume
        if attempt.resumed_step is not None or resume is None:
            return
        attempt.resumed_step = resume.step
        skipped = "; ".join(f"skipped step {s.step}: {s.reason}" for s in resume.skipped)
        q.add_event(
            session,
            job,
            kind=EventKind.CHECKPOINT,
            attempt=attempt.number,
            reason=EventReason.ResumedWithFallback if skipped else EventReason.Resumed,
            message=f"resumed from the checkpoint of step {resume.step}" + (f" ({skipped})" if skipped else ""),
        )

    def _requeue(self, session, job: Job, attempt: Attempt, why: EventReason, detail: str | None, words: str) -> None:
        """Back to the queue (keeping its submit time, so its place): a preempted job, or one
        whose fault has retries left. Its quota is released until it is admitted again."""
        if job.phase is not Phase.ADMITTED:
            q.transition(session, job, Phase.RECOVERING, why, attempt=attempt.number, message=detail)
        job.flavor, job.borrowed, job.preempt_deadline, job.preempt_reason = None, 0, None, None
        q.transition(session, job, Phase.PENDING, EventReason.Requeued, attempt=attempt.number, message=words)

    def send_cancels(self, backend: str, driver: Driver) -> None:
        """Stop attempts whose job was cancelled, or whose preemption grace period is over."""
        with self.store.session() as session:
            targets = [
                self.ref(job, attempt)
                for job in q.cancel_requested_active(session) + q.preemption_due(session, utcnow())
                for attempt in job.attempts
                # one not submitted yet has nothing to stop: its launch sees the cancel instead
                if attempt.backend == backend
                and attempt.state in ACTIVE_ATTEMPT_STATES
                and attempt.submitted_at is not None
            ]
        for ref in targets:
            if ref.key not in self._cancel_sent:
                self._cancel_sent.add(ref.key)
                if ref.spec.sweep is not None:
                    self.sweeps.cancel(driver, ref)
                else:
                    driver.cancel(ref)


METER_LAG_S = 2.0
"""A running attempt is metered up to this long before the last poll that saw it running: Slurm
records whole seconds and its queue may show a job running a moment after it ended, and rows
past the end are trimmed (`metering.trim`) while Prometheus' counters cannot go back."""

BILL_WINDOW_S = 7 * 86400.0
"""Instances stopped longer ago than this are billed already: not attributed again."""

HEARTBEAT_STORE_S = 15.0
"""A live attempt's heartbeat is stored at most this often: hang detection reads the
backend's newest one every cycle, the store needs it only to show."""


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _mark(obs: Observation) -> Observation:
    """The observation as far as the store cares: heartbeats within one HEARTBEAT_STORE_S
    window count as the same."""
    beat = obs.heartbeat
    bucket = datetime.fromtimestamp(beat.timestamp() // HEARTBEAT_STORE_S * HEARTBEAT_STORE_S, UTC) if beat else None
    return dataclasses.replace(obs, heartbeat=bucket)


def _reserved(job: Job, flavor: str) -> str:
    """What admission reserved for it: its GPUs, or a CPU job's cores (not "0 GPU(s)")."""
    if job.gpus:
        return f"{job.gpus} {flavor} GPU(s)"
    return amount_words(Resource.cpu, job.cpus, flavor)
