"""What every exporter reads: metric families named after the OpenTelemetry semantic
conventions, with their points, built from kernel aggregates at collection time.

A tool gives the exporters a `Source`: a function that reads its maps and returns
`Family` objects. Prometheus calls it on each scrape, OTLP on each export interval;
neither records anything per event. Counters are cumulative since the tool attached.
Histograms keep the kernel's log2 slots as they are (`HistPoint.slots`, in the unit
the kernel counted) with the factor that turns that unit into seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

__all__ = ["Attrs", "Family", "HistPoint", "Point", "Source", "log2_bounds"]

Attrs = Mapping[str, "str | int | bool"]
Kind = Literal["counter", "gauge", "histogram"]


@dataclass
class Point:
    """One value of a counter or gauge."""

    attrs: Attrs
    value: int | float


@dataclass
class HistPoint:
    """One kernel log2 histogram: slot i counts values in [2**i, 2**(i+1)) of the
    kernel's unit (slot 0 also holds 0 and 1; the last slot everything above)."""

    attrs: Attrs
    slots: np.ndarray[Any, Any]
    scale: float  # one kernel unit in seconds (1e-9 for nsecs, 1e-6 for usecs)
    sum: float  # seconds, exact (the kernel adds the latencies in ns)
    max: float | None = None  # seconds, when the kernel keeps the largest one
    min: float | None = None  # seconds, when the kernel keeps the smallest one

    @property
    def count(self) -> int:
        return int(self.slots.sum())


@dataclass
class Family:
    """One metric: an OpenTelemetry name (`process.disk.io`), a UCUM unit (`By`, `s`,
    `1`, `{operation}`), a kind, and its points (all with the same attribute keys)."""

    name: str
    kind: Kind
    unit: str
    description: str
    points: list[Point | HistPoint] = field(default_factory=list)


Source = Callable[[], list[Family]]


def log2_bounds(nslots: int, scale: float) -> list[float]:
    """Upper bounds of slots 0 .. nslots-2 in seconds (OTLP `explicit_bounds`); the last
    slot is the overflow bucket."""
    return [float(1 << (i + 1)) * scale for i in range(nslots - 1)]
