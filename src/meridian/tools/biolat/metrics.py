"""biolat's exported series."""

from __future__ import annotations

from ...export import Family, HistPoint, Point
from ...report_loop import duration_family
from .model import (
    INFO_COUNTERS,
    KIND_LATENCY,
    KIND_QUEUE,
    Options,
    Snapshot,
    depth_rows,
    disk_name,
    group,
    merged,
    op_name,
)

__all__ = ["series"]


def series(snap: Snapshot, opts: Options) -> list[Family]:
    """The exported families (cumulative since attach), per device and op, after the
    semantic conventions' `system.disk.*` metrics, plus the latency histograms."""
    nbytes = Family("system.disk.io", "counter", "By", "Bytes transferred by block requests")
    ops = Family("system.disk.operations", "counter", "{operation}", "Block requests completed")
    optime = Family(
        "system.disk.operation_time", "counter", "s", "Sum of the time each request took"
    )
    lat = duration_family(
        "system.disk.operation.duration",
        "Block request latency (issue, or insert with -Q, to completion)",
    )
    queue = duration_family("system.disk.queue.duration", "Time requests waited in the OS queue")
    lost = Family("meridian.biolat.lost", "counter", "{request}", "Requests not counted, by reason")
    for kind, fam in ((KIND_LATENCY, lat), (KIND_QUEUE, queue)):
        for (dev, op), cells in group(snap, kind, True).items():
            a: dict[str, str | int | bool] = {
                "system.device": disk_name(dev),
                "disk.io.direction": op_name(op),
            }
            h = merged(cells, opts.unit, opts.unit_ns)
            total = sum(c.sum_ns for _, c in cells)
            top = max(c.max_ns for _, c in cells)
            low = min((c.min_ns for _, c in cells if c.min_ns), default=0)
            fam.points.append(
                HistPoint(
                    a, h.slots, opts.unit_ns * 1e-9, total / 1e9, top / 1e9, low / 1e9 or None
                )
            )
            if kind == KIND_LATENCY:
                nbytes.points.append(Point(a, sum(c.bytes for _, c in cells)))
                ops.points.append(Point(a, h.total))
                optime.points.append(Point(a, total / 1e9))
    for reason, n in snap.counters.items():
        if reason not in INFO_COUNTERS:
            lost.points.append(Point({"reason": reason}, n))
    return [nbytes, ops, optime, lat, queue, lost, *depth_series(snap, opts)]


def depth_series(snap: Snapshot, opts: Options) -> list[Family]:
    """With --depth (exercise 4): the requests in flight on each disk at each issue, as
    a log2 histogram of counts (scale 1: the bounds are requests, not seconds), and
    those in flight now (issued since attach, not completed); the time with a request
    in flight (the semantic conventions' system.disk.io_time, iostat's %util over an
    interval); the queue's size; the latency by the depth at issue."""
    if not opts.depth:
        return []
    depth = Family(
        "meridian.biolat.queue.depth",
        "histogram",
        "{request}",
        "Requests in flight on the disk when each request was issued (itself included)",
    )
    inflight = Family(
        "meridian.biolat.inflight",
        "gauge",
        "{request}",
        "Requests issued since attach and not completed yet",
    )
    io_time = Family("system.disk.io_time", "counter", "s", "Time the disk had a request in flight")
    limit = Family(
        "meridian.biolat.queue.limit",
        "gauge",
        "{request}",
        "What the disk's queue holds per hardware queue (sysfs): nr_requests, hardware",
    )
    at_depth = duration_family(
        "meridian.biolat.operation.duration_by_depth",
        "Block request latency by the requests in flight at its issue (log2 ranges)",
    )
    for dev, info in depth_rows(snap, opts).items():
        a = {"system.device": disk_name(dev)}
        depth.points.append(HistPoint(a, info["hist"].slots, 1.0, info["sum"], info["max"]))
        inflight.points.append(Point(a, info["inflight"]))
        io_time.points.append(Point(a, info["busy_ns"] / 1e9))
        for name in ("nr_requests", "hw_queue_depth"):
            if name in info:
                limit.points.append(Point({**a, "limit": name}, info[name]))
        for d in info["latency_by_depth"]:
            low, high = d.depths
            da = {**a, "meridian.biolat.depth": f"{low}" if low == high else f"{low}-{high}"}
            scale = opts.unit_ns * 1e-9
            at_depth.points.append(
                HistPoint(da, d.hist.slots, scale, d.sum_ns / 1e9, d.max_ns / 1e9)
            )
    return [depth, inflight, io_time, limit, at_depth]
