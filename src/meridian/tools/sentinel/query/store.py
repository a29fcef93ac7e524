"""The questions `meridian sentinel query` asks a store (any storage.Backend, chDB or a
server): the top flows by cost in a time range, and one flow's hottest functions,
stacks and events over time.

The SQL of these is here, in `SQL` (top-services' is in services.py), and reads only
what ClickHouse 18.16 (Debian's server) and chDB both accept: no JOIN here (its syntax
and semantics differ between the two; services.py's one join is written in the one
form both take), the names are looked up with `IN (subquery)` and merged here.
Function and stack ids are interned per agent run, so they are keyed by (run_id, id)
and merged by name: the same function or stack seen by two runs is one row. Every
value put into a statement is a number checked here; user text never reaches the SQL.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ....durations import parse_duration
from ....errors import UsageError
from ..model.flows import FlowKey
from ..model.frames import UNKNOWN, Frame
from ..model.rollup import STACK_LABELS
from ..model.window import NO_FLOW, event_name
from ..sources.pmu_events import parse_event
from ..storage.backend import Backend

__all__ = [
    "SQL",
    "Bucket",
    "FlowDetail",
    "FlowRow",
    "FunctionCost",
    "StackCost",
    "flow_detail",
    "fmt_duration",
    "parse_event_code",
    "parse_flow",
    "parse_since",
    "time_step",
    "top_flows",
]

SQL = {
    "top_flows": "SELECT flow_id, sum(samples) AS n, sum(norm_cost) AS cost "
    "FROM ms_flow_rollup WHERE {where} AND flow_id != 0 "
    "GROUP BY flow_id ORDER BY cost DESC, flow_id LIMIT {limit}",
    "flow_names": "SELECT DISTINCT flow_id, src, dst, sport, dport, proto "
    "FROM ms_flows WHERE flow_id IN ({ids})",
    "functions": "SELECT run_id, function_id, sum(samples) AS n, sum(norm_cost) AS cost "
    "FROM ms_flow_rollup WHERE {where} GROUP BY run_id, function_id",
    "function_names": "SELECT DISTINCT run_id, function_id, `binary`, `function` "
    "FROM ms_functions WHERE (run_id, function_id) IN "
    "(SELECT run_id, function_id FROM ms_flow_rollup WHERE {where})",
    "stacks": "SELECT run_id, callstack_id, sum(samples) AS n, sum(norm_cost) AS cost "
    "FROM ms_flow_rollup WHERE {where} GROUP BY run_id, callstack_id",
    "stack_frames": "SELECT run_id, stack_id, binaries, functions, files, lines, offsets "
    "FROM ms_callstacks WHERE (run_id, stack_id) IN "
    "(SELECT run_id, callstack_id FROM ms_flow_rollup WHERE {where})",
    "timeline": "SELECT intDiv(time_bucket, {step}) * {step} AS t, event, "
    "sum(samples) AS n, sum(norm_cost) AS cost FROM ms_flow_rollup WHERE {where} "
    "GROUP BY t, event ORDER BY t, event",
    "last_seen": "SELECT max(time_bucket) AS last FROM ms_flow_rollup WHERE flow_id = {flow}",
}

NS = 1_000_000_000
_FLOW = re.compile(r"^(?:0x)?([0-9a-fA-F]{16})$")
# bucket widths of `flow`'s timeline, seconds: the first that gives at most MAX_BUCKETS
STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
MAX_BUCKETS = 60
NO_STACK = "[no stack]"


def parse_since(text: str | float) -> float:
    """`10m`, `1h`, `30s`, `250ms` or plain seconds -> seconds (> 0)."""
    try:
        since = parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"--since: {exc}, got {text!r}") from None
    if not since > 0:
        raise UsageError(f"--since: expected a duration above zero such as 10m, got {text!r}")
    return since


def parse_flow(text: str | int) -> int:
    """A flow id as top-flows prints it: 16 hex digits (an int passes as it is)."""
    if isinstance(text, int):
        if not 0 < text < 1 << 64:
            raise UsageError(f"flow id out of range: {text}")
        return text
    m = _FLOW.match(text.strip())
    if m is None:
        raise UsageError(
            f"FLOW: expected 16 hex digits as top-flows prints them (such as "
            f"3a5c0e9f12ab77d0), got {text!r}"
        )
    flow = int(m.group(1), 16)
    if flow == 0:
        raise UsageError("FLOW: 0000000000000000 is no flow (samples not attributed to one)")
    return flow


def parse_event_code(text: str) -> int:
    """An event name as `--events` takes it (llc-misses, cpu-clock, raw:0x1cd...) ->
    the logical event rollups are keyed by (every raw code is `raw`)."""
    try:
        return int(parse_event(text).event)
    except UsageError as exc:
        raise UsageError(f"--event: {exc}") from None


def fmt_duration(seconds: float) -> str:
    """600 -> 10m, 5400 -> 1h30m, 45 -> 45s (for messages)."""
    if seconds < 60 or seconds % 1:
        return f"{seconds:g}s"
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v)


def time_step(since_s: float) -> int:
    """The timeline's bucket width in seconds: at most MAX_BUCKETS buckets."""
    want = since_s / MAX_BUCKETS
    return next((s for s in STEPS if s >= want), 86_400)


