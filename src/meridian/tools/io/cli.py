"""`meridian io`'s command line: the argument parser (help ending in examples), the
checks that turn arguments into `Options` (one line and exit code 2 when they fail),
and `run`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ...errors import UsageError
from ...export import add_arguments, from_args
from ...flags import (
    add_cgroup_filter,
    add_command,
    add_duration,
    add_pid,
    add_strategy,
    add_verbose,
    cgroup_filter,
    positive_number,
    running_pids,
)
from .. import summary
from .agent import run_options
from .kernel import STRATEGIES
from .options import DEFAULT_METRICS_MAX_PIDS, Options

__all__ = ["add_parser", "options_from_args", "run"]

EXAMPLES = """examples:
  meridian io                       # every read/write on regular files, JSON lines
  meridian io -p 1234 -p 5678       # only these processes (filtered in the kernel)
  meridian io --comm postgres       # only processes with this name
  meridian io --cgroup /system.slice/nginx.service   # one cgroup (v2) and those below it
  meridian io --container web --format text   # one container, by name or id prefix
  meridian io --pod default/web-0 --no-events --duration 30   # one Kubernetes pod
  meridian io --format text         # aligned columns for people
  meridian io --disk-only           # only operations that reached the disk
  meridian io --min-latency 10      # only operations slower than 10 ms
  meridian io --no-events --duration 10   # metrics only: a per-PID summary after 10 s
  meridian io --no-events --prometheus :9435   # Prometheus metrics read from the maps
  meridian io --no-events --prometheus :9435 --metrics-max-pids all   # every process
  meridian io --no-events --prometheus :9435 --host-root /host   # in a pod: names its
                                    # containers from the node's / mounted at /host
  meridian io --top --sort latency  # live per-process view, slowest first (Ctrl-C ends)
  meridian io --top --max-pids 20   # 20 busiest processes, the rest per command name
  meridian io --workload --duration 10 --format text   # demo: a small file workload
  meridian io --otlp-endpoint http://localhost:4317 --otlp-logs   # OTLP metrics and logs
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = add_command(
        sub,
        "io",
        help=summary("io"),
        description="Trace reads and writes on regular files per process: latency, "
        "bytes, and whether the page cache served them. A summary per PID on exit.",
        examples=EXAMPLES,
    )
    add_pid(p)
    p.add_argument("--comm", action="append", default=[], help="trace this process name")
    add_cgroup_filter(p)
    p.add_argument(
        "--host-root",
        metavar="DIR",
        default="/",
        help="the node's root file system as mounted here (in a pod: its hostPath "
        "volumes, e.g. /host): containers are named from its cgroups and container "
        "runtimes' files (default /)",
    )
    p.add_argument("--format", choices=["json", "text"], default="json", help="event format")
    p.add_argument("--min-latency", metavar="MS", help="only events slower than MS milliseconds")
    p.add_argument("--disk-only", action="store_true", help="only events that reached the disk")
    p.add_argument("--no-events", action="store_true", help="metrics only, no event stream")
    add_duration(p)
    p.add_argument(
        "--max-pids",
        metavar="N",
        help="at most N processes get rows of their own (--top); the others are "
        "summed per command name (at most N of those), the rest into one 'other' row",
    )
    p.add_argument(
        "--metrics-max-pids",
        metavar="N",
        help=f"exported metrics (Prometheus, OTLP) keep at most N process series: with "
        f"more processes, the N-1 with the most bytes keep their own and the rest are "
        f"summed into process_pid=\"other\" (default {DEFAULT_METRICS_MAX_PIDS}; 'all': no cap)",
    )
    p.add_argument("--top", action="store_true", help="live per-process view (needs a terminal)")
    p.add_argument(
        "--sort", choices=["bytes", "latency", "ops"], default="bytes", help="--top order"
    )
    p.add_argument("--interval", metavar="SECONDS", default="1", help="--top refresh (default 1)")
    p.add_argument(
        "--grace", metavar="SECONDS", default="30", help="retire exited processes after this"
    )
    p.add_argument("--workload", action="store_true", help="run a small built-in file workload")
    add_strategy(p, STRATEGIES)
    add_verbose(p)
    add_arguments(p, logs=True)
    return p


def options_from_args(args: argparse.Namespace) -> Options:
    comms = []
    for c in args.comm:
        if not c or len(c.encode()) > 15:
            raise UsageError(f"--comm takes a process name of 1 to 15 bytes, got {c!r}")
        comms.append(c)
    min_lat = positive_number(args.min_latency, "--min-latency", minimum=0)
    max_series = positive_number(args.max_pids, "--max-pids", integer=True, minimum=1)
    metrics_max: float | None = DEFAULT_METRICS_MAX_PIDS
    if args.metrics_max_pids == "all":
        metrics_max = None
    elif args.metrics_max_pids is not None:
        try:
            metrics_max = positive_number(
                args.metrics_max_pids, "--metrics-max-pids", integer=True, minimum=1
            )
        except UsageError:
            raise UsageError(
                "--metrics-max-pids takes a number of processes (1 or more) or 'all', "
                f"got {args.metrics_max_pids!r}"
            ) from None
    interval = positive_number(args.interval, "--interval", minimum=0.05) or 1.0
    grace = positive_number(args.grace, "--grace", minimum=0)
    export = from_args(args)
    if export.otlp_logs and (args.no_events or args.top):
        raise UsageError("--otlp-logs sends events: it cannot go with --no-events or --top")
    if not os.path.isdir(args.host_root):
        raise UsageError(
            f"--host-root takes a directory (the node's / as mounted), got {args.host_root!r}"
        )
    return Options(
        pids=running_pids(args.pid),
        comms=comms,
        cgroup=cgroup_filter(args),
        host_root=args.host_root,
        format=args.format,
        min_latency_ns=int((min_lat or 0) * 1_000_000),
        disk_only=args.disk_only,
        duration=args.duration,
        strategy=args.strategy,
        # The kernel map holds up to four keys per process (op x cached).
        max_pids=max(8192, 4 * int(max_series)) if max_series else 8192,
        export=export,
        verbose=args.verbose,
        interval=interval,
        grace=30.0 if grace is None else grace,
        max_series=int(max_series) if max_series else None,
        metrics_max_series=None if metrics_max is None else int(metrics_max),
        top=args.top,
        sort=args.sort,
        # --top draws from the aggregates: no event stream, so nothing to drop.
        no_events=args.no_events or args.top,
        workload=args.workload,
    )


def run(args: argparse.Namespace) -> int:
    return run_options(options_from_args(args), sys.stdout)
