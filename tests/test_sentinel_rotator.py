"""PMU rotation with an injected clock: exact turns, each event's share of the turns
(the rotation's part of its sample scale), the safety limit."""

from __future__ import annotations

import pytest
from test_sentinel_modes import Clock

from meridian.tools.sentinel.pipeline.rotator import PmuRotator, rotation_shares


def same(group: list[str]) -> list[str]:
    """Every event opens as itself."""
    return group


def test_groups_turn_every_window() -> None:
    clock = Clock()
    r = PmuRotator([["a", "b", "c"], ["d"], ["e", "f"]], 100, clock)
    assert r.current() == ["a", "b", "c"]
    assert r.shares(same) == dict.fromkeys("abcdef", 3.0)
    turns = []
    for t in (0, 99, 100, 150, 199, 200, 350, 449, 450):
        clock.now = t
        turns.append(r.tick())
    assert turns == [None, None, ["d"], None, None, ["e", "f"], ["a", "b", "c"], None, ["d"]]


def test_one_group_never_turns() -> None:
    r = PmuRotator([["cpu-clock"]], 100, Clock())
    assert [r.tick(now=t) for t in (0, 100, 10_000)] == [None, None, None]
    assert r.shares(same) == {"cpu-clock": 1.0}


def test_new_groups_start_again() -> None:
    r = PmuRotator([["a"], ["b"]], 100, Clock())
    assert r.tick(now=100) == ["b"]
    assert r.set_groups([["x", "y"], ["z"], ["w"]], now=120) == ["x", "y"]
    assert r.shares(same) == {"x": 3.0, "y": 3.0, "z": 3.0, "w": 3.0}
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
    # trimming leaves the time sharing (two turns) but not what each turn samples
    assert r.schedule() == [["a", "b", "c"], ["d"]]
    r.set_max_events(1)
    assert r.schedule() == [["a"], ["d"]]
    assert r.shares(same) == {"a": 2.0, "d": 2.0}


def test_an_event_in_one_of_three_groups_is_scaled_by_3() -> None:
    r = PmuRotator([["cycles", "llc-misses"], ["cycles"], ["branch-misses"]], 100, Clock())
    got = r.shares(same)
    assert got["llc-misses"] == 3.0 and got["branch-misses"] == 3.0
    assert got["cycles"] == 1.5  # two turns of three


def test_an_event_in_two_of_two_groups_is_not_scaled() -> None:
    r = PmuRotator([["cycles", "llc-misses"], ["cycles", "branch-misses"]], 100, Clock())
    assert r.shares(same) == {"cycles": 1.0, "llc-misses": 2.0, "branch-misses": 2.0}


def test_every_group_falling_back_to_cpu_clock_is_not_scaled() -> None:
    """Diagnostic mode's two default groups on a host without a PMU: each turn opens
    cpu-clock, so cpu-clock is sampled all the time (the old scale said 2)."""
    r = PmuRotator(
        [["cycles", "instructions", "llc-misses", "branch-misses"], ["remote-dram", "hitm"]],
        100,
        Clock(),
    )

    def no_pmu(group: list[str]) -> list[str]:
        return ["cpu-clock" for _ in group]

    assert r.shares(no_pmu) == {"cpu-clock": 1.0}
    # one group falling back, the other not: cpu-clock half the time, like the other
    assert rotation_shares([["cpu-clock"], ["cycles"]]) == {"cpu-clock": 2.0, "cycles": 2.0}
    assert rotation_shares([["cpu-clock", "cpu-clock"]]) == {"cpu-clock": 1.0}


def test_bad_groups() -> None:
    with pytest.raises(
        ValueError, match=r"^the rotator needs at least one group, each with an event$"
    ):
        PmuRotator([], 100, Clock())
    with pytest.raises(ValueError, match="at least one group"):
        PmuRotator([["a"], []], 100, Clock())
    with pytest.raises(ValueError, match="above 0 ns"):
        PmuRotator([["a"]], 0, Clock())
    assert PmuRotator([["a"]], 1, Clock()).current() == ["a"]  # 1 ns is above 0
