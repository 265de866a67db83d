import pytest

from cellscale_hub.scheduling.capacity import Pending, admit_in_order, allocate


@pytest.mark.parametrize(
    ("capacity", "in_use", "gpus", "expected"),
    [
        (4, [], 2, [0, 1]),
        (4, [0, 1], 2, [2, 3]),
        (4, [1, 3], 2, [0, 2]),
        (4, [0, 1, 2], 2, None),
        (4, [], 5, None),
        (4, [0, 1, 2, 3], 0, []),
    ],
)
def test_allocate_is_all_or_nothing(capacity, in_use, gpus, expected):
    assert allocate(capacity, in_use, gpus) == expected


@pytest.mark.parametrize(
    ("in_use", "queue", "admitted"),
    [
        ([], [("a", 2), ("b", 2), ("c", 1)], {"a": [0, 1], "b": [2, 3]}),
        ([0], [("a", 4), ("b", 1)], {}),  # strict order: the big gang is not starved by b
        ([0, 1], [("a", 2), ("b", 0)], {"a": [2, 3], "b": []}),
    ],
)
def test_admit_in_order(in_use, queue, admitted):
    assert admit_in_order(4, in_use, [Pending(j, g) for j, g in queue]) == admitted
