"""Histograms and the one quantile function every tool and output uses.

The kernel counts latencies (and queue depths) in log-linear buckets (bpf/bits.bpf.h):
values below 2**SUB_BITS have a bucket each; above, each power of two [2**e, 2**(e+1))
is split into 2**SUB_BITS buckets of width 2**(e - SUB_BITS). It also keeps the exact
count, sum, smallest and largest value. Why this layout:

- a bucket is at most RELATIVE_ERROR = 1/16 of its lower bound wide, so a quantile
  interpolated inside its bucket is within 6.25% of the true one (values of at least
  16 units; below that, within one unit), where a log2 slot allowed 100%;
- a power of two's buckets sum to exactly its log2 slot (slot 0 holds 0 and 1, slot i
  [2**i, 2**(i+1))), so bcc's `usecs : count distribution` text and the exporters'
  power-of-two `le` buckets are what they were;
- the quantile is clamped to [min, max]: never below the smallest value seen nor above
  the largest (an interval's min and max are bounds: see `Hist.since`).

Values that take few distinct values (request sizes) are counted exactly instead
(`ExactCounts`), and their quantiles are the values themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

__all__ = [
    "RELATIVE_ERROR",
    "SUB_BITS",
    "Cell",
    "ExactCounts",
    "Hist",
    "Layout",
    "Log2Hist",
    "interval_min_max",
    "quantile",
    "slot_bounds",
    "slot_of",
]

STARS = 40
SUB_BITS = 4  # HIST_SUB_BITS in bpf/bits.bpf.h
RELATIVE_ERROR = 2.0**-SUB_BITS

U64 = np.ndarray[Any, np.dtype[np.uint64]]


def slot_of(value: int) -> int:
    """The log2 slot of `value` (bcc's)."""
    return max(int(value), 1).bit_length() - 1


def slot_bounds(i: int) -> tuple[int, int]:
    """Smallest and largest integer value of log2 slot i (bcc's `low -> high`)."""
    return (0, 1) if i == 0 else (1 << i, (1 << (i + 1)) - 1)


@dataclass(frozen=True)
class Layout:
    """Where each bucket starts and ends, and which log2 slot it belongs to.
    `sub_bits` None: the buckets are bcc's log2 slots themselves."""

    nbuckets: int
    sub_bits: int | None = SUB_BITS

    @property
    def relative_error(self) -> float:
        """A bucket's width over its lower bound, at most (values >= 2**sub_bits)."""
        return 1.0 if self.sub_bits is None else 2.0**-self.sub_bits

    def bucket_of(self, value: int) -> int:
        """The bucket the kernel puts `value` in (hist_bucket in bits.bpf.h)."""
        v, k = int(value), self.sub_bits
        if k is None:
            b = slot_of(v)
        elif v < 1 << k:
            b = v
        else:
            e = v.bit_length() - 1
            b = ((e - k + 1) << k) | ((v >> (e - k)) & ((1 << k) - 1))
        return min(b, self.nbuckets - 1)

    @property
    def lows(self) -> np.ndarray[Any, Any]:
        return _bounds(self)[0]

    @property
    def highs(self) -> np.ndarray[Any, Any]:
        """Exclusive upper bounds (the last bucket's nominal one: it holds the rest)."""
        return _bounds(self)[1]

    @property
    def slot_starts(self) -> np.ndarray[Any, Any]:
        """The first bucket of each log2 slot (the slots' buckets are contiguous)."""
        return _bounds(self)[2]


Arrays = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]


@cache
def _bounds(layout: Layout) -> Arrays:
    n, k = layout.nbuckets, layout.sub_bits
    if k is None:
        lows = np.array([0.0] + [float(1 << i) for i in range(1, n)])
        highs = np.array([float(1 << (i + 1)) for i in range(n)])
        return lows, highs, np.arange(n)
    b = np.arange(n)
    sub = 1 << k
    e = np.maximum(b >> k, 1) + k - 1  # the octave of buckets >= sub
    width = np.where(b < sub, 1.0, np.exp2(e - k))
    lows = np.where(b < sub, b.astype(float), np.exp2(e) + (b & (sub - 1)) * width)
    starts = [0] + [1 << i for i in range(1, k)] + list(range(sub, n, sub))
    return lows, lows + width, np.array([s for s in starts if s < n])


