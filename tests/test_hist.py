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


def test_render_with_percent_adds_each_slots_share_after_the_bar() -> None:
    assert Log2Hist.of([1, 0, 3]).render(percent=True) == (
        "     usecs               : count    distribution                               percent\n"
        "         0 -> 1          : 1        |*************                           |  25.00%\n"
        "         2 -> 3          : 0        |                                        |   0.00%\n"
        "         4 -> 7          : 3        |****************************************|  75.00%"
    )


def test_render_past_slot_32_is_bccs_wide_layout() -> None:
    """bcc's print_log2_hist: up to slot 32 the narrow layout, from slot 33 20 stars
    and columns of 20."""
    narrow = Log2Hist.of([0] * 32 + [1]).render("nsecs").splitlines()
    assert narrow[0] == "     nsecs               : count    distribution"
    assert narrow[-1] == f"{2**32:>10} -> {2**33 - 1:<10} : 1        |{'*' * 40}|"
    wide = Log2Hist.of([0] * 32 + [2, 1]).render("nsecs").splitlines()
    assert len(wide) == 35
    assert wide[0] == "               nsecs                         : count    distribution"
    assert [wide[1], wide[-2], wide[-1]] == [
        "                   0 -> 1                    : 0        |                    |",
        "          4294967296 -> 8589934591           : 2        |********************|",
        "          8589934592 -> 17179869183          : 1        |**********          |",
    ]
    assert Log2Hist.of([0] * 32 + [2, 1]).render("nsecs", percent=True).splitlines()[0] == (
        "               nsecs                         : count    distribution           percent"
    )


def test_cumulative_buckets_default_to_the_histograms_unit_and_end_in_inf() -> None:
    assert Log2Hist.of([1, 2]).cumulative_buckets() == [(2.0, 1), (4.0, 3), (float("inf"), 3)]
    assert Log2Hist.empty(4).cumulative_buckets() == [(float("inf"), 0)]


def test_json_names_the_unit_and_rounds_to_three_decimals() -> None:
    h = Log2Hist(np.array([0, 0, 0, 3], dtype=np.uint64), "msecs", lo=8.12345, hi=14.98775)
    assert h.to_json() == {
        "unit": "msecs",
        "count": 3,
        "p50": 11.556,  # 8.12345 + 0.5 * (14.98775 - 8.12345) = 11.5556: in [min, max]
        "p99": 14.919,  # 8.12345 + 0.99 * (14.98775 - 8.12345) = 14.919107
        "min": 8.123,
        "max": 14.988,
        "relative_error": 1.0,
        "buckets": [{"low": 8, "high": 15, "count": 3}],
    }


def test_empty_of_and_merge_of_nothing_keep_the_unit() -> None:
    assert Log2Hist.empty(4).unit == Log2Hist.of([1]).unit == "usecs"
    assert Log2Hist.empty(4, "nsecs").unit == Log2Hist.of([1], "nsecs").unit == "nsecs"
    none = Log2Hist.merge([], 5, "nsecs")
    assert (none.counts.tolist(), none.unit, none.total) == ([0] * 5, "nsecs", 0)
    assert Log2Hist.merge([Log2Hist.of([1, 2])], 5, "msecs").unit == "msecs"
