"""Kernel time to wall clock, per CPU: samples carry `bpf_ktime_get_ns()`, people and
ClickHouse want wall time. A linear model per CPU, `wall = slope * kernel + offset`,
fitted by least squares over the last pairs (kernel ns, wall ns) read on that CPU;
its slope and offset are exported as `ms_tsc_slope{cpu}` / `ms_tsc_offset_ns{cpu}`.

The pairs come from `read_pair(cpu)` (injected: tests give a known line). The fit is
done relative to the first pair, so float64 keeps sub-ns precision on 1e18 ns values.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, overload

import numpy as np

__all__ = ["ClockCalibrator", "read_pair_now"]

IntArray = np.ndarray[Any, np.dtype[np.integer[Any]]]


def read_pair_now(cpu: int) -> tuple[int, int]:
    """(CLOCK_MONOTONIC ns, CLOCK_REALTIME ns) read together: bpf_ktime_get_ns() is
    CLOCK_MONOTONIC, the same on every CPU, so `cpu` is not needed here. The
    monotonic reading is the midpoint of two, to halve the error of the gap."""
    a = time.monotonic_ns()
    w = time.time_ns()
    b = time.monotonic_ns()
    return (a + b) // 2, w


class _Model:
    """One CPU: pairs kept, and the fitted line relative to (k0, w0)."""

    def __init__(self, k0: int, w0: int, max_pairs: int) -> None:
        self.k0, self.w0 = k0, w0
        self.pairs: deque[tuple[int, int]] = deque(maxlen=max_pairs)
        self.slope = 1.0
        self.intercept = 0.0  # wall - w0 at kernel == k0

    def add(self, k: int, w: int) -> None:
        self.pairs.append((k - self.k0, w - self.w0))
        dk = np.array([p[0] for p in self.pairs], dtype=np.float64)
        dw = np.array([p[1] for p in self.pairs], dtype=np.float64)
        if len(dk) < 2 or np.ptp(dk) == 0:
            self.slope = 1.0
            self.intercept = float(np.mean(dw - dk))
            return
        mk, mw = dk.mean(), dw.mean()
        self.slope = float(np.sum((dk - mk) * (dw - mw)) / np.sum((dk - mk) ** 2))
        self.intercept = float(mw - self.slope * mk)

    @property
    def offset(self) -> float:
        """wall = slope * kernel + offset, in absolute ns (for the gauge)."""
        return self.w0 + self.intercept - self.slope * self.k0


class ClockCalibrator:
    """Per-CPU kernel -> wall ns. CPUs never calibrated use the model of the lowest
    calibrated CPU; with no pair at all, `to_wall` reads one first."""

    def __init__(
        self,
        read_pair: Callable[[int], tuple[int, int]] = read_pair_now,
        max_pairs: int = 32,
    ) -> None:
        self.read_pair = read_pair
        self.max_pairs = max_pairs
        self._models: dict[int, _Model] = {}
        self._table: tuple[IntArray, IntArray, np.ndarray[Any, Any], np.ndarray[Any, Any]] | None
        self._table = None

    def add(self, cpu: int, kernel_ns: int, wall_ns: int) -> None:
        """One observed pair."""
        m = self._models.get(cpu)
        if m is None:
            m = self._models[cpu] = _Model(kernel_ns, wall_ns, self.max_pairs)
        m.add(kernel_ns, wall_ns)
        self._table = None

    def calibrate(self, cpus: Iterable[int] = (0,)) -> None:
        """Read and add one pair per CPU (call it every flush window)."""
        for cpu in cpus:
            k, w = self.read_pair(cpu)
            self.add(cpu, k, w)

    def slopes(self) -> dict[int, float]:
        return {cpu: m.slope for cpu, m in sorted(self._models.items())}

    def offsets(self) -> dict[int, float]:
        return {cpu: m.offset for cpu, m in sorted(self._models.items())}

    def _tables(self) -> tuple[IntArray, IntArray, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Per-CPU (k0, w0 + round(intercept), slope, fractional intercept) arrays,
        indexed by cpu; gaps filled with the lowest calibrated CPU's model."""
        if self._table is not None:
            return self._table
        if not self._models:
            self.calibrate()
        n = max(self._models) + 1
        default = self._models[min(self._models)]
        k0 = np.empty(n, dtype=np.int64)
        w0 = np.empty(n, dtype=np.int64)
        slope = np.empty(n, dtype=np.float64)
        frac = np.empty(n, dtype=np.float64)
        for cpu in range(n):
            m = self._models.get(cpu, default)
            whole = int(np.floor(m.intercept))
            k0[cpu], w0[cpu] = m.k0, m.w0 + whole
            slope[cpu], frac[cpu] = m.slope, m.intercept - whole
        self._table = (k0, w0, slope, frac)
        return self._table

    @overload
    def to_wall(self, cpu: int, time_ns: int) -> int: ...
    @overload
    def to_wall(
        self, cpu: int | np.ndarray[Any, Any], time_ns: np.ndarray[Any, Any]
    ) -> np.ndarray[Any, np.dtype[np.int64]]: ...
    def to_wall(
        self, cpu: int | np.ndarray[Any, Any], time_ns: int | np.ndarray[Any, Any]
    ) -> int | np.ndarray[Any, np.dtype[np.int64]]:
        """Wall-clock ns of kernel times; `cpu` and `time_ns` broadcast together."""
        k0, w0, slope, frac = self._tables()
        scalar = not isinstance(time_ns, np.ndarray) and not isinstance(cpu, np.ndarray)
        c = np.asarray(cpu, dtype=np.int64)
        c = np.where((c < 0) | (c >= len(k0)), min(self._models), c)
        dk = np.asarray(time_ns).astype(np.int64) - k0[c]
        out = w0[c] + np.rint(dk * slope[c] + frac[c]).astype(np.int64)
        return int(out) if scalar else out
