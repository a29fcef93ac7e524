"""The pieces of a latency tool's exported series: a histogram point from a cell, and
the process attributes of a per-process key."""

from __future__ import annotations

from ..export import HistPoint
from ..hist import Cell

__all__ = ["Attrs", "hist_point", "process_attrs"]

Attrs = dict[str, str | int | bool]


def hist_point(attrs: Attrs, cell: Cell, unit_ns: int) -> HistPoint:
    """The cell as an exported histogram in seconds (its log2 slots: the exporters' `le`
    buckets), with its exact sum and max."""
    slots = cell.hist("", unit_ns).slots
    low = cell.min_ns / 1e9 if cell.min_ns else None
    return HistPoint(attrs, slots, unit_ns * 1e-9, cell.sum_ns / 1e9, cell.max_ns / 1e9, low)


def process_attrs(pid: int, comm: str) -> Attrs:
    """The conventions' process attributes (a -P histogram's key)."""
    return {"process.pid": pid, "process.executable.name": comm}
