"""The model of a latency tool: its options, the histograms read from the kernel
(`Cell`, one per key), snapshots and their differences, and summaries (merged
histograms with their percentiles)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import numpy as np

from ..hist import Log2Hist
from ..reporting import ReportOptions

__all__ = ["NSLOTS", "Cell", "LatencyOptions", "Snapshot", "Summary"]

NSLOTS = 32  # MEMLAT_MAX_SLOTS and RUNQLAT_MAX_SLOTS: slots of a kernel histogram


@dataclass
class LatencyOptions(ReportOptions):
    """The report options, and the two that every latency tool takes: -P and -p."""

    per_process: bool = False
    pid: int | None = None


@dataclass
class Cell:
    """One histogram of the kernel map (one key), summed over CPUs."""

    slots: np.ndarray[Any, np.dtype[np.uint64]]
    sum_ns: int
    max_ns: int
    tail: int = 0  # samples at or above the tool's tail threshold (0: it has none)

    @classmethod
    def of_cpus(cls, value: np.ndarray[Any, Any]) -> Cell:
        """The cell of one per-CPU map value (one record per CPU)."""
        names = value.dtype.names or ()
        return cls(
            value["slots"].sum(axis=0).astype(np.uint64),
            int(value["sum_ns"].sum()),
            int(value["max_ns"].max()),
            int(value["tail"].sum()) if "tail" in names else 0,
        )

    @property
    def count(self) -> int:
        return int(self.slots.sum())

    def since(self, prev: Cell, unit_ns: int) -> Cell:
        """What was added after `prev` (cumulative, from the same key)."""
        slots = self.slots - prev.slots
        return Cell(
            slots,
            self.sum_ns - prev.sum_ns,
            self._interval_max(prev, slots, unit_ns),
            self.tail - prev.tail,
        )

    def _interval_max(self, prev: Cell, slots: np.ndarray[Any, Any], unit_ns: int) -> int:
        """The kernel keeps the largest latency since attach. When it grew, the new one
        happened in this interval (exact); otherwise the interval's largest is at most
        both the old one and the top of its highest non-empty slot (an upper bound)."""
        if self.max_ns > prev.max_ns:
            return self.max_ns
        nonzero = np.flatnonzero(slots)
        if not len(nonzero):
            return 0
        top = (1 << (int(nonzero[-1]) + 1)) * unit_ns - 1
        return min(prev.max_ns, top)

    def __add__(self, other: Cell) -> Cell:
        return Cell(
            self.slots + other.slots,
            self.sum_ns + other.sum_ns,
            max(self.max_ns, other.max_ns),
            self.tail + other.tail,
        )


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


@dataclass
class Summary:
    """Histograms merged into one, with the exact sum, max and tail count."""

    hist: Log2Hist
    sum_ns: int
    max_ns: int
    tail: int = 0

    @classmethod
    def of(cls: type[T], cells: Iterable[Cell], unit: str) -> T:
        cells = list(cells)
        hist = Log2Hist.merge((Log2Hist(c.slots, unit) for c in cells), NSLOTS, unit)
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
        """The q-quantile estimate in ns, never above the largest latency seen."""
        return min(self.hist.percentile(q) * unit_ns, float(self.max_ns))

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
            "max_ns": self.max_ns,
            "hist": self.hist.to_json(),
        }
