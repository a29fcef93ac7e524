"""The command line of a latency tool: `meridian TOOL [interval] [count]` with -P, -p
(processes, each with all its threads), -T, --json, --duration, --strategy, -v (the
flags of flags.py) and the export options, and `meridian TOOL validate`, its on/off
experiment (`--seconds` per case and one option of its own).

A tool subclasses `LatencyCli`: its names and help, its own arguments (its unit, say),
how they make its options, how it reports, and its experiment."""

from __future__ import annotations

import argparse
import contextlib
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Generic, TextIO, TypeVar

from ..bpf import Strategy
from ..errors import UsageError
from ..export import add_arguments
from ..flags import (
    add_command,
    add_duration,
    add_json,
    add_pid,
    add_reports,
    add_strategy,
    add_verbose,
    positive_number,
    report_fields,
    running_pids,
)
from ..output import JsonWriter
from .model import LatencyOptions

__all__ = ["LatencyCli", "processes"]

Opts = TypeVar("Opts", bound=LatencyOptions)


def processes(pids: list[int] | None, proc_root: str = "/proc") -> list[int]:
    """-p's processes, each once: running, and a process (a thread's ID, which /proc
    also answers to, is refused: its process is what the kernel's set holds)."""
    out = []
    for pid in running_pids(sorted(set(pids or [])), proc_root):
        try:
            status = Path(f"{proc_root}/{pid}/status").read_text()
        except OSError:
            raise UsageError(f"no process with PID {pid} (see ps -e)") from None
        tgid = next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("Tgid:")), pid
        )
        if tgid != pid:
            raise UsageError(f"-p: {pid} is a thread of process {tgid}: give -p {tgid}")
        out.append(pid)
    return out


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

    def options(self, args: argparse.Namespace, common: dict[str, Any]) -> Opts:
        """The tool's options from its arguments; `common` holds the checked fields
        that every latency tool has (`flags.report_fields`, -P and -p)."""
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
        p = add_command(sub, self.name, self.help, self.description, self.examples)
        add_reports(p, "seconds between reports (default: one at the end), or validate")
        p.add_argument("-P", "--pids", action="store_true", help="one histogram per process")
        add_pid(p, "trace these processes only, all their threads (repeatable, or PID,PID)")
        self.add_arguments(p)
        add_json(p)
        self.add_output_arguments(p)
        add_duration(p)
        add_strategy(p, self.strategies)
        add_verbose(p)
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
        common = {
            **report_fields(args, validating),
            "per_process": args.pids,
            "pids": processes(args.pid),
        }
        opts = self.options(args, common)
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
