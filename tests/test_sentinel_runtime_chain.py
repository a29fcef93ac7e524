"""`meridian sentinel`'s agent driven whole, in process: each chain of decisions goes
through a running Runtime (its consumer and flush threads, real flush windows of a
tenth of a second) fed by the mock source, and shows where it must: in the windows the
observers are handed, in the metrics, in the control plane's status, and in what the
source itself was told to sample. No kernel; each test runs for a few seconds.
Where a test checks what each window holds, the runtime is stepped (Stepped): the
consumer and the flush take turns one window at a time on a clock of the test's own,
so a machine too busy to run the threads on time cannot change the windows.

- a throughput drop in a fixture /proc/net/dev holds diagnostic mode (its events and
  budget at the source) for the refractory period, then sentinel mode comes back;
- the mode follows the delivered samples/s with hysteresis;
- the safety governor sheds events while the offered rate is over the budget;
- the PMU rotation reaches every group, and the samples carry its events;
- each sample costs its own event's scale: its share of the rotation's turns, times
  the (mock) kernel's multiplexing.
"""

from __future__ import annotations

import re
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from children import wait_until
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics import exposition, parser
from test_sentinel_anomaly import net_dev

from meridian.tools.sentinel.agent.runtime import Runtime
from meridian.tools.sentinel.agent.services import Services
from meridian.tools.sentinel.agent.state import SampleBatch
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.records import Event
from meridian.tools.sentinel.model.window import Window
from meridian.tools.sentinel.pipeline.anomaly import AnomalyGauges, AnomalySignal
from meridian.tools.sentinel.sources.mock import DEFAULT_FLOWS, MockSource

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


# ---- anomaly -> diagnostic mode -> refractory period -> sentinel mode ---------------

STEADY = 10_000_000  # bytes/s received on eth0: 80 Mbit/s
REFRACTORY_S = 1.5
REFRACTORY_NS = round(REFRACTORY_S * SEC)
DROPS = 4  # readings of a dead link, all inside the refractory period


class Link:
    """eth0 in a fixture /proc/net/dev, receiving `rate` bytes/s; also the anomaly
    monitor's clock. A reading starts with the clock, and the file is rewritten there
    with the bytes received up to that instant: each reading sees the throughput the
    test set, however late the monitor's thread runs on a busy host."""

    def __init__(self, root: Path, rate: float) -> None:
        self.root = root
        self._rate = rate
        self._bytes = 0.0
        self._at = time.monotonic_ns()
        self._lock = threading.Lock()
        self._write()

    def set_rate(self, rate: float) -> None:
        with self._lock:
            self._advance(time.monotonic_ns())
            self._rate = rate

    def __call__(self) -> int:
        with self._lock:
            now = time.monotonic_ns()
            self._advance(now)
            self._write()
        return now

    def _advance(self, now: int) -> None:
        self._bytes += self._rate * (now - self._at) / SEC
        self._at = now

    def _write(self) -> None:
        net_dev(self.root, {"lo": (0, 0), "eth0": (int(self._bytes), 0)})


class Readings:
    """The monitor's readings as they reach the runtime's control, each with the time
    its call returned: from then on the plan holds the trigger."""

    def __init__(self, anomaly: Callable[[AnomalyGauges, Sequence[AnomalySignal]], None]) -> None:
        self._anomaly = anomaly
        self.calls: list[tuple[list[AnomalySignal], int]] = []

    def __call__(self, gauges: AnomalyGauges, signals: Sequence[AnomalySignal]) -> None:
        self._anomaly(gauges, signals)
        self.calls.append((list(signals), time.monotonic_ns()))

    def signals(self) -> list[tuple[AnomalySignal, int]]:
        return [(s, returned) for sigs, returned in list(self.calls) for s in sigs]


def anomaly_config() -> SentinelConfig:
    cfg = config()
    a = cfg.anomaly
    a.enabled = True
    a.interfaces = ["eth0"]
    a.poll_interval = 0.1
    a.refractory_period = REFRACTORY_S
    cfg.mode.auto = True
    cfg.mock.rate = 200  # far below the hysteresis on one CPU (up at 900/s, down below 500/s)
    cfg.run.verbose = 1  # the plan says why the mode changes
    return cfg


