"""Sites that go away, as the controller handles them (what it knows of each site lives in
`sitehealth.SiteBoard`): a backend whose scheduler stops answering keeps its attempts
UNKNOWN; those that never started move elsewhere after site_lost_timeout_s (fenced first,
so they can never start there), and are cancelled there once it answers again; a cloud pool
that had no capacity or reclaimed a node gets no new work for cloud_backoff_s.
"""

from __future__ import annotations

from functools import partial

from cellscale.vocabulary import AttemptState, Fault
from cellscale_hub.control.admit import Admitter
from cellscale_hub.control.sitehealth import SiteBoard
from cellscale_hub.control.steps import isolated
from cellscale_hub.drivers import AttemptRef, Driver, Observation
from cellscale_hub.drivers.capabilities import WatchesNodes
from cellscale_hub.scheduling.types import Preemption
from cellscale_hub.settings import Settings
from cellscale_hub.store import Store
from cellscale_hub.store.models import Attempt, utcnow


class SiteReconciler:
    def __init__(
        self, store: Store, drivers: dict[str, Driver], board: SiteBoard, admission: Admitter, settings: Settings
    ):
        self.store = store
        self.drivers = drivers
        self.board = board
        self.admission = admission  # placement changes when a site goes or comes back
        self.settings = settings
        self._abandoned: dict[str, list[AttemptRef]] = {}  # backend -> moved attempts to cancel there

    def while_lost(
        self, backend: str, attempts: list[Attempt], refs: dict[int, AttemptRef], why: str
    ) -> dict[tuple[str, int], Observation]:
        """Observations while a backend does not answer: UNKNOWN (never gone); an attempt that
        never started moves after `site_lost_timeout_s`, once fenced (it can never start there)."""
        lost_for = self.board.lost(backend, why)
        self.admission.request()  # placement now avoids it
        out = {}
        for attempt in attempts:
            ref = refs[attempt.id]
            unknown = f"{backend} does not answer ({why}): the attempt's state is unknown, not lost"
            obs = Observation(AttemptState.UNKNOWN, reason=unknown)
            moves = lost_for >= self.settings.site_lost_timeout_s and attempt.started_at is None
            if moves and self.drivers[backend].files.fence(ref):
                obs = Observation(
                    AttemptState.LOST,
                    fault=Fault.CAPACITY,
                    reason=f"moved: {backend} has not answered for {lost_for:.0f} s and the attempt had not started; "
                    f"it is fenced (it can never start there) and cancelled there when {backend} answers again",
                )
                self._abandoned.setdefault(backend, []).append(ref)
            out[ref.key] = obs
        return out

    def answers_again(self, backend: str, driver: Driver) -> None:
        if self.board.reached(backend):
            self.admission.request()
        for ref in self._abandoned.pop(backend, []):
            isolated("cancel of a moved attempt", backend, partial(driver.cancel, ref))

    def probe_if_lost(self, backend: str, driver: Driver) -> None:
        """A lost backend with no attempts to poll is asked its capacity instead (which raises
        while it still does not answer)."""
        if self.board.unavailable(backend):
            driver.capacity()  # raises while it still does not answer
            self.answers_again(backend, driver)

    def had_no_capacity(self, backend: str, reason: str | None) -> None:
        """An attempt ended for want of capacity there: close the backend for cloud_backoff_s."""
        if not self.board.unavailable(backend):
            self.board.close(backend, self.settings.cloud_backoff_s, f"it had no capacity ({reason})")

    def heed_notices(
        self,
        backend: str,
        driver: Driver,
        attempts: list[Attempt],
        refs: dict[int, AttemptRef],
        observations: dict[tuple[str, int], Observation],
    ) -> None:
        """A node announced to go away (a spot reclaim): preempt what runs there, with the
        checkpoint warning, and place nothing new on that backend for a while."""
        notices = driver.node_notices() if isinstance(driver, WatchesNodes) else {}
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
                warning = self.admission.start_preemption(session, Preemption(attempt.job_id, "", why), now)
                if warning:
                    warnings.append(warning[1])
        if warnings:
            self.board.close(backend, self.settings.cloud_backoff_s, f"it reclaimed {', '.join(sorted(notices))}")
        for ref in warnings:
            isolated("warn", backend, partial(driver.warn, ref))
