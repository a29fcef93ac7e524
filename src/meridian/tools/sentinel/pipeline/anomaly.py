"""The anomaly monitor: signals that make the agent look closer (diagnostic mode).

Throughput: the byte counters of each configured interface in /proc/net/dev (receive
bytes, as docs/requirements/sentinel.md §3.6; `throughput_direction` can add or choose
transmit) turned into bits per second between two readings, against an EWMA baseline
(`throughput_ewma_alpha`). A reading below `throughput_ratio_trigger` x the baseline
is a `throughput_drop`, unless the baseline is under `throughput_min_bps` (an idle
link has no throughput to lose). Latency: an optional probe file holding one number
in microseconds, rewritten by whatever measures it, with its own EWMA; above
`latency_ratio_trigger` x its baseline is a `latency_spike`.

Each reading is compared with the baseline before it joins it. The monitor reports
every reading that crosses a trigger; the mode controller's refractory period decides
what to act on. /proc is a parameter (tests use a fixture tree) and so is the clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ....errors import EnvironmentProblem, UsageError
from ..config.load import SentinelConfig

__all__ = [
    "AnomalyGauges",
    "AnomalyMonitor",
    "AnomalySignal",
    "Ewma",
    "read_net_dev",
]

THROUGHPUT_DROP = "throughput_drop"
LATENCY_SPIKE = "latency_spike"


@dataclass(frozen=True)
class AnomalySignal:
    """One trigger: `value` and `baseline` in bits/s (throughput) or µs (latency)."""

    kind: str  # THROUGHPUT_DROP or LATENCY_SPIKE
    subject: str  # the interface, or the latency probe's path
    value: float
    baseline: float
    ratio: float
    time_ns: int

    def __str__(self) -> str:
        if self.kind == THROUGHPUT_DROP:
            return (
                f"throughput of {self.subject} fell to {self.ratio:.2f} of its baseline "
                f"({self.value / 1e6:.3f} vs {self.baseline / 1e6:.3f} Mbit/s)"
            )
        return (
            f"latency from {self.subject} rose to {self.ratio:.2f} x its baseline "
            f"({self.value:.1f} vs {self.baseline:.1f} µs)"
        )


@dataclass
class AnomalyGauges:
    """The latest readings for the metrics: per interface, and the latency probe."""

    throughput_ratio: dict[str, float] = field(default_factory=dict)
    throughput_bps: dict[str, float] = field(default_factory=dict)
    latency_ratio: float | None = None
    latency_us: float | None = None


class Ewma:
    """Exponentially weighted moving average; the first value is the start."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def update(self, x: float) -> float | None:
        """Fold `x` in; returns the baseline from before it (None the first time)."""
        before = self.value
        self.value = x if before is None else self.alpha * x + (1 - self.alpha) * before
        return before


def read_net_dev(proc_root: str = "/proc") -> dict[str, tuple[int, int]]:
    """interface -> (receive bytes, transmit bytes) from /proc/net/dev."""
    path = os.path.join(proc_root, "net", "dev")
    with open(path, encoding="ascii", errors="replace") as f:
        lines = f.read().splitlines()
    out: dict[str, tuple[int, int]] = {}
    for line in lines[2:]:
        name, sep, rest = line.partition(":")
        cols = rest.split()
        if not sep or len(cols) < 16:
            continue
        out[name.strip()] = (int(cols[0]), int(cols[8]))
    return out


