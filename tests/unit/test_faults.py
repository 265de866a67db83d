"""Fault classes and their retry budgets, table by table."""

import pytest

from cellscale.magicargs import MagicUsageError, parse_line
from cellscale.spec import Retries
from cellscale_hub.faults import Fault, decide, from_exit_records

F = Fault


@pytest.mark.parametrize(
    "reasons, fault",
    [
        (["succeeded"], None),
        (["cancelled"], None),
        (["user_error", "failed"], F.USER_ERROR),  # one rank raised; the launcher stopped the rest
        (["failed", "failed"], F.INFRASTRUCTURE),  # killed, OOM, segfault: no Python exception
        (["launch_failed"], F.INFRASTRUCTURE),
        (["timeout", "failed"], F.TIMEOUT),
        (["preempted", "preempted"], F.PREEMPTION),
        (["user_error", "preempted"], F.USER_ERROR),
    ],
)
def test_a_gang_is_classified_from_its_exit_records(reasons, fault):
    assert from_exit_records(reasons) is fault


@pytest.mark.parametrize(
    "retries, fault, earlier, retry, words",
    [
        (Retries(), F.INFRASTRUCTURE, [], True, "infrastructure 1 of 3 allowed: retrying"),
        (
            Retries(),
            F.INFRASTRUCTURE,
            ["infrastructure", "infrastructure"],
            True,
            "infrastructure 3 of 3 allowed: retrying",
        ),
        (Retries(), F.INFRASTRUCTURE, ["infrastructure"] * 3, False, "infrastructure: retry budget spent (3)"),
        (Retries(), F.USER_ERROR, [], False, "user error: not retried (its budget is 0)"),
        (Retries(user_error=1), F.USER_ERROR, [], True, "user error 1 of 1 allowed: retrying"),
        (Retries(), F.TIMEOUT, [], False, "timeout: not retried (its budget is 0)"),
        (Retries(timeout=2), F.TIMEOUT, ["timeout", "infrastructure"], True, "timeout 2 of 2 allowed: retrying"),
        (
            Retries(infrastructure=0),
            F.PREEMPTION,
            ["preemption"] * 50,
            True,
            "preemption: requeued (never counted against a budget)",
        ),
        (
            Retries(infrastructure=1),
            F.INFRASTRUCTURE,
            ["preemption"] * 5,
            True,
            "infrastructure 1 of 1 allowed: retrying",
        ),
    ],
)
def test_each_class_has_its_own_budget(retries, fault, earlier, retry, words):
    verdict = decide(retries, fault, earlier)
    assert verdict.retry is retry and verdict.words(fault) == words


def test_retry_flags_reach_the_spec_and_are_checked():
    spec = parse_line("--gpus 2 --retries 5 --retries-timeout 1 --retries-user 2").to_spec("x = 1")
    assert spec.retries == Retries(infrastructure=5, timeout=1, user_error=2)
    with pytest.raises(MagicUsageError, match="--retries: Input should be greater than or equal to 0"):
        parse_line("--retries -1").to_spec("x = 1")
