"""The rates the flush thread hands to the plan, from windows the test constructs (the
samples delivered, the aggregator's rows, the kernel's drop counters) on a clock of
its own: the safety level decides on the offered rate (delivered plus what the token
bucket and the hard-drop window dropped in the window), the mode on the busy rate
(delivered less the samples in the kernel's idle code)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from symbolizer_fakes import IpResolver
from test_sentinel_modes import Clock

from meridian.tools.sentinel.agent.flush import Flusher
from meridian.tools.sentinel.agent.runtime import Runtime
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.records import RX, Event
from meridian.tools.sentinel.pipeline.aggregator import Aggregator
from meridian.tools.sentinel.pipeline.modes import Mode, SafetyLevel
from meridian.tools.sentinel.sources.mock import MockSource, make_samples

SEC = 1_000_000_000
WINDOW_NS = SEC // 2  # windows of 0.5 s: a rate is twice a window's count
BUDGET = 1000  # sentinel samples/s per CPU (the default), one CPU
IDLE_FN = 7  # the function id of the kernel's idle code (function id = ip >> 8)
BUSY_FN = 9
FLOW = 0x1234


def samples(n: int, ip: int, time_ns: int) -> Any:
    """n cpu-clock samples of one flow at `ip`."""
    fields = {"pid": 100, "flow_id": FLOW, "direction": RX, "cpu": 0}
    return make_samples(n, ip=ip, time_ns=time_ns, event=int(Event.CPU_CLOCK), **fields)


class Windows:
    """A Flusher over a runtime that never starts: each `window` is what the consumer
    would have left for one flush (samples aggregated and counted delivered, the
    cumulative drop counters), then the flush at the window's end."""

    def __init__(self, cfg: SentinelConfig) -> None:
        self.clock = Clock()
        self.rt = Runtime(cfg, MockSource(cpus=1), clock=self.clock, cpus=[0], log=lambda _: None)
        self.agg = Aggregator(cfg.aggregator.time_window_ns, IpResolver(frozenset({IDLE_FN})))
        self.dropped = {"token_bucket": 0, "hard_drop": 0, "ring_full": 0}
        self.flusher = self.flusher_over(self.agg)

    def flusher_over(self, agg: Any) -> Flusher:
        """A Flusher of this runtime, from now, over `agg` (anything with flush_array)."""
        rt = self.rt
        return Flusher(
            rt.state,
            rt.plan,
            agg,
            calibrator=rt.calibrator,
            names=rt.names,
            metrics=rt.metrics,
            totals=rt.totals,
            services=rt.services,
            catch_up=lambda _: None,
            started_ns=self.clock.now,
        )

    def window(self, busy: int, idle: int = 0, **drops: int) -> tuple[Mode, SafetyLevel]:
        """A window of `busy` + `idle` samples delivered and `drops` (by reason) dropped
        in it; the mode and the safety level the flush decided."""
        parts: list[Any] = []
        for n, fn in ((busy, BUSY_FN), (idle, IDLE_FN)):
            if n:
                parts.append(samples(n, fn << 8, self.clock.now))
        for p in parts:
            self.agg.add(p, time_ns=p["time_ns"].astype(np.int64))
        state = self.rt.state
        state.delivered += busy + idle
        for reason, n in drops.items():
            self.dropped[reason] += n
        state.dropped = dict(self.dropped)
        self.clock.now += WINDOW_NS
        self.flusher.flush(self.clock.now)
        return self.rt.plan.current_mode(), self.rt.plan.governor.level


def shed_windows() -> Windows:
    cfg = SentinelConfig()
    cfg.mode.auto = False  # only the safety level acts
    return Windows(cfg)


@pytest.mark.parametrize("reason", ["token_bucket", "hard_drop"])
def test_windows_at_the_budget_plus_the_kernels_drops_start_the_shedding(reason: str) -> None:
    """A slowly growing overload: the bucket lets exactly the budget through (1000/s)
    and drops a little more each window. Delivered alone never exceeds the budget;
    delivered plus the window's drops does from the first drop, and the level sheds
    there. Once the drops stop and the rate falls, it is normal again (the drops are
    the window's, not the run's cumulative count)."""
    w = shed_windows()
    at_budget = BUDGET * WINDOW_NS // SEC
    assert w.window(at_budget)[1] == SafetyLevel.NORMAL  # 1000/s offered: not over
    levels = [w.window(at_budget, **{reason: k})[1] for k in (10, 20, 40)]
    assert levels == [SafetyLevel.SHED_HEAVY] * 3
    assert w.rt.plan.governor.throttled
    assert w.window(at_budget // 5)[1] == SafetyLevel.NORMAL  # 200/s, no drops
    assert w.window(at_budget // 5)[1] == SafetyLevel.NORMAL


def test_windows_of_mostly_idle_samples_keep_the_mode_at_sentinel() -> None:
    """An idle VM sampled with cpu-clock delivers the whole budget, nearly all of it in
    the kernel's idle code: the busy rate (50/s) is far under the up-threshold (900/s),
    so the mode stays sentinel; the same rate of busy samples goes diagnostic."""
    cfg = SentinelConfig()  # sentinel budget 1000/s, up at 0.9 x, down below 0.5 x
    w = Windows(cfg)
    n = BUDGET * WINDOW_NS // SEC
    modes = [w.window(busy=n // 20, idle=n - n // 20)[0] for _ in range(4)]
    assert modes == [Mode.SENTINEL] * 4
    assert w.window(busy=n)[0] == Mode.DIAGNOSTIC
    # and back: diagnostic mode sampling an idle machine is not load either
    assert w.window(busy=n // 20, idle=n - n // 20)[0] == Mode.SENTINEL
