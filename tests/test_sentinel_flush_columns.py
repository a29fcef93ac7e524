"""The flush's sums, column-wise over a window's ROLLUP_DTYPE rows (flow_stats,
flow_rows), against the loop over Rollup objects they replace: the same cells in the
same order, the same functions and stacks, and bit for bit the same floats."""

from __future__ import annotations

from typing import Any

import numpy as np

from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE, Rollup, rollups
from meridian.tools.sentinel.model.window import FlowStat, flow_stats
from meridian.tools.sentinel.outputs.metrics import FlowRow, flow_rows

RNG = np.random.default_rng(7)


def window_rows(n: int) -> np.ndarray[Any, Any]:
    """n rollup rows as a busy window has them: a few flows, directions and events,
    thousands of functions and stacks, costs of very different sizes (the order of
    the additions shows in the last bits)."""
    rows = np.zeros(n, dtype=ROLLUP_DTYPE)
    rows["flow_id"] = RNG.choice(np.array([0, 0, 0, 17, (1 << 64) - 5], dtype=np.uint64), size=n)
    rows["direction"] = RNG.integers(0, 3, size=n)
    rows["event"] = RNG.choice([0, 1, 9], size=n)
    rows["function_id"] = RNG.integers(1, n // 3 + 2, size=n)
    rows["function_id"][::50] = (1 << 62) + 3  # a provisional id
    rows["callstack_id"] = RNG.integers(0, n // 5 + 2, size=n)
    rows["samples"] = RNG.integers(1, 1000, size=n)
    rows["norm_cost"] = RNG.random(n) * 10.0 ** RNG.integers(-6, 6, size=n)
    rows["time_bucket"] = 5_000_000_000
    return rows[np.lexsort((-rows["norm_cost"], rows["time_bucket"]))]


def stats_by_loop(rows: list[Rollup]) -> list[FlowStat]:
    """flow_stats as it summed Rollup objects one by one."""
    cells: dict[tuple[int, int, int], FlowStat] = {}
    for r in rows:
        k = (int(r.flow_id), int(r.direction), int(r.event))
        cell = cells.get(k)
        if cell is None:
            cell = cells[k] = FlowStat(*k)
        cell.add(r)
    return sorted(cells.values(), key=lambda s: (-s.norm_cost, s.flow_id, s.direction, s.event))


def test_flow_stats_are_the_loop_s() -> None:
    for n in (0, 1, 7, 5_000):
        rows = window_rows(n)
        got = flow_stats(rows)
        want = stats_by_loop(rollups(rows))
        assert got == want
        assert flow_stats(rollups(rows)) == got  # Rollup objects are summed alike
        for g, w in zip(got, want, strict=True):  # dicts compare without their order
            assert list(g.functions.items()) == list(w.functions.items())
            assert list(g.stacks.items()) == list(w.stacks.items())
            assert type(g.samples) is int and type(g.norm_cost) is float


class Names:
    def get(self, flow_id: int) -> FlowKey | None:
        return FlowKey("10.0.0.1", "10.0.0.2", 80, 40000, "tcp") if flow_id == 17 else None


def rows_by_loop(rows: list[Rollup], names: Names) -> list[tuple[Any, ...]]:
    """flow_rows' cells as it summed Rollup objects one by one."""
    sums: dict[tuple[int, int, int], list[float]] = {}
    for r in rows:
        cell = sums.setdefault((int(r.flow_id), int(r.direction), int(r.event)), [0, 0.0])
        cell[0] += int(r.samples)
        cell[1] += float(r.norm_cost)
    return [(f, d, e, int(n), c) for (f, d, e), (n, c) in sums.items()]


def test_flow_rows_are_the_loop_s() -> None:
    rows = window_rows(5_000)
    got = flow_rows(rows, Names(), event_name=str)
    want = rows_by_loop(rollups(rows), Names())
    assert [(r.flow_id, r.direction, r.event, r.samples, r.norm_cost) for r in got] == [
        (f, ["rx", "tx", "idle"][d], str(e), n, c) for f, d, e, n, c in want
    ]
    named = [r for r in got if r.flow_id == 17]
    assert named and all(r.src == "10.0.0.1" and r.dport == 40000 for r in named)
    assert flow_rows(rollups(rows), Names(), event_name=str) == got
    assert flow_rows(rows[:0]) == []
    assert isinstance(got[0], FlowRow)
