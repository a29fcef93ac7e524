"""`meridian sentinel`: the command line. Flags default to None so that only the
flags a person typed override the YAML file (config.merge_args); every mistake is
found here, before anything is loaded or served, and is one line with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any, TextIO

from ...errors import UsageError
from ...flags import add_command, add_duration, add_json, add_pid
from .. import summary

__all__ = ["EXAMPLES", "add_parser", "check_host", "config_from_args", "run"]

EXAMPLES = """examples:
  meridian sentinel                            # sample cheaply, live top services (Ctrl-C ends)
  meridian sentinel --duration 30              # 30 s, then the top services with their stacks
  meridian sentinel --duration 30 --by flow    # one row per 5-tuple, not per service
  meridian sentinel --mode diagnostic -F 4999  # richer events, higher budget and frequency
  meridian sentinel --events 'cycles,llc-misses;branch-misses'   # two groups taking turns
  meridian sentinel --events raw:0x1cd:0x1e    # a raw PMU code (config1 after the colon)
  meridian sentinel --samples-per-sec 500 --hard-drop-ns 1000000   # per-CPU budget
  meridian sentinel --interface eth0           # diagnostic mode when eth0's throughput drops
  meridian sentinel --xdp eth0 -p 1234         # XDP flow hook on eth0; only PID 1234
  meridian sentinel --lbr --raw-samples --data-dir /var/lib/ms   # samples with their branches
  meridian sentinel --json --duration 10       # one JSON object per flush window
  meridian sentinel --prometheus :9102         # /metrics on every address
  meridian sentinel --api-port 9103 --api-token-file tok   # HTTP control plane on /api/v1
  meridian sentinel --data-dir /var/lib/ms      # rollups, stacks, names in embedded ClickHouse
  meridian sentinel --clickhouse-url http://ch:8123 --clickhouse-password-file pw   # a server
  meridian sentinel query top-flows --since 10m --data-dir /var/lib/ms   # the store's top
  meridian sentinel query top-services --since 1h --data-dir /var/lib/ms   # by service
  meridian sentinel query flow 245eaf80ddcc96c7 --flamegraph flow.svg --data-dir /var/lib/ms
  meridian sentinel --print-config > sentinel.yaml   # every key with its default
  meridian sentinel --config sentinel.yaml -v  # from a file; -v names strategy and events
  meridian sentinel --perf-mock --mock-period-ms=25 --prometheus=:9102   # no kernel: demo
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = add_command(
        sub,
        "sentinel",
        help=summary("sentinel"),
        description="Sample PMU events (cpu-clock where the CPU has none) on every CPU at "
        "a bounded per-CPU budget, attribute each sample to the network flow the CPU "
        "was handling, and show the flows by cost with their hottest functions and "
        "stacks. OpenMetrics on --prometheus. Flags override the --config file.",
        examples=EXAMPLES,
    )
    p.add_argument("--config", metavar="FILE", help="YAML configuration (see --print-config)")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the configuration (every key, flags applied) as YAML and exit",
    )
    p.add_argument("--mode", choices=["sentinel", "diagnostic"], default=None, help="mode at start")
    p.add_argument("-F", "--frequency", metavar="HZ", help="samples per second per event and CPU")
    p.add_argument(
        "--events",
        metavar="LIST",
        help="events to sample in both modes, comma-separated; ';' separates groups that "
        "take turns on the PMU (cycles, instructions, llc-misses, branch-misses, "
        "remote-dram, hitm, cpu-clock, raw:0xCODE)",
    )
    p.add_argument("--samples-per-sec", metavar="N", help="sentinel budget, samples/s per CPU")
    p.add_argument(
        "--diagnostic-samples-per-sec", metavar="N", help="diagnostic budget, samples/s per CPU"
    )
    p.add_argument(
        "--hard-drop-ns", metavar="N", help="after the budget runs out, drop everything this long"
    )
    _repeated(
        p,
        "--interface",
        "IFACE",
        "watch this interface's throughput (repeatable; default all but lo)",
    )
    _repeated(p, "--xdp", "IFACE", "add an XDP flow-context hook on this interface (repeatable)")
    lbr = "each sample's last branches (LBR) too, stored with --raw-samples: branch-stack "
    lbr += "(alone: the sample's own records), snapshot or off; refused where the CPU has no LBR"
    p.add_argument("--lbr", nargs="?", const="on", metavar="MODE", help=lbr)
    add_pid(p, "only this process (repeatable, or PID,PID)")
    _serving_and_storage(p)
    _switch(p, "--raw-samples", "store every sample too (ms_raw_samples), not only rollups")
    _switch(p, "--perf-mock", "synthetic samples, no kernel (demos and tests)")
    p.add_argument("--mock-period-ms", metavar="MS", help="ms between two mock batches")
    add_duration(p)
    p.add_argument(
        "--by",
        choices=["service", "flow"],
        default=None,
        help="rows of the live table and the summary: one per service, the listening "
        "address, port and protocol (default; --json adds `services` beside `flows`), "
        "or one per flow (5-tuple)",
    )
    add_json(p, "one JSON object per flush window, and one summary object", default=None)
    p.add_argument(  # on or off, as every tool's -v; None: the YAML file's run.verbose
        "-v",
        "--verbose",
        action="store_const",
        const=1,
        default=None,
        help="name the strategy, the event source, mode changes (libbpf detail too)",
    )
    from .query.cli import add_query_parser

    add_query_parser(p.add_subparsers(dest="command", metavar="COMMAND"))
    return p


