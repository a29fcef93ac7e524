"""Log2 histograms: the kernel adds to slot floor(log2(v)); everything else is here:
merging, percentiles, bcc's `usecs : count distribution` text, JSON, Prometheus buckets.

Slot 0 holds 0 and 1; slot i >= 1 holds [2**i, 2**(i+1) - 1].
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Log2Hist", "slot_bounds", "slot_of"]

STARS = 40


def slot_of(value: int) -> int:
    """The slot the kernel puts `value` in."""
    return max(int(value), 1).bit_length() - 1


def slot_bounds(i: int) -> tuple[int, int]:
    """Smallest and largest integer value of slot i (bcc's `low -> high`)."""
    return (0, 1) if i == 0 else (1 << i, (1 << (i + 1)) - 1)


@dataclass
class Log2Hist:
    slots: np.ndarray[Any, np.dtype[np.uint64]]
    unit: str = "usecs"

    @classmethod
    def empty(cls, nslots: int, unit: str = "usecs") -> Log2Hist:
        return cls(np.zeros(nslots, dtype=np.uint64), unit)

    @classmethod
    def of(cls, slots: Sequence[int] | np.ndarray[Any, Any], unit: str = "usecs") -> Log2Hist:
        return cls(np.asarray(slots, dtype=np.uint64).copy(), unit)

    @classmethod
    def merge(cls, hists: Iterable[Log2Hist], nslots: int, unit: str) -> Log2Hist:
        out = cls.empty(nslots, unit)
        for h in hists:
            out.slots += h.slots
        return out

    def __add__(self, other: Log2Hist) -> Log2Hist:
        return Log2Hist(self.slots + other.slots, self.unit)

    def __sub__(self, other: Log2Hist) -> Log2Hist:
        return Log2Hist(self.slots - other.slots, self.unit)

    @property
    def total(self) -> int:
        return int(self.slots.sum())

    def percentile(self, q: float) -> float:
        """Estimate of the q-quantile (0..1), interpolated inside its slot."""
        total = self.total
        if total == 0:
            return 0.0
        rank = q * total
        cum = np.cumsum(self.slots)
        i = int(np.searchsorted(cum, rank, side="left"))
        i = min(i, len(self.slots) - 1)
        below = int(cum[i - 1]) if i else 0
        in_slot = int(self.slots[i])
        low, high = slot_bounds(i)
        frac = (rank - below) / in_slot if in_slot else 0.0
        return low + frac * (high + 1 - low)

    def render(self, label: str | None = None) -> str:
        """bcc/libbpf-tools print_log2_hist, to the character."""
        vals = [int(v) for v in self.slots]
        nonzero = [i for i, v in enumerate(vals) if v > 0]
        if not nonzero:
            return ""
        idx_max = nonzero[-1]
        val_max = max(vals)
        label = label or self.unit
        wide = idx_max > 32
        stars = STARS // 2 if wide else STARS
        width = 20 if wide else 10
        lines = [f"{'':>{15 if wide else 5}}{label:<{29 if wide else 19}} : count    distribution"]
        for i in range(idx_max + 1):
            low, high = slot_bounds(i)
            bar = _stars(vals[i], val_max, stars)
            lines.append(f"{low:>{width}} -> {high:<{width}} : {vals[i]:<8} |{bar}|")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """Non-empty slots with their bounds, plus the estimated percentiles."""
        return {
            "unit": self.unit,
            "count": self.total,
            "p50": round(self.percentile(0.50), 3),
            "p99": round(self.percentile(0.99), 3),
            "buckets": [
                {"low": slot_bounds(i)[0], "high": slot_bounds(i)[1], "count": int(v)}
                for i, v in enumerate(self.slots)
                if v
            ],
        }

    def cumulative_buckets(self, scale: float = 1.0) -> list[tuple[float, int]]:
        """Prometheus `le` buckets: (upper bound * scale, cumulative count), then +Inf.

        Slot i holds values below 2**(i+1), so that is its `le` bound."""
        out: list[tuple[float, int]] = []
        cum = 0
        last = max((i for i, v in enumerate(self.slots) if v), default=-1)
        for i in range(last + 1):
            cum += int(self.slots[i])
            out.append((float(1 << (i + 1)) * scale, cum))
        out.append((float("inf"), cum))
        return out


def _stars(val: int, val_max: int, width: int) -> str:
    num = min(val, val_max) * width // val_max if val_max else 0
    return "*" * num + " " * (width - num) + ("+" if val > val_max else "")
