"""runqlat's command line: `meridian runqlat [interval] [count]` and `meridian runqlat
validate`."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ...flags import options_of
from ...latency import LatencyCli
from ...report_loop import run_histograms
from .. import summary
from .kernel import STRATEGIES, Runqlat
from .model import Options
from .validate import validate, validate_text
from .views import report_json, report_text

__all__ = ["add_parser", "run", "run_options"]

EXAMPLES = """examples:
  meridian runqlat                 # run-queue latency histogram until Ctrl-C
  meridian runqlat 1 10            # print 1 second summaries, 10 times
  meridian runqlat -m 5            # milliseconds, every 5 seconds
  meridian runqlat -P              # one histogram per process
  meridian runqlat -p 185          # only PID 185 (all its threads)
  meridian runqlat -P -p 185,186   # PIDs 185 and 186, one histogram each
  meridian runqlat --json 1        # one JSON object per second
  meridian runqlat --otlp-endpoint http://localhost:4317   # histograms over OTLP
  meridian runqlat validate        # 1 busy process vs more busy processes than cores
"""


def run_options(opts: Options, out: TextIO) -> int:
    banner = "Tracing run queue latency... Hit Ctrl-C to end."
    return run_histograms(Runqlat(opts), opts, out, banner, report_json, report_text)


class _Cli(LatencyCli[Options]):
    name = "runqlat"
    help = summary("runqlat")
    description = (
        "Summarize run-queue latency: the time from a wake-up or a preemption "
        "until the task runs. 'validate' as first argument runs the on/off experiment."
    )
    examples = EXAMPLES
    strategies = STRATEGIES
    experiment_option = "--workers"
    experiment_seconds = 5.0
    run_options = staticmethod(run_options)
    validate_text = staticmethod(validate_text)

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("-m", "--milliseconds", action="store_true", help="histograms in msecs")

    def add_experiment_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--workers", metavar="N", help="busy processes of the ON case (2 x CPUs)"
        )

    def options(self, args: argparse.Namespace, common: dict[str, Any]) -> Options:
        return options_of(Options, args, **common, millis=args.milliseconds)

    def validate(
        self, opts: Options, seconds: float, value: int | None
    ) -> tuple[bool, dict[str, Any]]:
        report = validate(opts, seconds, value)
        return report["passed"], report


CLI = _Cli()
add_parser = CLI.add_parser
run = CLI.run
