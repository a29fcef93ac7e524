"""OTLP export with the OpenTelemetry SDK: metrics from kernel aggregates, and logs.

Metrics. Every `interval` seconds a thread calls the tool's `Source` (one read of the
maps), turns the families into the SDK's own `MetricsData` (what a `MetricReader` hands
to an exporter) and gives it to the SDK's OTLP exporter, gRPC or HTTP/protobuf.
Nothing is recorded per event. Why not the SDK's instruments: observable counters and
gauges would do for sums, but the API has no observable histogram, and feeding a
synchronous histogram one `record()` per event is the per-event cost the kernel
aggregates exist to avoid (and re-bucketing would lose the kernel's exact slots). So
each `HistogramDataPoint` is built here: `explicit_bounds` are the log2 slot bounds in
seconds, `bucket_counts` the kernel's slots, `sum` exact, `max` when the kernel keeps
it, `min` left unset (the kernel does not keep it). Temporality is cumulative since the
tool attached: an export that fails loses nothing, the next one carries the totals.

An unreachable collector does not stop the tool: the SDK exporter retries within an
export, this module backs off between exports (doubling up to a minute), says so once
on stderr, and exports once more on close.

Logs. `OtlpLogs.emit_json_lines()` turns each JSON event line into an OpenTelemetry
`LogRecord` (body: the line; attributes after the semantic conventions) through the
SDK's `BatchLogRecordProcessor`.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO, cast
from urllib.parse import urlsplit

from .. import __version__
from ..errors import ExtraMissing, UsageError
from .series import HistPoint, Point, Source, log2_bounds

__all__ = ["OtlpLogs", "OtlpMetrics", "check_endpoint", "parse_header"]

PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PORT = {"grpc": 4317, "http/protobuf": 4318}
MAX_BACKOFF_S = 60.0
CLOSE_WHEN_FAILING_S = 2.0
# Data points per request: collectors refuse messages over 4 MiB by default, and a
# histogram point with 40 log2 buckets is about 700 bytes.
BATCH_POINTS = 2000


def check_endpoint(url: str, protocol: str) -> str:
    """The endpoint as a base URL with scheme and port, or a UsageError."""
    u = urlsplit(url if "://" in url else f"http://{url}")
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(f"--otlp-endpoint takes a URL such as http://localhost:4317, got {url!r}")
    try:
        port = u.port or DEFAULT_PORT[protocol]
    except ValueError:
        raise UsageError(f"--otlp-endpoint has a bad port: {url!r}") from None
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{u.scheme}://{host}:{port}{u.path.rstrip('/')}"


def parse_header(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--otlp-header takes KEY=VALUE, got {value!r}")
    return key.strip().lower(), val.strip()


def _sdk() -> None:
    try:
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        raise ExtraMissing("--otlp-endpoint", "otlp") from None


class _LastError(logging.Handler):
    """Keeps the SDK exporters' last error line; they would print every retry."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage().split(", error details")[0]


_HANDLER = _LastError()


def _quiet_sdk_loggers() -> None:
    for name in ("opentelemetry.exporter.otlp", "opentelemetry.sdk._logs"):
        log = logging.getLogger(name)
        log.propagate = False
        if _HANDLER not in log.handlers:
            log.addHandler(_HANDLER)


def _exporter(
    signal: str, endpoint: str, protocol: str, headers: Mapping[str, str], timeout: float
) -> Any:
    """The SDK's OTLP exporter for `signal` ("metrics" or "logs")."""
    if protocol == "grpc":
        u = urlsplit(endpoint)
        target = (
            f"{u.hostname}:{u.port}"
            if ":" not in (u.hostname or "")
            else f"[{u.hostname}]:{u.port}"
        )
        insecure = u.scheme == "http"
        if signal == "metrics":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

            return OTLPMetricExporter(
                target,
                insecure=insecure,
                headers=dict(headers),
                timeout=timeout,
                max_export_batch_size=BATCH_POINTS,
            )
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        return OTLPLogExporter(target, insecure=insecure, headers=dict(headers), timeout=timeout)
    url = f"{endpoint}/v1/{signal}"
    if signal == "metrics":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )

        return HttpMetricExporter(
            url, headers=dict(headers), timeout=timeout, max_export_batch_size=BATCH_POINTS
        )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogExporter,
    )

    return HttpLogExporter(url, headers=dict(headers), timeout=timeout)


