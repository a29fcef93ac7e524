"""memlat's command line: `meridian memlat [interval] [count]`, its options, -o FILE,
and `meridian memlat validate`."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from ...errors import UsageError
from ...flags import options_of, positive_number
from ...latency import LatencyCli
from ...report_loop import run_histograms
from .. import summary
from .kernel import STRATEGIES, Memlat, start_of
from .model import STARTS, Options
from .validate import validate, validate_text
from .views import report_json, report_text

__all__ = ["add_parser", "run", "run_options"]

EXAMPLES = """examples:
  meridian memlat                  # minor/major fault latency histograms until Ctrl-C
  meridian memlat 1 10             # print 1 second summaries, 10 times
  meridian memlat --ns 5           # nanosecond buckets, every 5 seconds
  meridian memlat -P -p 1234       # per process, only PID 1234
  meridian memlat -P -p 12,34 -p 56   # per process, only these three PIDs
  meridian memlat --from handle_mm_fault   # the seed's Delta t: every handle_mm_fault call
  meridian memlat --threshold 16   # tail line counts faults >= 16 us
  meridian memlat --duration 10 -o faults.txt   # one 10 s report, also saved to a file
  meridian memlat --json 1         # one JSON object per second
  meridian memlat -P --prometheus :9435   # histograms on /metrics, read on scrape
  meridian memlat validate         # the on/off experiment: 10 s idle, 10 s page-touch
  meridian memlat validate --seconds 3 --json
  meridian memlat validate; echo $?   # 0 passed, 1 a check failed (the tail did not grow...)
"""


def run_options(opts: Options, out: TextIO) -> int:
    banner = "Tracing page faults... Hit Ctrl-C to end."
    if opts.start == "handle_mm_fault":
        banner = "Tracing page faults from handle_mm_fault's entry... Hit Ctrl-C to end."
    return run_histograms(Memlat(opts), opts, out, banner, report_json, report_text)


class _Cli(LatencyCli[Options]):
    name = "memlat"
    help = summary("memlat")
    description = (
        "Summarize page-fault handling latency (from the exception, or with --from "
        "handle_mm_fault from that function's entry, to the end of handle_mm_fault) as "
        "histograms per minor/major fault; faults that fail (SIGSEGV, SIGBUS, EFAULT) are "
        "counted as failed. 'validate' as first argument runs the on/off experiment with a "
        "built-in page-touch workload; its exit status is 0 when every check passed, 1 when "
        "one failed (more faults, more tail events and the workload's faults within 5% with "
        "the workload on than off), 2 on bad input."
    )
    examples = EXAMPLES
    strategies = STRATEGIES
    experiment_option = "--mb"
    experiment_seconds = 10.0
    run_options = staticmethod(run_options)
    validate_text = staticmethod(validate_text)

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--from",
            dest="start",
            choices=STARTS,
            help="where a fault's time starts: the page-fault exception (default; only "
            "faults taken as exceptions, every strategy), or the entry of handle_mm_fault "
            "(every call, get_user_pages() too, the seed's Delta t; needs fentry or kprobes)",
        )
        p.add_argument("--ns", action="store_true", help="histograms in nsecs")
        p.add_argument(
            "--threshold", metavar="US", help="tail threshold in microseconds (default 8)"
        )

    def add_output_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("-o", "--output", metavar="FILE", help="also write the reports to FILE")

    def add_experiment_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--mb", metavar="MIB", help="page-touch region size (default 256)")

    def options(self, args: argparse.Namespace, common: dict[str, Any]) -> Options:
        threshold = positive_number(args.threshold, "--threshold")
        return options_of(
            Options,
            args,
            **common,
            threshold_us=threshold if threshold is not None else 8.0,
            output=_output(args.output),
            # --strategy alone names its start point too
            start=args.start or start_of(args.strategy) or STARTS[0],
        )

    @contextlib.contextmanager
    def output(self, opts: Options) -> Iterator[TextIO]:
        with contextlib.ExitStack() as stack:
            f = stack.enter_context(open(opts.output, "w")) if opts.output else None
            yield _Tee(sys.stdout, f)  # type: ignore[misc]

    def validate(
        self, opts: Options, seconds: float, value: int | None
    ) -> tuple[bool, dict[str, Any]]:
        return validate(opts, seconds, value or 256)


def _output(path: str | None) -> str | None:
    if path is None:
        return None
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {parent} does not exist")
    if Path(path).is_dir():
        raise UsageError(f"cannot write {path}: it is a directory, give a file name")
    return path


class _Tee:
    """Write to stdout and, with -o, to a file too."""

    def __init__(self, out: TextIO, file: IO[str] | None) -> None:
        self.out, self.file = out, file

    def write(self, s: str) -> int:
        self.out.write(s)
        if self.file:
            self.file.write(s)
        return len(s)

    def flush(self) -> None:
        self.out.flush()
        if self.file:
            self.file.flush()


CLI = _Cli()
add_parser = CLI.add_parser
run = CLI.run
