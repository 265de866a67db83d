import pytest

from cellscale_hub.scheduling.capacity import allocate


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
