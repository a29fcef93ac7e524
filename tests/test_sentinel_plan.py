"""agent/plan.py on a clock the test holds: the mode from the busy rate (per CPU, and
below the source's own limit), the anomaly hold by the window's time, the safety level
on the offered rate, what is posted to the consumer and said, the PMU rotation's
timing, and the control plane's changes."""

from __future__ import annotations

import pytest
from test_sentinel_modes import Clock

from meridian.errors import UsageError
from meridian.tools.sentinel.agent.plan import Plan
from meridian.tools.sentinel.agent.state import RuntimeState
from meridian.tools.sentinel.config.load import SentinelConfig, parse_groups
from meridian.tools.sentinel.pipeline.modes import Mode, SafetyLevel

SEC = 1_000_000_000


def setup(cpus: int = 2, verbose: bool = False) -> tuple[Plan, RuntimeState, list[str]]:
    cfg = SentinelConfig()
    cfg.perf.sentinel_samples_per_sec = 1000
    cfg.perf.diagnostic_samples_per_sec = 4000
    cfg.perf.hard_drop_ns = 50_000
    cfg.perf.sentinel_groups = [["cycles"], ["instructions"]]
    cfg.perf.diagnostic_groups = [["llc-misses"], ["branch-misses"]]
    cfg.perf.rotation_window = 1.0
    cfg.run.verbose = int(verbose)
    logs: list[str] = []
    state = RuntimeState(cfg, logs.append, Clock())  # the clock stays at 0
    return Plan(state, cpus=cpus), state, logs


def names(group: list[object]) -> list[str]:
    return [e.name for e in group]  # type: ignore[attr-defined]


def level(plan: Plan) -> SafetyLevel:
    return plan.governor.level


def test_the_mode_follows_the_busy_rate_per_cpu_and_the_source_s_limit() -> None:
    plan, state, _ = setup()
    high = state.cfg.mode.hysteresis_high * 1000 * 2  # per-CPU budget x 2 CPUs
    plan.decide(high - 1, 0.0, SEC)
    assert plan.current_mode() == Mode.SENTINEL
    plan.decide(high, 0.0, 2 * SEC)
    assert plan.current_mode() == Mode.DIAGNOSTIC
    # a source at 100 Hz with 2 events delivers 200/s a CPU at most: the thresholds
    # are its shares of that
    plan, state, _ = setup()
    state.frequency, state.events = 100.0, ["cycles", "instructions"]
    high = state.cfg.mode.hysteresis_high * 200 * 2
    plan.decide(high - 1, 0.0, SEC)
    assert plan.current_mode() == Mode.SENTINEL
    plan.decide(high, 0.0, 2 * SEC)
    assert plan.current_mode() == Mode.DIAGNOSTIC
    plan, state, _ = setup()
    state.frequency, state.events = 100.0, []  # no events yet: no limit but the budget
    plan.decide(10.0, 0.0, SEC)
    assert plan.current_mode() == Mode.SENTINEL


def test_an_anomaly_holds_diagnostic_by_the_window_s_time() -> None:
    """The hold runs from the trigger's time and ends by the window's, whatever the
    clock reads (0 here); the mode change says the anomaly's reason."""
    plan, state, logs = setup(verbose=True)
    hold = round(state.cfg.anomaly.refractory_period * SEC)
    t = 5 * SEC
    assert plan.trigger(t, "throughput") and not plan.trigger(t + SEC, "again")
    plan.decide(0.0, 0.0, t + hold - 1)
    assert plan.current_mode() == Mode.DIAGNOSTIC
    assert logs == ["mode diagnostic: throughput"]
    plan.decide(0.0, 0.0, t + hold + 1)
    assert plan.current_mode() == Mode.SENTINEL


def test_the_safety_level_on_the_offered_rate_over_every_cpu_s_budget() -> None:
    plan, state, logs = setup(verbose=True)
    shed = state.cfg.mode.shed_high * 1000 * 2
    plan.decide(0.0, shed - 1, SEC)
    assert level(plan) == SafetyLevel.NORMAL and state.take_requests() == {}
    plan.decide(0.0, shed + 1, 2 * SEC)
    assert level(plan) == SafetyLevel.SHED_HEAVY
    plan.decide(0.0, 0.0, 3 * SEC)
    assert logs == [
        "safety level shed_heavy: shedding events",
        "safety level normal: back to normal",
    ]


