"""Why an attempt ended, as a class with its own retry budget, and what to do next.

| class            | examples                                                      | default budget |
| ---------------- | ------------------------------------------------------------- | -------------- |
| `user_error`     | an exception in the cell (the traceback is shown)             | 0: not retried |
|                  | an --env too large for the OS to start the job with (E2BIG)   |                |
| `infrastructure` | node failure, a rank killed, a lost or hung supervisor        | 3              |
| `timeout`        | ran past `--time`                                             | 0              |
| `preemption`     | stopped to make room for another job                          | unlimited      |

A job's budgets come from its spec (`--retries`, `--retries-timeout`, `--retries-user`).
Pure functions: the controller applies them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cellscale.spec import Retries
from cellscale.vocabulary import ExitReason, Fault


def from_exit_records(reasons: Iterable[ExitReason]) -> Fault | None:
    """One class for a gang from its nodes' exit records: a user error anywhere explains the
    rest (the launcher stops the other ranks), then a timeout, then a preemption."""
    found = {ExitReason(reason).fault for reason in reasons} - {None}
    for fault in (Fault.USER_ERROR, Fault.TIMEOUT, Fault.PREEMPTION, Fault.INFRASTRUCTURE):
        if fault in found:
            return fault
    return None


def budget(retries: Retries, fault: Fault) -> int | None:
    """Retries allowed for this class; None: unlimited."""
    return {
        Fault.USER_ERROR: retries.user_error,
        Fault.INFRASTRUCTURE: retries.infrastructure,
        Fault.TIMEOUT: retries.timeout,
        Fault.PREEMPTION: None,
        Fault.CAPACITY: None,
    }[fault]


@dataclass(frozen=True)
class Verdict:
    retry: bool
    used: int  # attempts of this class so far, this one included
    allowed: int | None

    def words(self, fault: Fault) -> str:
        name = fault.words
        if self.allowed is None:
            return f"{name}: requeued (never counted against a budget)"
        if self.retry:
            return f"{name} {self.used} of {self.allowed} allowed: retrying"
        if self.allowed == 0:
            return f"{name}: not retried (its budget is 0)"
        return f"{name}: retry budget spent ({self.allowed})"


def decide(retries: Retries, fault: Fault, earlier: Iterable[Fault | None]) -> Verdict:
    """Retry or give up, given the classes of the job's earlier attempts."""
    used = sum(1 for f in earlier if f == fault) + 1
    allowed = budget(retries, fault)
    return Verdict(retry=allowed is None or used <= allowed, used=used, allowed=allowed)
