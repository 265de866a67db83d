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
from pathlib import Path

from cellscale.spec import AttemptState, JobSpec, Phase
from cellscale_hub.drivers import AttemptRef, Driver, Observation
from cellscale_hub.lifecycle import outcome_of
from cellscale_hub.plans import prepare_job_dir
from cellscale_hub.scheduling.capacity import Pending, admit_in_order, free_gpu_ids
from cellscale_hub.store import Store
from cellscale_hub.store import jobs as q
from cellscale_hub.store.models import Attempt, Job, utcnow

log = logging.getLogger("cellscale.controller")


class Controller:
    def __init__(self, store: Store, drivers: dict[str, Driver], jobs_root: Path, bundles_root: Path,
                 interval: float = 0.5, launches_per_cycle: int = 16):
        self.store = store
        self.drivers = drivers
        self.jobs_root = jobs_root
        self.bundles_root = bundles_root
        self.interval = interval
        self.launches_per_cycle = launches_per_cycle  # a burst of submits must not starve polls and cancels
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cancel_sent: set[tuple[str, int]] = set()
        self._thread: threading.Thread | None = None

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
        """Run a cycle now (after a submit or cancel) instead of at the next tick."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.cycle()
            except Exception:  # one bad cycle must not stop the control plane
                log.exception("reconcile cycle failed")
            self._wake.wait(self.interval)
            self._wake.clear()

    # -- one cycle -------------------------------------------------------------------------
    def cycle(self) -> None:
        for name, driver in self.drivers.items():
            for step in (self.send_cancels, self.reconcile, self.admit):
                try:
                    step(name, driver)
                except Exception:  # a backend that does not answer must not stall the others
                    log.exception("%s on backend %s failed; its attempts keep their last known state", step.__name__, name)

    def ref(self, job: Job, attempt: Attempt) -> AttemptRef:
        return AttemptRef(
            job_id=job.id, number=attempt.number, job_dir=self.jobs_root / job.id, spec=JobSpec.model_validate(job.spec),
            gpu_ids=tuple(attempt.gpu_ids or ()), backend_ref=attempt.backend_ref, submitted_at=attempt.submitted_at,
            owner=job.owner, tenant=job.tenant,
        )

    def admit(self, backend: str, driver: Driver) -> None:
        capacity = driver.capacity().capacity_gpus
        with self.store.session() as session:
            pending = q.pending_queue(session, backend)
            if not pending:
                return
            in_use = [gpu for a in q.active_attempts(session, backend) for gpu in (a.gpu_ids or [])]
            fits = admit_in_order(capacity, in_use, [Pending(row.id, row.gpus) for row in pending])
            grants = dict(list(fits.items())[: self.launches_per_cycle])
            if len(fits) > len(grants):
                self._wake.set()  # the rest in the next cycle, right after a poll
            new_attempts = []
            for position, row in enumerate(pending):
                if row.id in grants:
                    job = session.get(Job, row.id)
                    attempt = Attempt(job_id=job.id, number=len(job.attempts) + 1, backend=backend,
                                      state=AttemptState.SUBMITTING.value, gpu_ids=grants[row.id])
                    job.attempts.append(attempt)
                    q.transition(session, job, Phase.ADMITTED, "QuotaReserved", attempt=attempt.number,
                                 message=f"GPUs {grants[row.id]} reserved on {backend}")
                    new_attempts.append((job, attempt))
                    continue
                if row.id in fits:
                    continue  # fits now; launched next cycle
                reason = _why_pending(row.gpus, capacity, in_use, position - len(fits))
                if reason != row.reason:
                    q.set_reason(session, row.id, reason)
        for job, attempt in new_attempts:
            self.launch(driver, job, attempt)

    def launch(self, driver: Driver, job: Job, attempt: Attempt, resubmit: bool = False) -> None:
        ref = dataclasses.replace(self.ref(job, attempt), resubmit=resubmit)
        spec = ref.spec
        bundle = self.bundles_root / spec.inputs_sha256 if spec.inputs_sha256 else None
        try:
            prepare_job_dir(ref, bundle, driver.launch_plan(ref))
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
                self._end_attempt(session, job, attempt, Observation(AttemptState.FAILED, reason=f"submit failed: {error}"))
                return
            attempt.state = AttemptState.STARTING.value
            q.transition(session, job, Phase.STARTING, "Submitted", attempt=attempt.number,
                         message=f"submitted to {driver.name} as {backend_ref}")

    def reconcile(self, backend: str, driver: Driver) -> None:
        with self.store.session() as session:
            attempts = q.active_attempts(session, backend)
            if not attempts:
                return
            refs = {a.id: self.ref(a.job, a) for a in attempts}
        observations = driver.poll(list(refs.values()))  # one batched query per backend
        relaunch = []
        with self.store.session() as session:
            for attempt_id, ref in refs.items():
                obs = observations.get(ref.key, Observation(AttemptState.UNKNOWN))
                attempt = session.get(Attempt, attempt_id)
                job = attempt.job
                if obs.state is AttemptState.SUBMITTING and attempt.submitted_at is None:
                    relaunch.append((job, attempt))  # the control plane died between admit and submit
                    continue
                self._observe(session, job, attempt, obs)
        for job, attempt in relaunch:
            self.launch(driver, job, attempt, resubmit=True)

    def _observe(self, session, job: Job, attempt: Attempt, obs: Observation) -> None:
        if obs.heartbeat:
            attempt.last_heartbeat = obs.heartbeat
        if obs.state is AttemptState.UNKNOWN:
            if attempt.state != AttemptState.UNKNOWN.value:
                q.add_event(session, job, kind="attempt", attempt=attempt.number, reason="BackendUnknown",
                            message=obs.reason or "the backend did not report this attempt; keeping it")
            attempt.state = AttemptState.UNKNOWN.value
            return
        if obs.state.ended:
            self._end_attempt(session, job, attempt, obs)
            return
        if obs.state is AttemptState.SUBMITTING:
            return
        if obs.state is AttemptState.RUNNING and attempt.started_at is None:
            attempt.started_at = utcnow()
        attempt.state = obs.state.value
        outcome = outcome_of(obs.state, obs.reason, job.cancel_requested)
        if outcome is None or Phase(job.phase).terminal:
            return
        if Phase(job.phase) is outcome.phase:
            job.reason = outcome.reason  # e.g. Slurm's own reason for waiting changed
        else:
            q.transition(session, job, outcome.phase, outcome.phase.value.title(), attempt=attempt.number,
                         message=outcome.reason)

    def _end_attempt(self, session, job: Job, attempt: Attempt, obs: Observation) -> None:
        attempt.state, attempt.exit_code, attempt.end_reason = obs.state.value, obs.exit_code, obs.reason
        attempt.ended_at = utcnow()
        q.add_event(session, job, kind="attempt", attempt=attempt.number, reason=obs.state.value.title(),
                    message=obs.reason)
        outcome = outcome_of(obs.state, obs.reason, job.cancel_requested)
        if outcome is None or Phase(job.phase).terminal:
            return
        if outcome.phase is Phase.SUCCEEDED:
            job.result_available = (self.jobs_root / job.id / "result.pkl").exists()
        q.transition(session, job, outcome.phase, _reason_word(obs), attempt=attempt.number, message=outcome.reason)

    def send_cancels(self, backend: str, driver: Driver) -> None:
        with self.store.session() as session:
            targets = [
                self.ref(job, attempt)
                for job in q.cancel_requested_active(session)
                for attempt in job.attempts
                if attempt.backend == backend and attempt.state in q.ACTIVE_ATTEMPT_STATES
            ]
        for ref in targets:
            if ref.key not in self._cancel_sent:
                self._cancel_sent.add(ref.key)
                driver.cancel(ref)


def _reason_word(obs: Observation) -> str:
    return {
        AttemptState.SUCCEEDED: "Finished",
        AttemptState.CANCELLED: "Cancelled",
        AttemptState.LOST: "AttemptLost",
    }.get(obs.state, "Failed")


def _why_pending(gpus: int, capacity: int, in_use: list[int], ahead: int) -> str:
    """Plain words for a waiting job. The words change only when capacity changes (not on
    every submit or cancel), so keeping them current costs few writes."""
    if ahead > 0:
        return f"queued in submit order behind a job that waits for GPUs; it needs {gpus} GPU(s)"
    free = len(free_gpu_ids(capacity, in_use))
    return f"waiting for {gpus} GPU(s) to be free at once; {free} of {capacity} free now"
