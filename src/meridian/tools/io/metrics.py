"""The metrics of `meridian io` for the exporters, per PID and direction, named after
the OpenTelemetry semantic conventions (`process.disk.io` and its neighbours).

`io_series()` is the one place that decides what is exported; it reads per-PID
summaries (`summarize()` over the kernel's per-(PID, op, cached) aggregate map, read on
each collection; processes the PID table retired are already deleted from that map).
With more than `--metrics-max-pids N` processes (default 100, `capped()`) the N-1
processes with the most bytes keep series of their own and the rest are summed into
one group whose `process.pid` and `process.executable.name` are `other`: a scrape
holds at most N groups however many processes run (the table's `--max-pids`, with its
per-command rows, is for people; this is for a time-series store).

| OpenTelemetry name                  | Prometheus name                               | attributes |
| ----------------------------------- | --------------------------------------------- | ---------- |
| process.disk.io (By)                | process_disk_io_bytes_total                   | P, D, W    |
| process.disk.operations             | process_disk_operations_total                 | P, D, C, I |
| process.disk.operation.duration (s) | process_disk_operation_duration_seconds       | P, D, C, I |
| process.disk.device.io (By)         | process_disk_device_io_bytes_total            | P, D       |
| process.disk.io_wait (s)            | process_disk_io_wait_seconds_total            | P, D       |
| process.disk.cache.hit_ratio (1)    | process_disk_cache_hit_ratio                  | P, D       |
| process.disk.io.first_time (s)      | process_disk_io_first_time_seconds            | P, D       |
| process.disk.io.last_time (s)       | process_disk_io_last_time_seconds             | P, D       |
| meridian.io.lost                    | meridian_io_lost_total                        | reason     |
| meridian.block.requests             | meridian_block_requests_total                 | P, D       |
| meridian.block.io (By)              | meridian_block_io_bytes_total                 | P, D       |
| meridian.block.request.duration (s) | meridian_block_request_duration_seconds       | P, D       |

P: process.pid, process.executable.name, and for a process in a container its
container.id, container.runtime and k8s.pod.uid (from its cgroup), its container.name,
container.image.name, k8s.pod.name, k8s.namespace.name and k8s.container.name (from the
runtime's files, where readable: containers.py);
D: disk.io.direction (read, write);
C: meridian.io.cached (true: served by the page cache); I: meridian.io.interface
(syscall, or io_uring: submitted through an io_uring ring); W: meridian.io.writeback (true:
bytes written back to disk for pages the process dirtied, charged to it, not the
flusher). The block families count device requests by the process that submitted them
(block.py, `block_series()`). First and last times are Unix times in seconds; latency
buckets are the kernel's log2 nanosecond slots (its log-linear buckets summed), with
the exact sum, min and max.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...export.series import Attrs, Family, HistPoint, Point, Source
from ...hist import Log2Hist
from ...report_loop import duration_family
from .block import BlockStats, capped_block, summarize_block
from .model import OPS, PidSummary, summarize, summarize_processes
from .writeback import by_process, summarize_writeback

if TYPE_CHECKING:
    from .kernel import FileIO

__all__ = [
    "OTHER",
    "block_series",
    "capped",
    "io_series",
    "io_source",
    "series_of",
    "snapshot_groups",
]

OTHER = "other"
OTHER_ATTRS: dict[str, str | int | bool] = {"process.pid": OTHER, "process.executable.name": OTHER}


Group = tuple[dict[str, str | int | bool], PidSummary]  # series attributes, what they sum


def latency_point(attrs: Attrs, hist: Log2Hist, sum_ns: int, max_ns: int) -> HistPoint:
    """A latency histogram of the kernel's log2 nanosecond slots, in seconds."""
    low = None if hist.lo is None else hist.lo / 1e9
    return HistPoint(attrs, hist.slots, 1e-9, sum_ns / 1e9, max_ns / 1e9, low)


