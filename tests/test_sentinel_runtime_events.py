"""`meridian sentinel`'s agent driven whole, in process (sentinel_runtime.py): what
the source samples and what each sample costs, as the windows, the metrics and the
status show them:

- the safety governor sheds events while the offered rate is over the budget;
- the PMU rotation reaches every group, and the samples carry its events;
- each sample costs its own event's scale: its share of the rotation's turns, times
  the (mock) kernel's multiplexing.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from itertools import pairwise
from typing import Any

import pytest
from sentinel_runtime import (
    CODES,
    FLUSH_S,
    SEC,
    Recorder,
    Stepped,
    agent,
    codes,
    config,
    gauge,
    gauges,
    runs,
    scrape,
    wait_for,
)

from meridian.tools.sentinel.agent.runtime import Runtime
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.records import Event
from meridian.tools.sentinel.model.window import Window
from meridian.tools.sentinel.sources.mock import DEFAULT_FLOWS, MockSource

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
