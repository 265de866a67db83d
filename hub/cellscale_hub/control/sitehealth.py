"""What the controller knows about each site's backends beyond their capacity: whether their
scheduler answers, whether a cloud pool just ran out of capacity (or reclaimed a spot node),
and when their own scheduler would start a whole node. Placement (`scheduling.placement`) reads
it as one `SiteState` per flavor; nothing here is durable (after a restart the next polls
learn it again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from cellscale.spec import JobSpec, Resources
from cellscale_hub.drivers import Driver
from cellscale_hub.drivers.capabilities import EstimatesStart
from cellscale_hub.scheduling.placement import SiteState, duration_words
from cellscale_hub.tenancy import Tenancy

log = logging.getLogger("cellscale.sites")


@dataclass
class _Backend:
    lost_since: float | None = None  # monotonic: its scheduler stopped answering
    lost_why: str = ""
    closed_until: float = 0.0  # monotonic: a cloud pool that had no capacity
    closed_why: str = ""
    estimate: tuple[float, float] | None = None  # (monotonic when asked, seconds to a whole node)


class SiteBoard:
    def __init__(self, estimate_every_s: float = 30.0):
        self.estimate_every_s = estimate_every_s
        self._backends: dict[str, _Backend] = {}
        self._lock = threading.Lock()

    def _of(self, backend: str) -> _Backend:
        return self._backends.setdefault(backend, _Backend())

    # -- what the controller tells it ----------------------------------------------------------
    def lost(self, backend: str, why: str) -> float:
        """Its scheduler did not answer; returns for how many seconds so far."""
        with self._lock:
            state = self._of(backend)
            if state.lost_since is None:
                state.lost_since, state.lost_why = time.monotonic(), why
                log.warning("backend %s does not answer: %s", backend, why)
            return time.monotonic() - state.lost_since

    def reached(self, backend: str) -> bool:
        """Its scheduler answered; True if it had been lost."""
        with self._lock:
            state = self._of(backend)
            was_lost, state.lost_since = state.lost_since is not None, None
        if was_lost:
            log.warning("backend %s answers again", backend)
        return was_lost

    def close(self, backend: str, seconds: float, why: str) -> None:
        """Place nothing there for `seconds` (a stockout, a spot reclaim)."""
        with self._lock:
            state = self._of(backend)
            state.closed_until, state.closed_why = time.monotonic() + seconds, why

    # -- what placement reads --------------------------------------------------------------------
    def unavailable(self, backend: str) -> str | None:
        with self._lock:
            state = self._backends.get(backend)
            if state is None:
                return None
            now = time.monotonic()
            if state.lost_since is not None:
                return f"its scheduler has not answered for {duration_words(now - state.lost_since)} ({state.lost_why})"
            if now < state.closed_until:
                return f"{state.closed_why}; closed for {duration_words(state.closed_until - now)} more"
            return None

    def states(self, tenancy: Tenancy, drivers: Mapping[str, Driver]) -> dict[str, SiteState]:
        """A SiteState per flavor that has a site (and a configured backend)."""
        out = {}
        for name, flavor in tenancy.flavors.items():
            if flavor.site is None or flavor.backend not in drivers:
                continue
            out[name] = SiteState(
                flavor.site,
                tenancy.sites[flavor.site],
                self._start_in(flavor.backend, drivers[flavor.backend], _an_account(tenancy, name)),
                self.unavailable(flavor.backend),
            )
        return out

    def _start_in(self, backend: str, driver: Driver, account: str | None) -> float:
        """Seconds until the backend's own scheduler would start a one-node job (work it runs
        that cellscale did not admit: other users of a shared cluster), asked at most every
        `estimate_every_s`; 0 when it cannot say."""
        now = time.monotonic()
        with self._lock:
            cached = self._of(backend).estimate
        if cached and now - cached[0] < self.estimate_every_s:
            return cached[1]
        seconds = 0.0
        try:
            if account is None:
                raise LookupError("no desk has quota there")
            view = driver.capacity()
            probe = JobSpec(source="pass", resources=Resources(gpus_per_node=view.gpus_per_node, timeout_min=60))
            at = driver.start_estimate(probe, account) if isinstance(driver, EstimatesStart) else None
            seconds = max(0.0, at - time.time()) if at is not None else 0.0
        except Exception:  # an estimate is a hint: placement goes on without it
            log.debug("no start estimate from %s", backend, exc_info=True)
        with self._lock:
            self._of(backend).estimate = (now, seconds)
        return seconds


def _an_account(tenancy: Tenancy, flavor: str) -> str | None:
    """A desk with quota on the flavor: the backend's own scheduler is asked as one of its
    members (a desk is a Slurm account)."""
    for tenant, config in tenancy.tenants.items():
        if any(flavor in tenancy.cluster_queues[q.cluster_queue].quotas for q in config.queues.values()):
            return tenant
    return None
