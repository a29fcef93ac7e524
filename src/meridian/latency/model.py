"""The model of a latency tool: its options, the histograms read from the kernel
(hist.Cell, one per key), snapshots and their differences, and summaries (merged
histograms with their percentiles)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from ..hist import Cell, Hist
from ..report_loop import UNITS, ReportOptions

__all__ = ["NSLOTS", "LatencyOptions", "Snapshot", "Summary"]

NSLOTS = 32  # log2 slots of a kernel histogram (MEMLAT_BUCKETS, RUNQLAT_BUCKETS: 2**32)


@dataclass
class LatencyOptions(ReportOptions):
    """The report options, and the two that every latency tool takes: -P and -p (the
    processes traced, a set in the kernel; empty: every process)."""

    per_process: bool = False
    pids: list[int] = field(default_factory=list)


K = TypeVar("K", bound=tuple[Any, ...])  # a tool's histogram key, pid first
S = TypeVar("S", bound="Snapshot[Any]")


@dataclass
class Snapshot(Generic[K]):
    """The histograms and counters at time `t` (monotonic), cumulative since attach;
    `since()` makes an interval of two of them (its length in `seconds`)."""

    t: float
    cells: dict[K, Cell]
    counters: dict[str, int] = field(default_factory=dict)
    inflight: int = 0  # intervals open in the kernel at `t` (when the tool counts them)
    seconds: float = 0.0
    unit_ns: int = 1000

    def since(self: S, prev: S) -> S:
        """What happened between `prev` and this snapshot."""
        cells = {}
        for k, c in self.cells.items():
            p = prev.cells.get(k)
            d = c if p is None else c.since(p, self.unit_ns)
            if d.count:
                cells[k] = d
        counters = {k: v - prev.counters.get(k, 0) for k, v in self.counters.items()}
        return replace(self, cells=cells, counters=counters, seconds=self.t - prev.t)

    def __add__(self: S, other: S) -> S:
        """Two intervals together (for cases measured in several rounds)."""
        cells = dict(self.cells)
        for k, c in other.cells.items():
            p = cells.get(k)
            cells[k] = c if p is None else p + c
        counters = {k: self.counters.get(k, 0) + v for k, v in other.counters.items()}
        return replace(
            self,
            t=max(self.t, other.t),
            cells=cells,
            counters=counters,
            seconds=self.seconds + other.seconds,
        )

    def of_pids(self: S, pids: Collection[int]) -> S:
        """The histograms of these processes (with -P: a key starts with the pid)."""
        return replace(self, cells={k: c for k, c in self.cells.items() if k[0] in pids})


T = TypeVar("T", bound="Summary")
_UNIT_NS = {name: ns for ns, name in UNITS.items()}


@dataclass
class Summary:
    """Histograms merged into one, with the exact sum, max and tail count."""

    hist: Hist
    sum_ns: int
    max_ns: int
    tail: int = 0

    @classmethod
    def of(cls: type[T], cells: Iterable[Cell], unit: str) -> T:
        """The cells merged, in `unit` (one of report_loop.UNITS)."""
        cells = list(cells)
        unit_ns = _UNIT_NS[unit]
        hist = Hist.merge((c.hist(unit, unit_ns) for c in cells), NSLOTS, unit)
        return cls(
            hist,
            sum(c.sum_ns for c in cells),
            max((c.max_ns for c in cells), default=0),
            sum(c.tail for c in cells),
        )

    @property
    def count(self) -> int:
        return self.hist.total

    def pct_ns(self, q: float, unit_ns: int) -> float:
        """The q-quantile in ns (hist.quantile: within [min, max], 6.25%)."""
        return self.hist.percentile(q) * unit_ns

    def stats(self, unit_ns: int, **more: Any) -> dict[str, Any]:
        """The JSON summary: the count, `more` fields, the average, p50, p99, max and
        the histogram."""
        n = self.count
        return {
            "count": n,
            **more,
            "avg_ns": self.sum_ns // n if n else 0,
            "p50_ns": round(self.pct_ns(0.5, unit_ns)),
            "p99_ns": round(self.pct_ns(0.99, unit_ns)),
            "min_ns": round(self.hist.lo * unit_ns) if self.hist.lo is not None else 0,
            "max_ns": self.max_ns,
            "relative_error": self.hist.relative_error,
            "hist": self.hist.to_json(),
        }
