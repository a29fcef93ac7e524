"""The flush thread: every `aggregator.flush_interval`, a window's rollups, the plan's
decisions (mode, safety level), the metrics snapshot, and a `Window` for every
observer (the live table, --json, the sinks and detectors)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

import numpy as np

from ..model.records import IDLE
from ..model.rollup import UNRESOLVED
from ..model.services import ServiceTotals
from ..model.window import Totals, Window, WindowInfo, flow_stats
from ..outputs.metrics import MetricsSnapshot, SentinelMetrics, flow_rows
from ..pipeline.aggregator import Aggregator
from ..pipeline.clock import ClockCalibrator
from ..pipeline.resolver import GONE_STACK, SKIPPED_STACK, RuntimeNames
from .plan import Plan
from .state import Array, RuntimeState

__all__ = ["Flusher"]

CATCH_UP_S = 0.2  # the flush waits this long at most for the consumer's last batch
KERNEL_DROPS = ("token_bucket", "hard_drop")  # offered but not delivered (safety level)
UNRESOLVED_STACK = UNRESOLVED


@dataclass(eq=False)
class Flusher:
    """The `sentinel-flush` thread's work (`run`), and the last window at stop
    (`flush(final=True)`). `catch_up(timeout)` has the consumer take its last batch
    before a window ends."""

    state: RuntimeState
    plan: Plan
    aggregator: Aggregator
    _: KW_ONLY
    calibrator: ClockCalibrator
    names: RuntimeNames
    metrics: SentinelMetrics
    totals: Totals
    services: ServiceTotals
    catch_up: Callable[[float], None]
    started_ns: int
    _last_flush: int = field(init=False)
    _last_delivered: int = field(init=False, default=0)
    _last_offered_drops: int = field(init=False, default=0)
    _index: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._last_flush = self.started_ns

    def run(self) -> None:
        interval = self.state.cfg.aggregator.flush_interval
        next_at = time.monotonic() + interval
        while not self.state.stopping.wait(max(0.0, next_at - time.monotonic())):
            next_at += interval
            if next_at < time.monotonic():  # late (a slow sink): do not catch up in a burst
                next_at = time.monotonic() + interval
            self.catch_up(CATCH_UP_S)
            self.flush(self.state.clock())

    def flush(self, now: int, final: bool = False) -> None:
        """The window ending at `now`: rollups, the plan's decisions (not in the final
        one), metrics, observers."""
        state = self.state
        seconds = max((now - self._last_flush) / 1e9, 1e-9)
        self._last_flush = now
        rows = self.aggregator.flush_array()  # summed column-wise below: no object a row
        self._count_labelled(rows)
        delivered = state.delivered - self._last_delivered
        self._last_delivered += delivered
        dropped = dict(state.dropped)
        drops = sum(dropped.get(k, 0) for k in KERNEL_DROPS)
        offered_drops, self._last_offered_drops = drops - self._last_offered_drops, drops
        sps = delivered / seconds
        if not final:
            # the mode follows the busy rate: a sampled idle CPU is not load
            idle = int(rows["samples"][rows["direction"] == IDLE].sum())
            busy = max(delivered - idle, 0) / seconds
            self.plan.decide(busy, (delivered + max(offered_drops, 0)) / seconds, now)
        mode = self.plan.current_mode()
        scales = dict(state.scales)
        info = WindowInfo(
            seconds=seconds,
            mode=mode.label,
            source=state.source_name,
            events=list(state.events),
            samples=delivered,
            samples_per_sec=sps,
            scales=scales,
            throttled=self.plan.governor.throttled,
            dropped=dropped,
            wall_ns=time.time_ns(),
        )
        state.last_info = info
        self.metrics.update(
            MetricsSnapshot(
                mode=int(mode),
                samples_per_sec=sps,
                pmu_scales=scales,
                throttled=info.throttled,
                window_s=seconds,
                flows=flow_rows(rows, self.names),
                dropped=dropped,
                labelled=dict(state.labelled),
                tsc_slope=self.calibrator.slopes(),
                tsc_offset_ns=self.calibrator.offsets(),
                anomaly=state.anomaly,
            )
        )
        stats = flow_stats(rows)
        self.totals.add(stats)
        self.services.add(stats)
        window = Window(self._index, now - round(seconds * 1e9), now, info, rows, stats, final)
        self._index += 1
        state.observers.window(window)

    def _count_labelled(self, rows: Array) -> None:
        for label, col, ident in (
            ("function_unresolved", "function_id", UNRESOLVED),
            ("stack_unresolved", "callstack_id", UNRESOLVED_STACK),
            ("stack_gone", "callstack_id", GONE_STACK),
            ("stack_skipped", "callstack_id", SKIPPED_STACK),
        ):
            hit = rows[col] == np.uint64(ident)
            if hit.any():
                self.state.labelled[label] += int(rows["samples"][hit].sum())
