"""Exact checks of the exporters found missing by mutation testing (issue 36, docs/
testing.md): series.py and exposition.py: the log2 bounds, and the names, label text and
numbers of the Prometheus text.

Everything runs in this process without a kernel and without gRPC (a fake where its
calls are checked; mutmut forks a process per mutant, which gRPC does not survive)."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from meridian.export import exposition
from meridian.export.exposition import go_float, label_value, prom_label, prom_name, render
from meridian.export.prometheus import (
    SeriesCollector,
)
from meridian.export.series import COUNTS, LATENCY, BucketRange, Family, HistPoint, Point

# ---- series.py ----------------------------------------------------------------------


def test_hist_point_count_is_the_sum_of_its_slots_as_an_int() -> None:
    """`count` is every value the kernel counted, a Python int (JSON, protobuf)."""
    p = HistPoint({}, np.array([3, 0, 4, 5], np.uint64), 1.0, 0.0)
    assert p.count == 12 and type(p.count) is int


def test_buckets_cumulate_up_to_each_bound_then_the_total() -> None:
    """Bounds are the upper bounds of slots 0..n-2 in the range; the last column is the
    total (+Inf), the OTLP counts the differences, the overflow slot in the last one."""
    b = COUNTS.of(6, 1.0)
    assert (b.ends, b.bounds, b.nslots) == ((0, 1, 2, 3, 4), (2.0, 4.0, 8.0, 16.0, 32.0), 6)
    slots = np.array([1, 2, 0, 4, 8, 16], np.uint64)
    assert b.cumulative(slots) == [1, 3, 3, 7, 15, 31]
    assert b.cumulative_rows(np.stack([slots, slots * 2])) == [
        [1, 3, 3, 7, 15, 31],
        [2, 6, 6, 14, 30, 62],
    ]
    assert b.counts(slots) == [1, 2, 0, 4, 8, 16]
    narrow = BucketRange(4.0, 8.0).of(6, 1.0)  # slots 0 and 3.. fold into the ends
    assert (narrow.ends, narrow.bounds) == ((1, 2), (4.0, 8.0))
    assert narrow.cumulative(slots) == [3, 3, 31]
    assert narrow.counts(slots) == [3, 0, 28]


def test_bucket_range_keeps_bounds_equal_to_its_ends_within_the_last_bit() -> None:
    """2**k * scale is inexact: a range whose ends are written as decimals still keeps
    the bound at each end, and nothing outside them."""
    rng = BucketRange(1.024e-06, 8.589934592)  # 2**10 ns .. 2**33 ns, written rounded
    b = rng.of(40, 1e-9)
    assert b.ends == tuple(range(9, 33))
    assert b.bounds[0] == float(1 << 10) * 1e-9 and b.bounds[-1] == float(1 << 33) * 1e-9
    above = BucketRange(1.0250e-06, 8.58e0).of(40, 1e-9)  # just inside each end
    assert above.ends == tuple(range(10, 32))
    # a range past the kernel's last slot stops at the last slot's lower bound
    assert BucketRange(1.0, 1e9).of(5, 1.0).ends == (0, 1, 2, 3)
    assert LATENCY.of(32, 1e-6).bounds[-1] == 67.108864


def test_family_bounds_are_its_own_range_else_its_units() -> None:
    """A histogram's range: the family's own if set, else by unit (s: latency)."""
    own = BucketRange(8.0, 64.0)
    assert Family("a", "histogram", "s", "").bounds is LATENCY
    assert Family("a", "histogram", "By", "").bounds is COUNTS
    assert Family("a", "histogram", "s", "", bucket_range=own).bounds is own
    assert Family("a", "histogram", "By", "", bucket_range=own).bounds is own


# ---- exposition.py ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "unit", "kind", "want"),
    [
        ("a.b-c/d", "By", "counter", "a_b_c_d_bytes"),
        ("ns:x.y", "{op}", "gauge", "ns:x_y"),
        ("x.bytes", "By", "counter", "x_bytes"),
        ("x.seconds", "s", "histogram", "x_seconds"),
        ("x.ratio", "1", "gauge", "x_ratio"),
        ("x.ratio", "1", "counter", "x_ratio"),
        ("x.share", "1", "counter", "x_share"),
        ("x.share", "1", "gauge", "x_share_ratio"),
        ("x_time", "s", "counter", "x_time_seconds"),
        ("xseconds", "s", "gauge", "xseconds_seconds"),
        ("Disk.IO", "By", "counter", "Disk_IO_bytes"),
    ],
)
def test_prom_name_replaces_dots_and_adds_the_unit_once(
    name: str, unit: str, kind: str, want: str
) -> None:
    """OpenTelemetry's compatibility rules: colons stay, `_ratio` only on gauges, a
    name that already ends in `_<unit>` gets no second one."""
    assert prom_name(name, unit, kind) == want


def test_prom_label_and_label_value_spell_attributes_as_prometheus_does() -> None:
    """Label names take no colon (metric names do); bools are lower case."""
    assert prom_label("k8s.pod:name-x") == "k8s_pod_name_x"
    assert [label_value(v) for v in (True, False, 0, 12, "é")] == ["true", "false", "0", "12", "é"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (float("nan"), "NaN"),
        (float("inf"), "+Inf"),
        (float("-inf"), "-Inf"),
        (100.0, "100.0"),
        (1.6e-05, "1.6e-05"),
        (123456.0, "123456.0"),
        (1234567.0, "1.234567e+06"),
        (12345678.9, "1.23456789e+07"),
        (1e7, "1e+07"),
        (1e20, "1e+20"),
        (-1234567.0, "-1234567.0"),
        (3, "3.0"),
    ],
)
def test_go_float_writes_values_as_go_does(value: float, text: str) -> None:
    """prometheus_client's floatToGoString: exponent form from 1e+06 up, positive
    values only; NaN and infinities spelled as Go does."""
    assert go_float(value) == text


def test_num_writes_small_whole_numbers_directly_and_others_as_go_floats() -> None:
    """The fast path of whole counts stops below a million, as Go switches to the
    exponent there."""
    num = exposition._num
    assert [num(0), num(999_999), num(1_000_000), num(-1), num(True), num(2.5)] == [
        "0.0",
        "999999.0",
        "1e+06",
        "-1.0",
        "1.0",
        "2.5",
    ]


def test_render_writes_the_exact_exposition_text() -> None:
    """HELP escaping, TYPE, counters' `_total`, sorted and escaped labels, a bool
    label, a series without labels, a gauge, and a histogram with two kernel layouts
    (each with its own bounds in the range)."""
    s4 = np.array([1, 0, 2, 3], np.uint64)
    s6 = np.ones(6, np.uint64)
    fams = [
        Family(
            "a.b-c",
            "counter",
            "By",
            "line1\nback\\slash",
            [Point({"z": 'q"\\\n', "a": True, "x.y": False}, 5), Point({}, 7)],
        ),
        Family("g", "gauge", "1", "", [Point({"m": 2}, 0.5)]),
        Family(
            "h",
            "histogram",
            "{req}",
            "hh",
            [HistPoint({"k": "v"}, s4, 1.0, 2.5), HistPoint({"k": "w"}, s6, 1.0, 0.0)],
        ),
    ]
    assert render(fams) == (
        "# HELP a_b_c_bytes_total line1\\nback\\\\slash\n"
        "# TYPE a_b_c_bytes_total counter\n"
        'a_b_c_bytes_total{a="true",x_y="false",z="q\\"\\\\\\n"} 5.0\n'
        "a_b_c_bytes_total 7.0\n"
        "# HELP g_ratio \n"
        "# TYPE g_ratio gauge\n"
        'g_ratio{m="2"} 0.5\n'
        "# HELP h hh\n"
        "# TYPE h histogram\n"
        'h_bucket{k="v",le="2.0"} 1.0\n'
        'h_bucket{k="v",le="4.0"} 1.0\n'
        'h_bucket{k="v",le="8.0"} 3.0\n'
        'h_bucket{k="v",le="+Inf"} 6.0\n'
        'h_count{k="v"} 6.0\n'
        'h_sum{k="v"} 2.5\n'
        'h_bucket{k="w",le="2.0"} 1.0\n'
        'h_bucket{k="w",le="4.0"} 2.0\n'
        'h_bucket{k="w",le="8.0"} 3.0\n'
        'h_bucket{k="w",le="16.0"} 4.0\n'
        'h_bucket{k="w",le="32.0"} 5.0\n'
        'h_bucket{k="w",le="+Inf"} 6.0\n'
        'h_count{k="w"} 6.0\n'
        'h_sum{k="w"} 0.0\n'
    )


def test_escape_handles_each_special_character_alone() -> None:
    """A value with only a backslash, only a newline or only a quote is escaped too."""
    esc = exposition._escape
    assert [esc("a\\b"), esc("a\nb"), esc('a"b'), esc("plain")] == [
        "a\\\\b",
        "a\\nb",
        'a\\"b',
        "plain",
    ]


def test_le_sorts_between_the_labels_before_and_after_it() -> None:
    """`le` goes where it sorts among the series' own labels, so the text is sorted as
    prometheus_client writes it; a series with no labels before `le` or none after."""
    slots = np.array([1, 1], np.uint64)
    fam = Family(
        "h",
        "histogram",
        "{x}",
        "",
        [
            HistPoint({"a": 1, "m": 2, "z": 3}, slots, 1.0, 0.0),
            HistPoint({"m": 4}, slots, 1.0, 0.0),
            HistPoint({"a": 5}, slots, 1.0, 0.0),
            HistPoint({"l": 6, "lf": 7}, slots, 1.0, 0.0),
            HistPoint({"a": 8, "b": 9, "y": 10, "z": 11}, slots, 1.0, 0.0),
        ],
    )
    text = render([fam])
    assert 'h_bucket{a="1",le="2.0",m="2",z="3"} 1.0\n' in text
    assert 'h_bucket{le="2.0",m="4"} 1.0\n' in text
    assert 'h_bucket{a="5",le="2.0"} 1.0\n' in text
    assert 'h_bucket{l="6",le="2.0",lf="7"} 1.0\n' in text
    assert 'h_bucket{a="8",b="9",le="2.0",y="10",z="11"} 1.0\n' in text
    assert render([Family("g", "gauge", "{x}", "", [Point({"le": 1, "a": 2}, 3)])]) == (
        '# HELP g \n# TYPE g gauge\ng{a="2",le="1"} 3.0\n'
    )  # a label that happens to be called `le` is kept
    assert 'h_count{a="1",m="2",z="3"} 2.0\n' in text
    labels = exposition._Labels()
    # the dicts live through the calls, as a scrape's families keep theirs
    shared, after = {"b": "x"}, {"p": "q"}
    empty: dict[str, str] = {}
    assert labels.of(shared) == ('{b="x"}', '{b="x",', "}")
    assert labels.of(empty) == ("", "{", "}")
    assert labels.of(after) == ('{p="q"}', "{", ',p="q"}')
    shared["c"] = "y"  # the text is made once per attribute dict (by identity)
    assert labels.of(shared) == ('{b="x"}', '{b="x",', "}")


def test_histogram_counts_from_a_million_are_written_as_go_floats() -> None:
    """Whole counts from 1,000,000 up leave the "12.0" fast path: "1e+06", as
    prometheus_client writes them; below, every line keeps the ".0" form."""
    big = np.array([0, 1_000_000], np.uint64)
    small = np.array([0, 999_999], np.uint64)
    fam = Family(
        "h",
        "histogram",
        "{x}",
        "",
        [HistPoint({"n": "big"}, big, 1.0, 1.0), HistPoint({"n": "small"}, small, 1.0, 1.0)],
    )
    text = render([fam])
    assert 'h_bucket{le="+Inf",n="big"} 1e+06\n' in text
    assert 'h_bucket{le="2.0",n="big"} 0.0\n' in text
    assert 'h_count{n="big"} 1e+06\n' in text
    assert 'h_bucket{le="+Inf",n="small"} 999999.0\n' in text
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SeriesCollector(lambda: [fam]))
    assert text == generate_latest(registry).decode()


def test_prometheus_client_families_match_the_fast_text_for_every_kind() -> None:
    """`families()` (sentinel's collector) writes what `render` writes: a counter, a
    gauge with a float and bool labels, a family with no points, and a histogram with
    its own bucket range."""
    slots = np.array([2, 0, 3, 1, 4], np.uint64)
    fams = [
        Family("c.x", "counter", "By", "c", [Point({"p": 1, "ok": True}, 3)]),
        Family("g.x", "gauge", "1", "g", [Point({"ok": False}, 0.25)]),
        Family("e.x", "counter", "{op}", "empty"),
        Family(
            "h.x",
            "histogram",
            "s",
            "h",
            [HistPoint({"d": "r"}, slots, 1.0, 9.5)],
            bucket_range=BucketRange(4.0, 8.0),
        ),
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SeriesCollector(lambda: fams))
    text = generate_latest(registry).decode()
    assert text == render(fams)
    assert 'h_x_seconds_bucket{d="r",le="4.0"} 2.0\n' in text
    assert 'h_x_seconds_bucket{d="r",le="8.0"} 5.0\n' in text
    assert 'h_x_seconds_bucket{d="r",le="+Inf"} 10.0\n' in text
    assert 'c_x_bytes_total{ok="true",p="1"} 3.0\n' in text
