"""The log-linear layout and the one quantile function: bounds, the stated relative
error against the exact quantile of the data, the log2 view bcc's text reads,
intervals, the kernel maps' cells and exact value counts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from meridian.hist import (
    RELATIVE_ERROR,
    Cell,
    ExactCounts,
    Hist,
    Layout,
    Log2Hist,
    interval_min_max,
    slot_bounds,
    slot_of,
)

NB = 464  # (1 + 32 - 4) * 16: BIOLAT_BUCKETS, MEMLAT_BUCKETS, RUNQLAT_BUCKETS


def hist_of(values: list[int], layout: Layout | None = None) -> Hist:
    """What the kernel would hold for `values`: their buckets, min and max."""
    lay = layout or Layout(NB)
    counts = np.zeros(lay.nbuckets, np.uint64)
    for v in values:
        counts[lay.bucket_of(v)] += np.uint64(1)
    return Hist.of_buckets(counts, "nsecs", float(min(values)), float(max(values)))


def exact_quantile(values: list[int], q: float) -> int:
    """Nearest rank: the smallest value that at least q of the values do not exceed."""
    s = sorted(values)
    return s[max(math.ceil(q * len(s)), 1) - 1]


def test_bucket_bounds_hold_their_values_and_sum_to_log2_slots() -> None:
    lay = Layout(NB)
    for v in [*range(0, 300), *(1 << e for e in range(31)), *((1 << e) - 1 for e in range(1, 32))]:
        b = lay.bucket_of(v)
        assert lay.lows[b] <= v < lay.highs[b]
        # the bucket belongs to v's log2 slot: the slot starts at or before it, and
        # the next slot after it
        slot = slot_of(v)
        assert lay.slot_starts[slot] <= b
        assert slot + 1 == len(lay.slot_starts) or b < lay.slot_starts[slot + 1]
        if v >= 16:  # the stated bound: a bucket's width is at most 1/16 of its low
            assert lay.highs[b] - lay.lows[b] <= RELATIVE_ERROR * lay.lows[b]
    assert len(lay.slot_starts) == 32
    assert lay.bucket_of(1 << 40) == NB - 1  # everything above in the last bucket


def test_render_is_the_log2_render_of_the_same_data_byte_for_byte() -> None:
    rng = np.random.default_rng(7)
    values = [int(v) for v in rng.lognormal(9, 2.5, 5000).astype(np.int64)] + [0, 1, 2, 3]
    log2 = np.bincount([slot_of(v) for v in values], minlength=32).astype(np.uint64)
    old = Log2Hist(log2, "nsecs")  # the kernel's log2 slots, as they were counted before
    new = hist_of(values)
    assert new.slots.tolist() == log2.tolist()
    assert new.render() == old.render() != ""
    assert new.render("depth") == old.render("depth")
    assert new.cumulative_buckets(1e-6) == old.cumulative_buckets(1e-6)
    assert new.to_json()["buckets"] == old.to_json()["buckets"]


@pytest.mark.parametrize("seed", range(20))
def test_quantiles_stay_within_min_and_max_and_the_relative_error(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    kind = seed % 4
    values: np.ndarray[Any, Any]
    if kind == 0:  # a wide spread
        values = rng.lognormal(10, 2, n)
    elif kind == 1:  # one value
        values = np.full(n, rng.integers(1, 1 << 30))
    elif kind == 2:  # two clusters
        values = np.concatenate([rng.normal(5000, 50, n), rng.normal(2e6, 1e4, n // 50 + 1)])
    else:  # small integers (queue depths)
        values = rng.integers(1, 40, n)
    vals = [max(int(v), 1) for v in values]
    h = hist_of(vals)
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0):
        got, want = h.percentile(q), exact_quantile(vals, q)
        assert min(vals) <= got <= max(vals), (q, got)
        # within one bucket of the true value: 1/16 of it from 16 units, 1 unit below
        assert abs(got - want) <= max(RELATIVE_ERROR * want, 1.0), (q, got, want)
    assert h.percentile(1.0) == max(vals)


def test_one_value_gives_that_value_exactly() -> None:
    h = hist_of([1_325_086] * 100)
    assert h.percentile(0.5) == h.percentile(0.99) == 1_325_086.0
    j = h.to_json()
    assert (j["p50"], j["p99"], j["min"], j["max"]) == (1325086, 1325086, 1325086, 1325086)
    assert j["relative_error"] == 0.0625


def test_a_log2_histogram_without_min_max_keeps_its_old_interpolation() -> None:
    h = Log2Hist.of([0, 0, 0, 10])  # all in [8, 15]
    assert h.percentile(0.5) == 12.0
    assert h.relative_error == 1.0
    assert h.percentile(0.99) <= 16


def test_an_interval_min_and_max_are_exact_when_they_moved_else_bounds() -> None:
    a = hist_of([100, 5000, 9000])
    b = hist_of([100, 5000, 9000, 50, 20000])  # a new min and max in the interval
    d = b.since(a)
    assert d.total == 2 and (d.lo, d.hi) == (50.0, 20000.0)
    c = hist_of([100, 5000, 9000, 50, 20000, 3000, 3100])  # neither moved
    d2 = c.since(b)
    assert d2.total == 2
    lay = Layout(NB)
    assert d2.lo == lay.lows[lay.bucket_of(3000)] and d2.hi == lay.highs[lay.bucket_of(3100)]
    assert d2.lo is not None and d2.hi is not None
    assert d2.lo <= d2.percentile(0.5) <= d2.hi


def cell_of(values: list[int], **counters: int) -> Cell:
    """The cell the kernel would hold for `values` in ns, counted in usecs buckets."""
    counts = np.zeros(NB, np.uint64)
    for v in values:
        counts[Layout(NB).bucket_of(v // 1000)] += np.uint64(1)
    return Cell(counts, sum(values), max(values), min_ns=min(values), **counters)


def test_a_cell_interval_subtracts_its_counters_and_bounds_its_min_and_max() -> None:
    a = cell_of([100_000, 5_000_000], tail=1, bytes=8192)
    b = cell_of([100_000, 5_000_000, 50_000, 20_000_000], tail=2, bytes=12288)
    d = b.since(a, 1000)  # a new min and max: exact
    assert (d.count, d.sum_ns, d.tail, d.bytes) == (2, 20_050_000, 1, 4096)
    assert (d.min_ns, d.max_ns) == (50_000, 20_000_000)
    c = cell_of([100_000, 5_000_000, 50_000, 20_000_000, 3_000_000], tail=2, bytes=12288)
    d2 = c.since(b, 1000)  # neither moved: the edges of the interval's one bucket
    lay = Layout(NB)
    bucket = lay.bucket_of(3000)
    assert d2.min_ns == lay.lows[bucket] * 1000 and d2.max_ns == lay.highs[bucket] * 1000 - 1
    assert d2.min_ns <= 3_000_000 <= d2.max_ns
    h = d2.hist("usecs", 1000)
    assert h.total == 1 and h.lo == d2.min_ns / 1000 and h.hi == d2.max_ns / 1000
    nothing = c.since(c, 1000)
    assert nothing.count == 0 and (nothing.sum_ns, nothing.max_ns, nothing.min_ns) == (0, 0, 0)


def test_cells_add_and_come_from_per_cpu_records() -> None:
    s = cell_of([2000, 9000], tail=1) + cell_of([1000], bytes=512)
    assert (s.count, s.sum_ns, s.max_ns, s.min_ns) == (3, 12000, 9000, 1000)
    assert (s.tail, s.bytes) == (1, 512)
    assert (s + Cell(np.zeros(NB, np.uint64), 0, 0)).min_ns == 1000  # 0 is "none", not a min
    fields = ("sum_ns", "max_ns", "tail", "min_ns")
    cpus = np.zeros(3, [("buckets", np.uint64, NB)] + [(f, np.uint64) for f in fields])
    for cpu, bucket, n, values in (
        (0, 2, 1, (2000, 2000, 0, 2000)),
        (2, 5, 2, (11000, 6000, 1, 5000)),
    ):
        cpus[cpu]["buckets"][bucket] = n
        for f, v in zip(fields, values, strict=True):
            cpus[cpu][f] = v
    got = Cell.of_cpus(cpus)  # CPU 1 saw nothing: its min 0 is not the smallest
    assert (got.count, got.sum_ns, got.max_ns, got.min_ns, got.tail) == (3, 13000, 6000, 2000, 1)


def test_exact_counts_quantiles_are_values_that_occurred() -> None:
    e = ExactCounts({4096: 300, 12288: 100})
    assert [e.percentile(q) for q in (0.0, 0.5, 0.75, 0.7501, 0.99, 1.0)] == [
        4096, 4096, 4096, 12288, 12288, 12288
    ]  # fmt: skip
    assert e.slots.tolist()[12:14] == [300, 100]
    assert e.render().splitlines()[13].startswith(f"{slot_bounds(12)[0]:>10} -> ")
    j = ExactCounts({4096: 10}, not_counted=2).to_json()
    assert (j["p50"], j["p99"], j["min"], j["max"], j["not_counted"]) == (4096, 4096, 4096, 4096, 2)
    d = ExactCounts({4096: 15, 8192: 1}).since(ExactCounts({4096: 10}))
    assert d.counts == {4096: 5, 8192: 1}


def test_a_log2_layout_puts_a_value_in_its_slot_and_the_rest_in_the_last() -> None:
    lay = Layout(8, None)
    assert [lay.bucket_of(v) for v in (0, 1, 2, 5, 127, 128, 10**9)] == [0, 0, 1, 2, 6, 7, 7]


def test_the_quantile_rank_is_exact_at_the_ends_and_in_the_first_bucket() -> None:
    h = Log2Hist.of([0, 0, 0, 10])  # all in [8, 16)
    assert h.percentile(0.0) == h.percentile(-1.0) == 8.0  # the bucket's low
    assert h.percentile(0.05) == pytest.approx(8.4)  # rank 0.5 of 10 in [8, 16)
    assert h.percentile(1.0) == h.percentile(1.5) == 16.0  # q past 1 is 1
    assert Log2Hist.of([10, 0]).percentile(0.5) == 1.0  # rank 5 of 10 in [0, 2)


def test_histograms_count_in_u64_whatever_they_are_built_from() -> None:
    signed = np.array([3, 1])  # int64
    for h in (Hist(signed), Hist.of([3, 1]), Hist.empty(2), Hist.of_buckets(signed, "nsecs")):
        assert h.counts.dtype == np.uint64
    # what it keeps: a count past 2**53 adds exactly (a float count would not)
    assert (Hist.empty(1) + Hist.of([2**53 + 1])).total == 2**53 + 1


def test_histograms_add_their_min_and_max_and_an_empty_one_of_another_layout() -> None:
    a, b = hist_of([100, 200]), hist_of([50, 300])
    s = a + b
    assert (s.total, s.lo, s.hi, s.unit, s.layout) == (4, 50.0, 300.0, "nsecs", Layout(NB))
    counts = np.zeros(NB, np.uint64)
    counts[Layout(NB).bucket_of(75)] = 1
    unknown = Hist.of_buckets(counts, "nsecs")  # min and max not known: the other's
    assert ((unknown + a).lo, (unknown + a).hi) == (100.0, 200.0)
    assert ((a + unknown).lo, (a + unknown).hi) == (100.0, 200.0)
    assert (Hist.empty(32) + a) is a and (a + Hist.empty(32)) is a
    with pytest.raises(ValueError, match="histograms of different layouts"):
        Log2Hist.of([1]) + a


def test_an_interval_with_nothing_new_keeps_the_unit_and_layout() -> None:
    h = hist_of([5, 3000])
    d = h.since(h)
    assert (d.total, d.unit, d.layout, d.lo, d.hi) == (0, "nsecs", Layout(NB), None, None)


def test_an_interval_in_the_last_buckets_keeps_a_max_above_its_values() -> None:
    """The last bucket holds everything above its nominal bound: an interval's max
    there is bounded by the max since attach, not by that bound; the bucket before
    it by its own high."""
    lay = Layout(NB)
    prev = hist_of([2**40])
    d = hist_of([2**40, 2**35]).since(prev)  # in the last bucket, the max did not move
    assert (d.lo, d.hi, d.unit) == (2.0**35, 2.0**40, "nsecs")
    d2 = hist_of([2**40, 4_100_000_000]).since(prev)  # in the one before it
    assert lay.bucket_of(4_100_000_000) == NB - 2
    assert (d2.lo, d2.hi) == (4_100_000_000.0, lay.highs[NB - 2])
    a = cell_of([2**40 * 1000])
    dc = cell_of([2**40 * 1000, 2**35 * 1000]).since(a, 1000)
    assert (dc.min_ns, dc.max_ns) == (2**35 * 1000, 2**40 * 1000)
    dc2 = cell_of([2**40 * 1000, 4_100_000_000_000]).since(a, 1000)
    assert (dc2.min_ns, dc2.max_ns) == (4_100_000_000_000, int(lay.highs[NB - 2]) * 1000 - 1)


def test_interval_min_max_of_nothing_is_none() -> None:
    assert interval_min_max(np.zeros(NB, np.uint64), 50, 900, 50, 900, 1000) == (0, 0)


def test_a_cell_from_per_cpu_records_keeps_each_bucket_and_a_min_of_one() -> None:
    """Records without a tail counter (biolat's), a CPU with min 1 (a queue depth of
    1), and records where no CPU saw anything."""
    fields = ("sum_ns", "max_ns", "min_ns")
    cpus = np.zeros(3, [("buckets", np.uint64, 8)] + [(f, np.uint64) for f in fields])
    cpus[0]["buckets"][1] = 2
    cpus[0]["min_ns"], cpus[0]["max_ns"], cpus[0]["sum_ns"] = 1, 3, 4
    cpus[2]["buckets"][1] = 1
    cpus[2]["buckets"][4] = 1
    cpus[2]["min_ns"], cpus[2]["max_ns"], cpus[2]["sum_ns"] = 2, 17, 19
    got = Cell.of_cpus(cpus)
    assert got.buckets.tolist() == [0, 3, 0, 0, 1, 0, 0, 0]
    assert (got.sum_ns, got.max_ns, got.min_ns, got.tail, got.bytes) == (23, 17, 1, 0, 0)
    none = Cell.of_cpus(np.zeros(2, cpus.dtype))
    assert (none.buckets.tolist(), none.min_ns, none.max_ns, none.tail) == ([0] * 8, 0, 0, 0)


def test_a_cells_histogram_has_its_unit_and_no_min_or_max_when_none() -> None:
    h = Cell(np.zeros(NB, np.uint64), 0, 0).hist("usecs", 1000)
    assert (h.unit, h.total, h.lo, h.hi) == ("usecs", 0, None, None)
    h2 = cell_of([3_000_000]).hist("msecs", 1_000_000)
    assert (h2.unit, h2.lo, h2.hi) == ("msecs", 3.0, 3.0)


def test_cells_add_their_tails_and_two_without_a_min_have_none() -> None:
    s = cell_of([2000], tail=2) + cell_of([1000], tail=3)
    assert (s.tail, s.min_ns) == (5, 1000)
    zero = Cell(np.zeros(NB, np.uint64), 0, 0)
    assert (zero + zero).min_ns == 0


def test_exact_counts_add_merge_and_subtract_their_not_counted() -> None:
    e = ExactCounts(unit="sectors")
    e.add(4096, 2)
    e.add(4096, 3)
    e.add(512, 0)  # nothing: no entry
    assert e.counts == {4096: 5}
    a = ExactCounts({4096: 2, 8192: 1}, "sectors", not_counted=1)
    b = ExactCounts({4096: 3, 512: 4}, "sectors", not_counted=2)
    s = a + b
    assert (s.counts, s.unit, s.not_counted) == ({4096: 5, 8192: 1, 512: 4}, "sectors", 3)
    assert a.counts == {4096: 2, 8192: 1}  # the sum is a new one
    d = s.since(a)
    assert (d.counts, d.unit, d.not_counted) == ({4096: 3, 512: 4}, "sectors", 2)
    assert ExactCounts().percentile(0.5) == 0.0


def test_exact_counts_json_and_render() -> None:
    e = ExactCounts({512: 50, 4096: 49, 65536: 1}, not_counted=3)
    assert e.to_json() == {
        "unit": "bytes",
        "count": 100,
        "p50": 512.0,
        "p99": 4096.0,
        "min": 512,
        "max": 65536,
        "relative_error": 0.0,
        "values": [
            {"value": 512, "count": 50},
            {"value": 4096, "count": 49},
            {"value": 65536, "count": 1},
        ],
        "not_counted": 3,
    }
    assert ExactCounts().to_json() == {
        "unit": "bytes",
        "count": 0,
        "p50": 0.0,
        "p99": 0.0,
        "min": 0,
        "max": 0,
        "relative_error": 0.0,
        "values": [],
        "not_counted": 0,
    }
    assert ExactCounts({4: 3, 16: 1}).render() == (
        "     bytes               : count    distribution\n"
        "         0 -> 1          : 0        |                                        |\n"
        "         2 -> 3          : 0        |                                        |\n"
        "         4 -> 7          : 3        |****************************************|\n"
        "         8 -> 15         : 0        |                                        |\n"
        "        16 -> 31         : 1        |*************                           |"
    )
