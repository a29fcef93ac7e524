"""The command line of `meridian syscalls`: its parser (`add_parser`), the checks that
turn the arguments into Options, and `run`, which picks the view: the terminal UI, the
plain lines of a live capture, or the replay of a recording."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...errors import ExtraMissing, UsageError
from ...flags import (
    add_cgroup_filter,
    add_command,
    add_duration,
    add_json,
    add_pid,
    add_strategy,
    add_verbose,
    cgroup_filter,
    options_of,
    running_pids,
)
from .. import summary
from .capture import CaptureFeed, capture, capture_tui
from .jsonl_spool import convert_command
from .kernel import STRATEGIES
from .numbers import resolve_names
from .options import Options, build_filter
from .plain_view import replay
from .recording_file import read_until_damage

__all__ = ["add_parser", "options_from_args", "run"]


EXAMPLES = """examples:
  meridian syscalls                      # the terminal UI (plain lines when piped)
  meridian syscalls --no-tui             # every file-system syscall, system-wide
  meridian syscalls -- ls /etc           # a command from its first syscall (and children)
  meridian syscalls -p 812               # a running process (and the children it forks)
  meridian syscalls -e openat,unlinkat   # only these syscalls
  meridian syscalls --all -p 812         # every syscall of PID 812
  meridian syscalls --cgroup /sys/fs/cgroup/system.slice/nginx.service  # one cgroup
  meridian syscalls --container web   # one container's calls (name or id prefix)
  meridian syscalls --failed             # only failing calls (the start row too)
  meridian syscalls --errno ENOENT       # only calls that failed with ENOENT
  meridian syscalls --filter passwd      # a substring anywhere (any case if lower case)
  meridian syscalls --path '^/etc' --regex  # calls on paths under /etc
  meridian syscalls --full               # the full log: starts and ends with indices
  meridian syscalls --json -- make       # one JSON object per call, pairing indices
  meridian syscalls -c -- git status     # calls, errors, time per syscall (strace -c)
  meridian syscalls -c --all -p 812 --duration 10s  # every syscall of 812, for 10 s
  meridian syscalls -c --json -- make    # the same table as one JSON object
  meridian syscalls -w trace.jsonl.zst -- make   # record JSON lines (zstd) while printing
  meridian syscalls -w trace.rec.zst -q  # record raw kernel records only (no view)
  meridian syscalls -r trace.jsonl.zst --failed  # replay a recording, filtered
  meridian syscalls -r trace.rec -w trace.jsonl  # convert a raw recording to JSON lines
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = add_command(
        sub,
        "syscalls",
        help=summary("syscalls"),
        description=(
            "Show file-system syscalls as start and end events paired into calls, "
            "with decoded arguments, paths of fds, results and durations."
        ),
        examples=EXAMPLES,
    )
    p.add_argument("command", nargs="*", help="-- COMMAND ARGS: trace this command")
    p.add_argument("-e", dest="names", metavar="SYSCALLS", help="comma-separated syscalls")
    p.add_argument("--all", action="store_true", help="every syscall, not only file ones")
    add_pid(p)
    p.add_argument("--no-follow", action="store_true", help="do not trace forked children")
    add_cgroup_filter(p)
    p.add_argument("--full", action="store_true", help="the full log: starts and ends")
    p.add_argument(
        "-c",
        "--summary-only",
        dest="summary",
        action="store_true",
        help="no rows: calls, errors and time per syscall at the end, as strace -c "
        "(time: each call's start to end, as strace -c -w)",
    )
    add_json(p)
    p.add_argument(
        "-w",
        dest="write",
        metavar="FILE",
        help="record every event: raw kernel records, or JSON lines when FILE ends in "
        ".jsonl/.json, converted at the end from a raw spool beside it (.zst: "
        "zstd-compressed); with -r: convert that recording to JSON lines",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="with -w: record only, show nothing")
    p.add_argument(
        "--record-format",
        choices=("raw", "jsonl"),
        help="-w format regardless of the name: raw or jsonl (both lossless; jsonl is "
        "converted from a raw spool when the capture ends, 1-6 s per million events)",
    )
    p.add_argument("-r", dest="read", metavar="FILE", help="replay a recording")
    p.add_argument("--filter", dest="text", metavar="TEXT", help="text in any field")
    p.add_argument("--regex", action="store_true", help="--filter/--comm/--path are regexes")
    p.add_argument(
        "--comm", metavar="NAME", help="process name contains NAME (in the kernel unless --regex)"
    )
    p.add_argument("--path", metavar="TEXT", help="a path argument contains TEXT")
    p.add_argument("--failed", action="store_true", help="only calls that failed")
    p.add_argument("--errno", metavar="NAMES", help="only calls failing with these errnos")
    add_duration(p)
    p.add_argument(
        "--ring-mb",
        type=int,
        metavar="MB",
        help="ring buffer size (default 16, or 64 with -w: a recording must ride out the "
        "writer's stalls, such as the kernel throttling dirty pages, at full rate)",
    )
    p.add_argument(
        "--max-rows",
        type=int,
        default=200_000,
        metavar="N",
        help="events kept in memory, live (default 200000; 0: no limit): past it the "
        "oldest leave memory (they are in the -w recording); the TUI says how many",
    )
    add_strategy(p, STRATEGIES)
    p.add_argument("--tui", action="store_true", help="the terminal UI (default on a terminal)")
    p.add_argument("--no-tui", action="store_true", help="plain lines (default when piped)")
    add_verbose(p)
    return p


