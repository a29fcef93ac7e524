"""runqlat's exported series."""

from __future__ import annotations

from ...export import Family, Point
from ...latency.metrics import Attrs, hist_point, process_attrs
from ...report_loop import duration_family
from .model import Options, Snapshot
from .views import LOST

__all__ = ["series"]


def series(snap: Snapshot, opts: Options) -> list[Family]:
    """The exported families (cumulative since attach): the run-queue latency
    histogram, per process with -P."""
    dur = duration_family(
        "system.runqueue.duration",
        "Run-queue latency: wake-up or preemption until the task runs",
    )
    lost = Family(
        "meridian.runqlat.lost", "counter", "{event}", "Waits not in the histograms, by reason"
    )
    for (pid, comm), c in sorted(snap.cells.items()):
        a: Attrs = process_attrs(pid, comm) if opts.per_process else {}
        dur.points.append(hist_point(a, c, opts.unit_ns))
    for reason in LOST if opts.pids else LOST[:1]:  # pids_full: only -p counts any
        lost.points.append(Point({"reason": reason}, snap.counters.get(reason, 0)))
    return [dur, lost]
