"""agent/control.py, what the control plane calls on a running agent, over a plan and
state the test holds (no source, no threads): each change reaches the plan or is
posted to the consumer, anomalies hold diagnostic mode, and the status is exact."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from test_sentinel_plan import SEC, names, setup

from meridian.errors import UsageError
from meridian.tools.sentinel.agent.control import RuntimeControl
from meridian.tools.sentinel.pipeline.anomaly import AnomalyGauges, AnomalySignal
from meridian.tools.sentinel.pipeline.modes import Mode
from meridian.tools.sentinel.pipeline.targets import TargetFilter


class FakeSymbolizer:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def register_jit(self, *args: Any) -> None:
        self.calls.append(("jit", *args))

    def register_data_object(self, *args: Any) -> int:
        self.calls.append(("object", *args))
        return 42


def control(verbose: bool = False) -> tuple[RuntimeControl, Any, list[str], FakeSymbolizer]:
    plan, state, logs = setup(verbose=verbose)
    sym = FakeSymbolizer()
    return RuntimeControl(state, plan, TargetFilter(), sym), state, logs, sym  # type: ignore[arg-type]


def test_changes_reach_the_plan_and_the_consumer() -> None:
    c, state, _, sym = control()
    assert c.set_mode("diagnostic") == Mode.DIAGNOSTIC
    assert names(state.take_requests()["events"]) == ["llc-misses"]
    c.set_budgets(diagnostic=3000)
    assert state.take_requests() == {"budget": (3000, 50_000)}
    c.set_budgets(hard_drop_ns=9)
    assert state.take_requests() == {"budget": (3000, 9)}
    c.set_budgets(sentinel=2000)  # kept for sentinel mode; diagnostic's stays posted
    assert state.take_requests() == {"budget": (3000, 9)}
    assert state.cfg.perf.sentinel_samples_per_sec == 2000
    c.set_groups(sentinel=[["cycles"]])  # not the current mode: nothing to open now
    assert state.take_requests() == {} and c.status()["groups"]["sentinel"] == [["cycles"]]
    c.set_groups(diagnostic=[["hitm", "cycles"]])
    assert names(state.take_requests()["events"]) == ["hitm", "cycles"]
    with pytest.raises(UsageError, match=r"^diagnostic_groups: "):
        c.set_groups(diagnostic=[["nope"]])
    with pytest.raises(UsageError, match=r"^sentinel_groups: "):
        c.set_groups(sentinel=[["nope"]])
    c.set_targets([{"pid": 7}, {"pid": 3}])
    assert state.take_requests() == {"pids": [3, 7]}
    c.register_jit(1, 2, 3, "/tmp/perf-1.map", "ab")
    assert c.register_data_object(1, 0x10, "arena", "t", 64) == 42
    assert sym.calls == [
        ("jit", 1, 2, 3, "/tmp/perf-1.map", "ab"),
        ("object", 1, 0x10, "arena", "t", 64),
    ]
    assert c.set_mode(None) == Mode.DIAGNOSTIC  # released: the next window decides


def test_anomalies_hold_diagnostic_and_are_said() -> None:
    c, state, logs, _ = control(verbose=True)
    gauges = AnomalyGauges({"eth0": 0.1}, {"eth0": 8.0}, None, None)
    drop = AnomalySignal("throughput_drop", "eth0", 8.0, 80.0, 0.1, 5 * SEC)
    c.anomaly(gauges, [drop, drop])  # the second within the hold: not said again
    assert state.anomaly is gauges
    assert logs == [f"anomaly: {drop}: diagnostic mode"]
    hold = round(state.cfg.anomaly.refractory_period * SEC)
    c.plan.decide(0.0, 0.0, hold + SEC)  # held from the signal's time (5 s), not the clock's
    assert c.plan.current_mode() == Mode.DIAGNOSTIC
    assert logs[-1] == f"mode diagnostic: {drop}"
    quiet, state, logs, _ = control()
    quiet.anomaly(gauges, [drop])
    assert logs == []


def test_the_status_exactly() -> None:
    c, state, _, _ = control()
    state.source_name, state.events, state.scales = "mock", ["cycles"], {"cycles": 2.0}
    state.delivered, state.kept, state.dropped = 10, 8, {"ring": 1}
    c.set_targets([{"pid": 7}])
    want = {
        "mode": "sentinel", "pinned": False, "source": "mock", "events": ["cycles"],
        "groups": {"sentinel": [["cycles"], ["instructions"]],
                   "diagnostic": [["llc-misses"], ["branch-misses"]]},
        "samples_per_sec_budget": 1000, "hard_drop_ns": 50_000, "samples_per_sec": 0.0,
        "scales": {"cycles": 2.0}, "safety_level": "normal", "throttled": False,
        "dropped": {"ring": 1}, "samples_delivered": 10, "samples_kept": 8,
        "labelled": dict(state.labelled), "targets": [{"pid": 7}], "running": False,
        "storage": None,
    }  # fmt: skip
    assert c.status() == want and c.store_backend() is None
    c.set_mode("diagnostic")
    state.last_info = SimpleNamespace(samples_per_sec=12.5)
    state.started = True
    stats = SimpleNamespace(
        backend="http://h:8123", connected=1, rows_written=5, backlog_rows=4, spooled_rows=3,
        spool_bytes=2048, dropped_rows=2, flush_errors=1,
    )  # fmt: skip
    sink = SimpleNamespace(stats=lambda: stats, backend="the backend")
    state.observers.add(SimpleNamespace(sink=sink, on_window=print, close=print))
    got = c.status()
    assert (got["mode"], got["pinned"], got["samples_per_sec"], got["running"]) == (
        "diagnostic",
        True,
        12.5,
        True,
    )
    assert (got["samples_per_sec_budget"], got["hard_drop_ns"]) == (4000, 50_000)
    assert got["storage"] == {
        "backend": "http://h:8123", "connected": True, "stored_rows": 5, "backlog_rows": 4,
        "spooled_rows": 3, "spool_bytes": 2048, "dropped_rows": 2, "flush_errors": 1,
    }  # fmt: skip
    assert c.store_backend() == "the backend"