def capped(
    pids: Mapping[int, PidSummary],
    max_series: int | None,
    container: Callable[[int], dict[str, str]] | None = None,
) -> list[Group]:
    """(attributes, summary) per series group: one per process, or with more than
    `max_series` processes the `max_series - 1` with the most cumulative bytes (so a
    steady process keeps its series) and one sum of the rest, `process.pid` = "other".
    So a scrape never holds more groups than `max_series`, however many processes.
    `container`: a process's container attributes by its cgroup id (Containers.attrs)."""
    ranked = sorted(pids.values(), key=lambda ps: (-ps.total().bytes, ps.pid))

    def own(ps: PidSummary) -> Group:
        attrs: dict[str, str | int | bool] = {"process.pid": ps.pid}
        attrs["process.executable.name"] = ps.comm
        if container is not None:
            attrs.update(container(ps.cgroup_id))
        return attrs, ps

    if max_series is None or len(ranked) <= max_series:
        return [own(ps) for ps in ranked]
    keep = max_series - 1
    other = PidSummary(0, OTHER)
    for ps in ranked[keep:]:
        other.merge(ps)
    return [*(own(ps) for ps in ranked[:keep]), (dict(OTHER_ATTRS), other)]


def snapshot_groups(
    keys: np.ndarray[Any, Any],
    vals: np.ndarray[Any, Any],
    max_series: int | None,
    container: Callable[[int], dict[str, str]] | None = None,
) -> list[Group]:
    """`capped(summarize(keys, vals), max_series)` straight from the aggregate map's
    snapshot: processes are ranked with numpy, only the kept ones become summaries,
    and the rest are summed per (op, cached) cell by treating all their rows as the
    CPUs of one key (summarize sums over CPUs), so a scrape of 1,000 processes costs
    about what one of `max_series` does."""
    n = len(keys)
    if not n:
        return []
    pid = keys["pid"].astype(np.int64)
    start = keys["start"].astype(np.int64)
    uniq, inv = np.unique(pid, return_inverse=True)
    inv = inv.reshape(-1)
    newest = np.full(len(uniq), -1, dtype=np.int64)
    np.maximum.at(newest, inv, start)
    live = start == newest[inv]  # the newest process of each PID, as summarize() keeps
    if max_series is None or len(uniq) <= max_series:
        return capped(summarize(keys, vals), max_series, container)
    rows = vals.reshape(n, -1)
    per_key = rows["bytes"].sum(axis=1).astype(np.int64)
    per_pid = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(per_pid, inv[live], per_key[live])
    keep = uniq[np.lexsort((uniq, -per_pid))[: max_series - 1]]
    kept = live & np.isin(pid, keep)
    groups = capped(summarize(keys[kept], vals[kept]), None, container)
    other = PidSummary(0, OTHER)
    rest = live & ~kept
    cells = zip(keys["op"][rest].tolist(), keys["cached"][rest].tolist(), strict=True)
    for op, cached in set(cells):
        m = rest & (keys["op"] == op) & (keys["cached"] == cached)
        for ps in summarize_processes(keys[m][:1], rows[m].reshape(1, -1)).values():
            other.merge(ps)
    return [*groups, (dict(OTHER_ATTRS), other)]


def io_series(
    pids: Mapping[int, PidSummary],
    lost: Mapping[str, int],
    mono_to_unix_ns: int,
    max_series: int | None = None,
) -> list[Family]:
    """The exported families for these per-PID summaries and drop counters."""
    return series_of(capped(pids, max_series), lost, mono_to_unix_ns)