def test_an_anomaly_holds_diagnostic_mode_for_the_refractory_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steady throughput, then a dead link for DROPS readings: the anomaly watch's
    first trigger puts the runtime in diagnostic mode (the source samples its events
    with its budget) for exactly the refractory period from that trigger (the later
    ones, inside it, do not extend it), then the rate brings sentinel mode back."""
    cfg = anomaly_config()
    a = agent(cfg)
    link = Link(tmp_path, STEADY)  # just before the monitor's first reading
    readings = Readings(a.rt.control.anomaly)
    monkeypatch.setattr(a.rt.control, "anomaly", readings)
    services = Services(cfg, a.rt, a.log.append, proc_root=str(tmp_path), clock=link)
    services.start()
    try:
        drop_ns = drive_a_drop(a, link, readings)
    finally:
        services.stop()
    check_the_hold(a, readings, drop_ns)


def drive_a_drop(a: Agent, link: Link, readings: Readings) -> int:
    """A baseline, then the drop; checks the control plane while diagnostic mode is
    held; returns when the drop began, once windows past the hold have come."""
    wait_for(lambda: len(readings.calls) >= 3 and len(a.rec.windows()) >= 3, "a baseline")
    assert readings.signals() == []
    assert a.rt.control.status()["mode"] == S
    drop_ns = time.monotonic_ns()
    link.set_rate(0)
    wait_for(lambda: len(readings.signals()) >= DROPS, f"{DROPS} throughput drops")
    link.set_rate(STEADY)
    hold_end = readings.signals()[0][0].time_ns + REFRACTORY_NS
    ctl = a.rt.control
    wait_for(
        lambda: (
            ctl.status()["events"] == DIAGNOSTIC_GROUP and a.src.events == codes(DIAGNOSTIC_GROUP)
        ),
        "the diagnostic events at the source",
    )
    st = ctl.status()
    assert time.monotonic_ns() < hold_end, "diagnostic mode applied only after its hold"
    assert (st["mode"], st["pinned"]) == (D, False)
    assert st["samples_per_sec_budget"] == a.src._budget == a.rt.cfg.perf.diagnostic_samples_per_sec
    wait_for(
        lambda: any(s.end_ns >= hold_end for s in a.rec.windows()),
        "a window past the refractory period",
        seconds=REFRACTORY_S + 10,
    )
    n = len(a.rec.windows())
    wait_for(lambda: len(a.rec.windows()) >= n + 3, "windows after the hold")
    assert ctl.status()["mode"] == S
    return drop_ns


def check_the_hold(a: Agent, readings: Readings, drop_ns: int) -> None:
    signals = readings.signals()
    (first, seen_ns), last = signals[0], signals[-1][0]
    assert {(s.kind, s.subject) for s, _ in signals} == {("throughput_drop", "eth0")}
    assert first.time_ns >= drop_ns, "a trigger before the throughput fell"
    hold_end = first.time_ns + REFRACTORY_NS
    assert last.time_ns < hold_end, "the drop outlasted the refractory period"
    windows = a.rec.windows()
    assert runs([s.mode for s in windows]) == [S, D, S]
    assert {s.mode for s in windows if s.end_ns < drop_ns} == {S}
    # diagnostic from the first trigger's arrival until the end of its refractory period
    held = [s for s in windows if seen_ns <= s.end_ns < hold_end]
    assert len(held) >= REFRACTORY_S / FLUSH_S / 2
    assert {s.mode for s in held} == {D}
    # sentinel from then on: the later triggers (inside the period) did not extend it
    after = [s for s in windows if s.end_ns >= hold_end]
    assert {s.mode for s in after} == {S}
    assert any(s.end_ns < last.time_ns + REFRACTORY_NS for s in after)
    # the window deciding a mode still shows the events before it; the next ones its own
    diagnostic = [s for s in windows if s.mode == D][1:]
    sentinel = a.rt.cfg.perf.sentinel_samples_per_sec
    assert {(tuple(s.events), s.source_budget) for s in diagnostic} == {
        (tuple(DIAGNOSTIC_GROUP), a.rt.cfg.perf.diagnostic_samples_per_sec)
    }
    assert all(s.source_events == codes(DIAGNOSTIC_GROUP) for s in diagnostic)
    assert int(Event.INSTRUCTIONS) in set().union(*(s.sampled() for s in diagnostic[1:]))
    assert {(tuple(s.events), s.source_budget) for s in after[1:]} == {
        (tuple(SENTINEL_GROUP), sentinel)
    }
    assert all(s.source_events == codes(SENTINEL_GROUP) for s in after[1:])
    assert not set().union(*(s.sampled() for s in after[2:])) & set(codes(["instructions"]))
    # the runtime acted on the first trigger alone, and said why the mode changed
    assert sum(line.startswith("anomaly: throughput of eth0") for line in a.log) == 1
    said = [line for line in a.log if line.startswith("mode ")]
    assert len(said) == 2 and said[0] == f"mode diagnostic: {first}", said
    assert re.fullmatch(r"mode sentinel: samples/s \d+ < 500", said[1]), said


# ---- hysteresis on the delivered rate ------------------------------------------------

HYSTERESIS_FLUSH_S = 0.2  # longer windows: a rate measured within a few %
# (mock samples/s, the mode the phase's windows show, whether every window ending in
# the phase shows it: else only those wholly inside it, the first may hold the mode
# before)
RATE_PHASES: tuple[tuple[int, str, bool], ...] = (
    (200, S, True),  # below both thresholds
    (1600, D, False),  # above the up-threshold
    (750, D, True),  # between them: diagnostic stays, from the first window on
    (200, S, False),  # below the down-threshold
    (750, S, True),  # between them again: sentinel stays
)


def test_the_mode_follows_the_delivered_rate_with_hysteresis() -> None:
    """Sentinel budget 2000/s, up at 0.5 x (1000/s), down below 0.25 x (500/s): the
    mock's rate, changed while running, gives exactly sentinel, diagnostic, sentinel,
    with a rate between the thresholds keeping whichever mode it finds. Stepped:
    with the threads, a window that a loaded machine made late held more than its
    share of samples, and its rate was not the mock's."""
    cfg = config(HYSTERESIS_FLUSH_S)
    cfg.mode.auto = True
    cfg.perf.sentinel_samples_per_sec = 2000  # the mock's bucket drops nothing at 1600/s
    cfg.mode.hysteresis_low = 0.25  # first: each must stay below the high one
    cfg.mode.hysteresis_high = 0.5
    cfg.mock.rate = RATE_PHASES[0][0]
    changes: list[int] = []
    st = Stepped(cfg)  # windows on a clock of the test's own: a late one is not a rate
    a = st.a
    try:
        for rate, _, _ in RATE_PHASES:
            if changes:
                a.src.rate = float(rate)
            changes.append(st.clock() if changes else a.rt.started_ns)
            st.until(
                lambda: sum(s.window.start_ns >= changes[-1] for s in a.rec.windows()) >= 3,
                f"three windows at {rate} samples/s",
            )
    finally:
        a.rt.stop()
    got, want, off = [], [], []
    for s in a.rec.windows():
        phase = bisect_right(changes, s.end_ns) - 1
        rate, mode, every = RATE_PHASES[phase]
        inside = s.window.start_ns >= changes[phase]
        if inside and abs(s.window.info.samples_per_sec - rate) > 0.3 * rate:
            off.append((rate, round(s.window.info.samples_per_sec)))
        if inside or every:
            got.append((phase, s.mode))
            want.append((phase, mode))
    assert off == [], "windows whose delivered rate is not the mock's"
    assert got == want
    assert runs([s.mode for s in a.rec.windows()]) == [S, D, S]
    # the mode's budget reached the source (the last window of each mode's last phase)
    budgets = {
        RATE_PHASES[bisect_right(changes, s.end_ns) - 1][1]: s.source_budget
        for s in a.rec.windows()
    }
    assert budgets == {S: 2000, D: cfg.perf.diagnostic_samples_per_sec}


