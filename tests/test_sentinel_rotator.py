"""PMU rotation with an injected clock: exact turns, the scale, the safety limit."""

from __future__ import annotations

import pytest
from test_sentinel_modes import Clock

from meridian.tools.sentinel.pipeline.rotator import PmuRotator


def test_groups_turn_every_window() -> None:
    clock = Clock()
    r = PmuRotator([["a", "b", "c"], ["d"], ["e", "f"]], 100, clock)
    assert r.current() == ["a", "b", "c"]
    assert r.scale == 3.0
    turns = []
    for t in (0, 99, 100, 150, 199, 200, 350, 449, 450):
        clock.now = t
        turns.append(r.tick())
    assert turns == [None, None, ["d"], None, None, ["e", "f"], ["a", "b", "c"], None, ["d"]]


def test_one_group_never_turns() -> None:
    r = PmuRotator([["cpu-clock"]], 100, Clock())
    assert [r.tick(now=t) for t in (0, 100, 10_000)] == [None, None, None]
    assert r.scale == 1.0


def test_new_groups_start_again() -> None:
    r = PmuRotator([["a"], ["b"]], 100, Clock())
    assert r.tick(now=100) == ["b"]
    assert r.set_groups([["x", "y"], ["z"], ["w"]], now=120) == ["x", "y"]
    assert r.scale == 3.0
    assert r.tick(now=219) is None
    assert r.tick(now=220) == ["z"]


def test_safety_limit_trims_each_group() -> None:
    r = PmuRotator([["a", "b", "c"], ["d"]], 100, Clock(), max_events=2)
    assert r.current() == ["a", "b"]
    assert r.set_max_events(1) == ["a"]
    assert r.set_max_events(1) is None  # nothing changes
    assert r.tick(now=100) == ["d"]
    assert r.set_max_events(4) is None  # ["d"] either way
    assert r.tick(now=200) == ["a", "b", "c"]
    assert r.scale == 2.0  # trimming does not change the time sharing


def test_bad_groups() -> None:
    with pytest.raises(ValueError, match="at least one group"):
        PmuRotator([], 100, Clock())
    with pytest.raises(ValueError, match="at least one group"):
        PmuRotator([["a"], []], 100, Clock())
    with pytest.raises(ValueError, match="above 0 ns"):
        PmuRotator([["a"]], 0, Clock())
