"""`meridian io --top`: a live, iotop-like table of processes, redrawn every interval.

Drawn on meridian/screen.py's live screen (plain ANSI, no TUI library).
Every number comes from the PID table (`pid_table.py`), so from the exact kernel
aggregates: throughput over the last interval, operations in it, that interval's
latency percentiles and cache hit ratio. Ctrl-C (or --duration) restores the screen
and prints the usual per-PID summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from ...errors import UsageError
from ...hist import Hist
from ...output import fmt_bytes
from ...screen import Screen, frame
from .model import empty_hist
from .pid_table import PidTable, Row
from .report import losses

__all__ = ["SORTS", "check_terminal", "fmt_ns", "render", "run_top", "sort_rows"]

SORTS = ("bytes", "latency", "ops")
# R/s, W/s: what the calls moved (cache or disk); DISK R/s, DISK W/s and IO% as iotop
# shows them: what the disk moved for them, and the share of the interval asleep in I/O
# wait within them (summed over the process's threads: over 100 when several wait).
HEADER = (
    *("PID", "COMM", "R/s", "W/s", "DISK R/s", "DISK W/s", "IO%"),
    *("R OPS", "W OPS", "P50", "P99", "HIT%"),
)
WIDTHS = (7, 15, 8, 8, 8, 8, 6, 7, 7, 7, 7, 6)  # 105 columns with the spaces


def fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.1f}{unit}" if ns < 100 * scale else f"{ns / scale:.0f}{unit}"
    return f"{ns:.0f}ns"


def _latency(row: Row) -> Hist:
    h = empty_hist()
    for v in row.ops.values():
        h = h + v.interval_hist
    return h


def _p(row: Row, q: float) -> float | None:
    h = _latency(row)
    return h.percentile(q) if h.total else None


def _interval_ops(row: Row) -> int:
    return sum(v.interval_ops for v in row.ops.values())


def sort_rows(rows: list[Row], key: str) -> list[Row]:
    """bytes: read + write throughput; latency: p99 of the interval; ops: operations."""
    if key not in SORTS:
        raise UsageError(f"--sort takes one of {', '.join(SORTS)}, got {key!r}")
    if key == "bytes":
        return sorted(rows, key=lambda r: (-r.total(1), -_interval_ops(r), r.pid or 0))
    if key == "ops":
        return sorted(rows, key=lambda r: (-_interval_ops(r), -r.total(1), r.pid or 0))
    return sorted(rows, key=lambda r: (-(_p(r, 0.99) or 0.0), -r.total(1), r.pid or 0))


def _cells(row: Row) -> list[str]:
    rd, wr = row.ops["read"], row.ops["write"]
    ops = _interval_ops(row)
    cached = sum(v.interval_cached_ops for v in row.ops.values())
    label = str(row.pid) if row.level == "pid" else f"({row.processes})"
    return [
        label,
        row.comm[:15],
        fmt_bytes(rd.bytes_per_s[1]),
        fmt_bytes(wr.bytes_per_s[1]),
        fmt_bytes(rd.disk_bytes_per_s[1]),
        fmt_bytes(wr.disk_bytes_per_s[1]),
        f"{sum(v.io_wait_ns_per_s[1] for v in row.ops.values()) / 1e7:.1f}",
        str(rd.interval_ops),
        str(wr.interval_ops),
        fmt_ns(_p(row, 0.5)),
        fmt_ns(_p(row, 0.99)),
        f"{100 * cached / ops:.1f}" if ops else "-",
    ]


def _line(cells: list[str]) -> str:
    parts = [cells[0].rjust(WIDTHS[0]), cells[1].ljust(WIDTHS[1])]
    parts += [c.rjust(w) for c, w in zip(cells[2:], WIDTHS[2:], strict=True)]
    return " ".join(parts)


def render(
    rows: list[Row],
    sort: str,
    interval: float,
    lost: dict[str, int],
    size: tuple[int, int] = (120, 40),
    clock: Callable[[], str] = lambda: time.strftime("%H:%M:%S"),
) -> str:
    """One frame, as text with ANSI codes, cut to the terminal's columns and lines."""
    cols, lines = size
    rows = sort_rows(rows, sort)
    rd = sum(r.ops["read"].bytes_per_s[1] for r in rows)
    wr = sum(r.ops["write"].bytes_per_s[1] for r in rows)
    dropped = ", ".join(f"{k}={v}" for k, v in losses(lost).items())
    head = [
        f"meridian io --top  {clock()}  every {interval:g}s  sorted by {sort}  "
        f"processes {sum(r.processes for r in rows)}",
        f"total read {fmt_bytes(rd)}/s  write {fmt_bytes(wr)}/s"
        + (f"  lost: {dropped}" if dropped else ""),
        "",
        _line(list(HEADER)),
    ]
    body = [_line(_cells(r)) for r in rows][: max(0, lines - len(head) - 1)]
    return frame(head + body, cols)


def check_terminal(out: TextIO) -> None:
    if not out.isatty():
        raise UsageError(
            "--top draws a live view and needs a terminal, but stdout is not one "
            "(to pipe or log, leave out --top: JSON lines or --format text)"
        )


def run_top(
    tool: Any,
    table: PidTable,
    opts: Any,
    out: TextIO,
    retire: Callable[[Any], None],
) -> None:
    """Redraw every opts.interval until Ctrl-C or opts.duration; restore the screen."""
    check_terminal(out)
    start = time.monotonic()
    end = start + opts.duration if opts.duration else None
    with Screen(out) as screen:
        try:
            while True:
                keys, vals = tool.stats()
                retire(table.update(keys, vals, time.monotonic_ns()))
                rows = table.rows(opts.max_series)
                lost = tool.counters()
                screen.draw(render(rows, opts.sort, opts.interval, lost, screen.size()))
                now = time.monotonic()
                if end is not None and now >= end:
                    break
                wait = opts.interval if end is None else min(opts.interval, end - now)
                time.sleep(max(wait, 0.0))
        except KeyboardInterrupt:
            pass
