"""meridian io's summary at the end: per process and op, as JSON objects or a table,
with the block requests per submitting process and what was lost."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TextIO

from ...hist import Hist
from ...output import JsonWriter, fmt_bytes, print_table
from .block import BlockStats
from .model import OPS, PidSummary
from .writeback import WritebackStats

__all__ = ["NOT_LOSSES", "losses", "report"]

LATENCY = ["P50(us)", "P99(us)", "MAX(us)"]
PIDS_HEADER = ["COMM", "PID", "OP", "OPS", "BYTES", "THROUGHPUT", *LATENCY, "HIT"]
BLOCK_HEADER = ["COMM", "PID", "OP", "REQUESTS", "BYTES", *LATENCY]
WRITEBACK_HEADER = ["COMM", "PID", "DEVICE", "REQUESTS", "BYTES", *LATENCY]
# Counters that are no loss: nothing was dropped, there was only nobody to charge. Shown
# apart, each with one line that says what it is, so a first run's writeback of pages
# dirtied before the tool started does not read as lost data.
NOT_LOSSES = {
    "wb_unattributed": "block writes of pages dirtied before tracing started or by the "
    "kernel itself (no process to charge them to; not a loss)",
    "failed": "read and write calls that returned an error (not in the table)",
}


def losses(counters: dict[str, int]) -> dict[str, int]:
    """The counters that are real losses (records or operations not counted), non-zero."""
    return {k: v for k, v in counters.items() if v and k not in NOT_LOSSES}


def _latency_us(hist: Hist, max_ns: int) -> list[str]:
    """p50, p99 and max in microseconds."""
    p50, p99 = (hist.percentile(q) for q in (0.5, 0.99))
    return [f"{p50 / 1e3:.1f}", f"{p99 / 1e3:.1f}", f"{max_ns / 1e3:.1f}"]


def report(
    pids: Iterable[PidSummary],
    counters: dict[str, int],
    seconds: float,
    as_json: bool,
    out: TextIO,
    rolling: dict[int, dict[str, Any]] | None = None,
    block: list[BlockStats] | None = None,
    writeback: list[WritebackStats] | None = None,
    container: Callable[[int], dict[str, str]] | None = None,
) -> None:
    """The per-PID summary; `rolling` (PidTable.rolling()) adds each live process's
    1 s / 10 s / 60 s throughput per op to the JSON objects; `block` the device
    requests per submitting process (block.py); `writeback` the write requests issued
    on behalf of the process that dirtied the pages (writeback.py); `container` each
    process's container attributes by its cgroup id (Containers.attrs)."""
    if as_json:
        w = JsonWriter(out)
        for ps in pids:
            d = ps.as_dict(seconds, container(ps.cgroup_id) if container else None)
            for op, windows in (rolling or {}).get(ps.pid, {}).items():
                if op in d:
                    d[op]["rolling"] = windows
            w.write(d)
        for b in block or []:
            w.write(b.as_dict())
        for wb in writeback or []:
            w.write(wb.as_dict())
        w.write({"type": "lost", "seconds": round(seconds, 6), **counters})
        return
    rows = []
    for ps in pids:
        for op in OPS:
            t = ps.total(op)
            if not t.ops:
                continue
            rate = fmt_bytes(t.bytes / seconds) + "/s" if seconds > 0 else "-"
            hit = f"{100 * (ps.hit_ratio(op) or 0):.1f}%"
            latency = _latency_us(t.hist, t.latency_max_ns)
            rows.append(
                [ps.comm, str(ps.pid), op, str(t.ops), fmt_bytes(t.bytes), rate, *latency, hit]
            )
    print(file=out)
    print_table(PIDS_HEADER, rows, out)
    if block:
        print(
            "\nblock requests by submitting process (device latency, issue to completion):",
            file=out,
        )
        print_table(
            BLOCK_HEADER,
            [
                [
                    *(b.comm, str(b.pid), b.op, str(b.requests), fmt_bytes(b.bytes)),
                    *_latency_us(b.hist, b.latency_max_ns),
                ]
                for b in block
            ],
            out,
        )
    if writeback:
        print("\nwritten back on behalf of (the process that dirtied the pages):", file=out)
        print_table(
            WRITEBACK_HEADER,
            [
                [
                    *(wb.comm, str(wb.pid), wb.device, str(wb.block.requests)),
                    fmt_bytes(wb.block.bytes),
                    *_latency_us(wb.block.hist, wb.block.latency_max_ns),
                ]
                for wb in writeback
            ],
            out,
        )
    for key, what in NOT_LOSSES.items():
        if counters.get(key):
            print(f"{key}={counters[key]}: {what}", file=out)
    lost = losses(counters)
    if lost:
        print("lost: " + ", ".join(f"{k}={v}" for k, v in lost.items()), file=out)
