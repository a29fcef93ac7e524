"""Exporters shared by every tool: a Prometheus endpoint read on scrape and OTLP
metrics (and logs) through the OpenTelemetry SDK, both fed by a tool's `Source`.

  series.py      the families a tool's source returns (OpenTelemetry names)
  prometheus.py  /metrics with the collector pattern, OpenTelemetry -> Prometheus names
  otlp.py        OTLP metrics from the aggregates, OTLP logs from events
  options.py     the shared command-line options and `exporting()`
"""

from .options import Exporters, ExportOptions, add_arguments, exporting, from_args
from .series import Family, HistPoint, Point, Source, log2_bounds

__all__ = [
    "ExportOptions",
    "Exporters",
    "Family",
    "HistPoint",
    "Point",
    "Source",
    "add_arguments",
    "exporting",
    "from_args",
    "log2_bounds",
]