def _resource(tool: str) -> Any:
    from opentelemetry.sdk.resources import Resource

    return Resource.create(
        {
            "service.name": "meridian",
            "service.version": __version__,
            "host.name": socket.gethostname(),
            "meridian.tool": tool,
        }
    )


class _Once:
    """Says a failure once on stderr, whatever the number of retries."""

    def __init__(self, what: str, err: TextIO) -> None:
        self.what, self.err, self.said = what, err, False

    def failed(self) -> None:
        if not self.said:
            self.said = True
            detail = _HANDLER.last or "no answer"
            print(
                f"meridian: {self.what} failed ({detail}); retrying with backoff, "
                "totals are cumulative so nothing is lost",
                file=self.err,
            )
            self.err.flush()


class OtlpMetrics:
    """Exports `source()` every `interval` seconds until `close()` (which exports once
    more, so the last totals leave too)."""

    def __init__(
        self,
        source: Source,
        tool: str,
        endpoint: str,
        protocol: str = "grpc",
        headers: Mapping[str, str] | None = None,
        interval: float = 10.0,
        err: TextIO | None = None,
    ) -> None:
        _sdk()
        from opentelemetry.sdk.metrics.export import AggregationTemporality
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        _quiet_sdk_loggers()
        self.source, self.interval = source, interval
        self.timeout = min(10.0, max(2.0, interval))
        self.exporter = _exporter("metrics", endpoint, protocol, headers or {}, self.timeout)
        self.resource = _resource(tool)
        self.scope = InstrumentationScope(f"meridian.{tool}", __version__)
        self.cumulative = AggregationTemporality.CUMULATIVE
        self.start_ns = time.time_ns()
        self.once = _Once(f"OTLP metrics export to {endpoint} ({protocol})", err or sys.stderr)
        self.exports = self.failures = 0
        self.healthy = True
        self._shut = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="otlp-metrics", daemon=True)
        self._thread.start()

    def metrics_data(self) -> Any:
        """The SDK's `MetricsData` for one read of the source."""
        from opentelemetry.sdk.metrics.export import (
            Gauge,
            Histogram,
            HistogramDataPoint,
            Metric,
            MetricsData,
            NumberDataPoint,
            ResourceMetrics,
            ScopeMetrics,
            Sum,
        )

        now = time.time_ns()
        metrics = []
        for fam in self.source():
            data: Any
            if fam.kind == "histogram":
                hpoints = []
                for p in fam.points:
                    assert isinstance(p, HistPoint)
                    hpoints.append(
                        HistogramDataPoint(
                            attributes=dict(p.attrs),
                            start_time_unix_nano=self.start_ns,
                            time_unix_nano=now,
                            count=p.count,
                            sum=p.sum,
                            bucket_counts=[int(n) for n in p.slots.tolist()],
                            explicit_bounds=log2_bounds(len(p.slots), p.scale),
                            min=None,  # type: ignore[arg-type]  # unknown: left unset
                            max=p.max,  # type: ignore[arg-type]
                        )
                    )
                data = Histogram(hpoints, self.cumulative)
            else:
                npoints = []
                for p in fam.points:
                    assert isinstance(p, Point)
                    npoints.append(
                        NumberDataPoint(
                            attributes=dict(p.attrs),
                            start_time_unix_nano=self.start_ns if fam.kind == "counter" else 0,
                            time_unix_nano=now,
                            value=p.value,
                        )
                    )
                if fam.kind == "counter":
                    data = Sum(npoints, self.cumulative, is_monotonic=True)
                else:
                    data = Gauge(npoints)
            metrics.append(Metric(fam.name, fam.description, fam.unit, data))
        scope = ScopeMetrics(self.scope, metrics, "")
        return MetricsData([ResourceMetrics(self.resource, [scope], "")])

    def export_once(self) -> bool:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        ok = bool(
            self.exporter.export(self.metrics_data(), timeout_millis=self.timeout * 1000)
            == MetricExportResult.SUCCESS
        )
        self.exports += 1
        if not ok:
            self.failures += 1
            self.once.failed()
        return ok

    def _export_safely(self) -> bool:
        if self._shut:
            return False
        try:
            ok = self.export_once()
        except Exception as exc:  # a bad read must not end the exports
            _HANDLER.last = f"{type(exc).__name__}: {exc}"
            self.once.failed()
            ok = False
        self.healthy = ok
        return ok

    def _loop(self) -> None:
        """Export every interval (backing off while failing); once more when stopped."""
        delay = self.interval
        while True:
            stopping = self._stop.wait(delay)
            ok = self._export_safely()
            if stopping:
                return
            delay = self.interval if ok else min(max(delay * 2, self.interval), MAX_BACKOFF_S)

    def close(self) -> None:
        """Stop, with one last export of the totals. While the collector answers that
        may take up to two export timeouts; while it does not, about 2 s (the totals it
        would have carried are the ones every earlier failed export had too)."""
        self._stop.set()
        self._thread.join(2 * self.timeout if self.healthy else CLOSE_WHEN_FAILING_S)
        self._shut = True
        self.exporter.shutdown(timeout_millis=1000)  # also cuts a retry wait short
        self._thread.join(1.0)


