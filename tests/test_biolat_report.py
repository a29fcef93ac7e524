"""biolat's text report on a snapshot whose answer is known: per disk its major:minor,
the max beside count, average and quantiles (the block I/O lab's part 1), and each
latency bucket's share of the count."""

from __future__ import annotations

import io

import numpy as np

from meridian.hist import Cell, Layout
from meridian.proc import kernel_dev
from meridian.tools.biolat.model import KIND_LATENCY, Options, Snapshot
from meridian.tools.biolat.views import report_text

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