# ---- the safety governor -------------------------------------------------------------

SHED_GROUP = ["cycles", "llc-misses", "branch-misses"]
THROTTLED = "ms_sampling_throttled"
# Well over DROPPED_S (consumer.py, 0.25 s): the flush's catch-up then reads the drop
# counters every window, even a little late (test_the_safety_level_does_not_flap_...
# shows what shorter windows do).
SHED_FLUSH_S = 0.4


def shed_config(flush: float, rate: int) -> SentinelConfig:
    """One group of three events, budget 1000/s on one CPU, automatic modes off: only
    the safety level acts on the rate."""
    cfg = config(flush)
    cfg.mode.auto = False
    cfg.perf.sentinel_groups = [SHED_GROUP]
    cfg.mock.rate = rate
    return cfg


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


def test_the_safety_governor_sheds_events_while_over_the_budget() -> None:
    """At 4000 samples/s offered, 4 x the budget (the source's bucket drops 3 in 4),
    the safety level sheds: ms_sampling_throttled is 1 and the source samples one
    event; at 200/s it is 0 and the source samples all three again. The runtime is
    stepped one window at a time (Stepped): with its threads, a late flush or
    catch-up on a loaded machine made the windows, not the rule, decide."""
    cfg = shed_config(SHED_FLUSH_S, 200)
    full, one = codes(SHED_GROUP), codes(SHED_GROUP[:1])
    st = Stepped(cfg)
    a = st.a
    try:
        rt, src, ctl = a.rt, a.src, a.rt.control
        st.until(lambda: len(a.rec.windows()) >= 2, "windows at 200 samples/s")
        calm = (gauge(rt, THROTTLED), src.events, ctl.status()["safety_level"])
        over_ns = st.clock()
        src.rate = 4000.0
        st.until(lambda: gauge(rt, THROTTLED) == 1, f"{THROTTLED} 1")
        st.until(lambda: ctl.status()["events"] == SHED_GROUP[:1], "one event per group")
        shed = (src.events, ctl.status()["safety_level"], ctl.status()["throttled"])
        n = len(a.rec.windows())
        st.until(lambda: len(a.rec.windows()) >= n + 2, "windows while shedding")
        under_ns = st.clock()
        src.rate = 200.0
        st.until(lambda: gauge(rt, THROTTLED) == 0, f"{THROTTLED} 0 again")
        st.until(lambda: ctl.status()["events"] == SHED_GROUP, "every event again")
        back = (src.events, ctl.status()["safety_level"], ctl.status()["throttled"])
        n = len(a.rec.windows())
        st.until(lambda: len(a.rec.windows()) >= n + 2, "windows after shedding")
    finally:
        a.rt.stop()
    assert calm == (0.0, full, "normal")
    assert shed == (one, "shed_heavy", True)
    assert back == (full, "normal", False)
    windows = a.rec.windows()
    assert runs([s.window.info.throttled for s in windows]) == [False, True, False]
    throttled = [s for s in windows if s.window.info.throttled]
    again = [s for s in windows if s.end_ns > throttled[-1].end_ns]
    assert throttled[0].end_ns > over_ns and again[0].end_ns > under_ns
    assert windows[-1].window.info.dropped["token_bucket"] > 0  # it was over the budget
    # the window deciding a level still shows the events before it; the next ones its own
    assert {(tuple(s.events), tuple(s.source_events)) for s in throttled[1:]} == {
        (tuple(SHED_GROUP[:1]), tuple(one))
    }
    assert set().union(*(s.sampled() for s in throttled[2:])) == set(one)
    assert {(tuple(s.events), tuple(s.source_events)) for s in again[1:]} == {
        (tuple(SHED_GROUP), tuple(full))
    }
    assert set().union(*(s.sampled() for s in again[2:])) == set(full)


