"""What every histogram tool's command line shares: checked numbers and PIDs, and the
report loop of `[interval] [count]`, `--duration` and Ctrl-C (which prints what
happened since the last report before the tool detaches)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TextIO, TypeVar

from .errors import UsageError
from .export import exporting
from .output import JsonWriter

__all__ = ["pid_arg", "positive_number", "report_loop", "run_histograms"]


def positive_number(value: str | None, what: str, integer: bool = False) -> float | None:
    """A number > 0 from the command line, or None when not given; else a UsageError."""
    if value is None:
        return None
    try:
        num = int(value) if integer else float(value)
    except ValueError:
        raise UsageError(
            f"{what} must be a {'whole ' if integer else ''}number, got {value!r}"
        ) from None
    if not num > 0 or num == float("inf"):
        raise UsageError(f"{what} must be greater than 0, got {value!r}")
    return num


def pid_arg(value: str | None, proc_root: str = "/proc") -> int | None:
    """A PID of a running process, or None when not given; else a UsageError."""
    if value is None:
        return None
    try:
        pid = int(value)
    except ValueError:
        raise UsageError(f"-p takes a process ID, got {value!r}") from None
    if pid <= 0:
        raise UsageError(f"-p takes a process ID greater than 0, got {value!r}")
    if not Path(f"{proc_root}/{pid}").exists():
        raise UsageError(f"no process with PID {pid}: see ps or pgrep for running processes")
    return pid


class _Timed(Protocol):
    @property
    def t(self) -> float: ...


S = TypeVar("S", bound=_Timed)


def report_loop(
    snapshot: Callable[[], S],
    emit: Callable[[S, S], None],
    *,
    interval: float | None,
    count: int | None,
    duration: float | None,
    has_news: Callable[[S, S], bool],
    wait: Callable[[float], None] = time.sleep,
    on_interrupt: Callable[[], None] = lambda: None,
) -> None:
    """Call `emit(prev, cur)` every `interval` seconds, `count` times, or once at the
    end of `duration` or at Ctrl-C. `wait(seconds)` passes the time between reports
    (a tool that streams events prints them there)."""
    start = prev = snapshot()
    end = start.t + duration if duration else None
    reports = 0
    try:
        while True:
            now = time.monotonic()
            due = prev.t + interval if interval else None
            stop_at = min(t for t in (due, end, now + 3600) if t is not None)
            while now < stop_at:
                wait(stop_at - now)
                now = time.monotonic()
            cur = snapshot()
            if due is not None and now >= due:
                emit(prev, cur)
                prev = cur
                reports += 1
                if count and reports >= count:
                    return
            if end is not None and now >= end:
                if interval is None or has_news(prev, cur):
                    emit(prev, cur)
                return
    except KeyboardInterrupt:
        on_interrupt()
        emit(prev, snapshot())


def run_histograms(
    session: Any,
    opts: Any,
    out: TextIO,
    banner: str,
    report_json: Callable[[Any, Any, str], Any],
    report_text: Callable[[Any, Any, TextIO], None],
) -> int:
    """Attach a histogram tool's `session` and print its reports (text or JSON lines)
    per `opts` (interval, count, duration, json, verbose) until done or Ctrl-C; with
    `opts.export`, the exporters read `tool.metrics()` meanwhile."""
    json_out = JsonWriter(out) if opts.json else None
    export = getattr(opts, "export", None)
    with session as tool, exporting(export, tool.metrics, tool.name):
        strategy = tool.strategy
        if opts.verbose:
            print(f"strategy: {strategy.name} ({', '.join(strategy.programs)})", file=sys.stderr)
        if not opts.json:
            print(banner, file=out)
        out.flush()

        def emit(prev: Any, cur: Any) -> None:
            delta = cur.since(prev)
            if json_out:
                json_out.write(report_json(delta, opts, strategy.name))
            else:
                report_text(delta, opts, out)
            out.flush()

        def blank_line() -> None:
            if not opts.json:
                print(file=out)

        report_loop(
            tool.snapshot,
            emit,
            interval=opts.interval,
            count=opts.count,
            duration=opts.duration,
            has_news=lambda prev, cur: bool(cur.since(prev).cells),
            on_interrupt=blank_line,
        )
    return 0