def quantile(
    lows: np.ndarray[Any, Any],
    highs: np.ndarray[Any, Any],
    counts: np.ndarray[Any, Any],
    q: float,
    lo: float | None = None,
    hi: float | None = None,
) -> float:
    """The q-quantile (0..1) of values counted in buckets [lows[i], highs[i]): the
    value of rank q * total (the smallest that at least that many values do not
    exceed), interpolated linearly inside its bucket, the bucket first narrowed to
    [lo, hi], the smallest and largest value seen, when known. Buckets of one value
    each (lows == highs) give that value exactly. The one implementation: every tool,
    text, JSON, table and live view calls it."""
    counts = np.asarray(counts, dtype=np.uint64)
    total = int(counts.sum())
    if total == 0:
        return 0.0
    cum = np.cumsum(counts)
    rank = min(max(q, 0.0), 1.0) * total
    if rank <= 0:
        i = int(np.flatnonzero(counts)[0])
        rank = 0.0
    else:
        i = min(int(np.searchsorted(cum, rank, side="left")), len(counts) - 1)
    below = int(cum[i - 1]) if i else 0
    a, b = float(lows[i]), float(highs[i])
    if lo is not None:
        a, b = max(a, lo), max(b, lo)
    if hi is not None:
        a, b = min(a, hi), min(b, hi)
    frac = (rank - below) / int(counts[i])
    return a + frac * (b - a)


@dataclass
class Hist:
    """A histogram in a `Layout` (log-linear from the kernel; `Hist(slots, unit)` alone
    is bcc's log2 slots), with the smallest and largest value seen (`lo`, `hi`, in the
    histogram's unit) when known. Views take the log2 `slots`; quantiles the buckets."""

    counts: U64
    unit: str = "usecs"
    layout: Layout | None = None  # None: log2 slots, one per count
    lo: float | None = None
    hi: float | None = None

    def __post_init__(self) -> None:
        self.counts = np.asarray(self.counts, dtype=np.uint64)
        if self.layout is None:
            self.layout = Layout(len(self.counts), None)

    @property
    def _layout(self) -> Layout:
        assert self.layout is not None
        return self.layout

    @classmethod
    def empty(cls, nslots: int, unit: str = "usecs") -> Hist:
        return cls(np.zeros(nslots, dtype=np.uint64), unit)

    @classmethod
    def of(cls, slots: Sequence[int] | np.ndarray[Any, Any], unit: str = "usecs") -> Hist:
        return cls(np.asarray(slots, dtype=np.uint64).copy(), unit)

    @classmethod
    def of_buckets(
        cls,
        counts: np.ndarray[Any, Any],
        unit: str,
        lo: float | None = None,
        hi: float | None = None,
    ) -> Hist:
        """A kernel histogram: log-linear buckets (bits.bpf.h), min and max in `unit`
        (None: not seen)."""
        return cls(np.asarray(counts, dtype=np.uint64), unit, Layout(len(counts)), lo, hi)

    @classmethod
    def merge(cls, hists: Iterable[Hist], nslots: int, unit: str) -> Hist:
        """The sum of `hists` (an empty log2 histogram of `nslots` if there are none)."""
        out: Hist | None = None
        for h in hists:
            out = h if out is None else out + h
        return cls.empty(nslots, unit) if out is None else Hist(out.counts, unit, *out._extra())

    def _extra(self) -> tuple[Layout | None, float | None, float | None]:
        return self.layout, self.lo, self.hi

    def __add__(self, other: Hist) -> Hist:
        if self.layout != other.layout:  # an empty one of another layout adds nothing
            if not other.total:
                return self
            if not self.total:
                return other
            raise ValueError(f"histograms of different layouts: {self.layout}, {other.layout}")
        return Hist(
            self.counts + other.counts,
            self.unit,
            self.layout,
            _pick(min, self.lo, other.lo),
            _pick(max, self.hi, other.hi),
        )

    def since(self, prev: Hist) -> Hist:
        """What was added after `prev` (both cumulative). The kernel keeps the min and
        max since attach: when they moved, the new one is this interval's (exact);
        otherwise the interval's lies between the old one and the edge of its lowest
        (highest) non-empty bucket, which bounds it."""
        counts = self.counts - prev.counts
        nz = np.flatnonzero(counts)
        if not len(nz):
            return Hist(counts, self.unit, self.layout)
        lo, hi = self.lo, self.hi
        lows, highs = self._layout.lows, self._layout.highs
        if lo is not None and prev.lo is not None and not lo < prev.lo:
            lo = max(lo, float(lows[nz[0]]))
        if hi is not None and prev.hi is not None and not hi > prev.hi:
            top = float(highs[nz[-1]]) if nz[-1] < len(counts) - 1 else hi
            hi = min(hi, top)
        return Hist(counts, self.unit, self.layout, lo, hi)

    def __sub__(self, other: Hist) -> Hist:
        return self.since(other)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def slots(self) -> U64:
        """bcc's log2 slots (the counts themselves for a log2 histogram)."""
        if self._layout.sub_bits is None:
            return self.counts
        out: U64 = np.add.reduceat(self.counts, self._layout.slot_starts).astype(np.uint64)
        return out

    @property
    def relative_error(self) -> float:
        return self._layout.relative_error

    def percentile(self, q: float) -> float:
        """The q-quantile (0..1) in the histogram's unit: `quantile()`."""
        lay = self._layout
        return quantile(lay.lows, lay.highs, self.counts, q, self.lo, self.hi)

    def render(self, label: str | None = None, percent: bool = False) -> str:
        """bcc/libbpf-tools print_log2_hist of the log2 slots, to the character; with
        `percent`, each slot's share of the count after its bar."""
        return render_slots(self.slots, label or self.unit, percent)

    def to_json(self) -> dict[str, Any]:
        """Count, p50, p99, min, max (when known), the quantiles' relative error and
        the non-empty log2 slots with their bounds."""
        out: dict[str, Any] = {
            "unit": self.unit,
            "count": self.total,
            "p50": round(self.percentile(0.50), 3),
            "p99": round(self.percentile(0.99), 3),
        }
        if self.lo is not None and self.total:
            out["min"] = round(self.lo, 3)
        if self.hi is not None and self.total:
            out["max"] = round(self.hi, 3)
        out["relative_error"] = self.relative_error
        out["buckets"] = [
            {"low": slot_bounds(i)[0], "high": slot_bounds(i)[1], "count": int(v)}
            for i, v in enumerate(self.slots)
            if v
        ]
        return out

    def cumulative_buckets(self, scale: float = 1.0) -> list[tuple[float, int]]:
        """Prometheus `le` buckets of the log2 slots: (upper bound * scale, cumulative
        count), then +Inf. Slot i holds values below 2**(i+1), so that is its bound."""
        out: list[tuple[float, int]] = []
        cum = 0
        slots = self.slots
        last = max((i for i, v in enumerate(slots) if v), default=-1)
        for i in range(last + 1):
            cum += int(slots[i])
            out.append((float(1 << (i + 1)) * scale, cum))
        out.append((float("inf"), cum))
        return out