def _check(args: argparse.Namespace, names: list[str], pids: list[int]) -> None:
    """The combinations and values the parser alone does not refuse."""
    if args.read and args.command:
        raise UsageError("-r replays a recording: it takes no command")
    if args.command and pids:
        raise UsageError("give either -p PID or -- COMMAND, not both")
    if args.max_rows < 0:
        raise UsageError(f"--max-rows must be 0 or more, got {args.max_rows}")
    if args.quiet and not args.write:
        raise UsageError("-q records only: it needs -w FILE")
    if args.ring_mb is None:
        args.ring_mb = 64 if args.write else 16
    if args.ring_mb <= 0:
        raise UsageError(f"--ring-mb must be greater than 0, got {args.ring_mb}")
    if names and args.all:
        raise UsageError("give either -e SYSCALLS or --all, not both")
    if args.summary and (args.full or args.quiet or args.tui):
        given = "--full" if args.full else "-q" if args.quiet else "--tui"
        raise UsageError(f"-c prints a table of counts, no rows: it takes no {given}")
    if args.summary and args.read and args.write:
        raise UsageError("-r FILE -w FILE.jsonl converts a recording: it takes no -c")


def options_from_args(args: argparse.Namespace) -> Options:
    names = resolve_names(args.names.split(",")) if args.names else []
    # A replay's -p filters the recording: its processes need not run any more.
    pids = list(args.pid or []) if args.read else running_pids(args.pid)
    _check(args, names, pids)
    errnos = [e.strip() for e in args.errno.split(",") if e.strip()] if args.errno else []
    plain = (
        args.no_tui
        or args.quiet
        or args.json
        or args.full
        or args.summary
        or not sys.stdout.isatty()
    )
    return options_of(
        Options,
        args,
        names=names,
        pids=pids,
        command=list(args.command),
        follow=not args.no_follow,
        errnos=errnos,
        cgroup=cgroup_filter(args),
        tui=args.tui or not plain,
    )


def _tui_module() -> Any:
    try:
        from . import tui
    except ImportError:
        raise ExtraMissing("the syscalls terminal UI", "tui") from None
    return tui


def run_tui(opts: Options) -> int:
    tui = _tui_module()
    flt = build_filter(opts, replay=bool(opts.read))
    if opts.read:
        events, damage = read_until_damage(opts.read)
        app = tui.SyscallsApp(tui.ListFeed(events), live=False, flt=flt)
        app.warning = str(damage) if damage else None
        app.run()
        if damage:
            raise damage
        return 0

    def show(feed: CaptureFeed) -> None:
        tui.SyscallsApp(feed, live=True, flt=flt, max_rows=opts.max_rows, spill=opts.write).run()

    return capture_tui(opts, show)


def run(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    # Build the filters now: a bad regex is a usage error before anything loads.
    flt = build_filter(opts, replay=bool(opts.read))
    if opts.read and opts.write:
        if flt is not None:
            raise UsageError("-r FILE -w FILE.jsonl converts every event: it takes no filters")
        return convert_command(opts.read, opts.write, sys.stderr)
    if opts.tui:
        return run_tui(opts)
    if opts.read:
        return replay(opts, sys.stdout, sys.stderr)
    return capture(opts, sys.stdout, sys.stderr)
