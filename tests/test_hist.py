from __future__ import annotations

import numpy as np
import pytest

from meridian.hist import Log2Hist, slot_bounds, slot_of


@pytest.mark.parametrize(
    ("value", "slot"), [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (4095, 11), (4096, 12), (2**40, 40)]
)
def test_slot_of_matches_kernel_log2(value: int, slot: int) -> None:
    assert slot_of(value) == slot


def test_slot_bounds_cover_every_integer_once() -> None:
    seen: list[int] = []
    for i in range(12):
        low, high = slot_bounds(i)
        seen.extend(range(low, high + 1))
        assert all(slot_of(v) == i for v in range(max(low, 1), high + 1))
    assert seen == list(range(len(seen)))


def test_render_is_bcc_layout() -> None:
    h = Log2Hist.of([0, 0, 1, 4, 2])
    assert h.render() == (
        "     usecs               : count    distribution\n"
        "         0 -> 1          : 0        |                                        |\n"
        "         2 -> 3          : 0        |                                        |\n"
        "         4 -> 7          : 1        |**********                              |\n"
        "         8 -> 15         : 4        |****************************************|\n"
        "        16 -> 31         : 2        |********************                    |"
    )


def test_render_empty_is_empty() -> None:
    assert Log2Hist.empty(8).render() == ""


def test_percentiles_interpolate_inside_the_slot() -> None:
    h = Log2Hist.of([0, 0, 0, 10])  # all in [8, 15]
    assert h.percentile(0.5) == pytest.approx(12.0)
    assert 8 <= h.percentile(0.99) <= 16
    assert Log2Hist.empty(4).percentile(0.5) == 0.0


def test_merge_and_difference() -> None:
    a, b = Log2Hist.of([1, 2, 3]), Log2Hist.of([0, 1, 1])
    assert (a + b).slots.tolist() == [1, 3, 4]
    assert (a - b).slots.tolist() == [1, 1, 2]
    assert Log2Hist.merge([a, b], 3, "usecs").total == 8


def test_cumulative_buckets_are_prometheus_le() -> None:
    h = Log2Hist.of([1, 0, 2, 0])
    assert h.cumulative_buckets(scale=1e-6) == [
        (2e-6, 1),
        (4e-6, 1),
        (8e-6, 3),
        (float("inf"), 3),
    ]


def test_json_lists_non_empty_slots() -> None:
    j = Log2Hist.of(np.array([0, 3, 0, 1], dtype=np.uint64)).to_json()
    assert j["count"] == 4
    assert j["buckets"] == [{"low": 2, "high": 3, "count": 3}, {"low": 8, "high": 15, "count": 1}]
