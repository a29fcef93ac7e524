"""Mode controller and safety level with an injected clock: a sequence of rates gives
an exact sequence of modes."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from meridian.errors import UsageError
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.pipeline.modes import (
    Mode,
    ModeController,
    SafetyGovernor,
    SafetyLevel,
)

S, D = Mode.SENTINEL, Mode.DIAGNOSTIC
SEC = 1_000_000_000


class Clock:
    """An injected clock the test moves by setting `now` (ns); shared by the sentinel
    tests of time-driven state."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def cfg(**mode: object) -> SentinelConfig:
    c = SentinelConfig()  # sentinel budget 1000/s per CPU, high 0.9, low 0.5, refractory 30 s
    for k, v in mode.items():
        setattr(c.mode, k, v)
    return c


def run(mc: ModeController, rates: Sequence[float]) -> list[Mode]:
    return [mc.update(r, now=i * SEC) for i, r in enumerate(rates)]


def test_hysteresis_gives_the_exact_mode_sequence() -> None:
    mc = ModeController(cfg(), Clock())
    rates = [100, 899, 900, 800, 501, 500, 499, 950, 10]
    assert run(mc, rates) == [S, S, D, D, D, D, S, D, S]
    assert mc.reason == "samples/s 10 < 500"


def test_thresholds_scale_with_cpus() -> None:
    mc = ModeController(cfg(), Clock(), cpus=4)  # high 3600, low 2000
    assert run(mc, [3599, 3600, 2000, 1999]) == [S, D, D, S]


def test_thresholds_are_shares_of_what_the_source_can_deliver() -> None:
    """-F 99 with one event open delivers 99/s per CPU however busy: the thresholds
    are 0.9 and 0.5 of that, not of the budget of 1000 (which it never reaches)."""
    mc = ModeController(cfg(), Clock(), cpus=2)
    mc.set_limit(99.0)  # high 178.2, low 99
    assert run(mc, [150, 178, 179, 120, 100, 98]) == [S, S, D, D, D, S]
    mc.set_limit(5000.0)  # above the budget: the budget bounds it (high 1800)
    assert run(mc, [1799, 1800]) == [S, D]
    mc.set_limit(None)
    assert (mc.high, mc.low) == (1800, 1000)


def test_initial_diagnostic_and_no_auto() -> None:
    assert run(ModeController(cfg(initial="diagnostic"), Clock()), [600, 400]) == [D, S]
    fixed = ModeController(cfg(auto=False), Clock())
    assert run(fixed, [5000, 5000, 0]) == [S, S, S]


def test_anomaly_forces_diagnostic_for_the_refractory_period() -> None:
    clock = Clock()
    mc = ModeController(cfg(), clock)
    seq: list[tuple[str, object]] = []
    for t, what in [
        (0.0, "update"),
        (1.0, "trigger"),  # held until 31 s
        (2.0, "update"),
        (10.0, "trigger"),  # inside the refractory period: ignored, no extension
        (30.999, "update"),
        (31.0, "update"),  # hold over, rate low: back to sentinel
        (32.0, "trigger"),  # a new hold, until 62 s
        (61.0, "update"),
        (62.0, "update"),
    ]:
        clock.now = round(t * SEC)
        seq.append((what, mc.trigger() if what == "trigger" else mc.update(100)))
    assert seq == [
        ("update", S),
        ("trigger", True),
        ("update", D),
        ("trigger", False),
        ("update", D),
        ("update", S),
        ("trigger", True),
        ("update", D),
        ("update", S),
    ]


def test_after_a_hold_hysteresis_decides() -> None:
    mc = ModeController(cfg(), Clock())
    assert mc.force_diagnostic(5 * SEC, now=0)
    assert mc.mode == D
    # 700 is between low (500) and high (900): diagnostic stays after the hold
    assert [mc.update(700, now=t * SEC) for t in (4, 5, 6)] == [D, D, D]
    assert mc.update(400, now=7 * SEC) == S


def test_without_auto_a_hold_returns_to_the_initial_mode() -> None:
    mc = ModeController(cfg(auto=False), Clock())
    assert mc.trigger(now=0)
    assert [mc.update(0, now=t * SEC) for t in (29, 30)] == [D, S]