Log2Hist = Hist  # the name the exporters and older callers import


def interval_min_max(
    counts: np.ndarray[Any, Any], lo: int, hi: int, prev_lo: int, prev_hi: int, unit_ns: int
) -> tuple[int, int]:
    """The smallest and largest sample (ns, 0 = none) of an interval whose log-linear
    `counts` are a difference of two kernel reads with min/max since attach (`prev_*`
    at the first read, `lo`/`hi` at the second). When one moved, the new one happened
    in this interval (exact); otherwise the interval's lies between the old one and
    the edge of its lowest (highest) non-empty bucket, in units of `unit_ns` (a bound)."""
    nz = np.flatnonzero(counts)
    if not len(nz):
        return 0, 0
    lay = Layout(len(counts))
    if hi <= prev_hi and nz[-1] < len(counts) - 1:
        hi = min(prev_hi, int(lay.highs[nz[-1]]) * unit_ns - 1)
    if prev_lo and lo >= prev_lo:
        lo = max(prev_lo, int(lay.lows[nz[0]]) * unit_ns)
    return lo, hi


@dataclass
class Cell:
    """One histogram of a kernel map (one key; summed over CPUs for a per-CPU map), as
    the latency tools and biolat keep it: log-linear buckets of the tool's unit, the
    exact sum, the largest and smallest sample (min_ns 0: none), and counters that add
    up with it: `tail` (samples at or above a latency tool's threshold) and `bytes`
    (biolat's request bytes). Sum, max and min are in ns, or in the histogram's own
    unit for what is not a time (biolat's queue depth, read with unit_ns 1)."""

    buckets: U64
    sum_ns: int
    max_ns: int
    tail: int = 0
    min_ns: int = 0
    bytes: int = 0

    @classmethod
    def of_cpus(cls, value: np.ndarray[Any, Any]) -> Cell:
        """The cell of one per-CPU map value (one record per CPU)."""
        names = value.dtype.names or ()
        mins = value["min_ns"][value["min_ns"] > 0]
        return cls(
            value["buckets"].sum(axis=0, dtype=np.uint64),
            int(value["sum_ns"].sum()),
            int(value["max_ns"].max()),
            int(value["tail"].sum()) if "tail" in names else 0,
            int(mins.min()) if len(mins) else 0,
        )

    @property
    def count(self) -> int:
        return int(self.buckets.sum())

    def hist(self, unit: str, unit_ns: int) -> Hist:
        """The histogram in `unit` (samples / unit_ns), with its min and max."""
        lo = self.min_ns / unit_ns if self.min_ns else None
        hi = self.max_ns / unit_ns if self.count else None
        return Hist.of_buckets(self.buckets, unit, lo, hi)

    def since(self, prev: Cell, unit_ns: int) -> Cell:
        """What was added after `prev` (cumulative, from the same key); its min and
        max as `interval_min_max` bounds them."""
        buckets = self.buckets - prev.buckets
        if not buckets.any():
            return Cell(buckets, 0, 0)
        lo, hi = interval_min_max(
            buckets, self.min_ns, self.max_ns, prev.min_ns, prev.max_ns, unit_ns
        )
        return Cell(
            buckets,
            self.sum_ns - prev.sum_ns,
            hi,
            self.tail - prev.tail,
            lo,
            self.bytes - prev.bytes,
        )

    def __add__(self, other: Cell) -> Cell:
        mins = [m for m in (self.min_ns, other.min_ns) if m]
        return Cell(
            self.buckets + other.buckets,
            self.sum_ns + other.sum_ns,
            max(self.max_ns, other.max_ns),
            self.tail + other.tail,
            min(mins, default=0),
            self.bytes + other.bytes,
        )


