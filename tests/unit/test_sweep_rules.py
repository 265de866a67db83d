"""The pure rules of sweeps: packing points into tasks, chunking tasks into arrays by the
backend's MaxArraySize, and splitting --max-parallel into per-array throttles."""

from __future__ import annotations

import pytest

from cellscale.vocabulary import PointStatus
from cellscale_hub.control.sweeps import chunk, pack, throttles
from cellscale_hub.store.points import counts


def test_pack_keeps_order_and_the_last_task_short():
    assert pack([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3], [4]]
    assert pack([7], 5) == [[7]]
    assert pack([], 3) == []


def test_chunk_restarts_the_index_at_each_array_with_an_offset():
    tasks = [[i] for i in range(250)]
    arrays = chunk(tasks, 101)  # MaxArraySize=101: indexes 0..100
    assert [(offset, len(part)) for offset, part in arrays] == [(0, 101), (101, 101), (202, 48)]
    assert arrays[1][1][0] == [101] and arrays[2][1][-1] == [249]


@pytest.mark.parametrize(
    ("slots", "arrays", "expected"),
    [
        (8, [(101, 0), (101, 0), (48, 0)], [8, 0, 0]),  # at submit: the oldest array runs, the others held
        (8, [(7, 7), (101, 0), (48, 0)], [7, 1, 0]),  # the first drains: a slot passes to the next
        (8, [(0, 0), (101, 3), (48, 0)], [0, 8, 0]),
        (8, [(3, 3), (2, 2), (40, 1)], [3, 2, 3]),
        (4, [(10, 6), (5, 0)], [6, 0]),  # more running than slots (throttle just lowered): never below what runs
        (8, [(2, 0)], [2]),  # never more than an array has left
    ],
)
def test_throttles_never_add_up_to_more_than_the_slots(slots, arrays, expected):
    limits = throttles(slots, arrays)
    assert limits == expected
    running = sum(min(r, live) for live, r in arrays)
    assert sum(limits) <= max(slots, running)
    assert all(limit >= min(r, live) for limit, (live, r) in zip(limits, arrays, strict=True))


def test_counts_name_every_status():
    got = counts([PointStatus.done, PointStatus.done, PointStatus.failed], retried=1)
    assert got == {"queued": 0, "running": 0, "done": 2, "failed": 1, "cached": 0, "cancelled": 0, "retried": 1}
