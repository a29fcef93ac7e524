"""The metrics of `meridian io` for the exporters, per PID and direction, named after
the OpenTelemetry semantic conventions (`process.disk.io` and its neighbours).

`io_series()` is the one place that decides what is exported; it reads per-PID
summaries (`summarize()` over the kernel's per-(PID, op, cached) aggregate map, read on
each collection; processes the PID table retired are already deleted from that map).
With `--max-pids N` (`capped()`) the N processes with the most bytes keep series of
their own, the others are summed per command name (no `process.pid` attribute, at most
N of those) and the rest into one series with `process.executable.name` = `other`.

| OpenTelemetry name                  | Prometheus name                               | attributes |
| ----------------------------------- | --------------------------------------------- | ---------- |
| process.disk.io (By)                | process_disk_io_bytes_total                   | P, D       |
| process.disk.operations             | process_disk_operations_total                 | P, D, C    |
| process.disk.operation.duration (s) | process_disk_operation_duration_seconds       | P, D, C    |
| process.disk.device.io (By)         | process_disk_device_io_bytes_total            | P, D       |
| process.disk.io_wait (s)            | process_disk_io_wait_seconds_total            | P, D       |
| process.disk.cache.hit_ratio (1)    | process_disk_cache_hit_ratio                  | P, D       |
| process.disk.io.first_time (s)      | process_disk_io_first_time_seconds            | P, D       |
| process.disk.io.last_time (s)       | process_disk_io_last_time_seconds             | P, D       |
| meridian.io.lost                    | meridian_io_lost_total                        | reason     |
| meridian.block.requests             | meridian_block_requests_total                 | P, D       |
| meridian.block.io (By)              | meridian_block_io_bytes_total                 | P, D       |
| meridian.block.request.duration (s) | meridian_block_request_duration_seconds       | P, D       |

P: process.pid, process.executable.name; D: disk.io.direction (read, write);
C: meridian.io.cached (true: served by the page cache). The block families count
device requests by the process that submitted them (block.py, `block_series()`). First and
last times are Unix times in seconds; latency buckets are the kernel's log2 nanosecond slots.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...export.series import Attrs, Family, HistPoint, Point, Source
from ...hist import Log2Hist
from ...reporting import duration_family
from .block import BlockStats, capped_block, summarize_block
from .model import OPS, PidSummary, summarize

if TYPE_CHECKING:
    from .kernel import FileIO

__all__ = ["block_series", "capped", "io_series", "io_source"]


def latency_point(attrs: Attrs, hist: Log2Hist, sum_ns: int, max_ns: int) -> HistPoint:
    """A latency histogram of the kernel's log2 nanosecond slots, in seconds."""
    return HistPoint(attrs, hist.slots, 1e-9, sum_ns / 1e9, max_ns / 1e9)


def capped(
    pids: Mapping[int, PidSummary], max_series: int | None
) -> list[tuple[dict[str, str | int | bool], PidSummary]]:
    """(attributes, summary) per series: one per process, or capped as the module says.
    Ranked by cumulative bytes, so a steady process keeps its series."""
    ranked = sorted(pids.values(), key=lambda ps: (-ps.total().bytes, ps.pid))

    def own(ps: PidSummary) -> tuple[dict[str, str | int | bool], PidSummary]:
        return {"process.pid": ps.pid, "process.executable.name": ps.comm}, ps

    if max_series is None or len(ranked) <= max_series:
        return [own(ps) for ps in ranked]
    groups: dict[str, PidSummary] = {}
    for ps in ranked[max_series:]:
        groups.setdefault(ps.comm, PidSummary(0, ps.comm)).merge(ps)
    by_bytes = sorted(groups.values(), key=lambda g: (-g.total().bytes, g.comm))
    out = [own(ps) for ps in ranked[:max_series]]
    out += [({"process.executable.name": g.comm}, g) for g in by_bytes[:max_series]]
    if len(by_bytes) > max_series:
        other = PidSummary(0, "other")
        for g in by_bytes[max_series:]:
            other.merge(g)
        out.append(({"process.executable.name": "other"}, other))
    return out