class FallAfterARead:
    """An observer that, on the flush thread, brings the mock's rate down to `rate` in
    the window after one whose drop counters were read by its catch-up (the second
    read seen while shedding: the first, at start, comes with no catch-up). The
    consumer reads them at most every DROPPED_S: not again for two windows of 0.1 s.
    `fell` is the index of the window the fall came at the end of."""

    def __init__(self, src: MockSource, rate: float) -> None:
        self.src = src
        self.rate = rate
        self.index = 0
        self.reads: list[int] = []  # windows whose drop counters changed, while shedding
        self.fell: int | None = None
        self._dropped = 0

    def on_window(self, window: Window) -> None:
        dropped = window.info.dropped.get("token_bucket", 0)
        if self.fell is None and len(self.reads) >= 2:
            self.src.rate, self.fell = self.rate, self.index
        elif self.fell is None and window.info.throttled and dropped != self._dropped:
            self.reads.append(self.index)
        self._dropped = dropped
        self.index += 1

    def close(self) -> None:
        pass


def test_the_safety_level_does_not_flap_when_the_rate_falls_with_short_windows() -> None:
    """Flush windows of 0.1 s (a valid flush_interval): shedding at 4000 samples/s,
    then the rate falls to 200/s right after a window: the level must go back to
    normal once, as it does with windows of DROPPED_S or more."""
    cfg = shed_config(FLUSH_S, 4000)
    a = agent(cfg)
    fall = FallAfterARead(a.src, 200.0)
    a.rt.add_observer(fall)
    a.rt.start()
    try:
        wait_for(lambda: fall.fell is not None, "the fall, after a read of the drops")
        wait_for(lambda: len(a.rec.windows()) >= (fall.fell or 0) + 8, "windows after it")
    finally:
        a.rt.stop()
    assert fall.fell is not None
    after = [s.window.info.throttled for s in a.rec.windows()[fall.fell :]]
    assert after[-4:] == [False] * 4  # the rate did fall: normal in the end
    assert runs(after) == [True, False]


