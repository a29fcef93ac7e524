"""OTLP metrics from kernel aggregates, and the checks of the OTLP options.

Every `interval` seconds a thread calls the tool's `Source` (one read of the maps),
builds an ExportMetricsServiceRequest with the generated `opentelemetry-proto`
messages and sends it (transport.py, gRPC or HTTP/protobuf). Nothing is recorded per
event, and nothing goes through the SDK's instruments: the API has no observable
histogram, and feeding a synchronous one a `record()` per event is the per-event cost
the kernel aggregates exist to avoid (and re-bucketing would blur the kernel's slots).
Each `HistogramDataPoint` has the family's bounds as `explicit_bounds` (the log2 slot
bounds in its range, series.py: the same for every point of the family and the same
as Prometheus' `le`), the kernel's slots in those buckets as `bucket_counts` (slots
below the range in the first, above it in the last), an exact `sum`, `max` (and
`min`) when the kernel keeps them. Not exponential histograms: their bounds are powers
of two of the metric's unit, seconds, and a slot of 2**i ns is not one (nor are its
bounds inclusive on the same side). Temporality is cumulative since the tool attached:
an export that fails loses nothing, the next one carries the totals. Requests carry at
most `BATCH_POINTS` data points.

An unreachable collector does not stop the tool: a failed export is counted, said once
on stderr, and the next one waits longer (doubling up to a minute, with jitter:
backoff.py). `close(deadline)` exports once more within the deadline, and `summary()`
says how many exports failed.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO
from urllib.parse import urlsplit

from .. import __version__
from ..backoff import Backoff
from ..errors import UsageError
from .series import Family, HistPoint, Point, Source
from .transport import Endpoint, FirstFailure, Transport

__all__ = ["OtlpMetrics", "check_endpoint", "parse_header"]

PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PORT = {"grpc": 4317, "http/protobuf": 4318}
MAX_BACKOFF_S = 60.0
FINAL_FLUSH_S = 2.0  # the last export (and the logs' last sends) after --duration
# Data points per request: collectors refuse messages over 4 MiB by default, and a
# histogram point with 40 log2 buckets is about 700 bytes.
BATCH_POINTS = 2000


def check_endpoint(url: str, protocol: str) -> str:
    """The endpoint as SCHEME://HOST:PORT[/PATH] (the port made explicit), or a one-line
    UsageError naming the value and what to write instead. The host must resolve now:
    a typo is said at start, not as a failed export after the run."""
    example = f"http://localhost:{DEFAULT_PORT[protocol]}"

    def bad(why: str) -> UsageError:
        return UsageError(f"--otlp-endpoint {url!r}: {why}; write a URL such as {example}")

    if "://" not in url:
        raise bad("no scheme (http:// or https://)")
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        raise bad("the port must be a number from 1 to 65535") from None
    if u.scheme not in ("http", "https"):
        raise bad(f"the scheme must be http or https, not {u.scheme!r}")
    if not u.hostname:
        raise bad("no host")
    if u.username is not None or u.password is not None:
        raise bad("user:password@ is not taken here (use --otlp-header authorization=...)")
    if u.query or u.fragment or url.rstrip("/").endswith("?"):
        raise bad("no ?query or #fragment")
    path = u.path.rstrip("/")
    if path and protocol == "grpc":
        raise bad("a gRPC endpoint has no path")
    if port == 0:
        raise bad("the port must be a number from 1 to 65535")
    host = u.hostname
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise bad(f"host {host!r} does not resolve ({exc.strerror or exc})") from None
    port = port or DEFAULT_PORT[protocol]
    return Endpoint(u.scheme, host, port, path).url


def parse_header(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--otlp-header takes KEY=VALUE, got {value!r}")
    return key.strip().lower(), val.strip()


def resource_attrs(tool: str) -> dict[str, str | int | bool]:
    return {
        "service.name": "meridian",
        "service.version": __version__,
        "host.name": socket.gethostname(),
        "meridian.tool": tool,
    }


def _attrs(msg: Any, attrs: Mapping[str, str | int | bool]) -> None:
    for k, v in attrs.items():
        kv = msg.add()
        kv.key = k
        if isinstance(v, bool):
            kv.value.bool_value = v
        elif isinstance(v, int):
            kv.value.int_value = v
        else:
            kv.value.string_value = str(v)


def _number(dp: Any, attrs: Mapping[str, str | int | bool], value: float) -> None:
    _attrs(dp.attributes, attrs)
    if isinstance(value, int):
        dp.as_int = value
    else:
        dp.as_double = value


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
        self.source, self.interval, self.tool = source, interval, tool
        self.timeout = min(10.0, max(2.0, interval))
        self.transport = Transport("metrics", Endpoint.parse(endpoint), protocol, headers or {})
        self.failure = FirstFailure(
            f"OTLP metrics export to {endpoint} ({protocol})",
            "totals are cumulative so nothing is lost",
            err,
        )
        self.start_ns = time.time_ns()
        self.exports = self.failures = 0
        self.last_error = ""
        self.last_ok = True
        self._lock = threading.Lock()  # one export at a time (the loop, or close)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="otlp-metrics", daemon=True)
        self._thread.start()

    def requests(self) -> list[bytes]:
        """ExportMetricsServiceRequest bodies for one read of the source, at most
        BATCH_POINTS data points each."""
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )
        from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

        now = time.time_ns()
        out: list[bytes] = []
        req: Any = None
        scope: Any = None
        npoints = 0

        def fresh() -> None:
            nonlocal req, scope, npoints
            if req is not None:
                out.append(req.SerializeToString())
            req = ExportMetricsServiceRequest()
            rm = req.resource_metrics.add()
            _attrs(rm.resource.attributes, resource_attrs(self.tool))
            scope = rm.scope_metrics.add()
            scope.scope.name, scope.scope.version = f"meridian.{self.tool}", __version__
            npoints = 0

        fresh()
        cumulative = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
        for fam in self.source():
            for at in range(0, max(len(fam.points), 1), BATCH_POINTS):
                if npoints and npoints + min(len(fam.points) - at, BATCH_POINTS) > BATCH_POINTS:
                    fresh()
                m = scope.metrics.add()
                m.name, m.description, m.unit = fam.name, fam.description, fam.unit
                points = fam.points[at : at + BATCH_POINTS]
                npoints += len(points)
                self._fill(m, fam, points, now, cumulative)
        fresh()
        return out

    def _fill(self, m: Any, fam: Family, points: list[Point | HistPoint], now: int,
              cumulative: int) -> None:  # fmt: skip
        if fam.kind == "histogram":
            m.histogram.aggregation_temporality = cumulative
            for p in points:
                assert isinstance(p, HistPoint)
                dp = m.histogram.data_points.add()
                _attrs(dp.attributes, p.attrs)
                dp.start_time_unix_nano, dp.time_unix_nano = self.start_ns, now
                b = fam.bounds.of(len(p.slots), p.scale)
                dp.count, dp.sum = p.count, p.sum
                dp.bucket_counts.extend(b.counts(p.slots))
                dp.explicit_bounds.extend(b.bounds)
                if p.min is not None:
                    dp.min = p.min
                if p.max is not None:
                    dp.max = p.max
            return
        if fam.kind == "counter":
            m.sum.aggregation_temporality = cumulative
            m.sum.is_monotonic = True
            data = m.sum.data_points
        else:
            data = m.gauge.data_points
        for p in points:
            assert isinstance(p, Point)
            dp = data.add()
            _number(dp, p.attrs, p.value)
            dp.time_unix_nano = now
            if fam.kind == "counter":
                dp.start_time_unix_nano = self.start_ns

    def export_once(self, deadline: float | None = None) -> bool:
        """One read of the source, sent; False (counted, said once) when it failed."""
        with self._lock:
            self.exports += 1
            error = ""
            try:
                for body in self.requests():
                    left = self.timeout if deadline is None else deadline - time.monotonic()
                    if left <= 0 and self.last_error:
                        error = self.last_error  # out of time: the last reason stands
                        break
                    r = self.transport.send(body, min(left, self.timeout))
                    if not r.ok:
                        error = r.error
                        break
            except Exception as exc:  # a bad read must not end the exports
                error = f"{type(exc).__name__}: {exc}"
            self.last_ok = not error
            if error:
                self.failures += 1
                self.last_error = error
                self.failure.say(error)
            return not error

    def _loop(self) -> None:
        """Export every interval; while failing, wait twice as long each time (from
        two intervals up to a minute)."""
        backoff = Backoff(2 * self.interval, MAX_BACKOFF_S)
        delay = self.interval
        while not self._stop.wait(delay):
            if self.export_once():
                backoff.reset()
                delay = self.interval
            else:
                delay = backoff.failed()

    def close(self, deadline: float | None = None) -> None:
        """Stop, with one last export of the totals, given until `deadline`
        (time.monotonic(); default FINAL_FLUSH_S from now)."""
        end = time.monotonic() + FINAL_FLUSH_S if deadline is None else deadline
        self._stop.set()
        self._thread.join(max(0.0, end - time.monotonic()))
        if not self._thread.is_alive():
            self.export_once(end)
        else:  # an export still under way took the time: it was the last one
            self._thread.join(max(0.0, end - time.monotonic()) + 0.5)
        self.transport.close()

    def summary(self) -> str:
        """One line for stderr when exports failed, else ''."""
        if not self.failures:
            return ""
        last = "arrived" if self.last_ok else f"did not arrive ({self.last_error})"
        return (
            f"meridian: {self.failures} of {self.exports} OTLP metric exports to "
            f"{self.transport.endpoint.url} failed; the last totals {last}"
        )