def io_series(
    pids: Mapping[int, PidSummary],
    lost: Mapping[str, int],
    mono_to_unix_ns: int,
    max_series: int | None = None,
) -> list[Family]:
    """The exported families for these per-PID summaries and drop counters."""
    nbytes = Family("process.disk.io", "counter", "By", "Bytes read and written on regular files")
    ops = Family(
        "process.disk.operations",
        "counter",
        "{operation}",
        "Reads and writes on regular files, by page cache (cached) or disk",
    )
    lat = duration_family("process.disk.operation.duration", "Latency of reads and writes")
    device = Family(
        "process.disk.device.io", "counter", "By", "Bytes that came from or went to the device"
    )
    wait = Family("process.disk.io_wait", "counter", "s", "Time asleep in I/O wait in operations")
    ratio = Family(
        "process.disk.cache.hit_ratio", "gauge", "1", "Share of operations served by the page cache"
    )
    first = Family("process.disk.io.first_time", "gauge", "s", "Unix time of the first operation")
    last = Family("process.disk.io.last_time", "gauge", "s", "Unix time of the last operation")
    lost_f = Family("meridian.io.lost", "counter", "{record}", "Records dropped, by reason")
    for proc, ps in capped(pids, max_series):
        for op in OPS:
            t = ps.total(op)
            if not t.ops:
                continue
            pd: dict[str, str | int | bool] = {**proc, "disk.io.direction": op}
            nbytes.points.append(Point(pd, t.bytes))
            device.points.append(Point(pd, t.disk_bytes))
            wait.points.append(Point(pd, t.io_wait_ns / 1e9))
            ratio.points.append(Point(pd, ps.hit_ratio(op) or 0.0))
            first.points.append(Point(pd, (t.first_ns + mono_to_unix_ns) / 1e9))
            last.points.append(Point(pd, (t.last_ns + mono_to_unix_ns) / 1e9))
            for cached in (False, True):
                s = ps.cells.get((op, cached))
                if s is None or not s.ops:
                    continue
                pdc: dict[str, str | int | bool] = {**pd, "meridian.io.cached": cached}
                ops.points.append(Point(pdc, s.ops))
                lat.points.append(latency_point(pdc, s.hist, s.latency_sum_ns, s.latency_max_ns))
    for reason, n in lost.items():
        lost_f.points.append(Point({"reason": reason}, n))
    return [nbytes, ops, lat, device, wait, ratio, first, last, lost_f]


def block_series(stats: list[BlockStats], max_series: int | None = None) -> list[Family]:
    """Device requests per submitting process. No semantic convention covers them, so
    the names are Meridian's; the attributes are the conventional ones."""
    reqs = Family(
        "meridian.block.requests", "counter", "{request}", "Block requests by submitting process"
    )
    nbytes = Family("meridian.block.io", "counter", "By", "Bytes of block requests by process")
    lat = duration_family(
        "meridian.block.request.duration", "Device latency of block requests, issue to completion"
    )
    for b in capped_block(stats, max_series):
        attrs: dict[str, str | int | bool] = {
            "process.executable.name": b.comm,
            "disk.io.direction": b.op,
        }
        if b.pid:
            attrs["process.pid"] = b.pid
        reqs.points.append(Point(attrs, b.requests))
        nbytes.points.append(Point(attrs, b.bytes))
        lat.points.append(latency_point(attrs, b.hist, b.latency_sum_ns, b.latency_max_ns))
    return [reqs, nbytes, lat]


def io_source(tool: FileIO, max_series: int | None = None) -> Source:
    """A `Source` over a running `FileIO`: the kernel maps are read on each call."""
    offset = time.time_ns() - time.monotonic_ns()

    def source() -> list[Family]:
        files = io_series(summarize(*tool.stats()), tool.counters(), offset, max_series)
        return files + block_series(summarize_block(*tool.disk_stats()), max_series)

    return source
