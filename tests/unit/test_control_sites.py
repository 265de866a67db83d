"""The sites reconciler (control/sites.py) on its own: a backend that stops answering keeps its
attempts UNKNOWN; one that never started moves (fenced, LOST with a capacity fault) once the
site has been lost for site_lost_timeout_s, and is cancelled there when the site answers
again; a capacity fault closes a pool for cloud_backoff_s, once."""

from __future__ import annotations

from types import SimpleNamespace

from cellscale.vocabulary import AttemptState, Fault
from cellscale_hub.control.sitehealth import SiteBoard
from cellscale_hub.control.sites import SiteReconciler
from cellscale_hub.settings import Settings


class Admission:
    def __init__(self):
        self.requests = 0

    def request(self):
        self.requests += 1


class Backend:
    def __init__(self, fences: bool = True):
        self.fences, self.fenced, self.cancelled = fences, [], []
        self.files = self  # a driver fences through its job files (driver.files.fence)

    def fence(self, ref):
        self.fenced.append(ref.key)
        return self.fences

    def cancel(self, ref):
        self.cancelled.append(ref.key)


def attempt(attempt_id: int, started: bool = False):
    return SimpleNamespace(id=attempt_id, started_at="then" if started else None)


def ref(attempt_id: int):
    return SimpleNamespace(key=(f"cs-{attempt_id}", 1))


def reconciler(backend: Backend, **settings) -> tuple[SiteReconciler, Admission]:
    admission = Admission()
    sites = SiteReconciler(None, {"dca": backend}, SiteBoard(), admission, Settings(**settings))
    return sites, admission


def test_a_lost_site_keeps_its_attempts_unknown_before_the_timeout():
    backend = Backend()
    sites, admission = reconciler(backend, site_lost_timeout_s=3600)
    out = sites.while_lost("dca", [attempt(1)], {1: ref(1)}, "connection refused")
    assert out[("cs-1", 1)].state is AttemptState.UNKNOWN and "connection refused" in out[("cs-1", 1)].reason
    assert backend.fenced == [] and admission.requests == 1  # placement now avoids it
    assert sites.board.unavailable("dca").startswith("its scheduler has not answered")


def test_past_the_timeout_what_never_started_moves_once_fenced_and_is_cancelled_on_return():
    backend = Backend()
    sites, admission = reconciler(backend, site_lost_timeout_s=0.0)
    out = sites.while_lost("dca", [attempt(1), attempt(2, started=True)], {1: ref(1), 2: ref(2)}, "down")
    moved, running = out[("cs-1", 1)], out[("cs-2", 1)]
    assert moved.state is AttemptState.LOST and moved.fault is Fault.CAPACITY and moved.reason.startswith("moved:")
    assert running.state is AttemptState.UNKNOWN  # it may still run there: never moved
    assert backend.fenced == [("cs-1", 1)]
    sites.answers_again("dca", backend)
    assert backend.cancelled == [("cs-1", 1)] and admission.requests == 2
    assert sites.board.unavailable("dca") is None
    sites.answers_again("dca", backend)
    assert backend.cancelled == [("cs-1", 1)]  # cancelled once


def test_an_attempt_the_site_refuses_to_fence_stays_unknown():
    backend = Backend(fences=False)
    sites, _ = reconciler(backend, site_lost_timeout_s=0.0)
    out = sites.while_lost("dca", [attempt(1)], {1: ref(1)}, "down")
    assert out[("cs-1", 1)].state is AttemptState.UNKNOWN
    sites.answers_again("dca", backend)
    assert backend.cancelled == []


def test_no_capacity_closes_the_pool_for_the_backoff_and_keeps_the_first_reason():
    sites, _ = reconciler(Backend(), cloud_backoff_s=600)
    sites.had_no_capacity("dca", "InsufficientInstanceCapacity")
    sites.had_no_capacity("dca", "a later stockout")
    why = sites.board.unavailable("dca")
    assert why.startswith("it had no capacity (InsufficientInstanceCapacity); closed for")