@dataclass(frozen=True)
class FlowRow:
    """One flow and its cost; the 5-tuple is None when the store has not named it."""

    flow: str  # 16 hex digits
    src: str | None
    dst: str | None
    sport: int | None
    dport: int | None
    proto: str | None
    samples: int
    norm_cost: float

    @property
    def flow_id(self) -> int:
        return int(self.flow, 16)

    @property
    def label(self) -> str:
        """`10.0.0.1:5201 -> 10.0.0.2:43012 tcp` (FlowKey's form), else the hex id."""
        if self.flow_id == 0:
            return NO_FLOW
        if self.src is None or self.dst is None:
            return self.flow
        try:
            key = FlowKey(self.src, self.dst, self.sport or 0, self.dport or 0, self.proto or 0)
        except ValueError:
            return f"{self.src}:{self.sport} -> {self.dst}:{self.dport} {self.proto}"
        return str(key)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["norm_cost"] = round(self.norm_cost, 6)
        return out


@dataclass(frozen=True)
class FunctionCost:
    function: str  # as people read it ("[unknown] (libx.so)" when not a symbol)
    binary: str
    samples: int
    norm_cost: float


@dataclass(frozen=True)
class StackCost:
    """One distinct stack: `frames` as text, `functions` the names a flame graph
    merges by; both innermost first. A stack without frames is one label."""

    frames: tuple[str, ...]
    functions: tuple[str, ...]
    samples: int
    norm_cost: float


@dataclass(frozen=True)
class Bucket:
    time_ns: int  # the bucket's start, wall clock
    event: str
    samples: int
    norm_cost: float


@dataclass(frozen=True)
class FlowDetail:
    """`flow`: everything, highest cost first (the views cut it)."""

    flow: FlowRow
    since_s: float
    step_s: int
    functions: list[FunctionCost]
    stacks: list[StackCost]
    timeline: list[Bucket]

    def flame_stacks(self) -> list[tuple[list[str], float]]:
        """(frames root-first, norm cost) pairs for flamegraph.render."""
        return [(list(reversed(s.functions)), s.norm_cost) for s in self.stacks]


def _where(
    since_s: float, now_s: float | None, flow: int | None = None, event: int | None = None
) -> str:
    """The rollup rows of the range (`ts`: the sorting key's column), of a flow and an
    event; only numbers go in."""
    lo = int((time.time() if now_s is None else now_s) - since_s)
    where = f"ts >= toDateTime({max(0, lo)})"
    if flow is not None:
        where += f" AND flow_id = {int(flow)}"
    if event is not None:
        where += f" AND event = {int(event)}"
    return where