# ---- PMU rotation --------------------------------------------------------------------

ROTATION = [["cycles"], ["llc-misses"], ["branch-misses"]]
ROTATION_S = 0.4


def test_the_pmu_rotation_reaches_every_group() -> None:
    """Three groups, each on the PMU for ROTATION_S: the windows show them in turn
    (1, 2, 3, 1, ...), the source samples each group's events while it holds the PMU
    (group 2's samples arrive, none before the first turn), and every sample's cost
    and the reported scale are those of an event in one of three groups. Stepped:
    with the threads, a first flush late by a turn on a loaded machine began the
    windows at group 2."""
    cfg = config()
    cfg.mode.auto = False
    cfg.perf.sentinel_groups = ROTATION
    cfg.perf.rotation_window = ROTATION_S
    cfg.perf.sentinel_samples_per_sec = 20_000  # nothing dropped, nothing shed
    cfg.mock.rate = 1000
    st = Stepped(cfg)  # the turns and the windows on a clock of the test's own
    a = st.a
    try:
        st.until(
            lambda: len(runs([s.events for s in a.rec.windows()])) >= 5,
            "the groups 1, 2, 3, 1, 2 in turn",
            most=40,
        )
        pmu_scale = gauges(a.rt, "ms_pmu_scale", "event")
    finally:
        a.rt.stop()
    windows = a.rec.windows()
    order = runs([s.events for s in windows])
    assert order == [ROTATION[i % len(ROTATION)] for i in range(len(order))]
    # each group holds the PMU for its rotation window (the first and last: part of it)
    turned = [i for i, s in enumerate(windows) if i == 0 or s.events != windows[i - 1].events]
    starts = [windows[i].end_ns for i in turned]
    held = [(b - e) / SEC for e, b in pairwise(starts[1:])]
    assert all(ROTATION_S / 2 <= h <= ROTATION_S + 0.5 for h in held), held
    # the samples follow: a window holds its group's events, and in the first two
    # windows of a turn the group's before it too (taken before the turn, or kept a
    # moment by the skew adjuster)
    wrong = []
    for i, s in enumerate(windows):
        run = bisect_right(turned, i) - 1
        allowed = set(codes(s.events))
        if run > 0 and i - turned[run] < 2:
            allowed |= set(codes(order[run - 1]))
        if not s.sampled() <= allowed:
            wrong.append((i, s.events, s.sampled()))
    assert wrong == []
    first_turn = starts[1]
    before = set().union(*(s.sampled() for s in windows if s.end_ns < first_turn))
    assert before == set(codes(ROTATION[0]))
    assert int(Event.LLC_MISS) in set().union(*(b.events for b in a.rec.batches))
    assert {int(Event.LLC_MISS), int(Event.BRANCH_MISS)} <= set().union(
        *(s.sampled() for s in windows)
    )
    # the scale: each event is in one of three groups, in every window and on every sample
    thirds = {"cycles": 3.0, "llc-misses": 3.0, "branch-misses": 3.0}
    assert all(s.window.info.scales == thirds for s in a.rec.seen)
    assert pmu_scale == thirds
    assert {x for b in a.rec.batches for xs in b.scales.values() for x in xs} == {3.0}
    rows_cost = sum(float(s.window.rows["norm_cost"].sum()) for s in a.rec.seen)
    assert rows_cost == pytest.approx(sum(b.norm_cost for b in a.rec.batches), rel=1e-9)