class _ReportingLogExporter:
    """Wraps the SDK log exporter: a failed batch is said once on stderr."""

    def __init__(self, inner: Any, once: _Once) -> None:
        self.inner, self.once = inner, once
        self.delivered = 0

    def export(self, batch: Any) -> Any:
        result = self.inner.export(batch)
        if getattr(result, "name", "") == "SUCCESS":
            self.delivered += len(batch)
        else:
            self.once.failed()
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


# JSON event fields -> OpenTelemetry attributes (semantic conventions where they exist).
LOG_ATTRS = {
    "pid": "process.pid",
    "tid": "thread.id",
    "comm": "process.executable.name",
    "op": "disk.io.direction",
    "file": "file.path",
    "fd": "meridian.io.fd",
    "bytes": "meridian.io.bytes",
    "bytes_requested": "meridian.io.bytes_requested",
    "disk_bytes": "meridian.io.disk_bytes",
    "latency_ns": "meridian.io.latency_ns",
    "cached": "meridian.io.cached",
    "io_wait_ns": "meridian.io.io_wait_ns",
    "timestamp_ns": "meridian.io.timestamp_ns",
}


class OtlpLogs:
    """Each event line becomes an OpenTelemetry log record, exported in batches."""

    def __init__(
        self,
        tool: str,
        endpoint: str,
        protocol: str = "grpc",
        headers: Mapping[str, str] | None = None,
        interval: float = 1.0,
        err: TextIO | None = None,
    ) -> None:
        _sdk()
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

        _quiet_sdk_loggers()
        timeout = min(10.0, max(2.0, interval))
        inner = _exporter("logs", endpoint, protocol, headers or {}, timeout)
        self.err = err or sys.stderr
        once = _Once(f"OTLP logs export to {endpoint} ({protocol})", self.err)
        self.exporter = _ReportingLogExporter(inner, once)
        self.provider = LoggerProvider(resource=_resource(tool))
        self.provider.add_log_record_processor(
            BatchLogRecordProcessor(
                cast(Any, self.exporter),
                schedule_delay_millis=min(interval, 1.0) * 1000,
                max_export_batch_size=2048,
                max_queue_size=1 << 16,
            )
        )
        self.logger = self.provider.get_logger(f"meridian.{tool}", __version__)
        self.offset_ns = time.time_ns() - time.monotonic_ns()
        self.emitted = 0

    def emit_json_lines(self, text: str) -> None:
        from opentelemetry._logs import LogRecord, SeverityNumber

        now = time.time_ns()
        for line in text.splitlines():
            if not line:
                continue
            ev = json.loads(line)
            attrs = {LOG_ATTRS[k]: v for k, v in ev.items() if k in LOG_ATTRS}
            ts = ev.get("timestamp_ns")
            self.logger.emit(
                LogRecord(
                    timestamp=ts + self.offset_ns if isinstance(ts, int) else now,
                    observed_timestamp=now,
                    severity_number=SeverityNumber.INFO,
                    severity_text="INFO",
                    body=line,
                    attributes=attrs,
                    event_name="meridian.io",
                )
            )
            self.emitted += 1

    def close(self) -> None:
        """Flush and stop; records that never reached the collector (it was down, or
        the queue was full) are counted on stderr, never dropped silently."""
        self.provider.force_flush()
        self.provider.shutdown()
        lost = self.emitted - self.exporter.delivered
        if lost:
            print(
                f"meridian: {lost} of {self.emitted} OTLP log records were not delivered",
                file=self.err,
            )
