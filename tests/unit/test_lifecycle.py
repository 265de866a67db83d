import pytest

from cellscale.spec import AttemptState, Phase
from cellscale_hub.lifecycle import ALLOWED, IllegalTransition, check_transition, outcome_of

P = Phase


@pytest.mark.parametrize(
    ("current", "target", "legal"),
    [
        (P.PENDING, P.ADMITTED, True),
        (P.PENDING, P.CANCELLED, True),
        (P.PENDING, P.RUNNING, False),
        (P.ADMITTED, P.STARTING, True),
        (P.STARTING, P.RUNNING, True),
        (P.RUNNING, P.SUCCEEDED, True),
        (P.RUNNING, P.PENDING, False),
        (P.RUNNING, P.RECOVERING, True),
        (P.RECOVERING, P.PENDING, True),
        (P.SUCCEEDED, P.RUNNING, False),
        (P.FAILED, P.PENDING, False),
        (P.CANCELLED, P.SUCCEEDED, False),
    ],
)
def test_transitions(current, target, legal):
    if legal:
        check_transition(current, target)
    else:
        with pytest.raises(IllegalTransition, match=f"from {current.value} to {target.value}"):
            check_transition(current, target)


def test_terminal_phases_never_change():
    assert all(not ALLOWED[p] for p in P if p.terminal)


@pytest.mark.parametrize(
    ("state", "reason", "cancel", "phase"),
    [
        (AttemptState.STARTING, None, False, P.STARTING),
        (AttemptState.RUNNING, None, False, P.RUNNING),
        (AttemptState.SUCCEEDED, None, False, P.SUCCEEDED),
        (AttemptState.FAILED, "rank 0: ValueError: x", False, P.FAILED),
        (AttemptState.FAILED, "killed", True, P.CANCELLED),
        (AttemptState.LOST, None, False, P.FAILED),
        (AttemptState.CANCELLED, None, False, P.CANCELLED),
        (AttemptState.UNKNOWN, None, False, None),
        (AttemptState.SUBMITTING, None, False, None),
    ],
)
def test_outcome_of_attempt_state(state, reason, cancel, phase):
    outcome = outcome_of(state, reason, cancel)
    assert (outcome.phase if outcome else None) is phase
    if phase is P.FAILED and reason:
        assert outcome.reason == reason
