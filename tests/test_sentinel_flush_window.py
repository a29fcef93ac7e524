"""What the flush thread (agent/flush.py) hands on from each window, from windows the
test constructs on a clock of its own (test_sentinel_flush_rates.Windows): the
`Window` every observer gets (its index, its span, its rows and their flows, its
`WindowInfo`), the metrics snapshot behind /metrics, and the samples counted under the
resolver's labels (unresolved functions, stacks unresolved, gone or skipped)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from sentinel_runtime import WindowsSeen, scrape
from test_sentinel_flush_rates import BUSY_FN, FLOW, IDLE_FN, SEC, WINDOW_NS, Windows

from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.records import IDLE, RX
from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE, UNRESOLVED
from meridian.tools.sentinel.model.window import Window
from meridian.tools.sentinel.pipeline.anomaly import AnomalyGauges
from meridian.tools.sentinel.pipeline.resolver import GONE_STACK, SKIPPED_STACK


def gauge(w: Windows, name: str) -> float:
    (sample,) = scrape(w.rt)[name].samples
    return float(sample.value)


def by_label(w: Windows, name: str, label: str) -> dict[str, float]:
    fam = scrape(w.rt)[name]
    return {s.labels[label]: float(s.value) for s in fam.samples if s.name.endswith("_total")}


def test_each_window_says_what_it_held_and_the_metrics_agree() -> None:
    """Three windows of 0.5 s (300 busy; 200 busy, 100 idle and 40 dropped by the token
    bucket; nothing) and the final one: numbered from 0, each from the end of the one
    before, their info (samples, rate, mode, source, events, scales, drops, wall
    clock) and rows as delivered; the metrics say the last window's."""
    w = Windows(SentinelConfig())
    kept = WindowsSeen()
    state = w.rt.state
    state.observers.add(kept)
    # what the consumer would have set (the runtime is never started here)
    state.source_name, state.events = "kernel", ["cpu-clock", "cycles"]
    state.scales = {"cpu-clock": 1.0, "cycles": 2.0}
    started = w.clock.now
    before = time.time_ns()
    w.window(300)
    w.window(200, idle=100, token_bucket=40)
    assert gauge(w, "ms_samples_per_sec") == 300 / 0.5  # the second window's
    assert by_label(w, "ms_dropped_samples", "reason")["token_bucket"] == 40
    w.window(0)
    assert gauge(w, "ms_samples_per_sec") == 0
    w.flusher.flush(w.clock.now + WINDOW_NS // 5, final=True)
    after = time.time_ns()
    windows = kept.windows
    assert [x.index for x in windows] == [0, 1, 2, 3]
    assert [x.final for x in windows] == [False, False, False, True]
    ends = [started + WINDOW_NS * k for k in (1, 2, 3)] + [started + 3 * WINDOW_NS + SEC // 10]
    assert [x.end_ns for x in windows] == ends
    assert [x.start_ns for x in windows] == [started, *ends[:-1]]
    infos = [x.info for x in windows]
    assert [i.seconds for i in infos] == [0.5, 0.5, 0.5, 0.1]
    assert [i.samples for i in infos] == [300, 300, 0, 0]
    assert [i.samples_per_sec for i in infos] == [600, 600, 0, 0]
    assert {(i.mode, i.source, i.throttled) for i in infos} == {("sentinel", "kernel", False)}
    assert all(i.events == ["cpu-clock", "cycles"] for i in infos)
    assert all(i.scales == {"cpu-clock": 1.0, "cycles": 2.0} for i in infos)
    assert {s.labels["event"]: s.value for s in scrape(w.rt)["ms_pmu_scale"].samples} == {
        "cpu-clock": 1.0,
        "cycles": 2.0,
    }
    assert [i.dropped["token_bucket"] for i in infos] == [0, 40, 40, 40]
    assert all(before <= i.wall_ns <= after for i in infos)
    assert state.last_info is infos[-1]
    # the rows and their flows: what was aggregated in the window, idle ones apart
    assert [int(x.rows["samples"].sum()) for x in windows] == [300, 300, 0, 0]
    idle = windows[1].rows["direction"] == IDLE
    assert int(windows[1].rows["samples"][idle].sum()) == 100
    assert [sorted((s.direction, s.samples) for s in x.stats) for x in windows[:2]] == [
        [(RX, 300)],
        sorted([(RX, 200), (IDLE, 100)]),
    ]
    assert w.rt.totals.samples == 600 and w.rt.totals.windows == 4
    assert gauge(w, "ms_agent_mode") == 0


def test_no_window_without_its_own_index_or_observers_getting_none() -> None:
    """Observers get the Window objects themselves, one a flush, never None."""
    w = Windows(SentinelConfig())
    kept = WindowsSeen()
    w.rt.state.observers.add(kept)
    for _ in range(3):
        w.window(10)
    assert all(isinstance(x, Window) for x in kept.windows) and len(kept.windows) == 3
    assert len({x.index for x in kept.windows}) == 3


class Rows:
    """An aggregator that hands the flush the rows the test made."""

    def __init__(self) -> None:
        self.next: Any = np.zeros(0, dtype=ROLLUP_DTYPE)

    def flush_array(self) -> Any:
        out, self.next = self.next, np.zeros(0, dtype=ROLLUP_DTYPE)
        return out


def rows(*cells: tuple[int, int, int]) -> Any:
    """Rollup rows of (function id, callstack id, samples)."""
    out = np.zeros(len(cells), dtype=ROLLUP_DTYPE)
    for i, (fid, sid, n) in enumerate(cells):
        out[i]["function_id"], out[i]["callstack_id"], out[i]["samples"] = fid, sid, n
        out[i]["flow_id"], out[i]["direction"] = 0x1234, RX
    return out


@pytest.mark.parametrize("windows", [1, 2])
def test_samples_under_each_label_add_up_over_windows(windows: int) -> None:
    """Per window: 3 samples of an unresolved function, 5 and 7 of an unresolved stack
    (one of them with the unresolved function too), 11 of a stack gone, 13 skipped,
    and 17 of a resolved function and stack, counted by label, added over windows,
    and shown by ms_labelled_samples_total."""
    w = Windows(SentinelConfig())
    agg = Rows()
    rt = w.rt
    flusher = w.flusher_over(agg)
    for _ in range(windows):
        agg.next = rows(
            (UNRESOLVED, 1, 3),
            (BUSY_FN, UNRESOLVED, 5),
            (UNRESOLVED, UNRESOLVED, 7),
            (BUSY_FN, GONE_STACK, 11),
            (IDLE_FN, SKIPPED_STACK, 13),
            (BUSY_FN, 2, 17),
        )
        w.clock.now += WINDOW_NS
        flusher.flush(w.clock.now)
    want = {
        "function_unresolved": 10 * windows,
        "stack_unresolved": 12 * windows,
        "stack_gone": 11 * windows,
        "stack_skipped": 13 * windows,
    }
    assert dict(rt.state.labelled) == want
    assert by_label(w, "ms_labelled_samples", "label") == want


def test_the_plan_gets_each_windows_busy_and_offered_rates_and_its_end() -> None:
    """The rates the plan decides on, exactly: busy is delivered less idle, offered is
    delivered plus the kernel's drops in the window (a source that reports no
    hard_drop count: none), both per second; and the window's end."""
    w = Windows(SentinelConfig())
    w.dropped = {"token_bucket": 0}
    asked: list[tuple[float, float, int]] = []
    decide = w.rt.plan.decide

    def spy(busy_per_sec: float, offered_per_sec: float, now: int) -> None:
        asked.append((busy_per_sec, offered_per_sec, now))
        decide(busy_per_sec, offered_per_sec, now)

    w.rt.plan.decide = spy  # type: ignore[method-assign]
    start = w.clock.now
    w.window(300, idle=100, token_bucket=40)
    w.window(0, idle=200, token_bucket=10)
    w.window(500)
    assert asked == [
        (600.0, 880.0, start + WINDOW_NS),
        (0.0, 420.0, start + 2 * WINDOW_NS),
        (1000.0, 1000.0, start + 3 * WINDOW_NS),
    ]


def test_a_diagnostic_throttled_window_is_said_so_in_the_metrics() -> None:
    """Busy, and over the budget (500 delivered and 6000 dropped in 0.5 s: 13,000/s,
    over even the diagnostic budget of 10,000/s): the window and /metrics say
    diagnostic and throttled; the flow's norm cost per second is its window's over the
    window's length; and a window of 3 s spans 3 s."""
    w = Windows(SentinelConfig())
    kept = WindowsSeen()
    rt = w.rt
    rt.state.observers.add(kept)
    rt.names.flows.add({FLOW: FlowKey("10.0.0.1", "10.0.0.2", 40000, 5201)})
    rt.state.anomaly = AnomalyGauges(throughput_ratio={"eth0": 0.25})
    rt.calibrator.calibrate([0])
    w.window(500, token_bucket=6000)
    (info,) = [x.info for x in kept.windows]
    assert (info.mode, info.throttled) == ("diagnostic", True)
    assert gauge(w, "ms_agent_mode") == 1 and gauge(w, "ms_sampling_throttled") == 1
    (norm,) = scrape(rt)["ms_flow_event_norm"].samples
    assert norm.value == 500 / 0.5  # one sample is a norm cost of 1
    assert (norm.labels["src"], norm.labels["dport"]) == ("10.0.0.1", "5201")
    # ... with the anomaly monitor's readings and the clock model of the window
    (ratio,) = scrape(rt)["ms_throughput_ratio"].samples
    assert (ratio.labels["interface"], ratio.value) == ("eth0", 0.25)
    assert [s.labels["cpu"] for s in scrape(rt)["ms_tsc_slope"].samples] == ["0"]
    assert [s.labels["cpu"] for s in scrape(rt)["ms_tsc_offset_ns"].samples] == ["0"]
    w.clock.now += 3 * SEC
    w.flusher.flush(w.clock.now)
    assert kept.windows[-1].end_ns - kept.windows[-1].start_ns == 3 * SEC
