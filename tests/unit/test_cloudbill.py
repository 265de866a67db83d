"""A cloud pool's bill attributed to attempts (cellscale_hub.cost.cloudbill): table-driven."""

import pytest

from cellscale_hub.cost.cloudbill import attribute
from cellscale_hub.drivers.capabilities import Instance, Run

RATE = 8 * 2.5 / 3600  # an 8-GPU node at $2.50/GPU-h, per second


def inst(node="c1", requested=0.0, stopped=100.0):
    return Instance(node, requested, stopped, RATE * ((stopped or 200.0) - requested))


@pytest.mark.parametrize(
    ("instances", "runs", "expected", "shared"),
    [
        # boot 0-10, the job 10-80, idle tail 80-100: all of it is the job's
        ([inst()], [Run("a", "c1", 10, 80)], {"a": 100}, 0),
        # two nodes of one gang: each node's whole bill
        ([inst("c1"), inst("c2")], [Run("a", "c1", 10, 80), Run("a", "c2", 10, 80)], {"a": 200}, 0),
        # two jobs in turn: the first 0-50 (boot + run), the second the gap, its run and the tail
        ([inst()], [Run("a", "c1", 10, 50), Run("b", "c1", 60, 90)], {"a": 50, "b": 50}, 0),
        # a resume whose job went elsewhere: shared
        ([inst()], [], {}, 100),
        # a running instance (no stop yet) with a running job: billed to now (200)
        ([inst(stopped=None)], [Run("a", "c1", 10, None)], {"a": 200}, 0),
        # runs on other nodes or outside the instance's life do not count
        ([inst()], [Run("a", "c2", 10, 80), Run("b", "c1", 150, 160)], {}, 100),
    ],
)
def test_every_billed_second_goes_to_an_attempt_or_is_shared(instances, runs, expected, shared):
    bill = attribute(instances, runs, now=200.0)
    assert {k: round(v / RATE, 6) for k, v in bill.usd.items()} == expected
    assert bill.unattributed_usd == pytest.approx(shared * RATE)
    assert bill.total_usd == pytest.approx(sum(i.usd for i in instances))
