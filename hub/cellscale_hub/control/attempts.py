"""Attempts, as the controller drives them: it submits admitted ones, polls each backend's
active ones (one batched query per backend per cycle) and stores what changed, ends them
(retry, requeue after preemption, or the job's end), and stops those whose job was cancelled
or whose preemption grace period is over.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cellscale.spec import JobSpec
from cellscale.vocabulary import ACTIVE_ATTEMPT_STATES, AttemptState, EventKind, EventReason, Fault, Phase
from cellscale_hub.bundles import BundleStore
from cellscale_hub.control.admit import Admitter
from cellscale_hub.control.sites import SiteReconciler
from cellscale_hub.control.sweeps import SweepRunner
from cellscale_hub.cost.metering import METER_LAG_S, Metering
from cellscale_hub.drivers import AttemptRef, BackendUnreachable, Driver, Observation
from cellscale_hub.faults import decide
from cellscale_hub.lifecycle import outcome_of
from cellscale_hub.metrics import Metrics
from cellscale_hub.refs import attempt_ref
from cellscale_hub.settings import Settings
from cellscale_hub.store import Store, totals
from cellscale_hub.store import jobs as q
from cellscale_hub.store.models import Attempt, Job, utcnow
from cellscale_hub.store.points import settle_points
from cellscale_hub.store.tenancy_book import TenancyBook

log = logging.getLogger("cellscale.controller")

EVERY_DEADLINE = datetime.max.replace(tzinfo=UTC)
"""`preemption_due(session, EVERY_DEADLINE)`: every job warned of its preemption, due or not."""

HEARTBEAT_STORE_S = 15.0
"""A live attempt's heartbeat is stored at most this often: hang detection reads the
backend's newest one every cycle, the store needs it only to show."""