def test_a_mode_change_posts_its_groups_and_budget_and_says_why() -> None:
    plan, state, logs = setup(verbose=True)
    assert plan.budget == (1000, 50_000)
    high = state.cfg.mode.hysteresis_high * 1000 * 2
    plan.decide(high, 0.0, 5 * SEC)
    req = state.take_requests()
    assert names(req["events"]) == ["llc-misses"] and req["budget"] == (4000, 50_000)
    assert logs == [f"mode diagnostic: samples/s {high:.0f} >= {high:.0f}"]
    # the new mode's rotation starts at the window's time, not the clock's
    assert plan.tick(5 * SEC + SEC // 2) is None
    assert names(plan.tick(6 * SEC) or []) == ["branch-misses"]
    plan.decide(high, 0.0, 7 * SEC)  # no change: nothing posted
    assert state.take_requests() == {}


def test_the_rotation_turns_at_exactly_its_window() -> None:
    plan, _, _ = setup()
    assert plan.tick(SEC - 1) is None
    assert names(plan.tick(SEC) or []) == ["instructions"]


def test_the_control_plane_s_changes() -> None:
    plan, state, _ = setup()
    assert plan.force("diagnostic") == Mode.DIAGNOSTIC
    assert names(state.take_requests()["events"]) == ["llc-misses"]
    plan.force("diagnostic")
    assert state.take_requests() == {}  # already: nothing posted
    assert plan.force(None) == Mode.DIAGNOSTIC  # released; the next window decides
    plan.set_budgets(None, 5000, None)
    assert state.take_requests() == {"budget": (5000, 50_000)}
    plan.set_budgets(2000, None, 7)
    assert state.take_requests() == {"budget": (5000, 7)}
    assert state.cfg.perf.sentinel_samples_per_sec == 2000
    plan.set_groups({"sentinel": parse_groups([["cycles"]], "x")})  # not the current mode's
    assert state.take_requests() == {}
    plan.set_groups({"diagnostic": parse_groups([["hitm"]], "x")})
    assert names(state.take_requests()["events"]) == ["hitm"]


def test_bad_groups_are_named_by_their_setting() -> None:
    cfg = SentinelConfig()
    cfg.perf.__dict__["diagnostic_groups"] = [["no-such-event"]]  # past the settings' check
    with pytest.raises(UsageError, match=r"^perf\.diagnostic_groups: "):
        Plan(RuntimeState(cfg, print, Clock()), cpus=1)


def test_diagnostic_mode_s_own_budget_and_a_switch_while_shedding() -> None:
    """Started in diagnostic mode, its budget is the one posted and the one the safety
    level weighs the offered rate against; a mode switch in the window the level changes
    still opens the new mode's group."""
    plan, state, _ = setup()
    state.cfg.mode.initial = "diagnostic"
    plan = Plan(state, cpus=2)
    assert plan.budget == (4000, 50_000)
    plan.decide(10**6, state.cfg.mode.shed_high * 1000 * 2 + 1, SEC)  # under 4000 x 2
    assert level(plan) == SafetyLevel.NORMAL
    plan, state, _ = setup()
    high = state.cfg.mode.hysteresis_high * 1000 * 2
    plan.decide(high, 10**9, SEC)  # to diagnostic, and shedding
    assert level(plan) == SafetyLevel.SHED_HEAVY
    assert names(state.take_requests()["events"]) == ["llc-misses"]


def test_a_group_over_the_events_opened_at_once_is_cut() -> None:
    plan, state, _ = setup()
    state.cfg.perf.sentinel_groups = [
        ["cycles", "instructions", "llc-misses", "hitm", "branch-misses"]
    ]
    plan = Plan(state, cpus=1)
    assert len(plan.rotator.current()) == state.cfg.perf.max_events_per_group
