"""memlat's model: histograms keyed by (pid, kind, comm), kind minor or major; the
faults lost by reason; summaries with the tail count (faults at or above the tail
threshold, counted exactly by the kernel)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import latency
from ...latency import Cell, LatencyOptions

__all__ = ["KINDS", "LOST", "STARTS", "Cell", "Key", "Options", "Snapshot", "Summary"]

KINDS = ("minor", "major")  # enum memlat_kind
LOST = ("failed", "unmatched", "evicted", "hists_full", "nested")  # struct memlat_counters
# --from: where a fault's time starts. "exception": the page-fault exception (only faults
# taken as exceptions); "handle_mm_fault": the entry of handle_mm_fault, whoever calls it
# (get_user_pages() too): Delta t (docs/requirements/memlat-runqlat.md, "Delta t").
STARTS = ("exception", "handle_mm_fault")

Key = tuple[int, int, str]  # pid (0 unless -P), kind, comm


@dataclass
class Options(LatencyOptions):
    ns: bool = False
    threshold_us: float = 8.0
    output: str | None = None
    start: str = "exception"  # --from, one of STARTS

    @property
    def unit_ns(self) -> int:
        return 1 if self.ns else 1000

    @property
    def tail_ns(self) -> int:
        return round(self.threshold_us * 1000)


class Summary(latency.Summary):
    def as_dict(self, opts: Options) -> dict[str, Any]:
        n = self.count
        return self.stats(
            opts.unit_ns,
            tail_threshold_us=opts.threshold_us,
            tail_count=self.tail,
            tail_share=round(self.tail / n, 6) if n else 0.0,
        )

    def tail_line(self, opts: Options) -> str:
        n = self.count
        share = 100.0 * self.tail / n if n else 0.0
        return (
            f"tail: {self.tail} of {n} faults ({share:.2f}%) >= {opts.threshold_us:g} us; "
            f"p50 {_us(self.pct_ns(0.5, opts.unit_ns))}, "
            f"p99 {_us(self.pct_ns(0.99, opts.unit_ns))}, max {_us(self.max_ns)}"
        )


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f} us" if ns < 10_000 else f"{ns / 1000:.0f} us"


class Snapshot(latency.Snapshot[Key]):
    def lost(self) -> dict[str, int]:
        """Faults started or finished that are not in the histograms, by reason."""
        return {k: self.counters.get(k, 0) for k in LOST}

    def total(self, unit: str, kind: int | None = None, pid: int | None = None) -> Summary:
        return Summary.of(
            (
                c
                for (p, k, _), c in self.cells.items()
                if (kind is None or k == kind) and (pid is None or p == pid)
            ),
            unit,
        )
