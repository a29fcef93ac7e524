"""The Prometheus endpoint: prometheus_client's collector pattern, so the kernel maps
are read on each scrape and nothing is kept between scrapes.

Names follow OpenTelemetry's Prometheus compatibility rules: dots become underscores,
the unit becomes a suffix (`By` -> `_bytes`, `s` -> `_seconds`, `1` -> `_ratio` on
gauges; annotations such as `{operation}` add nothing), counters end in `_total`.
So `process.disk.io` in bytes is `process_disk_io_bytes_total`, and the attribute
`process.pid` is the label `process_pid`. Histograms are Prometheus histograms in
seconds whose `le` bounds are the kernel's log2 slot bounds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..errors import ExtraMissing, UsageError
from .series import HistPoint, Point, Source

__all__ = [
    "PrometheusServer",
    "SeriesCollector",
    "families",
    "log2_le_buckets",
    "parse_listen",
    "prom_label",
    "prom_name",
]

UNIT_SUFFIX = {"By": "bytes", "s": "seconds", "1": "ratio"}


def prom_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus name of an OpenTelemetry metric, without a counter's `_total`."""
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    suffix = UNIT_SUFFIX.get(unit)
    if suffix == "ratio" and kind != "gauge":
        suffix = None
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    return base


def prom_label(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _label_value(v: str | int | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def log2_le_buckets(p: HistPoint) -> list[tuple[str, int]]:
    """Cumulative `le` buckets in seconds for the kernel's log2 slots, sparse: the upper
    bound of each non-empty slot and of the slot below it, then +Inf (which also holds
    the last slot). The bounds left out sit between two equal cumulative counts, so
    `histogram_quantile` gives what it would with all of them; a series of 40 slots
    does not become 41 series per label set, and a bound once shown stays (counts only
    grow)."""
    counts = [int(n) for n in p.slots.tolist()]
    last = len(counts) - 1  # the overflow slot: only in +Inf
    keep = {j for i, n in enumerate(counts[:last]) if n for j in (i - 1, i) if j >= 0}
    if last >= 1 and counts[last]:
        keep.add(last - 1)
    out, cum = [], 0
    for i in range(last):
        cum += counts[i]
        if i in keep:
            out.append((repr(float(1 << (i + 1)) * p.scale), cum))
    out.append(("+Inf", p.count))
    return out


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
                h.add_metric([_label_value(p.attrs[k]) for k in keys], log2_le_buckets(p), p.sum)
            yield h
            continue
        cls = CounterMetricFamily if fam.kind == "counter" else GaugeMetricFamily
        m = cls(name, fam.description, labels=labels)
        for p in fam.points:
            assert isinstance(p, Point)
            m.add_metric([_label_value(p.attrs[k]) for k in keys], p.value)
        yield m


class SeriesCollector:
    """A prometheus_client collector (only `collect()`) over a `Source`."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        return families(self.source)


def parse_listen(value: str, option: str = "--prometheus") -> tuple[str, int]:
    """`[HOST]:PORT` (or a bare PORT) to (host, port); no host means every address."""
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{option} takes [HOST]:PORT with a port from 1 to 65535, got {value!r}")
    return host or "0.0.0.0", int(port)


class PrometheusServer:
    """Serves /metrics from a thread until `close()`. A port in use is a UsageError."""

    def __init__(
        self, source: Source, where: tuple[str, int], option: str = "--prometheus"
    ) -> None:
        """`option` names the flag in errors (each tool's own: --metrics-port ...)."""
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ExtraMissing(option, "prometheus") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SeriesCollector(source))
        try:
            self.server, self.thread = start_http_server(where[1], addr=where[0], registry=registry)
        except OSError as exc:
            raise UsageError(
                f"{option} cannot listen on {where[0]}:{where[1]}: {exc.strerror}"
            ) from None

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