class AnomalyMonitor:
    """`poll(now)` reads the counters and the probe and returns the triggers."""

    def __init__(
        self,
        cfg: SentinelConfig,
        proc_root: str = "/proc",
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.cfg = cfg.anomaly
        self.proc_root = proc_root
        self.clock = clock
        self.interval_s = self.cfg.poll_interval
        self.last_error: str | None = None
        try:
            counters = read_net_dev(proc_root)
        except (OSError, ValueError) as exc:
            raise EnvironmentProblem(
                f"the anomaly monitor cannot read {proc_root}/net/dev: {exc}"
            ) from None
        missing = [i for i in self.cfg.interfaces if i not in counters]
        if missing:
            have = ", ".join(sorted(counters)) or "none"
            names = ", ".join(repr(i) for i in missing)
            word = "interfaces" if len(missing) > 1 else "interface"
            raise UsageError(
                f"--interface / anomaly.interfaces: no {word} {names} on this host (it has: {have})"
            )
        self.fixed = bool(self.cfg.interfaces)
        now = clock()
        self._last: dict[str, tuple[int, int]] = {}  # interface -> (bytes, time_ns)
        self._base: dict[str, Ewma] = {}
        self._gauges = AnomalyGauges()
        self._latency = Ewma(self.cfg.latency_ewma_alpha)
        for name in self._watched(counters):
            self._last[name] = (self._bytes(counters[name]), now)

    def _watched(self, counters: dict[str, tuple[int, int]]) -> list[str]:
        if self.fixed:
            return [i for i in self.cfg.interfaces if i in counters]
        return sorted(i for i in counters if i != "lo")

    def _bytes(self, rx_tx: tuple[int, int]) -> int:
        d = self.cfg.throughput_direction
        return rx_tx[0] if d == "rx" else rx_tx[1] if d == "tx" else rx_tx[0] + rx_tx[1]

    def poll(self, now: int | None = None) -> list[AnomalySignal]:
        """Read once; the signals of this reading (empty: nothing unusual)."""
        now = self.clock() if now is None else now
        signals = self._poll_throughput(now)
        if self.cfg.latency_probe_path is not None:
            signals += self._poll_latency(self.cfg.latency_probe_path, now)
        return signals

    def _poll_throughput(self, now: int) -> list[AnomalySignal]:
        try:
            counters = read_net_dev(self.proc_root)
        except (OSError, ValueError) as exc:
            self.last_error = f"cannot read {self.proc_root}/net/dev: {exc}"
            return []
        out: list[AnomalySignal] = []
        g = self._gauges
        watched = self._watched(counters)
        for name in list(self._last):
            if name not in watched:  # gone (or no longer watched)
                self._forget(name)
        for name in watched:
            total = self._bytes(counters[name])
            last = self._last.get(name)
            self._last[name] = (total, now)
            if last is None or now <= last[1]:
                continue
            if total < last[0]:  # counters reset (the interface was re-created)
                self._base.pop(name, None)
                continue
            bps = (total - last[0]) * 8e9 / (now - last[1])
            base = self._base.setdefault(name, Ewma(self.cfg.throughput_ewma_alpha))
            before = base.update(bps)
            ratio = bps / before if before else 1.0
            g.throughput_bps[name] = bps
            g.throughput_ratio[name] = ratio
            if (
                before is not None
                and before >= self.cfg.throughput_min_bps
                and before > 0
                and ratio < self.cfg.throughput_ratio_trigger
            ):
                out.append(AnomalySignal(THROUGHPUT_DROP, name, bps, before, ratio, now))
        return out

    def _forget(self, name: str) -> None:
        self._last.pop(name, None)
        self._base.pop(name, None)
        self._gauges.throughput_bps.pop(name, None)
        self._gauges.throughput_ratio.pop(name, None)

    def _poll_latency(self, path: str, now: int) -> list[AnomalySignal]:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read().strip()
            us = float(text.split()[0]) if text else float("nan")
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            self.last_error = f"latency probe {path}: {exc}"
            return []
        if not us >= 0 or us == float("inf"):
            self.last_error = f"latency probe {path}: not a latency in µs: {text[:40]!r}"
            return []
        before = self._latency.update(us)
        ratio = us / before if before else 1.0
        self._gauges.latency_us = us
        self._gauges.latency_ratio = ratio
        if before and ratio > self.cfg.latency_ratio_trigger:
            return [AnomalySignal(LATENCY_SPIKE, path, us, before, ratio, now)]
        return []

    def gauges(self) -> AnomalyGauges:
        """A copy of the latest readings (for `ms_throughput_*`, `ms_latency_*`)."""
        g = self._gauges
        return AnomalyGauges(
            dict(g.throughput_ratio), dict(g.throughput_bps), g.latency_ratio, g.latency_us
        )
