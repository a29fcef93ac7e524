"""biolat's slow-request records (exercise 3): decoded from the ring buffer, one dict
each, and their text line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, TextIO

import numpy as np

from ... import proc
from ...output import JsonWriter, iso_now
from .model import op_name

__all__ = ["SLOW_HEADER", "print_slow", "slow_line", "slow_records"]

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


def print_slow(recs: np.ndarray[Any, Any], out: TextIO, json_out: JsonWriter | None) -> None:
    if not len(recs):
        return
    for r in slow_records(recs):
        if json_out:
            json_out.write(r)
        else:
            print(slow_line(r), file=out)
    out.flush()
