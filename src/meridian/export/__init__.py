"""Exporters shared by every tool: a Prometheus endpoint read on scrape, OTLP metrics
from the aggregates (both fed by a tool's `Source`) and OTLP logs from events.

  series.py      the families a tool's source returns (OpenTelemetry names)
  exposition.py  Prometheus names and the text format, rendered from the families
  prometheus.py  the /metrics server (and prometheus_client's collector, for sentinel)
  otlp.py        OTLP metrics, the endpoint check
  logs.py        OTLP logs: bounded queue, background sender, every record accounted
  wire.py        log records in protobuf wire format, encoded a column at a time
  transport.py   one request to a collector, gRPC or HTTP/protobuf, within a deadline
  options.py     the shared command-line options, `exporting()` and the final flush
"""

from .options import Exporters, ExportOptions, add_arguments, exporting, from_args
from .series import BucketRange, Family, HistPoint, Point, Source

__all__ = [
    "BucketRange",
    "ExportOptions",
    "Exporters",
    "Family",
    "HistPoint",
    "Point",
    "Source",
    "add_arguments",
    "exporting",
    "from_args",
]
