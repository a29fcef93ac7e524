"""biolat's reports: latency histograms per op (and disk with -D), queued time (-Q),
request sizes (--sizes), queue depth (--depth) and a table per disk and op; in JSON
all of them, per device and op."""

from __future__ import annotations

import time
from typing import Any, TextIO

from ...hist import slot_bounds
from ...output import fmt_bytes, iso_now, print_table
from .model import (
    INFO_COUNTERS,
    KIND_LATENCY,
    KIND_QUEUE,
    Groups,
    Options,
    Snapshot,
    depth_rows,
    dev_numbers,
    device_rows,
    disk_name,
    group,
    merged,
    op_name,
    sizes_of,
)

__all__ = ["report_json", "report_text"]


def report_json(snap: Snapshot, opts: Options) -> dict[str, Any]:
    out: dict[str, Any] = {
        "time": iso_now(),
        "interval_s": round(snap.seconds, 6),
        "unit": opts.unit,
    }
    devices = []
    size_groups = group(snap, KIND_LATENCY, opts.per_disk)
    queue_groups = group(snap, KIND_QUEUE, opts.per_disk)
    for row, ((dev, op), cells) in zip(device_rows(snap, opts), size_groups.items(), strict=True):
        d = row.as_dict()
        d["sizes"] = sizes_of(snap, dev, op).to_json()
        d["latency_by_size"] = [
            {
                "size_low": slot_bounds(slot)[0],
                "size_high": slot_bounds(slot)[1],
                "count": c.count,
                "latency_avg_ns": c.sum_ns // c.count,
                "latency": c.hist(opts.unit, opts.unit_ns).to_json(),
            }
            for slot, c in cells
        ]
        if (dev, op) in queue_groups:
            d["queue"] = merged(queue_groups[(dev, op)], opts.unit, opts.unit_ns).to_json()
        devices.append(d)
    out["devices"] = devices
    out["depth"] = [
        {
            "disk": disk_name(dev),
            **info,
            "hist": info["hist"].to_json(),
            "latency_by_depth": [d.as_dict() for d in info["latency_by_depth"]],
        }
        for dev, info in depth_rows(snap, opts).items()
    ]
    out["lost"] = {k: v for k, v in snap.counters.items() if k not in INFO_COUNTERS}
    out["requeued"] = snap.counters.get("requeued", 0)
    return out


def _disk(dev: int | None) -> str:
    """The disk's name with its major:minor, as iostat and lsblk show them."""
    name = disk_name(dev)
    if dev is None or name == dev_numbers(dev):  # no name in /sys: the numbers alone
        return name
    return f"{name} ({dev_numbers(dev)})"


def _head(dev: int | None, op: int, opts: Options) -> str:
    disk = f"disk = {_disk(dev)}, " if opts.per_disk else ""
    return f"\n{disk}op = {op_name(op)}"


def report_text(snap: Snapshot, opts: Options, out: TextIO) -> None:
    if opts.timestamps:
        print(time.strftime("%H:%M:%S"), file=out)
    groups = group(snap, KIND_LATENCY, opts.per_disk)
    if not groups:
        print("no block I/O completed in this interval", file=out)
    for (dev, op), cells in groups.items():
        print(_head(dev, op, opts), file=out)
        print(merged(cells, opts.unit, opts.unit_ns).render(percent=True), file=out)
    if opts.queued:
        for (dev, op), cells in group(snap, KIND_QUEUE, opts.per_disk).items():
            print(f"{_head(dev, op, opts)}, queued (insert to issue)", file=out)
            print(merged(cells, opts.unit, opts.unit_ns).render(percent=True), file=out)
    if opts.sizes:
        _sizes_text(snap, groups, opts, out)
    if opts.depth:
        _depth_text(snap, opts, out)
    _stats_text(snap, opts, out)
    lost = {k: v for k, v in snap.counters.items() if v and k not in INFO_COUNTERS}
    if lost:
        print(
            "lost: " + ", ".join(f"{k}={v}" for k, v in lost.items()) + _lost_hint(lost), file=out
        )
    if snap.counters.get("requeued"):
        print(f"requeued after issue: {snap.counters['requeued']}", file=out)


def _lost_hint(lost: dict[str, int]) -> str:
    if set(lost) == {"unmatched"}:
        return " (completions of requests issued before tracing started)"
    return ""


