"""biolat's reports on a snapshot whose answer is known: per disk its major:minor,
the max beside count, average and quantiles (the block I/O lab's part 1), and each
latency bucket's share of the count; with --depth, the utilization and the latency by
depth at issue (exercise 4)."""

from __future__ import annotations

import io

import numpy as np

from meridian.export import HistPoint, Point
from meridian.hist import Cell, Layout
from meridian.proc import kernel_dev
from meridian.tools.biolat.metrics import series
from meridian.tools.biolat.model import (
    KIND_DEPTH,
    KIND_LATENCY,
    KIND_LATENCY_AT_DEPTH,
    Options,
    Snapshot,
)
from meridian.tools.biolat.views import report_json, report_text

NB = 464  # BIOLAT_BUCKETS


def cell(latencies_ns: list[int]) -> Cell:
    """What the kernel keeps for these requests' latencies (4 KiB each)."""
    lay = Layout(NB)
    buckets = np.zeros(NB, np.uint64)
    for v in latencies_ns:
        buckets[lay.bucket_of(v // 1000)] += np.uint64(1)  # the kernel counts in us
    return Cell(buckets, sum(latencies_ns), max(latencies_ns), 0, min(latencies_ns), 4096 * 4)


def test_text_report_shows_major_minor_max_and_bucket_shares() -> None:
    dev = kernel_dev(7, 42)  # a loop device number no disk here has: named by numbers
    snap = Snapshot(0.0, {(dev, 0, KIND_LATENCY, 12): cell([3_000, 5_000, 6_000, 900_000])})
    snap.seconds = 2.0
    out = io.StringIO()
    report_text(snap, Options(per_disk=True), out)
    text = out.getvalue()
    assert "disk = 7:42, op = read" in text  # no name in /sys: the numbers once
    shares = [line.split("|")[-1].strip() for line in text.splitlines() if line.count("|") == 2]
    assert [s for s in shares if s != "0.00%"] == ["25.00%", "50.00%", "25.00%"]
    head, row = [line.split() for line in text.splitlines()[-2:]]
    assert head[:3] == ["DISK", "MAJ:MIN", "OP"] and head[-1] == "MAX(us)"
    assert row[1:4] == ["7:42", "read", "4"]
    assert row[-1] == "900"  # the slowest request, exact: the kernel keeps it


def depth_cell(depths: list[int]) -> Cell:
    """What the kernel keeps for the depths seen at these issues."""
    lay = Layout(NB)
    buckets = np.zeros(NB, np.uint64)
    for d in depths:
        buckets[lay.bucket_of(d)] += np.uint64(1)
    return Cell(buckets, sum(depths), max(depths), 0, min(depths), 0)


def test_depth_report_shows_utilization_and_latency_by_depth() -> None:
    """--depth: 0.5 s busy in a 2 s interval is 25.0 %; requests issued alone (depth 1)
    and deep (depths 4-7) in their own rows, each with its count, average and max; the
    same in JSON and as exported series (the io_time counter in seconds)."""
    dev = kernel_dev(7, 42)
    alone, deep = [20_000, 40_000], [500_000, 700_000, 900_000]
    snap = Snapshot(
        0.0,
        {
            (dev, 0, KIND_LATENCY, 12): cell(alone + deep),
            (dev, 0, KIND_DEPTH, 0): depth_cell([1, 1, 4, 5, 6]),
            (dev, 0, KIND_LATENCY_AT_DEPTH, 0): cell(alone),
            (dev, 0, KIND_LATENCY_AT_DEPTH, 2): cell(deep),
        },
        busy_ns={dev: 500_000_000},
    )
    snap.seconds = 2.0
    opts = Options(per_disk=True, depth=True)
    out = io.StringIO()
    report_text(snap, opts, out)
    lines = out.getvalue().splitlines()
    assert any(
        line.startswith("utilization 25.0% (time with a request in flight)") for line in lines
    )
    at = lines.index("latency by queue depth at issue:")
    assert lines[at + 1].split() == ["DEPTH", "COUNT", "AVG(us)", "P50(us)", "P99(us)", "MAX(us)"]
    one, four = lines[at + 2].split(), lines[at + 3].split()
    assert (one[0], one[1], one[2], one[-1]) == ("1", "2", "30.0", "40.0")
    assert (four[0], four[1], four[2], four[-1]) == ("4-7", "3", "700.0", "900.0")
    [d] = report_json(snap, opts)["depth"]
    assert d["utilization"] == 0.25 and d["busy_ns"] == 500_000_000
    rows = [
        (r["depth_low"], r["depth_high"], r["count"], r["latency_max_ns"])
        for r in d["latency_by_depth"]
    ]
    assert rows == [(1, 1, 2, 40_000), (4, 7, 3, 900_000)]
    fams = {f.name: f.points for f in series(snap, opts)}
    [io_time] = fams["system.disk.io_time"]
    assert isinstance(io_time, Point) and io_time.value == 0.5
    by_depth = {
        p.attrs["meridian.biolat.depth"]: p
        for p in fams["meridian.biolat.operation.duration_by_depth"]
    }
    assert set(by_depth) == {"1", "4-7"}
    assert isinstance(by_depth["4-7"], HistPoint) and by_depth["4-7"].count == 3
