"""The command line of a latency tool: `meridian TOOL [interval] [count]` with -P, -p,
-T, --json, --duration, --strategy, -v and the export options, and `meridian TOOL
validate`, its on/off experiment (`--seconds` per case and one option of its own).

A tool subclasses `LatencyCli`: its names and help, its own arguments (its unit, say),
how they make its options, how it reports, and its experiment."""

from __future__ import annotations

import argparse
import contextlib
import sys
from contextlib import AbstractContextManager
from typing import Any, Generic, TextIO, TypeVar

from ..bpf import Strategy
from ..errors import UsageError
from ..export import add_arguments
from ..output import JsonWriter
from ..reporting import positive_number, report_fields
from .model import LatencyOptions

__all__ = ["LatencyCli"]

Opts = TypeVar("Opts", bound=LatencyOptions)


class LatencyCli(Generic[Opts]):
    """One latency tool's command line: `add_parser(sub)` and `run(args)`, from what
    the tool says in the attributes and methods below."""

    name: str
    help: str
    description: str
    examples: str  # the help's epilog: "examples:" and one command a line
    strategies: tuple[Strategy, ...]
    experiment_option: str  # the experiment's option besides --seconds
    experiment_seconds: float  # the default length of each case

    # ---- what a tool says --------------------------------------------------------

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """The tool's own options, listed after -p."""

    def add_output_arguments(self, p: argparse.ArgumentParser) -> None:
        """The tool's output options, listed after --json."""

    def add_experiment_arguments(self, group: argparse._ArgumentGroup) -> None:
        """The experiment's option (`experiment_option`), after --seconds."""
        raise NotImplementedError

    def options(self, args: argparse.Namespace, report: dict[str, Any]) -> Opts:
        """The tool's options from its arguments; `report` holds the checked report
        fields (`reporting.report_fields`)."""
        raise NotImplementedError

    def output(self, opts: Opts) -> AbstractContextManager[TextIO]:
        """Where the reports go."""
        return contextlib.nullcontext(sys.stdout)

    def run_options(self, opts: Opts, out: TextIO) -> int:
        """Trace and report until done or Ctrl-C."""
        raise NotImplementedError

    def validate(
        self, opts: Opts, seconds: float, value: int | None
    ) -> tuple[bool, dict[str, Any]]:
        """Run the experiment, `seconds` per case, `value` its option's (or None)."""
        raise NotImplementedError

    def validate_text(self, report: dict[str, Any], out: TextIO) -> None:
        raise NotImplementedError

    # ---- the command line --------------------------------------------------------

    def add_parser(self, sub: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            self.name,
            help=self.help,
            description=self.description,
            epilog=self.examples,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument(
            "interval",
            nargs="?",
            help="seconds between reports (default: one at the end), or validate",
        )
        p.add_argument("count", nargs="?", help="number of reports (default: until Ctrl-C)")
        p.add_argument("-P", "--pids", action="store_true", help="one histogram per process")
        p.add_argument("-p", "--pid", metavar="PID", help="trace this process only")
        self.add_arguments(p)
        p.add_argument(
            "-T", "--timestamp", action="store_true", help="print a timestamp per report"
        )
        p.add_argument("--json", action="store_true", help="JSON lines instead of text")
        self.add_output_arguments(p)
        p.add_argument("--duration", metavar="SECONDS", help="stop after this long")
        p.add_argument(
            "--strategy", choices=[s.name for s in self.strategies], help="force a probe strategy"
        )
        p.add_argument("-v", "--verbose", action="store_true", help="libbpf and strategy detail")
        add_arguments(p)
        v = p.add_argument_group("validate")
        v.add_argument(
            "--seconds",
            metavar="N",
            help=f"length of each case (default {self.experiment_seconds:g})",
        )
        self.add_experiment_arguments(v)
        return p

    def run(self, args: argparse.Namespace) -> int:
        validating = args.interval == "validate"
        option = self.experiment_option
        value = getattr(args, option.lstrip("-").replace("-", "_"))
        if not validating and (args.seconds is not None or value is not None):
            raise UsageError(f"--seconds and {option} belong to 'meridian {self.name} validate'")
        opts = self.options(args, report_fields(args, validating))
        with self.output(opts) as out:
            if not validating:
                return self.run_options(opts, out)
            if args.count is not None:
                raise UsageError(f"validate takes no count, got {args.count!r}")
            if opts.export is not None and opts.export.any:
                raise UsageError("validate exports nothing: drop --prometheus and --otlp-endpoint")
            seconds = positive_number(args.seconds, "--seconds") or self.experiment_seconds
            number = positive_number(value, option, integer=True)
            ok, report = self.validate(opts, seconds, int(number) if number else None)
            if opts.json:
                JsonWriter(out).write(report)
            else:
                self.validate_text(report, out)
            return 0 if ok else 1