def _sizes_text(snap: Snapshot, groups: Groups, opts: Options, out: TextIO) -> None:
    for (dev, op), cells in groups.items():
        count = sum(c.count for _, c in cells)
        avg = sum(c.bytes for _, c in cells) / count if count else 0
        sizes = sizes_of(snap, dev, op)
        print(f"{_head(dev, op, opts)}, request sizes (avg {fmt_bytes(avg)})", file=out)
        print(sizes.render("bytes"), file=out)
        uncounted = ""
        if sizes.not_counted:
            uncounted = f" ({sizes.not_counted} not counted: size map full)"
        print(
            f"sizes exact: p50 {sizes.percentile(0.5):.0f} bytes, "
            f"p99 {sizes.percentile(0.99):.0f} bytes{uncounted}",
            file=out,
        )
        rows = []
        for slot, c in cells:
            h = c.hist(opts.unit, opts.unit_ns)
            rows.append(
                [
                    fmt_bytes(slot_bounds(slot)[0]),
                    str(c.count),
                    f"{c.sum_ns / c.count / opts.unit_ns:.1f}",
                    f"{h.percentile(0.5):.0f}",
                    f"{h.percentile(0.99):.0f}",
                ]
            )
        u = "ms" if opts.millis else "us"
        print_table(["SIZE>=", "COUNT", f"AVG({u})", f"P50({u})", f"P99({u})"], rows, out)


def _depth_text(snap: Snapshot, opts: Options, out: TextIO) -> None:
    """Per disk: the depth at each issue, against the queue's size; the utilization;
    the latency by the depth at issue."""
    u = "ms" if opts.millis else "us"
    for dev, info in depth_rows(snap, opts).items():
        print(
            f"\ndisk = {_disk(dev)}, queue depth at issue "
            f"(now {info['inflight']}, max {info['max']}, avg {info['avg']})",
            file=out,
        )
        print(info["hist"].render("depth"), file=out)
        util = info["utilization"]
        busy = "-" if util is None else f"{100 * util:.1f}%"
        print(f"utilization {busy} (time with a request in flight){_limits(info)}", file=out)
        rows = [
            [
                f"{d.depths[0]}" if d.depths[0] == d.depths[1] else f"{d.depths[0]}-{d.depths[1]}",
                str(d.hist.total),
                f"{d.sum_ns / d.hist.total / opts.unit_ns:.1f}",
                f"{d.hist.percentile(0.5):.0f}",
                f"{d.hist.percentile(0.99):.0f}",
                f"{d.max_ns / opts.unit_ns:.1f}",
            ]
            for d in info["latency_by_depth"]
            if d.hist.total
        ]
        if rows:
            print("latency by queue depth at issue:", file=out)
            print_table(
                ["DEPTH", "COUNT", f"AVG({u})", f"P50({u})", f"P99({u})", f"MAX({u})"], rows, out
            )


def _limits(info: dict[str, Any]) -> str:
    """What the queue can hold, as sysfs says: ', of nr_requests 128, hardware 1 x 128'."""
    parts = []
    if "nr_requests" in info:
        parts.append(f"nr_requests {info['nr_requests']}")
    if "hw_queue_depth" in info:
        queues = info.get("hw_queues", 1)
        parts.append(f"hardware queue depth {queues} x {info['hw_queue_depth']}")
    return f"; queue size: {', '.join(parts)}" if parts else ""


def _stats_text(snap: Snapshot, opts: Options, out: TextIO) -> None:
    rows = device_rows(snap, opts)
    if not rows:
        return
    u = "ms" if opts.millis else "us"
    table = []
    for r in rows:
        table.append(
            [
                r.disk,
                r.dev or "-",
                r.op,
                str(r.count),
                f"{r.count / r.seconds:.1f}" if r.seconds else "-",
                f"{r.bytes / r.seconds / 1e6:.2f}" if r.seconds else "-",
                fmt_bytes(r.bytes / r.count if r.count else 0),
                f"{r.sum_ns / r.count / opts.unit_ns:.1f}" if r.count else "-",
                f"{r.hist.percentile(0.5):.0f}",
                f"{r.hist.percentile(0.99):.0f}",
                f"{r.hist.hi:.0f}" if r.hist.hi is not None else "-",
            ]
        )
    print(file=out)
    head = ["DISK", "MAJ:MIN", "OP", "COUNT", "IOPS", "MB/s", "AVG_SIZE", f"AVG({u})"]
    print_table([*head, f"P50({u})", f"P99({u})", f"MAX({u})"], table, out)
