"""agent/state.py: a batch's cost per sample, the observers (each hook on its own, a
failing one said once and dropped, a reader gone away ending the run, every one
closed), and the requests posted to the consumer."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
from test_sentinel_modes import Clock

from meridian.tools.sentinel.agent.state import Observers, RuntimeState, SampleBatch
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.pipeline.anomaly import AnomalyGauges


def test_a_batch_s_cost_per_sample_is_its_scale_over_its_segments() -> None:
    samples = np.zeros(3, dtype=[("gso_segs", "<u2")])
    samples["gso_segs"] = [0, 1, 4]
    batch = SampleBatch(samples, np.zeros(3), np.zeros(0), np.array([2.0, 2.0, 2.0]))
    assert batch.norm_cost.tolist() == [2.0, 2.0, 0.5]


class Seen:
    """An observer that keeps what it is given; `fail` raises that from every hook."""

    def __init__(self, fail: BaseException | None = None, samples: bool = True) -> None:
        self.got: list[Any] = []
        self.fail = fail
        if samples:
            self.on_samples = self._keep

    def _keep(self, arg: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.got.append(arg)

    def on_window(self, window: Any) -> None:
        self._keep(window)

    def close(self) -> None:
        self.got.append("closed")
        if self.fail is not None:
            raise self.fail


def test_observers_each_on_their_own() -> None:
    logs: list[str] = []
    stopping = threading.Event()
    ok, windows_only, broken = Seen(), Seen(samples=False), Seen(RuntimeError("disk full"))
    obs = Observers([ok, broken], logs.append, stopping)
    obs.add(windows_only)
    obs.samples("b1")  # type: ignore[arg-type]
    obs.window("w1")  # type: ignore[arg-type]
    obs.samples("b2")  # type: ignore[arg-type]
    assert ok.got == ["b1", "w1", "b2"] and windows_only.got == ["w1"] and broken.got == []
    assert logs == ["Seen failed and is dropped: disk full"]  # once, then dropped
    obs.close()
    assert ok.got[-1] == windows_only.got[-1] == "closed" and broken.got == []
    assert not stopping.is_set() and obs.sink() is None


def test_a_reader_gone_away_ends_the_run_and_a_failed_close_the_others_still() -> None:
    logs: list[str] = []
    stopping = threading.Event()
    pipe = Seen(BrokenPipeError(32, "Broken pipe"))
    after = Seen()
    obs = Observers([pipe, after], logs.append, stopping)
    obs.window("w")  # type: ignore[arg-type]
    assert stopping.is_set() and after.got == ["w"] and logs == []
    obs.window("w2")  # type: ignore[arg-type]
    assert after.got == ["w", "w2"]  # the pipe's observer is kept, not dropped
    bad = Seen()
    bad.fail = OSError("gone")
    obs = Observers([bad, after], logs.append, stopping)
    obs.close()
    assert logs == ["closing Seen: gone"] and after.got[-1] == "closed"


def test_the_store_s_sink_is_the_first_observer_with_stats() -> None:
    stats = SimpleNamespace(stats=lambda: None)
    no_stats = SimpleNamespace(sink=object(), on_window=print, close=print)
    store = SimpleNamespace(sink=stats, on_window=print, close=print)
    other = SimpleNamespace(sink=SimpleNamespace(stats=lambda: 1), on_window=print, close=print)
    obs = Observers([no_stats, store, other], print, threading.Event())
    assert obs.sink() is stats


def test_requests_to_the_consumer() -> None:
    state = RuntimeState(SentinelConfig(), print, Clock())
    assert not state.running and not state.wakeup.is_set()
    with state.lock:
        state.post("budget", (1, 2))
        state.post("budget", (3, 4))  # the last one wins
        state.post("events", ["e"])
    assert state.wakeup.is_set()
    assert state.take_requests() == {"budget": (3, 4), "events": ["e"]}
    assert state.take_requests() == {}
    state.started = True
    assert state.running
    state.stopping.set()
    assert not state.running


def test_an_observer_failing_in_on_window_is_dropped_and_hooks_it_lacks_are_skipped() -> None:
    logs: list[str] = []
    calls: list[str] = []

    def fail(window: Any) -> None:
        calls.append(window)
        raise ValueError("bad window")

    failing = SimpleNamespace(on_window=fail, close=lambda: None)
    samples_only = SimpleNamespace(on_samples=calls.append)  # no on_window, no close
    obs = Observers([failing, samples_only], logs.append, threading.Event())
    obs.window("w1")  # type: ignore[arg-type]
    obs.window("w2")  # type: ignore[arg-type]
    assert calls == ["w1"] and logs == ["SimpleNamespace failed and is dropped: bad window"]
    obs.close()


def test_a_fresh_state_and_its_observers() -> None:
    """Counters start at nothing; the observers report through the state's log and end
    the run through its stopping event."""
    logs: list[str] = []
    state = RuntimeState(SentinelConfig(), logs.append, Clock())
    assert (state.source_name, state.events, state.frequency, state.scales) == ("-", [], None, {})
    assert (state.delivered, state.kept, state.dropped, state.last_info) == (0, 0, {}, None)
    assert state.started is False and state.anomaly == AnomalyGauges()
    assert state.labelled == {
        "function_unresolved": 0, "stack_unresolved": 0, "stack_gone": 0, "stack_skipped": 0
    }  # fmt: skip
    state.observers.add(Seen(RuntimeError("x")))
    state.observers.add(Seen(BrokenPipeError(32, "Broken pipe")))
    state.observers.window("w")  # type: ignore[arg-type]
    assert logs == ["Seen failed and is dropped: x"] and state.stopping.is_set()
