"""The histogram tools' run loop (biolat, memlat, runqlat): the options it reads, the
reports every `[interval]`, `count` times, at the end of `--duration` or at Ctrl-C
(which prints what happened since the last report before the tool detaches), and
what runs beside it: the `--workload` child (io's too) and the histogram family of
the exported latencies."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TextIO, TypeVar

from .export import Exporters, ExportOptions, Family, exporting
from .output import JsonWriter
from .proc import start_environment

__all__ = [
    "UNITS",
    "ReportOptions",
    "duration_family",
    "report_loop",
    "run_histograms",
    "stop_child",
    "workload",
]

UNITS = {1: "nsecs", 1000: "usecs", 1_000_000: "msecs"}  # a histogram slot's unit, in ns


@dataclass
class ReportOptions:
    """The options every histogram tool's report loop reads; a tool's `Options`
    extends them (and says its unit: `unit_ns`)."""

    interval: float | None = None
    count: int | None = None
    duration: float | None = None
    timestamps: bool = False
    json: bool = False
    strategy: str | None = None
    verbose: bool = False
    export: ExportOptions | None = None

    @property
    def unit_ns(self) -> int:
        return 1000

    @property
    def unit(self) -> str:
        return UNITS[self.unit_ns]


# ---- the report loop -----------------------------------------------------------------


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
    ready: Callable[[], None] = lambda: None,
) -> None:
    """Call `emit(prev, cur)` every `interval` seconds, `count` times, or once at the
    end of `duration` or at Ctrl-C. `wait(seconds)` passes the time between reports
    (a tool that streams events prints them there); `ready()` once the first snapshot,
    the baseline, is taken."""
    start = prev = snapshot()
    ready()
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
    opts: ReportOptions,
    out: TextIO,
    banner: str,
    report_json: Callable[[Any, Any, str], Any],
    report_text: Callable[[Any, Any, TextIO], None],
    *,
    drain: Callable[[Any, float, Exporters], None] | None = None,
    during: AbstractContextManager[Any] | None = None,
) -> int:
    """Attach a histogram tool's `session` and print its reports (text or JSON lines)
    per `opts` until done or Ctrl-C; with `opts.export`, the exporters read
    `tool.metrics()` meanwhile. `drain(tool, seconds, exporters)` prints (and sends,
    with --otlp-logs) the events a tool streams, waiting at most that long (the time
    between reports passes there, and the last ones print at Ctrl-C); `during` (a
    workload) runs while the tool reports."""
    json_out = JsonWriter(out) if opts.json else None
    with session as tool, exporting(opts.export, tool.metrics, tool.name) as exporters:
        strategy = tool.strategy

        def ready() -> None:
            """-v: the strategy, once the baseline is taken (a ready signal for tests)."""
            if opts.verbose:
                print(f"strategy: {strategy.name} ({', '.join(tool.selected)})", file=sys.stderr)
                sys.stderr.flush()

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

        def wait(seconds: float) -> None:
            if drain is None:
                time.sleep(seconds)
            else:
                drain(tool, seconds, exporters)

        def last_lines() -> None:
            if drain is not None:
                drain(tool, 0, exporters)
            if not opts.json:
                print(file=out)

        with during or contextlib.nullcontext():
            report_loop(
                tool.snapshot,
                emit,
                interval=opts.interval,
                count=opts.count,
                duration=opts.duration,
                has_news=lambda prev, cur: bool(cur.since(prev).cells),
                wait=wait,
                on_interrupt=last_lines,
                ready=ready,
            )
    return 0


# ---- child processes -----------------------------------------------------------------


def stop_child(child: subprocess.Popen[Any], grace: float = 5.0) -> None:
    """End a child process: SIGTERM, then SIGKILL if it is still there after `grace`
    seconds; reaped either way."""
    if child.poll() is None:
        child.terminate()
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


@contextlib.contextmanager
def workload(name: str | None, seconds: float | None) -> Iterator[None]:
    """`--workload`: the built-in workload `name` (`python -m meridian.workloads name`)
    in a child process while the block runs (for `seconds` at most, an hour when
    None), then stopped; in the environment this tool was started with, as the user
    would run it. None: no workload."""
    if name is None:
        yield
        return
    cmd = [sys.executable, "-m", "meridian.workloads", name, "--seconds", str(seconds or 3600)]
    child = subprocess.Popen(cmd, env=start_environment())
    try:
        yield
    finally:
        stop_child(child)


# ---- export --------------------------------------------------------------------------


def duration_family(name: str, description: str) -> Family:
    """An exported latency histogram, in seconds (the conventions' `*.duration`)."""
    return Family(name, "histogram", "s", description)
