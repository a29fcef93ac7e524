"""`meridian sentinel`'s stop(): a consumer slow to drain the source (a TCG guest
under load) is waited for, so the last window, and the run's totals, hold every sample
the windows counted as delivered."""

from __future__ import annotations

import time

import pytest
from sentinel_runtime import WindowsSeen

from meridian.tools.sentinel.agent import runtime
from meridian.tools.sentinel.agent.runtime import Runtime
from meridian.tools.sentinel.agent.state import Array
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.records import empty_lbr
from meridian.tools.sentinel.sources.mock import MockSource, make_samples


class SlowDrain(MockSource):
    """A scripted source whose first poll after stop_sampling() takes `delay` seconds
    and returns the ring's last `rest` samples."""

    def __init__(self, delay: float, rest: int) -> None:
        super().__init__(flows=())
        self.delay, self.rest, self.halted = delay, rest, False

    def stop_sampling(self) -> None:
        self.halted = True

    def poll(self, timeout_s: float) -> tuple[Array, Array]:
        if self.halted and self.rest:
            time.sleep(self.delay)
            n, self.rest = self.rest, 0
            return make_samples(n, time_ns=time.monotonic_ns()), empty_lbr(0)
        time.sleep(min(timeout_s, 0.01))
        return make_samples(0), empty_lbr(0)


def test_stop_waits_for_a_consumer_that_drains_slowly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain takes longer than JOIN_S (made short here) but less than DRAIN_JOIN_S:
    its samples are in the final window and the totals, and nothing is abandoned."""
    monkeypatch.setattr(runtime, "JOIN_S", 0.2)
    monkeypatch.setattr(runtime, "DRAIN_JOIN_S", 5.0)
    cfg = SentinelConfig()
    cfg.metrics.enabled = False
    cfg.anomaly.enabled = False
    cfg.mock.enabled = True
    cfg.aggregator.flush_interval = 0.1
    rec, log = WindowsSeen(), list[str]()
    rt = Runtime(cfg, SlowDrain(delay=1.0, rest=500), observers=[rec], log=log.append, cpus=[0])
    rt.start()
    try:
        time.sleep(0.3)
    finally:
        rt.stop()
    assert not [line for line in log if "did not stop" in line], log
    assert rec.windows[-1].final
    assert sum(w.info.samples for w in rec.windows) == 500
    assert rt.totals.samples == 500


class Closing(MockSource):
    def __init__(self) -> None:
        super().__init__(flows=())
        self.closed = False

    def close(self) -> None:
        self.closed = True
        super().close()


class NoKallsyms:
    """A symbolizer whose kallsyms read fails (read once the source is open)."""

    def register_jit(self, *args: object) -> None:
        pass

    def load_kernel(self) -> None:
        raise MemoryError("kallsyms")


def test_a_failure_after_the_source_opened_closes_it() -> None:
    """start() fails in the kallsyms read, after the source's programs are loaded: the
    source is closed (its BPF links detached), not left to the process's exit."""
    cfg = SentinelConfig()
    cfg.metrics.enabled = False
    cfg.mock.enabled = True
    src = Closing()
    rt = Runtime(cfg, src, symbolizer=NoKallsyms(), cpus=[0])  # type: ignore[arg-type]
    with pytest.raises(MemoryError):
        rt.start()
    assert src.closed and rt.source is None
