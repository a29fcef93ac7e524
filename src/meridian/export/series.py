"""What every exporter reads: metric families named after the OpenTelemetry semantic
conventions, with their points, built from kernel aggregates at collection time.

A tool gives the exporters a `Source`: a function that reads its maps and returns
`Family` objects. Prometheus calls it on each scrape, OTLP on each export interval;
neither records anything per event. Counters are cumulative since the tool attached.
Histograms keep the kernel's log2 slots as they are (`HistPoint.slots`, in the unit
the kernel counted) with the factor that turns that unit into the family's (seconds);
the family's `BucketRange` says which slot bounds every one of its series shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

import numpy as np

__all__ = [
    "COUNTS",
    "LATENCY",
    "RANGES",
    "Attrs",
    "BucketRange",
    "Buckets",
    "Family",
    "HistPoint",
    "Point",
    "Source",
]

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
    scale: float  # one kernel unit in the family's unit (seconds: 1e-9 for nsecs)
    sum: float  # seconds, exact (the kernel adds the latencies in ns)
    max: float | None = None  # seconds, when the kernel keeps the largest one
    min: float | None = None  # seconds, when the kernel keeps the smallest one

    @property
    def count(self) -> int:
        return int(self.slots.sum())


@dataclass(frozen=True)
class Buckets:
    """The buckets one kernel layout (slot count and scale) shows in a range: bound k
    is the upper bound of slot `ends[k]`, so its cumulative count is that of slots 0
    .. ends[k]; what lies above the last bound is only in the overflow bucket."""

    ends: tuple[int, ...]
    bounds: tuple[float, ...]
    nslots: int

    def cumulative_rows(self, slots: np.ndarray[Any, Any]) -> list[list[int]]:
        """For each row of stacked slots (one histogram a row), the cumulative count at
        each bound, then the total (Prometheus' +Inf): one numpy pass for them all."""
        cum = np.cumsum(slots, axis=1, dtype=np.uint64)
        rows: list[list[int]] = cum.take((*self.ends, self.nslots - 1), axis=1).tolist()
        return rows

    def cumulative(self, slots: np.ndarray[Any, Any]) -> list[int]:
        """`cumulative_rows` of one histogram."""
        return self.cumulative_rows(slots[np.newaxis])[0]

    def counts(self, slots: np.ndarray[Any, Any]) -> list[int]:
        """The count in each bucket (OTLP `bucket_counts`): the first holds every slot
        up to the first bound, the last every slot above the last bound."""
        cum = self.cumulative(slots)
        return [n - below for below, n in zip([0, *cum], cum, strict=False)]


@dataclass(frozen=True)
class BucketRange:
    """The bounds a histogram family shows, in its unit (seconds, or a count):
    every upper bound of a kernel log2 slot (2**(i+1) kernel units) from `low` to
    `high`, and no others. Every series of the family has them all, whatever it
    counted, so a sum over series (`sum by (le)`) adds like with like; values below
    `low` are in the first bucket, values above `high` only in +Inf. The kernel's last
    slot holds everything above its lower bound, so no bound lies beyond it."""

    low: float
    high: float

    def of(self, nslots: int, scale: float) -> Buckets:
        """The buckets of kernel histograms of `nslots` slots of `scale` each."""
        return _buckets(self, nslots, scale)


@cache
def _buckets(rng: BucketRange, nslots: int, scale: float) -> Buckets:
    tolerance = 1e-9  # bounds computed as 2**k * scale are inexact in the last bit
    ends = [
        i
        for i in range(nslots - 1)
        if rng.low * (1 - tolerance) <= float(1 << (i + 1)) * scale <= rng.high * (1 + tolerance)
    ]
    return Buckets(tuple(ends), tuple(float(1 << (i + 1)) * scale for i in ends), nslots)


LATENCY = BucketRange(1e-6, 2.0**36 * 1e-9)  # 1 us .. 68.7 s (2**36 ns)
COUNTS = BucketRange(1.0, 1024.0)  # queue depths
RANGES = {"s": LATENCY}  # a histogram family's range by unit; any other unit: COUNTS


@dataclass
class Family:
    """One metric: an OpenTelemetry name (`process.disk.io`), a UCUM unit (`By`, `s`,
    `1`, `{operation}`), a kind, and its points (all with the same attribute keys). A
    histogram's bounds are `bucket_range`, by default the one of its unit (`RANGES`;
    a histogram of another quantity, such as sizes in bytes, sets its own)."""

    name: str
    kind: Kind
    unit: str
    description: str
    points: list[Point | HistPoint] = field(default_factory=list)
    bucket_range: BucketRange | None = None

    @property
    def bounds(self) -> BucketRange:
        return self.bucket_range or RANGES.get(self.unit, COUNTS)


Source = Callable[[], list[Family]]
