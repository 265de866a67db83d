"""The attempts reconciler's hang check (control/attempts.py): a live attempt is hung after
heartbeat_timeout_s without a heartbeat, or, when the job asked for it, when its step stopped
advancing for its stall timeout; a pending or ended one never is."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

from cellscale.vocabulary import AttemptState
from cellscale_hub.control.attempts import AttemptReconciler
from cellscale_hub.drivers import Observation
from cellscale_hub.settings import Settings
from cellscale_hub.store.models import utcnow


def attempts(**settings) -> AttemptReconciler:
    return AttemptReconciler(None, None, None, None, None, None, None, None, Settings(**settings))


def attempt(step: int | None = None, step_age_s: float = 0.0):
    return SimpleNamespace(last_step=step, last_step_at=utcnow() - timedelta(seconds=step_age_s) if step else None)


def test_silence_past_the_heartbeat_timeout_is_a_hang():
    quiet = Observation(AttemptState.RUNNING, heartbeat=utcnow() - timedelta(seconds=90))
    assert attempts(heartbeat_timeout_s=60)._hung(quiet, attempt(), None).startswith("no heartbeat for 90 s")
    assert attempts(heartbeat_timeout_s=120)._hung(quiet, attempt(), None) is None


def test_a_step_that_stopped_advancing_is_a_hang_only_with_a_stall_timeout():
    beating = Observation(AttemptState.RUNNING, heartbeat=utcnow(), step=7)
    stuck = attempt(step=7, step_age_s=300)
    assert "step 7 did not advance for 300 s" in attempts()._hung(beating, stuck, 120)
    assert attempts()._hung(beating, stuck, None) is None
    assert attempts()._hung(beating, attempt(step=6, step_age_s=300), 120) is None  # it advanced


def test_only_a_live_attempt_can_hang():
    old = utcnow() - timedelta(hours=1)
    for state in (AttemptState.SUBMITTING, AttemptState.SUCCEEDED, AttemptState.UNKNOWN):
        assert attempts()._hung(Observation(state, heartbeat=old), attempt(), None) is None