def test_a_pinned_mode_wins_until_released() -> None:
    mc = ModeController(cfg(), Clock())
    assert mc.force("diagnostic") == D
    assert run(mc, [0, 0]) == [D, D]
    assert mc.force(Mode.SENTINEL) == S
    assert mc.trigger(now=0)  # recorded, but the pin wins
    assert mc.update(5000, now=SEC) == S
    mc.force(None)
    assert mc.update(0, now=2 * SEC) == D  # the anomaly hold (until 30 s) applies again
    assert mc.update(0, now=30 * SEC) == S
    with pytest.raises(UsageError, match="mode must be sentinel or diagnostic, got 'x'"):
        mc.force("x")


def test_mode_labels() -> None:
    assert (S.label, D.label, int(D)) == ("sentinel", "diagnostic", 1)
    assert Mode.parse(" Diagnostic ") == D


def test_safety_level_sheds_while_over_the_budget() -> None:
    gov = SafetyGovernor(SentinelConfig())  # shed above 1.0 x budget, back below 0.5
    rates = [900, 1000, 1001, 800, 500, 499, 1200]
    levels = [gov.update(r, 1000) for r in rates]
    N, H = SafetyLevel.NORMAL, SafetyLevel.SHED_HEAVY
    assert levels == [N, N, H, H, H, N, H]
    assert gov.throttled and gov.max_events_per_group == 1
    gov.update(0, 1000)
    assert not gov.throttled and gov.max_events_per_group == 4
    assert gov.update(10, 0) == N  # no budget known: no ratio
    assert gov.update(10, 1) == H  # a budget of 1/s is a budget
    low = SentinelConfig()
    low.mode.shed_high, low.mode.shed_low = 0.8, 0.4  # valid: shed before the budget
    assert SafetyGovernor(low).update(10, 0) == N  # still no ratio without a budget


def test_each_mode_change_says_why() -> None:
    """The reason the runtime logs with a change of mode ("mode diagnostic: ..."),
    set only when the mode changes."""
    clock = Clock()
    mc = ModeController(cfg(), clock)
    assert mc.reason == "initial (sentinel)"
    assert mc.update(950, now=0) == D and mc.reason == "samples/s 950 >= 900"
    assert mc.update(400, now=SEC) == S and mc.reason == "samples/s 400 < 500"
    assert mc.force("diagnostic") == D and mc.reason == "pinned to diagnostic"
    mc.force(S)
    assert mc.trigger(now=2 * SEC) and mc.mode == S  # held back by the pin ...
    mc.force(None)
    assert mc.update(0, now=3 * SEC) == D and mc.reason == "anomaly"  # ... until released
    fixed = ModeController(cfg(auto=False), clock)
    assert fixed.trigger(now=0, why="latency probe") and fixed.reason == "latency probe"
    triggered, held = ModeController(cfg(), clock), ModeController(cfg(), clock)
    assert triggered.trigger(now=0) and triggered.reason == "anomaly"  # the default
    assert held.force_diagnostic(SEC, now=0) and held.reason == "anomaly"
    assert fixed.update(0, now=30 * SEC) == S
    assert fixed.reason == "anomaly hold over, back to sentinel"


def test_a_hold_begins_at_the_time_given_or_the_clock() -> None:
    """force_diagnostic and trigger take `now` when given, the clock's otherwise; a hold
    ending now or earlier holds nothing; a pinned mode is not changed by one."""
    clock = Clock()
    clock.now = 5 * SEC
    mc = ModeController(cfg(), clock)
    assert mc.force_diagnostic(10 * SEC, why="probe") and (mc.mode, mc.reason) == (D, "probe")
    assert mc.forced_until == 10 * SEC
    late = ModeController(cfg(), Clock())  # its clock at 0
    assert late.force_diagnostic(5 * SEC, now=5 * SEC) and late.mode == S  # over already
    assert late.force_diagnostic(6 * SEC, now=7 * SEC) and late.mode == S
    pinned = ModeController(cfg(), Clock())
    pinned.force(S)
    assert pinned.force_diagnostic(10 * SEC, now=0) and pinned.mode == S
    # trigger: its refractory period from the `now` given, not from the clock (at 0)
    tr = ModeController(cfg(), Clock())
    assert tr.trigger(now=0) and tr.forced_until == 30 * SEC
    assert not tr.trigger(now=29 * SEC)
    assert tr.trigger(now=40 * SEC) and tr.forced_until == 70 * SEC
