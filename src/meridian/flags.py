"""The flags several tools share, each added by one function so that it is spelled,
typed and checked the same in every tool: `-p/--pid` (repeatable), `--duration`
(seconds, a float), `--json`, `--strategy`, `-v`, `--cgroup`/`--container`/`--pod`,
and the histogram tools' `[interval] [count]` and `-T`; `add_command` makes a tool's
parser, its help ending in examples. A value the flag's type refuses is argparse's
one-line error, exit code 2, before anything loads. Then the checks that need the host
or more than one flag (`running_pids`, `positive_number`, `report_fields`,
`cgroup_filter`), and `options_of`, which makes a tool's options dataclass from its
arguments."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import cgroup
from .containers import Containers
from .durations import parse_duration
from .errors import UsageError
from .export import from_args

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from .bpf import Strategy

__all__ = [
    "add_cgroup_filter",
    "add_command",
    "add_duration",
    "add_json",
    "add_pid",
    "add_reports",
    "add_strategy",
    "add_verbose",
    "cgroup_filter",
    "options_of",
    "pid_list",
    "positive_number",
    "report_fields",
    "running_pids",
    "seconds",
]


# ---- value types: argparse calls them, a refusal is its one-line error -----------------


def pid_list(text: str) -> list[int]:
    """`-p`'s value: a process ID, or several separated by commas."""
    pids = []
    for part in text.split(","):
        try:
            pid = int(part)
        except ValueError:
            pid = 0
        if pid <= 0:
            raise argparse.ArgumentTypeError(
                f"takes a process ID (a whole number greater than 0), got {text!r}"
            )
        pids.append(pid)
    return pids


def seconds(text: str) -> float:
    """`--duration`'s value: seconds, or a duration with its unit (durations.py)."""
    try:
        value = parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"takes seconds, or a duration such as 250ms, 2s, 1m; got {text!r}"
        ) from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be greater than 0 seconds, got {text!r}")
    return value


# ---- the flags ---------------------------------------------------------------------


def add_command(
    sub: Any, name: str, help: str, description: str, examples: str
) -> argparse.ArgumentParser:
    """The parser of command `name` on `sub` (subparsers): its help in the list of
    commands, its description, and its examples (one command a line, as written)
    after the options."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


def add_pid(
    p: argparse.ArgumentParser, help: str = "trace this process (repeatable, or PID,PID)"
) -> None:
    """-p/--pid, repeatable (or PID,PID): a list of PIDs, None when not given."""
    p.add_argument("-p", "--pid", action="extend", type=pid_list, metavar="PID", help=help)


def add_duration(p: argparse.ArgumentParser) -> None:
    """--duration: seconds as a float, None when not given."""
    p.add_argument(
        "--duration",
        type=seconds,
        metavar="SECONDS",
        help="stop after this long (seconds, or 250ms, 2s, 1m)",
    )


def add_json(
    p: argparse.ArgumentParser,
    help: str = "JSON lines instead of text",
    default: bool | None = False,
) -> None:
    """--json; `default` None tells a flag not given from one given (sentinel: the YAML
    file's value stands)."""
    p.add_argument("--json", action="store_const", const=True, default=default, help=help)


def add_cgroup_filter(p: argparse.ArgumentParser) -> None:
    """--cgroup, --container or --pod (one of them): a cgroup and those below it,
    filtered in the kernel; `cgroup_filter` resolves them."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--cgroup",
        metavar="PATH",
        help="only processes in this cgroup v2 directory or below it (a path under the "
        "cgroup2 mount, or as in /proc/PID/cgroup)",
    )
    where.add_argument(
        "--container",
        metavar="NAME|ID",
        help="only this running container's processes (its name or a unique prefix of "
        "its id; docker, containerd, CRI-O, podman)",
    )
    where.add_argument(
        "--pod",
        metavar="NAME|UID",
        help="only this running Kubernetes pod's processes (its name, NAMESPACE/NAME, "
        "or its uid), containers started in it later too",
    )


def add_strategy(p: argparse.ArgumentParser, strategies: Iterable[Strategy]) -> None:
    p.add_argument(
        "--strategy", choices=[s.name for s in strategies], help="force a probe strategy"
    )


def add_verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help="libbpf and strategy detail")


def add_reports(
    p: argparse.ArgumentParser,
    interval_help: str = "seconds between reports (default: one at the end)",
) -> None:
    """A histogram tool's `[interval] [count]` (checked by `report_fields`) and -T."""
    p.add_argument("interval", nargs="?", help=interval_help)
    p.add_argument("count", nargs="?", help="number of reports (default: until Ctrl-C)")
    p.add_argument("-T", "--timestamp", action="store_true", help="print a timestamp per report")


# ---- checks ------------------------------------------------------------------------


def running_pids(pids: list[int] | None, proc_root: str = "/proc") -> list[int]:
    """The -p list (empty when not given), each one a running process."""
    for pid in pids or []:
        if not Path(f"{proc_root}/{pid}").is_dir():
            raise UsageError(f"no process with PID {pid} (see ps -e)")
    return list(pids or [])


def cgroup_filter(args: argparse.Namespace) -> tuple[int, int] | None:
    """--cgroup, --container or --pod as the kernel filters them: the cgroup's id and its
    depth (that cgroup or below), None for none; the node's cgroups below --host-root
    where the tool has it."""
    if args.cgroup is not None:
        found = cgroup.resolve(args.cgroup)
    elif args.container is not None or args.pod is not None:
        host = Containers.on_host(getattr(args, "host_root", "/"))
        found = host.cgroup_of(args.container, args.pod)
    else:
        return None
    return found.id, found.depth


def positive_number(
    value: str | None, what: str, integer: bool = False, minimum: float | None = None
) -> float | None:
    """A number from the command line, or None when not given; else a UsageError. Above
    0 and finite, or with `minimum`, at least that."""
    if value is None:
        return None
    try:
        num = int(value) if integer else float(value)
    except ValueError:
        raise UsageError(
            f"{what} must be a {'whole ' if integer else ''}number, got {value!r}"
        ) from None
    if minimum is not None:
        if not num >= minimum:
            raise UsageError(f"{what} must be at least {minimum:g}, got {value!r}")
    elif not num > 0 or num == float("inf"):
        raise UsageError(f"{what} must be greater than 0, got {value!r}")
    return num


def report_fields(args: argparse.Namespace, validating: bool = False) -> dict[str, Any]:
    """The `report_loop.ReportOptions` fields that are not the arguments as they are:
    `[interval] [count]` checked (none when the interval is a sub-command such as
    `validate`), -T and the export options."""
    count = None if validating else positive_number(args.count, "count", integer=True)
    return {
        "interval": None if validating else positive_number(args.interval, "interval"),
        "count": int(count) if count is not None else None,
        "timestamps": args.timestamp,
        "export": from_args(args),
    }


Opts = TypeVar("Opts", bound="DataclassInstance")


def options_of(cls: type[Opts], args: argparse.Namespace, **given: Any) -> Opts:
    """A tool's options dataclass `cls`: the fields in `given` (checked or renamed
    values), and every other field that names a command-line argument (its `dest`)
    from that argument as it is; the rest keep their defaults."""
    same = {
        f.name: getattr(args, f.name)
        for f in fields(cls)
        if f.init and f.name not in given and hasattr(args, f.name)
    }
    return cls(**same, **given)