def _pick(f: Any, a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else f(a, b)


@dataclass
class ExactCounts:
    """Values counted exactly (value -> count), as request sizes are: the quantiles
    are values that occurred. `not_counted`: values the kernel's bounded map had no
    room for (in `total`, not in the counts)."""

    counts: dict[int, int] = field(default_factory=dict)
    unit: str = "bytes"
    not_counted: int = 0

    def add(self, value: int, n: int) -> None:
        if n:
            self.counts[value] = self.counts.get(value, 0) + n

    def __add__(self, other: ExactCounts) -> ExactCounts:
        out = ExactCounts(dict(self.counts), self.unit, self.not_counted + other.not_counted)
        for v, n in other.counts.items():
            out.add(v, n)
        return out

    def since(self, prev: ExactCounts) -> ExactCounts:
        out = ExactCounts({}, self.unit, self.not_counted - prev.not_counted)
        for v, n in self.counts.items():
            out.add(v, n - prev.counts.get(v, 0))
        return out

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def percentile(self, q: float) -> float:
        """The q-quantile: `quantile()` over buckets of one value each (exact)."""
        if not self.counts:
            return 0.0
        values = np.array(sorted(self.counts), dtype=np.float64)
        counts = np.array([self.counts[int(v)] for v in values], dtype=np.uint64)
        return quantile(values, values, counts, q)

    @property
    def slots(self) -> U64:
        """The log2 slots of the values (bcc's size histogram)."""
        top = max((slot_of(v) for v in self.counts), default=0)
        out = np.zeros(top + 1, dtype=np.uint64)
        for v, n in self.counts.items():
            out[slot_of(v)] += np.uint64(n)
        return out

    def render(self, label: str | None = None) -> str:
        return render_slots(self.slots, label or self.unit)

    def to_json(self) -> dict[str, Any]:
        """Count, exact p50 and p99, min, max, each value with its count, and the
        values not counted."""
        return {
            "unit": self.unit,
            "count": self.total,
            "p50": self.percentile(0.5),
            "p99": self.percentile(0.99),
            "min": min(self.counts, default=0),
            "max": max(self.counts, default=0),
            "relative_error": 0.0,
            "values": [{"value": v, "count": n} for v, n in sorted(self.counts.items())],
            "not_counted": self.not_counted,
        }


def render_slots(slots: np.ndarray[Any, Any], label: str, percent: bool = False) -> str:
    """bcc/libbpf-tools print_log2_hist, to the character; `percent` adds each slot's
    share of the count after the bar (biolat's report, exercise 1 of its lab)."""
    vals = [int(v) for v in slots]
    nonzero = [i for i, v in enumerate(vals) if v > 0]
    if not nonzero:
        return ""
    idx_max = nonzero[-1]
    val_max = max(vals)
    wide = idx_max > 32
    stars = STARS // 2 if wide else STARS
    width = 20 if wide else 10
    total = sum(vals)
    head = f"{'':>{15 if wide else 5}}{label:<{29 if wide else 19}} : count    distribution"
    lines = [head + (" " * (stars - 10) + " percent" if percent else "")]
    for i in range(idx_max + 1):
        low, high = slot_bounds(i)
        bar = _stars(vals[i], val_max, stars)
        share = f" {100 * vals[i] / total:6.2f}%" if percent else ""
        lines.append(f"{low:>{width}} -> {high:<{width}} : {vals[i]:<8} |{bar}|{share}")
    return "\n".join(lines)


def _stars(val: int, val_max: int, width: int) -> str:
    num = min(val, val_max) * width // val_max if val_max else 0
    return "*" * num + " " * (width - num) + ("+" if val > val_max else "")