def _names(backend: Backend, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """flow_id -> its 5-tuple, for the flows the store has named."""
    if not ids:
        return {}
    rows = backend.query(SQL["flow_names"].format(ids=", ".join(str(int(i)) for i in ids)))
    return {int(r["flow_id"]): r for r in rows}


def _flow_row(flow_id: int, samples: int, cost: float, name: dict[str, Any] | None) -> FlowRow:
    n = name or {}
    return FlowRow(
        f"{flow_id:016x}",
        n.get("src"),
        n.get("dst"),
        None if name is None else int(n["sport"]),
        None if name is None else int(n["dport"]),
        n.get("proto"),
        int(samples),
        float(cost),
    )


def top_flows(
    backend: Backend,
    since_s: float,
    event: str | int | None = None,
    limit: int = 20,
    *,
    now_s: float | None = None,
) -> list[FlowRow]:
    """The `limit` flows with the most norm cost in the last `since_s` seconds (of one
    event when given), highest first, ties by flow id; samples on no flow are left out."""
    if not isinstance(limit, int) or limit < 1:
        raise UsageError(f"--limit: expected a whole number above zero, got {limit!r}")
    code = parse_event_code(event) if isinstance(event, str) else event
    where = _where(since_s, now_s, event=code)
    rows = backend.query(SQL["top_flows"].format(where=where, limit=limit))
    names = _names(backend, [int(r["flow_id"]) for r in rows])
    return [
        _flow_row(int(r["flow_id"]), r["n"], r["cost"], names.get(int(r["flow_id"]))) for r in rows
    ]


def _function_name(binary: str, function: str) -> str:
    """As the agent's view names it (Symbolizer.function_name)."""
    if function == UNKNOWN and binary:
        return f"{UNKNOWN} ({os.path.basename(binary) or binary})"
    return function


def _by_cost(items: dict[Any, list[float]]) -> list[tuple[Any, int, float]]:
    """(key, samples, cost), highest cost first, ties by key."""
    rows = [(k, int(v[0]), v[1]) for k, v in items.items()]
    return sorted(rows, key=lambda r: (-r[2], str(r[0])))


def _add(acc: dict[Any, list[float]], key: Any, row: dict[str, Any]) -> None:
    cell = acc.setdefault(key, [0, 0.0])
    cell[0] += int(row["n"])
    cell[1] += float(row["cost"])


def _functions(backend: Backend, where: str) -> list[FunctionCost]:
    names = {
        (int(r["run_id"]), int(r["function_id"])): (r["binary"], r["function"])
        for r in backend.query(SQL["function_names"].format(where=where))
    }
    acc: dict[tuple[str, str], list[float]] = {}
    for r in backend.query(SQL["functions"].format(where=where)):
        fid = int(r["function_id"])
        found = names.get((int(r["run_id"]), fid))
        if found is None:  # UNRESOLVED, or named by a window not stored yet
            found = ("", STACK_LABELS.get(fid, f"[function {fid} not in the store]"))
        _add(acc, found, r)
    return [FunctionCost(_function_name(b, f), b, n, c) for (b, f), n, c in _by_cost(acc)]


def _frames(row: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A stored stack's frames as text and as function names (innermost first)."""
    names = ("binaries", "functions", "files", "lines", "offsets")
    cols = zip(*(row[n] for n in names), strict=False)  # equal lengths, as written
    frames = [Frame(b, f, fi, int(li), 0, int(off)) for b, f, fi, li, off in cols]
    return (
        tuple(str(f) for f in frames),
        tuple(_function_name(f.binary, f.function) for f in frames),
    )


def _stacks(backend: Backend, where: str) -> list[StackCost]:
    stored = {
        (int(r["run_id"]), int(r["stack_id"])): _frames(r)
        for r in backend.query(SQL["stack_frames"].format(where=where))
    }
    acc: dict[tuple[tuple[str, ...], tuple[str, ...]], list[float]] = {}
    for r in backend.query(SQL["stacks"].format(where=where)):
        sid = int(r["callstack_id"])
        found = stored.get((int(r["run_id"]), sid))
        if found is None:
            label = STACK_LABELS.get(sid, NO_STACK if sid == 0 else "[stack not in the store]")
            found = ((label,), (label,))
        _add(acc, found, r)
    return [StackCost(k[0], k[1], n, c) for k, n, c in _by_cost(acc)]


def _timeline(backend: Backend, where: str, step_s: int) -> list[Bucket]:
    rows = backend.query(SQL["timeline"].format(where=where, step=step_s * NS))
    return [
        Bucket(int(r["t"]), event_name(int(r["event"])), int(r["n"]), float(r["cost"]))
        for r in rows
    ]


def flow_detail(
    backend: Backend, flow: str | int, since_s: float, *, now_s: float | None = None
) -> FlowDetail:
    """One flow in the last `since_s` seconds: its 5-tuple and totals, every function
    and stack with its cost (highest first), and samples and cost per event and time
    bucket. A flow without samples in the range is a UsageError that says when it
    was last seen, or that the store never saw it."""
    fid = parse_flow(flow)
    where = _where(since_s, now_s, flow=fid)
    timeline = _timeline(backend, where, time_step(since_s))
    if not timeline:
        rows = backend.query(SQL["last_seen"].format(flow=fid))
        last = int(rows[0]["last"] or 0) if rows else 0
        if not last:
            raise UsageError(
                f"flow {fid:016x} is not in the store (top-flows lists the flows it has)"
            )
        ago = max(0, int((time.time() if now_s is None else now_s) - last / NS))
        wider = fmt_duration(60 * (ago // 60 + 1))
        raise UsageError(
            f"flow {fid:016x} has no samples in the last {fmt_duration(since_s)}; "
            f"its last were {fmt_duration(ago)} ago (try --since {wider})"
        )
    name = _names(backend, [fid]).get(fid)
    samples = sum(b.samples for b in timeline)
    cost = sum(b.norm_cost for b in timeline)
    return FlowDetail(
        _flow_row(fid, samples, cost, name),
        since_s,
        time_step(since_s),
        _functions(backend, where),
        _stacks(backend, where),
        timeline,
    )
