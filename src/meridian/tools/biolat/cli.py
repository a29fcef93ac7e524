"""biolat's command line: `meridian biolat [interval] [count]` and its options."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from ... import proc
from ...errors import UsageError
from ...export import Exporters, add_arguments
from ...flags import (
    add_command,
    add_duration,
    add_json,
    add_reports,
    add_strategy,
    add_verbose,
    options_of,
    report_fields,
)
from ...output import JsonWriter
from ...report_loop import run_histograms, workload
from .. import summary
from .kernel import STRATEGIES, Biolat
from .model import Options
from .records import SLOW_HEADER, print_slow
from .views import report_json, report_text

__all__ = ["add_parser", "options_from_args", "run", "run_options"]

EXAMPLES = """examples:
  meridian biolat                 # latency histograms by op until Ctrl-C
  meridian biolat 1 10            # print 1 second summaries, 10 times
  meridian biolat -D -m 5         # per disk, milliseconds, every 5 seconds
  meridian biolat -Q              # include OS queued time (insert to complete)
  meridian biolat -d nvme0n1      # only this disk (loop0, /dev/vda, 259:0 also work)
  meridian biolat --sizes         # request size histograms and latency by size
  meridian biolat --depth         # queue depth at each issue, per disk
  meridian biolat --slow 10       # stream each request slower than 10 ms
  meridian biolat --slow 10 --otlp-endpoint http://localhost:4317 --otlp-logs
                                  # ... and send each as an OTLP log record
  meridian biolat --json 1        # one JSON object per second
  meridian biolat --workload 10 1 # demo: a small O_DIRECT workload, one 10 s report
  meridian biolat --prometheus :9435   # per-disk histograms on /metrics, read on scrape
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = add_command(
        sub,
        "biolat",
        help=summary("biolat"),
        description="Summarize block device I/O latency as histograms, per op and disk.",
        examples=EXAMPLES,
    )
    add_reports(p)
    p.add_argument("-D", "--disks", action="store_true", help="one histogram per disk")
    p.add_argument("-Q", "--queued", action="store_true", help="include OS queued time")
    p.add_argument("-m", "--milliseconds", action="store_true", help="histograms in msecs")
    p.add_argument("-d", "--disk", metavar="DISK", help="trace this disk only")
    add_json(p)
    p.add_argument("--sizes", action="store_true", help="request size histograms (exercise 2)")
    p.add_argument("--depth", action="store_true", help="queue depth histograms (exercise 4)")
    p.add_argument("--slow", metavar="MS", help="stream requests slower than MS ms (0: all)")
    add_duration(p)
    add_strategy(p, STRATEGIES)
    p.add_argument("--workload", action="store_true", help="run a small built-in disk workload")
    add_verbose(p)
    add_arguments(p, logs=True)
    return p


def options_from_args(args: argparse.Namespace) -> Options:
    slow = None
    if args.slow is not None:
        try:
            slow = float(args.slow)
        except ValueError:
            raise UsageError(f"--slow takes milliseconds as a number, got {args.slow!r}") from None
        if slow < 0 or slow != slow:
            raise UsageError(f"--slow must be 0 or more milliseconds, got {args.slow!r}")
    if getattr(args, "otlp_logs", False) and slow is None:
        raise UsageError("--otlp-logs sends the slow requests: give --slow MS (0: all)")
    disk = None
    if args.disk is not None:
        try:
            disk = proc.parse_device(args.disk)
        except ValueError as exc:
            raise UsageError(f"{exc}: see lsblk for disk names") from None
    return options_of(
        Options,
        args,
        **report_fields(args),
        per_disk=args.disks,
        millis=args.milliseconds,
        disk=disk,
        slow_ms=slow,
    )


def run(args: argparse.Namespace) -> int:
    return run_options(options_from_args(args), sys.stdout)


def run_options(opts: Options, out: TextIO) -> int:
    banner = "Tracing block device I/O... Hit Ctrl-C to end."
    if opts.slow_ms is not None:
        banner += "\n" + SLOW_HEADER
    json_out = JsonWriter(out) if opts.json else None

    def drain(tool: Biolat, seconds: float, exporters: Exporters) -> None:
        print_slow(tool.events(min(0.05, seconds)), out, json_out, exporters.logs)

    total = opts.duration or (opts.interval * opts.count if opts.interval and opts.count else None)
    return run_histograms(
        Biolat(opts),
        opts,
        out,
        banner,
        lambda snap, o, _strategy: report_json(snap, o),
        report_text,
        drain=drain,
        during=workload("direct-io" if opts.workload else None, total),
    )
