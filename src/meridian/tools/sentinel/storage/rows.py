"""What the agent stores, as JSONEachRow lines: rollups, raw samples (with their LBR),
call stacks, data objects, and the names of flows and functions.

Lines are built column-wise with one %-template per table (no json.dumps per number),
and grouped by the day of their time, so a batch never spans two partitions. A line
here lacks its opening `{"batch_id":N,`: the batcher adds it when it forms a batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # types only: storage needs neither module to run
    from ..model.dataobjects import DataObject
    from ..model.frames import Frame
    from ..model.rollup import Rollup

__all__ = [
    "Chunk",
    "data_object_lines",
    "flow_lines",
    "function_lines",
    "raw_lines",
    "rollup_lines",
    "stack_lines",
]

Array = np.ndarray[Any, Any]
DAY_NS = 86_400 * 1_000_000_000
# (epoch day of the rows, 0 for tables without time; the lines)
Chunk = tuple[int, list[str]]

ROLLUP_FIELDS = (
    "time_bucket",
    "flow_id",
    "function_id",
    "callstack_id",
    "data_object_id",
    "event",
    "numa_node",
    "direction",
    "interference_class",
    "samples",
    "norm_cost",
    "pid",
)
# raw columns taken as they are from a sample record (sample_dtype), in line order
RAW_FIELDS = (
    "flow_id",
    "flow_source",
    "cpu",
    "pid",
    "tid",
    "cgroup_id",
    "ifindex",
    "ip",
    "data_addr",
    "user_stack_id",
    "kernel_stack_id",
    "event",
    "raw_code",
    "numa_node",
    "direction",
    "gso_segs",
)


def _tail(run_id: int, host: str) -> str:
    return f',"run_id":{int(run_id)},"host":{json.dumps(host)}}}'


def _finite(x: Array) -> Array:
    return np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)


def _by_day(days: Array, lines: list[str]) -> list[Chunk]:
    """Lines grouped by day, in their order within a day."""
    if len(lines) == 0:
        return []
    first = int(days[0])
    if (days == days[0]).all():
        return [(first, lines)]
    out: list[Chunk] = []
    for day in np.unique(days).tolist():
        idx = np.flatnonzero(days == day).tolist()
        out.append((int(day), [lines[i] for i in idx]))
    return out


def _uint_list(values: Iterable[int]) -> str:
    return "[" + ",".join(str(int(v)) for v in values) + "]"


def rollup_lines(rollups: Sequence[Rollup] | Array, run_id: int, host: str) -> list[Chunk]:
    """Rollups (aggregator.Rollup objects, or a ROLLUP_DTYPE array from flush_array)."""
    if isinstance(rollups, np.ndarray):
        cols: dict[str, Array] = {f: rollups[f] for f in ROLLUP_FIELDS}
    else:
        cols = {
            f: np.array([getattr(r, f) for r in rollups], dtype=np.float64)
            if f == "norm_cost"
            else np.array([int(getattr(r, f)) for r in rollups], dtype=np.uint64)
            for f in ROLLUP_FIELDS
        }
    n = len(cols["flow_id"])
    if n == 0:
        return []
    cols["norm_cost"] = _finite(cols["norm_cost"])
    template = ",".join(
        f'"{f}":%r' if f == "norm_cost" else f'"{f}":%d' for f in ROLLUP_FIELDS
    ) + _tail(run_id, host)
    lists = [cols[f].tolist() for f in ROLLUP_FIELDS]
    lines = [template % row for row in zip(*lists, strict=True)]
    days = np.asarray(cols["time_bucket"]).astype(np.uint64) // np.uint64(DAY_NS)
    return _by_day(days, lines)


def _lbr_index(lbr: Array | None) -> dict[tuple[int, int], tuple[str, str]]:
    """(cpu, kernel time) -> the JSON arrays of branch sources and targets."""
    if lbr is None or len(lbr) == 0:
        return {}
    out: dict[tuple[int, int], tuple[str, str]] = {}
    nr = np.minimum(lbr["nr"], lbr["entries"].shape[1]).tolist()
    froms, tos = lbr["entries"]["from"], lbr["entries"]["to"]
    for i, (cpu, t) in enumerate(zip(lbr["cpu"].tolist(), lbr["time_ns"].tolist(), strict=True)):
        k = nr[i]
        out[(cpu, t)] = (_uint_list(froms[i, :k].tolist()), _uint_list(tos[i, :k].tolist()))
    return out


def raw_lines(
    samples: Array,
    run_id: int,
    host: str,
    *,
    lbr: Array | None = None,
    scale: float | Array = 1.0,
    wall_ns: Array | None = None,
    callstack_ids: Array | None = None,
) -> list[Chunk]:
    """Raw samples (sample_dtype). `lbr` (lbr_dtype) records join their sample by
    (cpu, time_ns); `wall_ns` is each sample's wall-clock time (ClockCalibrator.to_wall),
    else the sample's own time is stored as it is; norm_cost = scale / gso_segs, as in
    the rollups (`scale`: one for all, or each sample's, its event's)."""
    n = len(samples)
    if n == 0:
        return []
    names = samples.dtype.names or ()

    def col(name: str) -> Array:
        return samples[name] if name in names else np.zeros(n, dtype=np.uint64)

    ktime = col("time_ns").astype(np.uint64)
    wall = ktime if wall_ns is None else np.asarray(wall_ns).astype(np.uint64)
    gso = np.maximum(col("gso_segs"), 1).astype(np.float64)
    cost = _finite(np.asarray(scale, dtype=np.float64) / gso)
    stacks = np.zeros(n, dtype=np.uint64) if callstack_ids is None else callstack_ids
    head = ",".join(f'"{f}":%d' for f in ("time_ns", "ktime_ns", *RAW_FIELDS, "callstack_id"))
    template = head + ',"norm_cost":%r,"lbr_from":%s,"lbr_to":%s' + _tail(run_id, host)
    lists: list[list[Any]] = [wall.tolist(), ktime.tolist()]
    lists += [col(f).tolist() for f in RAW_FIELDS]
    lists += [np.asarray(stacks).tolist(), cost.tolist()]
    index = _lbr_index(lbr)
    empty = ("[]", "[]")
    if index:
        keys = zip(col("cpu").tolist(), ktime.tolist(), strict=True)
        branches = [index.get(k, empty) for k in keys]
    else:
        branches = [empty] * n
    lines = [
        template % (*row, b[0], b[1])
        for row, b in zip(zip(*lists, strict=True), branches, strict=True)
    ]
    return _by_day(wall // np.uint64(DAY_NS), lines)


def stack_lines(
    stacks: Sequence[tuple[int, Sequence[Frame]]], run_id: int, host: str, seen_ns: int
) -> list[Chunk]:
    """(stack_id, frames innermost first) pairs, as Symbolizer.consume_stacks gives."""
    tail = _tail(run_id, host)
    lines = []
    for stack_id, frames in stacks:
        fields = {
            "stack_id": int(stack_id),
            "binaries": [f.binary for f in frames],
            "functions": [f.function for f in frames],
            "files": [f.file for f in frames],
            "lines": [max(0, int(f.line)) for f in frames],
            "offsets": [max(0, int(f.offset)) for f in frames],
            "addrs": [int(f.addr) & 0xFFFFFFFFFFFFFFFF for f in frames],
            "seen_ns": int(seen_ns),
        }
        lines.append(json.dumps(fields, separators=(",", ":"))[1:-1] + tail)
    return [(0, lines)] if lines else []


def data_object_lines(
    objects: Sequence[DataObject], run_id: int, host: str, seen_ns: int
) -> list[Chunk]:
    """Registered data objects (Symbolizer.consume_data_objects)."""
    tail = _tail(run_id, host)
    lines = []
    for o in objects:
        fields = {
            "object_id": int(o.object_id),
            "pid": int(o.pid),
            "address": int(o.address),
            "size": int(o.size or 0),
            "name": str(o.name),
            "type": str(o.type or ""),
            "seen_ns": int(seen_ns),
        }
        lines.append(json.dumps(fields, separators=(",", ":"))[1:-1] + tail)
    return [(0, lines)] if lines else []


def flow_lines(
    flows: Sequence[tuple[int, str, str, int, int, str]], run_id: int, host: str, seen_ns: int
) -> list[Chunk]:
    """(flow_id, src, dst, sport, dport, proto) of flows named for the first time."""
    tail = _tail(run_id, host)
    lines = []
    for flow_id, src, dst, sport, dport, proto in flows:
        fields = {
            "flow_id": int(flow_id),
            "src": str(src),
            "dst": str(dst),
            "sport": int(sport),
            "dport": int(dport),
            "proto": str(proto),
            "seen_ns": int(seen_ns),
        }
        lines.append(json.dumps(fields, separators=(",", ":"))[1:-1] + tail)
    return [(0, lines)] if lines else []


def function_lines(
    functions: Sequence[tuple[int, str, str]], run_id: int, host: str, seen_ns: int
) -> list[Chunk]:
    """(function_id, binary, function) of functions named for the first time."""
    tail = _tail(run_id, host)
    lines = [
        json.dumps(
            {"function_id": int(fid), "binary": str(b), "function": str(f), "seen_ns": seen_ns},
            separators=(",", ":"),
        )[1:-1]
        + tail
        for fid, b, f in functions
    ]
    return [(0, lines)] if lines else []
