"""The runtime's periodic threads: the flush loop (a window's rollups, the mode and
safety decisions, the metrics, the observers), the symbols thread (the slow reads
the consumer skips) and the anomaly monitor's loop."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..model.rollup import UNRESOLVED
from ..model.rollup import rollups as to_rollups
from ..model.window import Window, WindowInfo, flow_stats
from ..outputs.metrics import MetricsSnapshot, flow_rows
from ..pipeline.modes import SafetyLevel
from ..pipeline.resolver import GONE_STACK
from .state import Array, RuntimeState

__all__ = ["Flusher"]

CATCH_UP_S = 0.2  # the flush waits this long at most for the consumer's last batch
SYMBOLS_SHARE = 0.25  # of one core, at most, on average: the symbols thread's slow reads
SYMBOLS_S = 0.1  # its period while addresses wait for a slow read
SWEEP_S = 1.0  # its longest sleep, and how often it looks for exited processes
KERNEL_DROPS = ("token_bucket", "hard_drop")  # offered but not delivered (safety level)
UNRESOLVED_STACK = UNRESOLVED


class Flusher(RuntimeState):
    """The flush, symbols and anomaly loops of the runtime."""

    # ---- the flush thread ---------------------------------------------------------------

    def _flush_loop(self) -> None:
        interval = self.cfg.aggregator.flush_interval
        next_at = time.monotonic() + interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += interval
            if next_at < time.monotonic():  # late (a slow sink): do not catch up in a burst
                next_at = time.monotonic() + interval
            self._catch_up()
            self._flush(final=False)

    def _catch_up(self) -> None:
        """Have the consumer take what the source holds now (it waits between small
        batches), so that the window ends with the samples of its last moment."""
        consumer = self._threads.get("sentinel-consumer")
        if consumer is None or not consumer.is_alive():
            return
        self._taken.clear()
        self._wakeup.set()
        self._taken.wait(CATCH_UP_S)

    def _flush(self, final: bool) -> Window:
        """One window: rollups, mode and safety decisions, metrics, observers."""
        assert self.aggregator is not None
        now = self.clock() if not final else self.stopped_ns or self.clock()
        seconds = max((now - self._last_flush) / 1e9, 1e-9)
        self._last_flush = now
        rows = self.aggregator.flush_array()
        self._count_labelled(rows)
        rollups = to_rollups(rows)
        delivered = self._delivered - self._last_delivered
        self._last_delivered += delivered
        dropped = dict(self._dropped)
        drops = sum(dropped.get(k, 0) for k in KERNEL_DROPS)
        offered_drops, self._last_offered_drops = drops - self._last_offered_drops, drops
        sps = delivered / seconds
        if not final:
            self._decide(sps, (delivered + max(offered_drops, 0)) / seconds, now)
        with self._ctl:
            mode, scale = self._mode, self.rotator.scale
        events = list(self._event_names)
        stats = flow_stats(rollups)
        info = WindowInfo(
            seconds=seconds,
            mode=mode.label,
            source=self._source_name,
            events=events,
            samples=delivered,
            samples_per_sec=sps,
            scale=scale,
            throttled=self.governor.throttled,
            dropped=dropped,
            wall_ns=time.time_ns(),
        )
        self._last_info = info
        self.metrics.update(
            MetricsSnapshot(
                mode=int(mode),
                samples_per_sec=sps,
                pmu_scale=scale,
                throttled=self.governor.throttled,
                window_s=seconds,
                flows=flow_rows(rollups, self.names),
                dropped=dropped,
                tsc_slope=self.calibrator.slopes(),
                tsc_offset_ns=self.calibrator.offsets(),
                anomaly=self._anomaly_gauges if self._anomaly_gauges is not None else _gauges(),
            )
        )
        self.totals.add(stats)
        window = Window(
            self._window_index, now - round(seconds * 1e9), now, info, rows, rollups, stats, final
        )
        self._window_index += 1
        for obs in list(self.observers):
            hook = getattr(obs, "on_window", None)
            if hook is not None:
                self._call(obs, hook, window)
        return window

    def _count_labelled(self, rows: Array) -> None:
        for label, col, ident in (
            ("function_unresolved", "function_id", UNRESOLVED),
            ("stack_unresolved", "callstack_id", UNRESOLVED_STACK),
            ("stack_gone", "callstack_id", GONE_STACK),
        ):
            hit = rows[col] == np.uint64(ident)
            if hit.any():
                self.labelled[label] += int(rows["samples"][hit].sum())

    def _decide(self, delivered_per_sec: float, offered_per_sec: float, now: int) -> None:
        """Mode (hysteresis, anomaly hold), safety level, and what the source must change."""
        with self._ctl:
            before = self._mode
            mode = self.mode_controller.update(delivered_per_sec, now)
            budget_all = self.cfg.budget(mode.label) * len(self.cpus)
            level_before = self.governor.level
            level = self.governor.update(offered_per_sec, budget_all)
            group = None
            if mode != before:
                self._mode = mode
                group = self.rotator.set_groups(self._groups[mode.label], now)
                self._budget = (self.cfg.budget(mode.label), self.cfg.perf.hard_drop_ns)
                self._post("budget", self._budget)
            if level != level_before:
                changed = self.rotator.set_max_events(self.governor.max_events_per_group)
                group = changed if changed is not None else group
            if group is not None:
                self._post("events", group)
            reason = self.mode_controller.reason
        if mode != before and self.cfg.run.verbose:
            self.log(f"mode {mode.label}: {reason}")
        if level != level_before and self.cfg.run.verbose:
            what = "shedding events" if level == SafetyLevel.SHED_HEAVY else "back to normal"
            self.log(f"safety level {level.name.lower()}: {what}")

    # ---- the symbols thread ------------------------------------------------------------

    def _symbols_loop(self) -> None:
        """The slow reads the consumer skipped (symbol and line tables, kallsyms), at
        most SYMBOLS_SHARE of a core on average: one read may take a second, and
        the wait after it is as long as it must be. Processes gone past their grace
        period (or replaced by an exec) leave the caches here too, once a SWEEP_S.
        With nothing waiting it sleeps until an address misses (symbolizer.missed):
        an idle agent wakes once a second, not ten times."""
        sym = self.symbolizer
        swept = time.monotonic()
        while not self._stop.is_set():
            sym.missed.wait(SWEEP_S)
            if self._stop.is_set():
                break
            began = time.perf_counter()
            if time.monotonic() - swept >= SWEEP_S:
                sym.sweep()
                swept = time.monotonic()
            sym.warm(SYMBOLS_S * SYMBOLS_SHARE)
            spent = time.perf_counter() - began
            self._stop.wait(max(SYMBOLS_S * (1 - SYMBOLS_SHARE), spent * (1 / SYMBOLS_SHARE - 1)))

    # ---- the anomaly thread ------------------------------------------------------------

    def _anomaly_loop(self) -> None:
        mon = self.anomaly
        assert mon is not None
        while not self._stop.wait(mon.interval_s):
            signals = mon.poll()
            self._anomaly_gauges = mon.gauges()
            for s in signals:
                with self._ctl:
                    took = self.mode_controller.trigger(s.time_ns, why=str(s))
                if took and self.cfg.run.verbose:
                    self.log(f"anomaly: {s}: diagnostic mode")


def _gauges() -> Any:
    from ..pipeline.anomaly import AnomalyGauges

    return AnomalyGauges()
