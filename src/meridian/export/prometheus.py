"""The Prometheus endpoint: the source (the kernel maps) is read on each scrape and
nothing is kept between scrapes.

Two renderers: the tools' exporters (`exporting()`) serve the text format rendered
straight from the families (exposition.py: fast at thousands of series); sentinel's
OpenMetrics endpoint goes through prometheus_client's collector pattern (`families`,
`SeriesCollector`), which negotiates OpenMetrics with the scraper.
"""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..errors import ExtraMissing, UsageError
from .exposition import (
    CONTENT_TYPE,
    label_value,
    log2_le_buckets,
    prom_label,
    prom_name,
    render,
)
from .series import HistPoint, Point, Source

__all__ = [
    "PrometheusServer",
    "QuietHandler",
    "SeriesCollector",
    "check_listen",
    "families",
    "log2_le_buckets",
    "parse_listen",
    "prom_label",
    "prom_name",
]


def families(source: Source) -> Iterator[Any]:
    """prometheus_client metric families for everything `source()` returns."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    for fam in source():
        name = prom_name(fam.name, fam.unit, fam.kind)
        keys = list(fam.points[0].attrs) if fam.points else []
        labels = [prom_label(k) for k in keys]
        if fam.kind == "histogram":
            h = HistogramMetricFamily(name, fam.description, labels=labels)
            for p in fam.points:
                assert isinstance(p, HistPoint)
                values = [label_value(p.attrs[k]) for k in keys]
                h.add_metric(values, log2_le_buckets(p, fam.bounds), p.sum)
            yield h
            continue
        cls = CounterMetricFamily if fam.kind == "counter" else GaugeMetricFamily
        m = cls(name, fam.description, labels=labels)
        for p in fam.points:
            assert isinstance(p, Point)
            m.add_metric([label_value(p.attrs[k]) for k in keys], p.value)
        yield m


class SeriesCollector:
    """A prometheus_client collector (only `collect()`) over a `Source`."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        return families(self.source)


def parse_listen(
    value: str, option: str = "--prometheus", any_port: bool = False
) -> tuple[str, int]:
    """`[HOST]:PORT` (or a bare PORT) to (host, port); no host means every address.
    `any_port`: port 0 (any free one) is allowed, for a server that says where it is."""
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    low = 0 if any_port else 1
    if not port.isdigit() or not low <= int(port) < 65536:
        raise UsageError(
            f"{option} takes [HOST]:PORT with a port from {low} to 65535, got {value!r}"
        )
    return host or "0.0.0.0", int(port)


def _bind_error(option: str, where: tuple[str, int], exc: OSError, hint: str = "") -> UsageError:
    what = exc.strerror or str(exc)
    return UsageError(f"{option} cannot listen on {where[0]}:{where[1]}: {what}{hint}")


def _family(where: tuple[str, int]) -> int:
    """AF_INET or AF_INET6 for the host (a gaierror, an OSError, when it has none)."""
    infos = socket.getaddrinfo(where[0], where[1], type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return int(infos[0][0])


def check_listen(where: tuple[str, int], option: str = "--prometheus") -> None:
    """Bind the address once and let it go, so that a host that does not resolve or a
    port in use is a one-line error at start, before the kernel programs load."""
    try:
        with socket.socket(_family(where), socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(where)
    except OSError as exc:
        hint = "; choose another [HOST]:PORT (e.g. :9436)"
        raise _bind_error(option, where, exc, hint) from None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    source: Source

    def __init__(self, where: tuple[str, int]) -> None:
        self.address_family = _family(where)
        super().__init__(where, _Handler)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (stderr is the tool's) and answers with
    `reply`."""

    def reply(self, body: bytes, content_type: str, encoding: str | None = None) -> None:
        """200 with `body`, its type, its Content-Encoding (if any) and its length."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Handler(QuietHandler):
    """GET /metrics (or /): the source rendered now, gzip when the scraper takes it."""

    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        try:
            body = render(self.server.source()).encode()
        except Exception as exc:  # a failed read is a 500 for this scrape, not the end
            self.send_error(500, f"{type(exc).__name__}: {exc}")
            return
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            self.reply(gzip.compress(body, compresslevel=1), CONTENT_TYPE, "gzip")
        else:
            self.reply(body, CONTENT_TYPE)


class PrometheusServer:
    """Serves /metrics from a thread until `close()`. A port in use is a UsageError.

    `fast` (what `exporting()` uses): the text format rendered by exposition.py.
    Otherwise prometheus_client's server and collector (OpenMetrics when asked)."""

    def __init__(
        self,
        source: Source,
        where: tuple[str, int],
        fast: bool = False,
    ) -> None:
        self.server: Any
        if fast:
            try:
                self.server = _Server(where)
            except OSError as exc:
                raise _bind_error("--prometheus", where, exc) from None
            self.server.source = source
            self.thread = threading.Thread(
                target=self.server.serve_forever, name="prometheus", daemon=True
            )
            self.thread.start()
            return
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ExtraMissing("--prometheus", "prometheus") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SeriesCollector(source))
        try:
            self.server, self.thread = start_http_server(where[1], addr=where[0], registry=registry)
        except OSError as exc:
            raise _bind_error("--prometheus", where, exc) from None

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
