"""What the safety level keeps of a group when it sheds (issue 25 item 8.2): the base
(cycles, or cpu-clock without a PMU), then the detectors' events (hitm, remote-dram),
then the generic ones, each rank in the order written; never simply the first N."""

from __future__ import annotations

import pytest
from test_sentinel_modes import Clock

from meridian.tools.sentinel.agent.plan import Plan
from meridian.tools.sentinel.agent.state import RuntimeState
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.pipeline.modes import SafetyLevel, shed_rank
from meridian.tools.sentinel.pipeline.rotator import PmuRotator, keep
from meridian.tools.sentinel.sources.pmu_events import parse_events

SEC = 1_000_000_000


def names(group: list[str], n: int) -> list[str]:
    return [e.name for e in keep(parse_events(",".join(group)), n, shed_rank)]


def test_a_shed_group_keeps_the_base_and_the_detectors_events() -> None:
    assert names(["cycles", "instructions", "llc-misses", "hitm"], 2) == ["cycles", "hitm"]
    assert names(["cycles", "instructions", "llc-misses", "hitm"], 1) == ["cycles"]
    assert names(["cycles", "instructions", "llc-misses", "hitm"], 3) == [
        "cycles",
        "instructions",
        "hitm",
    ]
    assert names(["instructions", "hitm", "llc-misses", "cycles"], 2) == ["hitm", "cycles"]


@pytest.mark.parametrize(
    ("group", "n", "kept"),
    [
        (["remote-dram", "hitm"], 1, ["remote-dram"]),  # equal ranks: the order written
        (["hitm", "remote-dram"], 1, ["hitm"]),
        (["llc-misses", "remote-dram", "branch-misses", "cycles"], 2, ["remote-dram", "cycles"]),
        (["instructions", "cpu-clock", "llc-misses"], 1, ["cpu-clock"]),
        (["branch-misses", "raw:0x1cd:0x1e", "llc-misses"], 2, ["branch-misses", "raw:0x1cd:0x1e"]),
        (["cycles", "llc-misses"], 4, ["cycles", "llc-misses"]),  # under the limit: all
    ],
)
def test_ranks_then_the_order_written(group: list[str], n: int, kept: list[str]) -> None:
    assert names(group, n) == kept


def test_the_rotator_keeps_by_its_rank_or_the_first() -> None:
    assert keep(["a", "b", "c"], 2) == ["a", "b"]
    assert keep(["a", "b", "c"], None) == ["a", "b", "c"]
    r = PmuRotator([["x", "y", "z"]], 100, Clock(), max_events=2, rank=lambda e: -ord(e))
    assert r.current() == ["y", "z"]


def level(plan: Plan) -> SafetyLevel:
    return plan.governor.level


def test_the_runtime_plan_sheds_by_rank_and_restores() -> None:
    """The plan the runtime uses: over the budget the safety level sheds the group
    [cycles, instructions, llc-misses, hitm] to 2 events, cycles and hitm; back under
    it, all four again."""
    cfg = SentinelConfig()
    cfg.perf.sentinel_groups = [["cycles", "instructions", "llc-misses", "hitm"]]
    cfg.mode.shed_max_events_per_group = 2
    clock = Clock()
    state = RuntimeState(cfg, lambda line: None, clock)
    plan = Plan(state, cpus=1)
    assert [e.name for e in plan.rotator.current()] == [
        "cycles",
        "instructions",
        "llc-misses",
        "hitm",
    ]
    plan.decide(busy_per_sec=0.0, offered_per_sec=5000.0, now=SEC)  # 5 x the budget
    assert level(plan) == SafetyLevel.SHED_HEAVY
    assert [e.name for e in state.take_requests()["events"]] == ["cycles", "hitm"]
    plan.decide(busy_per_sec=0.0, offered_per_sec=100.0, now=2 * SEC)
    assert level(plan) == SafetyLevel.NORMAL
    assert len(state.take_requests()["events"]) == 4
