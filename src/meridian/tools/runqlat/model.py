"""runqlat's model: histograms keyed by (pid, comm), pid 0 and no comm unless -P."""

from __future__ import annotations

from dataclasses import dataclass

from ... import latency
from ...latency import Cell, LatencyOptions

__all__ = ["Cell", "Key", "Options", "Snapshot"]

Key = tuple[int, str]  # tgid (0 unless -P), comm
Snapshot = latency.Snapshot[Key]


@dataclass
class Options(LatencyOptions):
    millis: bool = False

    @property
    def unit_ns(self) -> int:
        return 1_000_000 if self.millis else 1000
