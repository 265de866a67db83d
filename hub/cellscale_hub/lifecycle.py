"""The job state machine: which phase changes are legal, and what an attempt's state means
for its job. Pure functions; the controller applies them and the store records each change
as an event."""

from __future__ import annotations

from dataclasses import dataclass

from cellscale.spec import AttemptState, Phase

P = Phase
ALLOWED: dict[Phase, frozenset[Phase]] = {
    P.PENDING: frozenset({P.ADMITTED, P.CANCELLED, P.FAILED, P.SUCCEEDED}),  # SUCCEEDED: a sweep all cached
    P.ADMITTED: frozenset({P.STARTING, P.RUNNING, P.SUCCEEDED, P.FAILED, P.CANCELLED, P.PENDING}),
    P.STARTING: frozenset({P.RUNNING, P.SUCCEEDED, P.FAILED, P.CANCELLED, P.RECOVERING}),
    P.RUNNING: frozenset({P.SUCCEEDED, P.FAILED, P.CANCELLED, P.RECOVERING}),
    P.RECOVERING: frozenset({P.PENDING, P.ADMITTED, P.FAILED, P.CANCELLED}),
    P.SUCCEEDED: frozenset(),
    P.FAILED: frozenset(),
    P.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    pass


def check_transition(current: Phase, target: Phase) -> None:
    if target not in ALLOWED[current]:
        raise IllegalTransition(f"a job cannot go from {current.value} to {target.value}")


@dataclass(frozen=True)
class Outcome:
    """The job phase an attempt's observed state leads to, and why."""

    phase: Phase
    reason: str


def outcome_of(state: AttemptState, reason: str | None, cancel_requested: bool) -> Outcome | None:
    """Map an attempt's state (and the backend's reason) to the job's next phase and its
    reason; None when the job should stay put."""
    if state is AttemptState.STARTING:
        return Outcome(P.STARTING, reason or "the backend is starting the ranks")
    if state is AttemptState.RUNNING:
        return Outcome(P.RUNNING, "all ranks are running")
    if state is AttemptState.SUCCEEDED:
        return Outcome(P.SUCCEEDED, "every rank exited 0")
    if state is AttemptState.CANCELLED or (cancel_requested and state.ended):
        return Outcome(P.CANCELLED, "cancelled by request")
    if state is AttemptState.FAILED:
        return Outcome(P.FAILED, reason or "a rank failed")
    if state is AttemptState.LOST:
        return Outcome(P.FAILED, reason or "the attempt's processes vanished without an exit record")
    return None  # SUBMITTING, UNKNOWN: keep what we know