def series_of(
    groups: list[Group],
    lost: Mapping[str, int],
    mono_to_unix_ns: int,
    writeback: Sequence[BlockStats] = (),
) -> list[Family]:
    """The exported families of these series groups (`capped`, `snapshot_groups`), and
    in `process.disk.io` with `meridian.io.writeback` true the bytes written back on
    behalf of each process (`writeback`, per process and op, summed over devices)."""
    nbytes = Family(
        "process.disk.io",
        "counter",
        "By",
        "Bytes read and written on regular files; meridian.io.writeback=true: bytes the "
        "kernel wrote back to disk for pages the process dirtied",
    )
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
    for proc, ps in groups:
        for op in OPS:
            t = ps.total(op)
            if not t.ops:
                continue
            pd: dict[str, str | int | bool] = {**proc, "disk.io.direction": op}
            nbytes.points.append(Point({**pd, "meridian.io.writeback": False}, t.bytes))
            device.points.append(Point(pd, t.disk_bytes))
            wait.points.append(Point(pd, t.io_wait_ns / 1e9))
            ratio.points.append(Point(pd, ps.hit_ratio(op) or 0.0))
            first.points.append(Point(pd, (t.first_ns + mono_to_unix_ns) / 1e9))
            last.points.append(Point(pd, (t.last_ns + mono_to_unix_ns) / 1e9))
            for (o, cached, via), s in sorted(ps.cells.items()):
                if o != op or not s.ops:
                    continue
                pdc: dict[str, str | int | bool] = {
                    **pd,
                    "meridian.io.cached": cached,
                    "meridian.io.interface": via,
                }
                ops.points.append(Point(pdc, s.ops))
                lat.points.append(latency_point(pdc, s.hist, s.latency_sum_ns, s.latency_max_ns))
    for b in writeback:
        nbytes.points.append(Point(block_attrs(b, True), b.bytes))
    for reason, n in lost.items():
        lost_f.points.append(Point({"reason": reason}, n))
    return [nbytes, ops, lat, device, wait, ratio, first, last, lost_f]


def block_attrs(b: BlockStats, writeback: bool) -> dict[str, str | int | bool]:
    """A block entry's series attributes (pid 0: the `other` group)."""
    return {
        "process.pid": b.pid or OTHER,
        "process.executable.name": b.comm,
        "disk.io.direction": b.op,
        "meridian.io.writeback": writeback,
    }


def block_series(
    stats: list[BlockStats], max_series: int | None = None, writeback: Sequence[BlockStats] = ()
) -> list[Family]:
    """Device requests per submitting process, and (`meridian.io.writeback` true) those
    written back on behalf of the process that dirtied the pages (writeback.py, summed
    over devices). No semantic convention covers them, so the names are Meridian's; the
    attributes are the conventional ones."""
    reqs = Family(
        "meridian.block.requests", "counter", "{request}", "Block requests by submitting process"
    )
    nbytes = Family("meridian.block.io", "counter", "By", "Bytes of block requests by process")
    lat = duration_family(
        "meridian.block.request.duration", "Device latency of block requests, issue to completion"
    )
    if max_series is not None and len({b.pid for b in stats}) > max_series:
        stats = capped_block(stats, max_series - 1)  # and one `other` group
    if max_series is not None and len({b.pid for b in writeback}) > max_series:
        writeback = capped_block(list(writeback), max_series - 1)
    for b, wb in [*((b, False) for b in stats), *((b, True) for b in writeback)]:
        attrs = block_attrs(b, wb)
        reqs.points.append(Point(attrs, b.requests))
        nbytes.points.append(Point(attrs, b.bytes))
        lat.points.append(latency_point(attrs, b.hist, b.latency_sum_ns, b.latency_max_ns))
    return [reqs, nbytes, lat]


def io_source(tool: FileIO, max_series: int | None = None) -> Source:
    """A `Source` over a running `FileIO`: the kernel maps are read on each call."""
    offset = time.time_ns() - time.monotonic_ns()

    def source() -> list[Family]:
        groups = snapshot_groups(*tool.stats(), max_series, tool.containers.attrs)
        wb = by_process(summarize_writeback(*tool.writeback_stats()))
        if max_series is not None and len({b.pid for b in wb}) > max_series:
            wb = capped_block(list(wb), max_series - 1)
        files = series_of(groups, tool.counters(), offset, wb)
        return files + block_series(summarize_block(*tool.disk_stats()), max_series, wb)

    return source
