"""One flush window as the runtime hands it to its observers (views, sinks,
detectors) and the run's bounded totals: pure data over aggregator rollups, shared by
the outputs, the agent and the query side, so none of them imports another.

A window's rollups are summed per flow column-wise (`flow_stats` over the
ROLLUP_DTYPE array, numpy): a busy window has thousands of rows, and a Python object
per row was most of the flush's time. Each sum still adds its rows in their order,
as a loop over Rollup objects did: the same floats."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Protocol

import numpy as np

from .flows import FlowKey
from .groups import in_order
from .records import DIRECTION_NAMES, EVENT_NAMES, IDLE
from .rollup import Rollup, as_rows

Array = np.ndarray[Any, Any]

NO_FLOW = "(no flow)"
IDLE_LABEL = "(idle)"


class Names(Protocol):
    """Ids to what a person reads (the runtime implements it over FlowNames and the
    symbolizer). It may also have `canonical_function(id) -> int` and
    `canonical_stack(id) -> int`: the id an id is ranked under (a provisional id's
    function once resolved), which the outputs merge by."""

    def flow(self, flow_id: int) -> FlowKey | None: ...
    def function(self, function_id: int) -> str: ...
    def stack(self, stack_id: int) -> list[str]: ...


def event_name(event: int) -> str:
    return EVENT_NAMES[event] if 0 <= event < len(EVENT_NAMES) else str(event)


def direction_name(direction: int) -> str:
    return DIRECTION_NAMES[direction] if 0 <= direction < len(DIRECTION_NAMES) else "?"


@dataclass
class FlowStat:
    """One (flow, direction, event): samples, norm cost, and cost per function and
    per stack (to name the hottest)."""

    flow_id: int
    direction: int
    event: int
    samples: int = 0
    norm_cost: float = 0.0
    functions: dict[int, float] = field(default_factory=dict)
    stacks: dict[int, float] = field(default_factory=dict)

    def add(self, r: Rollup) -> None:
        cost = float(r.norm_cost)
        self.samples += int(r.samples)
        self.norm_cost += cost
        f, s = int(r.function_id), int(r.callstack_id)
        self.functions[f] = self.functions.get(f, 0.0) + cost
        self.stacks[s] = self.stacks.get(s, 0.0) + cost

    def merge(self, other: FlowStat) -> None:
        self.samples += other.samples
        self.norm_cost += other.norm_cost
        for f, c in other.functions.items():
            self.functions[f] = self.functions.get(f, 0.0) + c
        for s, c in other.stacks.items():
            self.stacks[s] = self.stacks.get(s, 0.0) + c

    def hottest(
        self, n: int = 1, merge: Callable[[int], int] | None = None
    ) -> list[tuple[int, float]]:
        """The `n` functions with the most cost (ties: lower id first). `merge` maps
        an id to the one it is counted under (a provisional id to the function it
        was resolved to: Names.canonical_function)."""
        return _top(self.functions, n, merge)

    def hottest_stacks(
        self, n: int = 1, merge: Callable[[int], int] | None = None
    ) -> list[tuple[int, float]]:
        return _top(self.stacks, n, merge)


def _top(
    costs: dict[int, float], n: int, merge: Callable[[int], int] | None
) -> list[tuple[int, float]]:
    if merge is not None:
        merged: dict[int, float] = {}
        for ident, cost in costs.items():
            key = merge(ident)
            merged[key] = merged.get(key, 0.0) + cost
        costs = merged
    # the n first of thousands (a window's functions): a heap, not a sort of them all
    return heapq.nsmallest(n, costs.items(), key=lambda kv: (-kv[1], kv[0]))


def _order(s: FlowStat) -> tuple[float, int, int, int]:
    return (-s.norm_cost, s.flow_id, s.direction, s.event)


def flow_stats(rows: Array | Iterable[Rollup]) -> list[FlowStat]:
    """Rollups (ROLLUP_DTYPE rows, or Rollup objects) summed per (flow, direction,
    event), highest norm cost first; each cell's functions and stacks in the order
    they first occur."""
    rows = as_rows(rows)
    if not len(rows):
        return []
    first, cell = in_order(rows["flow_id"], rows["direction"], rows["event"])
    cost = rows["norm_cost"].astype(np.float64)
    samples = np.zeros(len(first), dtype=np.uint64)
    np.add.at(samples, cell, rows["samples"].astype(np.uint64))
    norm = np.bincount(cell, weights=cost, minlength=len(first))
    functions = _per_cell(cell, rows["function_id"], cost, len(first))
    stacks = _per_cell(cell, rows["callstack_id"], cost, len(first))
    keys = zip(*(rows[k][first].tolist() for k in ("flow_id", "direction", "event")), strict=True)
    out = [
        FlowStat(flow, direction, event, n, c, fs, ss)
        for (flow, direction, event), n, c, fs, ss in zip(
            keys, samples.tolist(), norm.tolist(), functions, stacks, strict=True
        )
    ]
    return sorted(out, key=_order)


def _per_cell(cell: Array, ids: Array, cost: Array, cells: int) -> list[dict[int, float]]:
    """Per cell, the cost of each id in it (summed in row order), as a dict of the ids
    in the order they first occur in the cell."""
    first, inv = in_order(cell, ids)
    sums = np.bincount(inv, weights=cost, minlength=len(first))
    owner = cell[first]
    order = np.argsort(owner, kind="stable")
    keys, values = ids[first][order].tolist(), sums[order].tolist()
    cuts = np.searchsorted(owner[order], np.arange(cells + 1)).tolist()
    return [dict(zip(keys[a:b], values[a:b], strict=True)) for a, b in pairwise(cuts)]


class Totals:
    """The whole run, for the exit summary: bounded, so a host with a million flows
    keeps the `max_rows` costliest (flow, direction, event) rows and the
    `max_per_row` costliest functions and stacks of each."""

    def __init__(self, max_rows: int = 4096, max_per_row: int = 64) -> None:
        self.max_rows = max_rows
        self.max_per_row = max_per_row
        self.rows: dict[tuple[int, int, int], FlowStat] = {}
        self.samples = 0
        self.norm_cost = 0.0
        self.windows = 0

    def add(self, stats: Iterable[FlowStat]) -> None:
        self.windows += 1
        for s in stats:
            self.samples += s.samples
            self.norm_cost += s.norm_cost
            k = (s.flow_id, s.direction, s.event)
            cell = self.rows.get(k)
            if cell is None:
                cell = self.rows[k] = FlowStat(*k)
            cell.merge(s)
            if len(cell.functions) > 2 * self.max_per_row:
                cell.functions = dict(cell.hottest(self.max_per_row))
            if len(cell.stacks) > 2 * self.max_per_row:
                cell.stacks = dict(cell.hottest_stacks(self.max_per_row))
        if len(self.rows) > 2 * self.max_rows:
            keep = sorted(self.rows.values(), key=_order)[: self.max_rows]
            self.rows = {(s.flow_id, s.direction, s.event): s for s in keep}

    def top(self, n: int) -> list[FlowStat]:
        return sorted(self.rows.values(), key=_order)[:n]


@dataclass
class WindowInfo:
    """The state around one flush window, for the headers and the JSON objects."""

    seconds: float  # the window's length
    mode: str  # sentinel / diagnostic
    source: str  # the sample source's name
    events: Sequence[str] = ()
    samples: int = 0  # delivered by the source in the window, before target filtering
    samples_per_sec: float = 0.0
    # each event's sample scale (pipeline/scales.py): what its samples' cost is
    # multiplied by, the inverse of the share of the time it was really sampled
    scales: Mapping[str, float] = field(default_factory=dict)
    throttled: bool = False
    dropped: Mapping[str, int] = field(default_factory=dict)  # cumulative, by reason
    wall_ns: int = 0  # the window's end, wall clock

    def dropped_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.dropped.items()) if v)

    def scales_text(self) -> str:
        """`cycles x1.5 llc-misses x3`, or `1` when no event is scaled."""
        if all(v == 1 for v in self.scales.values()):
            return "1"
        return " ".join(f"{k} x{v:.3g}" for k, v in self.scales.items())


def flow_label(flow_id: int, names: Names) -> str:
    """`10.0.0.1:5201 -> 10.0.0.2:43012 tcp`, the 16-hex id when the 5-tuple is not
    known, or `(no flow)` for flow 0."""
    if flow_id == 0:
        return NO_FLOW
    key = names.flow(flow_id)
    return str(key) if key is not None else f"{flow_id:016x}"


def row_label(s: FlowStat, names: Names) -> str:
    """A row's flow as flow_label says it; `(idle)` for the samples in the kernel's
    idle code (flow 0, direction IDLE)."""
    if s.flow_id == 0 and s.direction == IDLE:
        return IDLE_LABEL
    return flow_label(s.flow_id, names)


def row_direction(s: FlowStat) -> str:
    """rx or tx; "" for a row of no flow (idle or not): it has no direction."""
    return direction_name(s.direction) if s.flow_id else ""


@dataclass
class Window:
    """One flush window, as the runtime hands it to every observer (views, and part
    2's sinks and detectors): the rollups as an array (`aggregator.ROLLUP_DTYPE`, for
    bulk sinks), their per-flow sums, and the state around them."""

    index: int
    start_ns: int  # CLOCK_MONOTONIC
    end_ns: int
    info: WindowInfo
    rows: Any  # np.ndarray of ROLLUP_DTYPE
    stats: Sequence[FlowStat]
    final: bool = False  # the last window, flushed by stop()
