"""`meridian sentinel`'s agent driven whole, in process, for the runtime tests
(test_sentinel_runtime_chain.py, test_sentinel_runtime_events.py): a Runtime over the
mock source, an observer that records its windows and batches, the scrape of its
metrics, and Stepped, which runs the consumer and the flush in turn on a clock of the
test's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from children import wait_until
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics import exposition, parser

from meridian.tools.sentinel.agent.runtime import Runtime
from meridian.tools.sentinel.agent.state import SampleBatch
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.records import Event
from meridian.tools.sentinel.model.window import Window
from meridian.tools.sentinel.sources.mock import MockSource

T = TypeVar("T")
SEC = 1_000_000_000
FLUSH_S = 0.1
S, D = "sentinel", "diagnostic"
SENTINEL_GROUP = ["cycles", "llc-misses"]
DIAGNOSTIC_GROUP = ["cycles", "instructions", "llc-misses", "branch-misses"]
CODES = {"cycles": Event.CYCLES, "instructions": Event.INSTRUCTIONS}
CODES |= {"llc-misses": Event.LLC_MISS, "branch-misses": Event.BRANCH_MISS}
# prometheus_client's OpenMetrics functions carry no annotations
generate_latest: Callable[[CollectorRegistry], bytes] = exposition.generate_latest
metric_families: Callable[[str], Iterator[Any]] = parser.text_string_to_metric_families


def codes(names: Sequence[str]) -> list[int]:
    """The mock source's event codes of these event names."""
    return [int(CODES[n]) for n in names]


def runs(values: Sequence[T]) -> list[T]:
    """`values` with each run of equal neighbours as one."""
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def wait_for(cond: Callable[[], object], what: str, seconds: float = 10) -> None:
    wait_until(cond, seconds, what, step=0.02)


@dataclass(frozen=True)
class Seen:
    """A window as an observer got it, and what the source sampled at that moment."""

    window: Window
    source_events: list[int]
    source_budget: int

    @property
    def mode(self) -> str:
        return self.window.info.mode

    @property
    def events(self) -> list[str]:
        return list(self.window.info.events)

    @property
    def end_ns(self) -> int:
        return self.window.end_ns

    def sampled(self) -> set[int]:
        """The event codes of the window's samples."""
        return {int(e) for e in np.unique(self.window.rows["event"])}


@dataclass(frozen=True)
class Batch:
    """What `on_samples` keeps of a batch (its arrays are the aggregator's)."""

    events: frozenset[int]
    scales: dict[int, frozenset[float]]  # event code -> the scales its samples had
    norm_cost: float


class Recorder:
    """An observer: the windows (with the source's events and budget as each is
    handed over, on the flush thread) and the batches (the consumer thread)."""

    def __init__(self, src: MockSource) -> None:
        self.src = src
        self.seen: list[Seen] = []
        self.batches: list[Batch] = []

    def on_samples(self, batch: SampleBatch) -> None:
        codes = batch.samples["event"]
        events = frozenset(int(e) for e in np.unique(codes))
        scale = np.broadcast_to(batch.scale, codes.shape)  # one per sample
        scales = {e: frozenset(np.unique(scale[codes == e]).tolist()) for e in events}
        self.batches.append(Batch(events, scales, float(batch.norm_cost.sum())))

    def on_window(self, window: Window) -> None:
        self.seen.append(Seen(window, self.src.events, self.src._budget))

    def close(self) -> None:
        pass

    def windows(self) -> list[Seen]:
        """The flush thread's windows so far (not the last one, flushed by stop())."""
        return [s for s in list(self.seen) if not s.window.final]


class WindowsSeen:
    """An observer that keeps the windows it is handed, and nothing else."""

    def __init__(self) -> None:
        self.windows: list[Window] = []

    def on_samples(self, batch: object) -> None:
        pass

    def on_window(self, window: Window) -> None:
        self.windows.append(window)

    def close(self) -> None:
        pass


@dataclass
class Agent:
    rt: Runtime
    src: MockSource
    rec: Recorder
    log: list[str]


def config(flush: float = FLUSH_S) -> SentinelConfig:
    """The mock source's settings; no /metrics, no anomaly monitor, one group per mode."""
    cfg = SentinelConfig()
    cfg.metrics.enabled = False
    cfg.anomaly.enabled = False
    cfg.mock.enabled = True
    cfg.mock.period_ms = 10
    cfg.aggregator.flush_interval = flush
    cfg.perf.sentinel_groups = [SENTINEL_GROUP]
    cfg.perf.diagnostic_groups = [DIAGNOSTIC_GROUP]
    cfg.perf.rotation_window = 3600
    return cfg


def agent(cfg: SentinelConfig) -> Agent:
    """A Runtime (not started) on one CPU, so that the budgets are the rates, over a
    mock source made from `cfg.mock` (one CPU too: its token bucket holds the budget)."""
    m = cfg.mock
    src = MockSource(period_ms=m.period_ms, rng_seed=m.rng_seed, rate=m.rate, cpus=1)
    rec = Recorder(src)
    log: list[str] = []
    return Agent(Runtime(cfg, src, observers=[rec], log=log.append, cpus=[0]), src, rec, log)


def scrape(rt: Runtime) -> dict[str, Any]:
    """The runtime's metric families by name, as a scrape renders them."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(rt.metrics)
    return {f.name: f for f in metric_families(generate_latest(reg).decode())}


def gauge(rt: Runtime, name: str) -> float:
    """An unlabelled gauge of the runtime's metrics."""
    (sample,) = scrape(rt)[name].samples
    return float(sample.value)


def gauges(rt: Runtime, name: str, label: str) -> dict[str, float]:
    """A gauge by one label's value."""
    return {s.labels[label]: float(s.value) for s in scrape(rt)[name].samples}


class ManualClock:
    """CLOCK_MONOTONIC of a stepped agent: it moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1_000 * SEC

    def __call__(self) -> int:
        return self.now


class Stepped:
    """An Agent whose consumer and flush the test runs in turn, one window at a
    time, on a clock of its own (runtime.open(), no threads): what each window holds
    and when the plan decides do not depend on how busy the machine is."""

    def __init__(self, cfg: SentinelConfig) -> None:
        self.clock = ManualClock()
        m = cfg.mock
        src = MockSource(
            period_ms=m.period_ms,
            rng_seed=m.rng_seed,
            clock=self.clock,
            rate=m.rate,
            cpus=1,
            sleep=lambda s: None,
        )
        rec = Recorder(src)
        log: list[str] = []
        rt = Runtime(cfg, src, observers=[rec], log=log.append, clock=self.clock, cpus=[0])
        self.a = Agent(rt, src, rec, log)
        self.window_ns = round(cfg.aggregator.flush_interval * SEC)
        self.consumer, self.flusher = rt.open()

    def window(self) -> None:
        """One flush window: the time passes, the consumer takes what the source
        delivered in it (and the drop counters), the flush decides and hands it out."""
        self.clock.now += self.window_ns
        self.consumer.step(0)
        self.flusher.flush(self.clock())

    def until(self, cond: Callable[[], object], what: str, most: int = 10) -> None:
        """Windows until `cond` holds, at most `most` of them."""
        for _ in range(most):
            if cond():
                return
            self.window()
        assert cond(), f"{what}: not within {most} windows"
