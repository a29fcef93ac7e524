"""meridian io: every read and write on a regular file, per process
(docs/requirements/io.md).

The kernel decides everything: regular files only, the PID, comm and cgroup filters,
cached or disk per operation, and exact per-(process, op, cached) aggregates with a
log2 latency histogram. Events come through a ring buffer as numpy columns and leave
as JSON lines (or aligned text) without a dict per event; a live PID table over the
aggregates feeds --top, the exporters and the summary at the end.

One concept per module; the imports go down this list, never up:
    cli           the command line: parser, checks (PIDs, cgroups), `run`
    agent         the run: session, event stream or --top, PID table, exporters, summary
    top           --top: the live, iotop-like view of the PID table
    report        the summary at the end (JSON objects or a table)
    metrics       the exported families (OpenTelemetry names), per process and op
    logs          the events as OTLP log records (--otlp-logs)
    event_format  the event stream: numpy columns to JSON lines or text
    pid_table     the PID table: rolling windows per process, retiring the exited
    kernel        the Session (`FileIO`), the strategies and the kernel maps
    names         the kernel's file names in a bounded (dev, ino) -> path cache
    options       what the user asked (`Options`)
    writeback     device writes charged to the process that dirtied the pages
    block         block requests per submitting process (`BlockStats`)
    model         the per-process aggregates (`PidSummary`, `OpStats`), `summarize`
"""

from __future__ import annotations

from .cli import add_parser, run
from .kernel import STRATEGIES

__all__ = ["STRATEGIES", "add_parser", "run"]
