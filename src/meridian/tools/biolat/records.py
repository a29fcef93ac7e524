"""biolat's slow-request records (exercise 3): decoded from the ring buffer, one dict
each, their text line, and (--otlp-logs) an OTLP log record each, whose body is the
JSON object and whose attributes follow the semantic conventions where they exist."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from ... import proc
from ...output import JsonWriter, dumps, iso_now
from .model import op_name

if TYPE_CHECKING:
    from ...export.logs import OtlpLogs
    from ...export.wire import Column

__all__ = ["LOG_ATTRS", "SLOW_HEADER", "print_slow", "slow_line", "slow_records"]

# Slow-request fields -> OTLP log attributes: strings, then integers.
LOG_ATTRS = (
    ("disk", "system.device"),
    ("dev", "meridian.biolat.dev"),
    ("op", "disk.io.direction"),
    ("rwbs", "meridian.biolat.rwbs"),
    ("comm", "process.executable.name"),
    ("pid", "process.pid"),
    ("sector", "meridian.biolat.sector"),
    ("bytes", "meridian.biolat.bytes"),
    ("latency_ns", "meridian.biolat.latency_ns"),
    ("queue_ns", "meridian.biolat.queue_ns"),
    ("error", "meridian.biolat.error"),
)

SLOW_HEADER = (
    f"{'TIME':<15} {'COMM':<16} {'PID':>7} {'DISK':<8} {'T':<4} "
    f"{'SECTOR':>12} {'BYTES':>8} {'LAT(ms)':>9}"
)


def slow_records(events: np.ndarray[Any, Any]) -> Iterator[dict[str, Any]]:
    """One dict per slow request, in the order the kernel completed them."""
    offset = time.time_ns() - time.monotonic_ns()
    for e in events:
        dev = int(e["dev"])
        yield {
            "event": "slow_io",
            "wall_time": iso_now(int(e["ts_ns"]) + offset),
            "timestamp_ns": int(e["ts_ns"]),
            "disk": proc.device_name(dev),
            "dev": f"{proc.dev_major(dev)}:{proc.dev_minor(dev)}",
            "op": op_name(int(e["op"])),
            "rwbs": e["rwbs"].decode(errors="replace"),
            "sector": int(e["sector"]),
            "bytes": int(e["bytes"]),
            "latency_ns": int(e["latency_ns"]),
            "queue_ns": int(e["queue_ns"]),
            "pid": int(e["pid"]),
            "comm": e["comm"].decode(errors="replace"),
            "error": int(e["error"]),
        }


def slow_line(r: dict[str, Any]) -> str:
    return (
        f"{r['wall_time'][11:26]:<15} {r['comm']:<16} {r['pid']:>7} {r['disk']:<8} "
        f"{r['rwbs']:<4} {r['sector']:>12} {r['bytes']:>8} {r['latency_ns'] / 1e6:>9.3f}"
    )


def print_slow(
    recs: np.ndarray[Any, Any],
    out: TextIO,
    json_out: JsonWriter | None,
    logs: OtlpLogs | None = None,
) -> None:
    """Each slow request as a line (or JSON object), and as an OTLP log record."""
    if not len(recs):
        return
    records = list(slow_records(recs))
    for r in records:
        if json_out:
            json_out.write(r)
        else:
            print(slow_line(r), file=out)
    out.flush()
    if logs is not None:
        emit_logs(logs, records, time.time_ns() - time.monotonic_ns())


def emit_logs(logs: OtlpLogs, records: list[dict[str, Any]], offset_ns: int) -> None:
    """The records as log records timed at their completion (`offset_ns`: Unix time
    minus CLOCK_MONOTONIC, the records' clock)."""
    bodies = [dumps(r).encode() for r in records]
    time_ns = np.array([r["timestamp_ns"] + offset_ns for r in records], np.int64)
    attrs: list[tuple[str, Column]] = []
    for field, name in LOG_ATTRS:
        values = [r[field] for r in records]
        if isinstance(values[0], str):
            attrs.append((name, values))
        else:
            attrs.append((name, np.array(values, np.int64)))
    logs.emit(bodies, time_ns, attrs)
