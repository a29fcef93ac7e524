"""meridian io's run: the kernel session, the event stream (or --top), the PID table
and the exporters until the end, then the summary.

Every `interval` the PID table takes a snapshot of the aggregate map and names the
processes to retire; their keys leave the kernel maps here, so they never fill with
the dead, and their block requests (and writeback on their behalf) move to the
summary's lists (at most RETIRED_MAX each).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import numpy as np

from ...export import Exporters, exporting
from ...report_loop import workload
from .block import BlockStats, summarize_block
from .event_format import TEXT_HEADER, EventFormatter
from .kernel import URING_MISSING, FileIO
from .logs import IoLogs
from .metrics import io_source
from .options import Options
from .pid_table import RETIRED_MAX, PidTable, delete_keys, of_processes
from .report import report
from .top import check_terminal, run_top
from .writeback import WritebackStats, summarize_writeback

__all__ = ["run_options"]


def run_options(opts: Options, out: TextIO) -> int:
    if opts.top:
        check_terminal(out)  # before loading anything
    with FileIO(opts) as tool, workload("file-io" if opts.workload else None, opts.duration):
        source = io_source(tool, max_series=opts.metrics_max_series)
        with exporting(opts.export, source, "io") as exporters:
            return _stream(tool, exporters, opts, out)


class _Retirer:
    """Deletes the keys of retired processes from the kernel maps: the aggregate map's
    (the PID table names them) and the block and writeback maps' (gone by the table's
    rule), whose entries it keeps for the summary."""

    def __init__(self, tool: FileIO, table: PidTable) -> None:
        assert tool.obj is not None
        self.tool, self.table = tool, table
        self.disk_map = tool.obj.maps["disk_io"]
        self.wb_map = tool.obj.maps["writeback"]
        self.block: list[BlockStats] = []
        self.writeback: list[WritebackStats] = []

    def __call__(self, keys: np.ndarray[Any, Any]) -> None:
        self.tool.forget_stats(keys)
        dkeys, dvals = self.tool.disk_stats()
        wkeys, wvals = self.tool.writeback_stats()
        procs = {
            (int(p), int(s))
            for keys in (dkeys, wkeys)
            for p, s in zip(keys["pid"], keys["start"], strict=True)
        }
        gone = self.table.gone(procs, time.monotonic_ns())  # one call: it keeps timers
        if gone:
            mask = of_processes(dkeys, gone)
            self.block.extend(summarize_block(dkeys[mask], dvals[mask]))
            del self.block[: max(0, len(self.block) - RETIRED_MAX)]
            delete_keys(self.disk_map, dkeys[mask])
            mask = of_processes(wkeys, gone)
            self.writeback.extend(summarize_writeback(wkeys[mask], wvals[mask]))
            del self.writeback[: max(0, len(self.writeback) - RETIRED_MAX)]
            delete_keys(self.wb_map, wkeys[mask])


def _stream(tool: FileIO, exporters: Exporters, opts: Options, out: TextIO) -> int:
    """The event stream (or --top) and the PID table until the end, then the summary."""
    fmt = EventFormatter(names=tool.names)  # paths from the kernel
    chunks: Callable[[np.ndarray[Any, Any]], Iterable[str]] = (
        fmt.json_chunks if opts.format == "json" else lambda ev: (fmt.text_lines(ev),)
    )

    logs = IoLogs(exporters.logs, fmt.offset_ns) if exporters.logs else None

    def write(recs: np.ndarray[Any, Any]) -> None:
        texts = chunks(recs) if logs is None else list(chunks(recs))  # kept for the logs
        for text in texts:
            out.write(text)
        out.flush()
        if logs is not None:
            logs.emit(recs, "".join(texts) if opts.format == "json" else fmt.json_lines(recs))

    table = PidTable(time.monotonic_ns(), grace_s=opts.grace)
    retire = _Retirer(tool, table)
    if opts.verbose:
        print(f"strategy: {tool.strategy.name} ({', '.join(tool.selected)})", file=sys.stderr)
    if not tool.uring:
        print(f"note: {URING_MISSING}", file=sys.stderr)
    sys.stderr.flush()
    start = time.monotonic()
    if opts.top:
        run_top(tool, table, opts, out, retire)
    if opts.format == "text" and not opts.top:
        print("Tracing reads and writes on regular files... Hit Ctrl-C to end.", file=out)
        if not opts.no_events:
            print(TEXT_HEADER, file=out)
        out.flush()
    end = start + opts.duration if opts.duration else None
    next_table = start + opts.interval
    try:
        while not opts.top and (end is None or time.monotonic() < end):
            now = time.monotonic()
            wait = 0.05 if end is None else max(0.0, min(0.05, end - now))
            recs = tool.events(wait)
            if len(recs):
                write(recs)
            if now >= next_table:  # the PID table: windows, retiring the exited
                retire(table.update(*tool.stats(), time.monotonic_ns()))
                next_table = now + opts.interval
    except KeyboardInterrupt:
        pass
    recs = tool.events(0)
    if len(recs):
        write(recs)
    table.update(*tool.stats(), time.monotonic_ns())
    counters = tool.counters()
    if opts.verbose:
        print("lost: " + " ".join(f"{k}={v}" for k, v in counters.items()), file=sys.stderr)
    block = retire.block + summarize_block(*tool.disk_stats())
    writeback = retire.writeback + summarize_writeback(*tool.writeback_stats())
    seconds = time.monotonic() - start
    counters = {**counters, **exporters.finish()}  # the last OTLP sends, bounded
    as_json = opts.format == "json"
    report(
        table.summaries(),
        counters,
        seconds,
        as_json,
        out,
        table.rolling(),
        block,
        writeback,
        tool.containers.attrs,
    )
    out.flush()
    return 0