class AttemptReconciler:
    def __init__(
        self,
        store: Store,
        jobs_root: Path,
        bundles: BundleStore,
        tenancy: TenancyBook,
        admission: Admitter,
        sites: SiteReconciler,
        metering: Metering,
        metrics: Metrics,
        settings: Settings,
    ):
        self.store = store
        self.jobs_root = jobs_root
        self.bundles = bundles
        self.tenancy = tenancy
        self.admission = admission  # an attempt that started, ended or was requeued changes what it decides
        self.sites = sites
        self.metering = metering
        self.metrics = metrics
        self.settings = settings
        self.sweeps = SweepRunner(store)  # runs a sweep's points inside its one admission
        self._cancel_sent: set[tuple[str, int]] = set()
        self._seen: dict[str, dict[int, tuple]] = {}  # backend -> attempt -> what its last stored observation was
        self._active: dict[str, _Kept] = {}  # backend -> its active attempts and their refs, as last read
        self._stops: _Kept | None = None  # the attempts to stop, by backend, as last read

    def ref(self, job: Job, attempt: Attempt) -> AttemptRef:
        return attempt_ref(self.jobs_root, job, attempt)

    # -- submit ----------------------------------------------------------------------------
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

    # -- poll ------------------------------------------------------------------------------
    def _observe_all(self, driver: Driver, refs: dict[int, AttemptRef], attempts: list[Attempt]):
        """`driver.poll` for plain attempts (with what `driver.files.annotate` adds), the sweep runner
        for sweeps' (raises BackendUnreachable when the backend does not answer)."""
        sweeps = [ref for ref in refs.values() if ref.spec.sweep is not None]
        plain = [ref for ref in refs.values() if ref.spec.sweep is None]
        observed = driver.files.annotate(plain, driver.poll(plain)) if plain else {}
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
        attempts, refs = self._active_attempts(backend)
        seen = self._seen.setdefault(backend, {})
        for gone in seen.keys() - refs.keys():
            del seen[gone]
        if not attempts:
            self.sites.probe_if_lost(backend, driver)
            return
        polled_at = utcnow()  # what the poll says running was running at this time (or later)
        try:
            observations = self._observe_all(driver, refs, attempts)
        except BackendUnreachable as exc:
            observations = self.sites.while_lost(backend, attempts, refs, str(exc))
        else:
            self.sites.answers_again(backend, driver)
            self.sites.heed_notices(backend, driver, attempts, refs, observations)
        relaunch, hung, changed = [], [], {}
        alive = self.metering.alive(backend, refs.keys())
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

    def _active_attempts(self, backend: str) -> tuple[list[Attempt], dict[int, AttemptRef]]:
        """The backend's active attempts (with their jobs) and refs, read again only after the
        store changed: an idle cycle polls the backend without a query."""
        changes = self.store.changes  # before the read: a write during it makes the next cycle read again
        kept = self._active.get(backend)
        if kept is not None and kept.changes == changes:
            return kept.value
        with self.store.session() as session:
            attempts = q.active_attempts(session, backend)
            refs = {a.id: self.ref(a.job, a) for a in attempts}
        self._active[backend] = _Kept(changes, (attempts, refs))
        return attempts, refs

    def _hung(self, obs: Observation, attempt: Attempt, stall_timeout_s: float | None) -> str | None:
        """Why a live attempt counts as hung: no heartbeat beyond the timeout (a frozen
        process or an unreachable node), or, when the job asked for it, a training step that
        stopped advancing (a deadlock in a collective, with the heartbeat still going)."""
        if obs.state not in (AttemptState.RUNNING, AttemptState.STARTING):
            return None
        now = utcnow()
        timeout_s = self.settings.heartbeat_timeout_s
        if obs.heartbeat is not None and (silent := (now - obs.heartbeat).total_seconds()) > timeout_s:
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
            self.admission.request()  # a holder started: estimated starts change
            q.transition(
                session,
                job,
                outcome.phase,
                EventReason.of_phase(outcome.phase),
                attempt=attempt.number,
                message=outcome.reason,
            )

    # -- end -------------------------------------------------------------------------------
    def _end_attempt(self, session, job: Job, attempt: Attempt, obs: Observation) -> None:
        self.admission.request()  # its GPUs are free, or it is back in the queue
        attempt.state, attempt.exit_code, attempt.end_reason = obs.state, obs.exit_code, obs.reason
        attempt.ended_at = utcnow()
        if obs.held:  # the ledger's clock: the backend's own start and end of the allocation
            attempt.held_from = attempt.held_from or _at(obs.held[0])
            attempt.held_until = _at(obs.held[1]) if obs.held[1] else attempt.ended_at
        elif attempt.held_from is not None:
            attempt.held_until = attempt.ended_at
        self.metering.due_now(attempt.backend)  # its last row now, not at the next interval
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
        if fault is Fault.CAPACITY:
            self.sites.had_no_capacity(attempt.backend, obs.reason)
        q.add_event(
            session,
            job,
            kind=EventKind.ATTEMPT,
            attempt=attempt.number,
            reason=EventReason.Preempted if preempted else EventReason.of_attempt_end(obs.state),
            message=obs.reason,
        )
        if preempted:
            self._requeue_preempted(session, job, attempt)
            return
        self._settle(session, job, attempt, obs, fault)

    def _requeue_preempted(self, session, job: Job, attempt: Attempt) -> None:
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

    def _settle(self, session, job: Job, attempt: Attempt, obs: Observation, fault: Fault | None) -> None:
        """After an attempt's end (not a preemption): its retry while the fault has retries
        left, else the job's own end."""
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
        job.short_share = False
        q.transition(session, job, Phase.PENDING, EventReason.Requeued, attempt=attempt.number, message=words)

    # -- stop ------------------------------------------------------------------------------
    def send_cancels(self, backend: str, driver: Driver) -> None:
        """Stop attempts whose job was cancelled, or whose preemption grace period is over."""
        for ref in self._to_stop().get(backend, []):
            if ref.key not in self._cancel_sent:
                self._cancel_sent.add(ref.key)
                if ref.spec.sweep is not None:
                    self.sweeps.cancel(driver, ref)
                else:
                    driver.cancel(ref)

    def _to_stop(self) -> dict[str, list[AttemptRef]]:
        """The submitted active attempts to stop, by backend: read again only when the store
        changed or the next grace period ends (so at the same cycle as a read every cycle)."""
        now = utcnow()
        changes = self.store.changes  # before the read: a write during it makes the next cycle read again
        kept = self._stops
        if kept is not None and kept.changes == changes and (kept.until is None or now < kept.until):
            return kept.value
        targets: dict[str, list[AttemptRef]] = {}
        with self.store.session() as session:
            warned = q.preemption_due(session, EVERY_DEADLINE)  # those due now, and when the next one is
            due = [job for job in warned if job.preempt_deadline <= now]
            for job in q.cancel_requested_active(session) + due:
                for attempt in job.attempts:
                    # one not submitted yet has nothing to stop: its launch sees the cancel instead
                    if attempt.state in ACTIVE_ATTEMPT_STATES and attempt.submitted_at is not None:
                        targets.setdefault(attempt.backend, []).append(self.ref(job, attempt))
        later = [job.preempt_deadline for job in warned if job.preempt_deadline > now]
        self._stops = _Kept(changes, targets, min(later, default=None))
        return targets


@dataclass(frozen=True)
class _Kept:
    """What a reconciler read from the store, good while `Store.changes` is still `changes`
    (and, when set, until `until`)."""

    changes: int
    value: Any
    until: datetime | None = None


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _mark(obs: Observation) -> Observation:
    """The observation as far as the store cares: heartbeats within one HEARTBEAT_STORE_S
    window count as the same."""
    beat = obs.heartbeat
    bucket = datetime.fromtimestamp(beat.timestamp() // HEARTBEAT_STORE_S * HEARTBEAT_STORE_S, UTC) if beat else None
    return dataclasses.replace(obs, heartbeat=bucket)
