"""memlat's exported series."""

from __future__ import annotations

from ...export import Family, Point
from ...latency.metrics import Attrs, hist_point, process_attrs
from ...report_loop import duration_family
from .model import KINDS, Options, Snapshot

__all__ = ["series"]


def series(snap: Snapshot, opts: Options) -> list[Family]:
    """The exported families (cumulative since attach): fault counts and latency
    histograms per type (`system.paging.type`), and per process with -P."""
    faults = Family("system.paging.faults", "counter", "{fault}", "Page faults handled")
    dur = duration_family(
        "system.paging.fault.duration",
        "Page-fault handling latency ("
        + ("handle_mm_fault's entry" if opts.start == "handle_mm_fault" else "exception")
        + " to the end of handle_mm_fault)",
    )
    tail = Family(
        "meridian.memlat.tail",
        "counter",
        "{fault}",
        f"Faults at or above the tail threshold ({opts.threshold_us:g} us)",
    )
    lost = Family(
        "meridian.memlat.lost", "counter", "{fault}", "Faults not in the histograms, by reason"
    )
    for (pid, kind, comm), c in sorted(snap.cells.items()):
        a: Attrs = {"system.paging.type": KINDS[kind]}
        if opts.per_process:
            a = {**process_attrs(pid, comm), **a}
        faults.points.append(Point(a, c.count))
        tail.points.append(Point(a, c.tail))
        dur.points.append(hist_point(a, c, opts.unit_ns))
    for reason, n in snap.lost().items():
        lost.points.append(Point({"reason": reason}, n))
    return [faults, dur, tail, lost]