def _serving_and_storage(p: argparse.ArgumentParser) -> None:
    """/metrics, the control plane and the store: where each is."""
    for flag, metavar, text in (
        (
            "--prometheus",
            "[HOST]:PORT",
            "serve /metrics here (no HOST: every address; 0: any port)",
        ),
        ("--metrics-port", "PORT", "deprecated: --prometheus 127.0.0.1:PORT"),
        ("--metrics-address", "HOST", "deprecated: --prometheus HOST:PORT"),
        ("--api-port", "PORT", "serve the control plane /api/v1 (0: any)"),
        ("--api-address", "HOST", "its address (default 127.0.0.1)"),
        ("--api-token-file", "FILE", "the API requires this bearer token"),
        ("--data-dir", "DIR", "store in embedded ClickHouse (chDB) here"),
        ("--clickhouse-url", "URL", "store on this ClickHouse server (HTTP)"),
        ("--clickhouse-user", "USER", "ClickHouse user (default: default)"),
        ("--clickhouse-password-file", "FILE", "file holding the ClickHouse password"),
        ("--spool-dir", "DIR", "batches not yet stored wait here (default: see --print-config)"),
    ):
        p.add_argument(flag, metavar=metavar, help=text)


def _switch(p: argparse.ArgumentParser, flag: str, help: str) -> None:
    """An on flag left None when absent, so the YAML file's value stands."""
    p.add_argument(flag, action="store_const", const=True, default=None, help=help)


def _repeated(p: argparse.ArgumentParser, flag: str, metavar: str, help: str, *more: str) -> None:
    """A flag given once per value; None when absent, so the YAML file's list stands."""
    p.add_argument(flag, *more, metavar=metavar, action="append", default=None, help=help)


# The flags every other tool spells otherwise (--prometheus [HOST]:PORT): still read.
DEPRECATED = ("metrics_port", "metrics_address")


def config_from_args(args: argparse.Namespace, err: TextIO = sys.stderr) -> Any:
    """The configuration: file (or defaults) with the typed flags laid over it. A
    deprecated flag works, and says so on `err`."""
    from .config.load import FLAGS, load_config, merge_args

    cfg = merge_args(load_config(args.config), args)
    for dest in DEPRECATED:
        if getattr(args, dest, None) is not None:
            flag = FLAGS[dest][1]
            print(
                f"meridian sentinel: {flag} is deprecated: use --prometheus [HOST]:PORT", file=err
            )
    return cfg


def _interfaces() -> list[str]:
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return []


def check_host(cfg: Any, proc_root: str = "/proc") -> None:
    """What the host must have, checked before anything starts: the interfaces and
    processes named, and an LBR where branch records are asked for (the mock makes
    its own)."""
    if not cfg.mock.enabled:
        from .sources.lbr import require_lbr

        require_lbr(cfg.perf.lbr)
    have = _interfaces()
    for flag, names in (
        ("--interface", cfg.anomaly.interfaces),
        ("--xdp", [] if cfg.mock.enabled else cfg.perf.xdp_interfaces),
    ):
        for name in names:
            if name not in have:
                raise UsageError(
                    f"{flag}: no interface {name!r} on this host (it has: {', '.join(have)})"
                )
    for pid in cfg.targets.pids:
        if pid <= 0:
            raise UsageError(f"-p takes a process ID (a positive whole number), got {pid}")
        if not cfg.mock.enabled and not os.path.isdir(f"{proc_root}/{pid}"):
            raise UsageError(f"-p: no process with PID {pid} (see ps -e)")


def run(args: argparse.Namespace) -> int:
    from .config.load import dump_config

    cfg = config_from_args(args)
    if args.print_config:
        from .storage.factory import data_dir_for, spool_dir_for

        unset = {"clickhouse.spool_dir": str(spool_dir_for(cfg.clickhouse))}
        if not cfg.clickhouse.url:
            unset["clickhouse.data_dir"] = str(data_dir_for(cfg.clickhouse))
        sys.stdout.write(dump_config(cfg, unset))
        return 0
    check_host(cfg)
    from .agent.run import run_cli

    return run_cli(cfg, sys.stdout, sys.stderr)
