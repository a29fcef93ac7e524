"""The exporter options every tool shares (`--prometheus`, `--otlp-*`), checked once,
and `exporting()`, which runs the chosen exporters around a tool's session."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

from ..errors import ExtraMissing, UsageError
from .series import Source

__all__ = ["ExportOptions", "Exporters", "add_arguments", "exporting", "from_args"]


@dataclass
class ExportOptions:
    prometheus: tuple[str, int] | None = None
    otlp_endpoint: str | None = None
    otlp_protocol: str = "grpc"
    otlp_headers: dict[str, str] = field(default_factory=dict)
    otlp_interval: float = 10.0
    otlp_logs: bool = False

    @property
    def any(self) -> bool:
        return self.prometheus is not None or self.otlp_endpoint is not None


def add_arguments(p: argparse.ArgumentParser, logs: bool = False) -> None:
    g = p.add_argument_group("export")
    g.add_argument("--prometheus", metavar="[HOST]:PORT", help="serve /metrics here (e.g. :9435)")
    g.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="send OTLP metrics here: scheme, host, port (e.g. http://localhost:4317)",
    )
    g.add_argument(
        "--otlp-protocol",
        choices=["grpc", "http/protobuf"],
        default="grpc",
        help="OTLP transport (default grpc)",
    )
    g.add_argument(
        "--otlp-header",
        metavar="K=V",
        action="append",
        default=[],
        help="OTLP request header (repeatable)",
    )
    g.add_argument(
        "--otlp-interval", metavar="S", help="seconds between OTLP metric exports (default 10)"
    )
    if logs:
        g.add_argument(
            "--otlp-logs", action="store_true", help="also send each event as an OTLP log record"
        )


def from_args(args: argparse.Namespace) -> ExportOptions:
    """Every export option checked, before anything is loaded: the endpoint's scheme,
    host (it must resolve) and port, and that the Prometheus address can be bound."""
    from .otlp import check_endpoint, parse_header
    from .prometheus import check_listen, parse_listen

    o = ExportOptions()
    if args.prometheus is not None:
        o.prometheus = parse_listen(args.prometheus)
        _require("prometheus_client", "--prometheus", "prometheus")
        check_listen(o.prometheus)
    o.otlp_protocol = args.otlp_protocol
    if args.otlp_endpoint is not None:
        o.otlp_endpoint = check_endpoint(args.otlp_endpoint, o.otlp_protocol)
    o.otlp_headers = dict(parse_header(h) for h in args.otlp_header)
    if args.otlp_interval is not None:
        try:
            o.otlp_interval = float(args.otlp_interval)
        except ValueError:
            raise UsageError(
                f"--otlp-interval must be a number of seconds, got {args.otlp_interval!r}"
            ) from None
        if not 0.1 <= o.otlp_interval <= 86400:
            raise UsageError(
                f"--otlp-interval must be from 0.1 to 86400 seconds, got {args.otlp_interval!r}"
            )
    o.otlp_logs = bool(getattr(args, "otlp_logs", False))
    if o.otlp_endpoint is not None:
        _require("opentelemetry.proto", "--otlp-endpoint", "otlp")
        if o.otlp_protocol == "grpc":
            _require("grpc", "--otlp-endpoint", "otlp")
    needs_endpoint = o.otlp_logs or o.otlp_headers or args.otlp_interval is not None
    if needs_endpoint and o.otlp_endpoint is None:
        raise UsageError("--otlp-logs, --otlp-header and --otlp-interval need --otlp-endpoint URL")
    return o


def _require(module: str, option: str, extra: str) -> None:
    """An optional part missing is a one-line error before anything is loaded."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ExtraMissing(option, extra) from None


class Exporters:
    """The running exporters of one tool: `logs` is set when events go out over OTLP."""

    def __init__(self) -> None:
        from .logs import OtlpLogs
        from .otlp import OtlpMetrics
        from .prometheus import PrometheusServer

        self.prometheus: PrometheusServer | None = None
        self.otlp: OtlpMetrics | None = None
        self.logs: OtlpLogs | None = None
        self.err: TextIO = sys.stderr
        self._finished = False

    def finish(self) -> dict[str, int]:
        """The last OTLP sends, metrics and logs together within FINAL_FLUSH_S, each
        failure said in one line on stderr; the log records lost (by why) for the tool's
        summary (empty without --otlp-logs). Once; `exporting()` calls it if the tool
        did not."""
        from .otlp import FINAL_FLUSH_S

        if self._finished:
            return self.logs.lost() if self.logs else {}
        self._finished = True
        deadline = time.monotonic() + FINAL_FLUSH_S
        if self.otlp is not None:  # one request or a few: the totals first
            self.otlp.close(deadline)
        if self.logs is not None:
            self.logs.close(deadline)
        for line in (x.summary() for x in (self.otlp, self.logs) if x is not None):
            if line:
                print(line, file=self.err)
        self.err.flush()
        return self.logs.lost() if self.logs else {}


@contextlib.contextmanager
def exporting(
    opts: ExportOptions | None, source: Source, tool: str, err: TextIO | None = None
) -> Iterator[Exporters]:
    """Start the exporters `opts` asks for over `source`; stop them (OTLP sends one
    last time, bounded) when the block ends, even on an error."""
    ex = Exporters()
    if opts is None:
        yield ex
        return
    ex.err = err or sys.stderr
    with contextlib.ExitStack() as stack:
        if opts.prometheus is not None:
            from .prometheus import PrometheusServer

            ex.prometheus = PrometheusServer(source, opts.prometheus, fast=True)
            stack.callback(ex.prometheus.close)
        if opts.otlp_endpoint is not None:
            from .logs import OtlpLogs
            from .otlp import OtlpMetrics

            stack.callback(ex.finish)
            ex.otlp = OtlpMetrics(
                source,
                tool,
                opts.otlp_endpoint,
                opts.otlp_protocol,
                opts.otlp_headers,
                opts.otlp_interval,
                ex.err,
            )
            if opts.otlp_logs:
                ex.logs = OtlpLogs(
                    tool, opts.otlp_endpoint, opts.otlp_protocol, opts.otlp_headers, err=ex.err
                )
        yield ex
