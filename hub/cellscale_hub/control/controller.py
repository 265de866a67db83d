"""The reconcile loop: admits pending jobs, starts attempts, and drives every job's phase
from what its backend reports, with one batched poll per backend per cycle.

It keeps no state of its own that matters: after a restart (kill -9 included) the next
cycle finds the active attempts in the store and asks their backends about them, so no
job is lost, and drivers' idempotent submit means none is run twice.

The controller keeps the cycle, its thread and the wiring; the work is done by reconcilers,
each in its own module: admission (`admit.Admitter`), attempts (`attempts.AttemptReconciler`:
launch, poll, end, cancel), sites that go away (`sites.SiteReconciler`), the cost ledger
(`cost.metering.Metering`), bundle clean-up (`bundles.sweep_bundles`) and staging ahead.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from pathlib import Path

from cellscale_hub.bundles import BundleStore, sweep_bundles
from cellscale_hub.control.admit import Admitter
from cellscale_hub.control.attempts import AttemptReconciler
from cellscale_hub.control.sitehealth import SiteBoard
from cellscale_hub.control.sites import SiteReconciler
from cellscale_hub.control.staging import StageAhead
from cellscale_hub.control.steps import isolated
from cellscale_hub.cost.metering import Metering
from cellscale_hub.drivers import Driver, flavor_capacities
from cellscale_hub.drivers.capabilities import MirrorsTenancy
from cellscale_hub.metrics import Metrics
from cellscale_hub.settings import Settings
from cellscale_hub.store import Store
from cellscale_hub.store.tenancy_book import TenancyBook
from cellscale_hub.waiting import WaitingBoard

log = logging.getLogger("cellscale.controller")


class Controller:
    """Runs the reconcilers, each step isolated, once a cycle: every `settings.interval` and at
    once after wake(). Its constructor takes its collaborators and the one frozen Settings."""

    def __init__(
        self,
        store: Store,
        drivers: dict[str, Driver],
        jobs_root: Path,
        bundles: BundleStore,
        tenancy: TenancyBook,
        settings: Settings | None = None,
        waiting: WaitingBoard | None = None,
        metrics: Metrics | None = None,
    ):
        self.store = store
        self.drivers = drivers
        self.bundles = bundles
        self.tenancy = tenancy
        self.waiting = waiting or WaitingBoard()  # why each pending job waits, for the API
        self.metrics = metrics or Metrics()
        self.sites = SiteBoard()  # what the reconcilers learn of each site, read by placement
        settings = settings or Settings()
        self._settings = settings
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._swept_at = 0.0
        self._mirrored: dict[str, int] = {}  # backend -> tenancy revision it last accepted
        self.admission = Admitter(
            store, drivers, jobs_root, tenancy, self.sites, self.waiting, self.metrics, settings, self.wake
        )
        self.site_watch = SiteReconciler(store, drivers, self.sites, self.admission, settings)
        self.metering = Metering(store, jobs_root, tenancy, self.metrics, settings)
        self.attempts = AttemptReconciler(
            store, jobs_root, bundles, tenancy, self.admission, self.site_watch, self.metering, self.metrics, settings
        )
        self.stage_ahead = StageAhead(store, drivers, jobs_root, self.waiting)  # datasets onto the next jobs' nodes
        for driver in drivers.values():
            driver.notify = self.wake  # e.g. a local supervisor exited: reconcile its end now

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """New settings for every reconciler, from its next step (tests and benchmarks retune a
        running controller)."""
        self._settings = settings
        for reconciler in (self.admission, self.site_watch, self.metering, self.attempts):
            reconciler.settings = settings

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
        self.admission.request()
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
            self._wake.wait(self.settings.interval)
            rest = self.settings.wake_gap_s - (time.perf_counter() - began)
            if rest > 0:
                self._stop.wait(rest)  # the wakes of a flood of submits share one cycle

    # -- one cycle -------------------------------------------------------------------------
    def cycle(self) -> None:
        if time.monotonic() - self._swept_at > self.settings.bundle_sweep_s:
            self._swept_at = time.monotonic()
            keep_s = self.settings.bundle_keep_succeeded_s
            isolated("bundle clean-up", "-", partial(sweep_bundles, self.store, self.bundles, keep_s))
        steps = (
            self.mirror_tenancy,
            self.attempts.send_cancels,
            self.attempts.reconcile,
            self.metering.bill_cloud,
            self.metering.meter,
        )
        for name, driver in self.drivers.items():
            for step in steps:
                isolated(step.__name__, name, partial(step, name, driver))
        try:
            capacities = flavor_capacities(self.tenancy.current, self.drivers)
            isolated("capacity metering", "-", partial(self.metering.meter_capacity, capacities))
            launches = self.admission.admit(capacities) if self.admission.needed(capacities) else []
        except Exception:
            log.exception("admission failed; nothing was admitted this cycle")
            self.admission.request()
            launches = []
        for job, attempt in launches:
            launch = partial(self.attempts.launch, self.drivers[job.backend], job, attempt)
            isolated("launch", job.backend, launch)
        isolated("staging ahead", "-", self.stage_ahead.cycle)

    def mirror_tenancy(self, backend: str, driver: Driver) -> None:
        """Tell the backend's own scheduler about quotas and shares, once per tenancy change
        (retried each cycle until the backend accepts it)."""
        revision = self.tenancy.revision
        if isinstance(driver, MirrorsTenancy) and self._mirrored.get(backend) != revision:
            driver.apply_tenancy(self.tenancy.current)
            self._mirrored[backend] = revision
