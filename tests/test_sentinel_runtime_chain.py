"""`meridian sentinel`'s agent driven whole, in process: each chain of decisions goes
through a running Runtime (its consumer and flush threads, real flush windows of a
tenth of a second) fed by the mock source, and shows where it must: in the windows the
observers are handed, in the metrics, in the control plane's status, and in what the
source itself was told to sample. No kernel; each test runs for a few seconds.
Where a test checks what each window holds, the runtime is stepped (Stepped,
sentinel_runtime.py). The mode's decisions here; the events' in
test_sentinel_runtime_events.py:

- a throughput drop in a fixture /proc/net/dev holds diagnostic mode (its events and
  budget at the source) for the refractory period, then sentinel mode comes back;
- the mode follows the delivered samples/s with hysteresis.
"""

from __future__ import annotations

import re
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from sentinel_runtime import (
    DIAGNOSTIC_GROUP,
    FLUSH_S,
    SEC,
    SENTINEL_GROUP,
    Agent,
    D,
    S,
    Stepped,
    agent,
    codes,
    config,
    runs,
    wait_for,
)
from test_sentinel_anomaly import net_dev

from meridian.tools.sentinel.agent.services import Services
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.records import Event
from meridian.tools.sentinel.pipeline.anomaly import AnomalyGauges, AnomalySignal

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