# ---- each event's own scale ----------------------------------------------------------

SHARED = [["cycles", "llc-misses"], ["cycles"], ["branch-misses"]]
GSO_1 = tuple(replace(f, gso_max=1) for f in DEFAULT_FLOWS)  # every sample: 1 segment


@pytest.mark.parametrize("multiplex", [{}, {"llc-misses": 2.0}], ids=["rotation", "multiplexed"])
def test_a_windows_cost_is_its_samples_times_their_events_scale(
    multiplex: dict[str, float],
) -> None:
    """Three groups taking turns, cycles in two of them: in every window, each event's
    norm cost is its samples times its own scale (one segment per sample): cycles
    1.5, the others 3, and llc-misses twice that when the (mock) kernel gives it a
    counter half the time it is enabled. (The old scale, the number of groups, made
    every sample 3.) /metrics, the status and the windows say the same."""
    cfg = config()
    cfg.mode.auto = False
    cfg.perf.sentinel_groups = SHARED
    cfg.perf.rotation_window = 0.3
    cfg.perf.sentinel_samples_per_sec = 20_000  # nothing dropped, nothing shed
    more: dict[str, Any] = {"multiplex": multiplex} if multiplex else {}
    src = MockSource(period_ms=10, rng_seed=5, rate=1000, cpus=1, flows=GSO_1, **more)
    rec = Recorder(src)
    log: list[str] = []
    rt = Runtime(cfg, src, observers=[rec], log=log.append, cpus=[0])
    want = {"cycles": 1.5, "llc-misses": 3.0 * multiplex.get("llc-misses", 1.0)}
    want["branch-misses"] = 3.0
    rt.start()
    try:
        wait_for(
            lambda: len(runs([s.events for s in rec.windows()])) >= 4,
            "the three groups in turn, then the first again",
        )
        pmu_scale = scrape(rt)["ms_pmu_scale"].samples
        status = rt.control.status()
    finally:
        rt.stop()
    samples = dict.fromkeys(want, 0)
    for s in rec.seen:
        rows = s.window.rows
        for name, scale in want.items():
            mine = rows["event"] == CODES[name]
            n = int(rows["samples"][mine].sum())
            assert float(rows["norm_cost"][mine].sum()) == pytest.approx(n * scale, rel=1e-9), (
                s.window.index,
                name,
            )
            samples[name] += n
    assert all(n > 0 for n in samples.values()), samples
    assert {p.labels["event"]: p.value for p in pmu_scale} == pytest.approx(want)
    assert status["scales"] == pytest.approx(want)
    assert all(s.window.info.scales == pytest.approx(want) for s in rec.seen)
    # and sample by sample, as the raw rows store it
    got = {e: x for b in rec.batches for e, xs in b.scales.items() for x in xs}
    assert got == pytest.approx({int(CODES[k]): v for k, v in want.items()})
