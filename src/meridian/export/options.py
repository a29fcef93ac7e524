"""The exporter options every tool shares (`--prometheus`, `--otlp-*`), checked once,
and `exporting()`, which runs the chosen exporters around a tool's session."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
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
        "--otlp-endpoint", metavar="URL", help="send OTLP metrics here (e.g. http://localhost:4317)"
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
    from .otlp import check_endpoint, parse_header
    from .prometheus import parse_listen

    o = ExportOptions()
    if args.prometheus is not None:
        o.prometheus = parse_listen(args.prometheus)
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
    if o.prometheus is not None:
        _require("prometheus_client", "--prometheus", "prometheus")
    if o.otlp_endpoint is not None:
        _require("opentelemetry.sdk", "--otlp-endpoint", "otlp")
        _require(
            f"opentelemetry.exporter.otlp.proto.{_MODULE[o.otlp_protocol]}",
            "--otlp-endpoint",
            "otlp",
        )
    needs_endpoint = o.otlp_logs or o.otlp_headers or args.otlp_interval is not None
    if needs_endpoint and o.otlp_endpoint is None:
        raise UsageError("--otlp-logs, --otlp-header and --otlp-interval need --otlp-endpoint URL")
    return o


_MODULE = {"grpc": "grpc", "http/protobuf": "http"}


def _require(module: str, option: str, extra: str) -> None:
    """An optional part missing is a one-line error before anything is loaded."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ExtraMissing(option, extra) from None


class Exporters:
    """The running exporters of one tool: `logs` is set when events go out over OTLP."""

    def __init__(self) -> None:
        from .otlp import OtlpLogs, OtlpMetrics
        from .prometheus import PrometheusServer

        self.prometheus: PrometheusServer | None = None
        self.otlp: OtlpMetrics | None = None
        self.logs: OtlpLogs | None = None


@contextlib.contextmanager
def exporting(
    opts: ExportOptions | None, source: Source, tool: str, err: TextIO | None = None
) -> Iterator[Exporters]:
    """Start the exporters `opts` asks for over `source`; stop them (OTLP exports one
    last time) when the block ends, even on an error."""
    ex = Exporters()
    if opts is None:
        yield ex
        return
    err = err or sys.stderr
    with contextlib.ExitStack() as stack:
        if opts.prometheus is not None:
            from .prometheus import PrometheusServer

            ex.prometheus = PrometheusServer(source, opts.prometheus)
            stack.callback(ex.prometheus.close)
        if opts.otlp_endpoint is not None:
            from .otlp import OtlpLogs, OtlpMetrics

            kw = {
                "endpoint": opts.otlp_endpoint,
                "protocol": opts.otlp_protocol,
                "headers": opts.otlp_headers,
                "interval": opts.otlp_interval,
                "err": err,
            }
            ex.otlp = OtlpMetrics(source, tool, **kw)  # type: ignore[arg-type]
            stack.callback(ex.otlp.close)
            if opts.otlp_logs:
                ex.logs = OtlpLogs(tool, **kw)  # type: ignore[arg-type]
                stack.callback(ex.logs.close)
        yield ex
