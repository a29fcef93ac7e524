"""What people see of `meridian sentinel`: the live table of the top services or flows
(redrawn every flush window on a terminal, like `io --top`), the summary on exit (top
services or flows with their hottest functions and stacks), and one JSON object per
flush window.

`by="service"` (run.group_by, --by: the command's default) groups the flows by their
listening side (model/services.py: `10.0.0.1:8080 tcp (412 flows)`), `by="flow"` (the
functions' default) shows one row per 5-tuple. The JSON objects carry `flows` either
way (what scripts read) and `services` beside them when grouped by service.

Everything here is a pure function of aggregator rollups and a `Names` lookup (flow
5-tuples, function names, stack frames), so it is tested without a kernel or a
runtime. The live table is drawn on meridian/screen.py's live screen.

What a person reads, not what the pipeline keys by: functions and stacks are ranked
after merging the ids that name the same thing (Names.canonical_function and
canonical_stack, when the names have them: a provisional id and the id of the
function it resolved to); stacks go by rank, never by id (the JSON's `stack_id` is
the interned id that storage knows, null for a label); rows of no flow, `(no flow)`
and `(idle)` (the CPU idling: aggregator.py), have no direction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ....output import dumps, fmt_scaled, print_table
from ....screen import Screen, frame, terminal_size
from ..model.rollup import PROVISIONAL_BASE, STACK_LABELS
from ..model.services import ServiceStat, ServiceTotals, service_lookup, service_stats
from ..model.window import (
    FlowStat,
    Names,
    Totals,
    Window,
    WindowInfo,
    direction_name,
    event_name,
    row_direction,
    row_label,
)

__all__ = [
    "JsonView",
    "LiveView",
    "render_live",
    "render_summary",
    "summary_json",
    "window_json",
]

LIVE_HEADER = ("FLOW", "DIR", "EVENT", "SAMPLES", "NORM COST", "HOTTEST FUNCTION")
BY = ("service", "flow")
BY_SERVICE = "by service: flows grouped by listening address, port, protocol (--by flow: 5-tuples)"


def _merge(names: Names, what: str) -> Callable[[int], int] | None:
    """Names.canonical_function (what="function") or canonical_stack, if it has it."""
    found: Callable[[int], int] | None = getattr(names, f"canonical_{what}", None)
    return found


def _functions(s: FlowStat, names: Names, n: int) -> list[tuple[int, float]]:
    return s.hottest(n, _merge(names, "function"))


def _stacks(s: FlowStat, names: Names, n: int) -> list[tuple[int, float]]:
    """The row's n hottest stacks. A label (stacks not read, unresolved, gone) lumps
    the samples of many stacks: it only takes the places real stacks leave, else on a
    loaded host it pushes the stacks that say where the cost was out of the top."""
    top = s.hottest_stacks(n + len(STACK_LABELS), _merge(names, "stack"))
    return sorted(top, key=lambda stack: stack[0] in STACK_LABELS)[:n]


def _stack_ref(stack_id: int) -> int | None:
    """A stack id as storage knows it; None for no stack or a label."""
    if stack_id == 0 or stack_id in STACK_LABELS or stack_id >= PROVISIONAL_BASE:
        return None
    return stack_id


def _count(n: int, what: str = "sample") -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _hottest_name(s: FlowStat, names: Names) -> str:
    top = _functions(s, names, 1)
    return names.function(top[0][0]) if top else "-"


def _flows(stats: Sequence[FlowStat]) -> int:
    """Distinct flows (no flow, idle or not, is none)."""
    return len({s.flow_id for s in stats if s.flow_id})


def _service(s: FlowStat) -> ServiceStat | None:
    """A service's row (not a row of one unnamed flow, or of no flow, in the service
    view)."""
    return s if isinstance(s, ServiceStat) and s.service is not None else None


def _label(s: FlowStat, names: Names) -> str:
    """`10.0.0.1:8080 tcp (412 flows)` for a service, else row_label's."""
    svc = _service(s)
    return f"{svc.service} ({svc.flows_text()})" if svc is not None else row_label(s, names)


def _direction(s: FlowStat) -> str:
    return direction_name(s.direction) if _service(s) is not None else row_direction(s)


def _grouped(stats: Sequence[FlowStat], names: Names, by: str) -> Sequence[FlowStat]:
    """The rows of a window as `by` says: per service, or the flows as they are."""
    if by not in BY:
        raise ValueError(f"by must be one of {BY}, got {by!r}")
    return service_stats(stats, service_lookup(names)) if by == "service" else stats


def _services(rows: Sequence[FlowStat]) -> int:
    """Distinct services among the rows."""
    return len({svc.service for s in rows if (svc := _service(s)) is not None})


def _cells(s: FlowStat, names: Names) -> list[str]:
    return [
        _label(s, names),
        _direction(s),
        event_name(s.event),
        str(s.samples),
        fmt_scaled(s.norm_cost),
        _hottest_name(s, names),
    ]


def _header(by: str, header: tuple[str, ...] = LIVE_HEADER) -> tuple[str, ...]:
    return ("SERVICE", *header[1:]) if by == "service" else header


def _widths(rows: list[list[str]], cols: int, header: Sequence[str] = LIVE_HEADER) -> list[int]:
    """Column widths: the flow column as wide as its longest 5-tuple (capped), the
    function column takes what is left of the terminal."""
    w = [len(h) for h in header]
    for r in rows:
        w = [max(a, len(c)) for a, c in zip(w, r, strict=True)]
    w[0] = min(w[0], 56)
    w[5] = max(len(LIVE_HEADER[5]), cols - sum(w[:5]) - 5)
    return w


def _line(cells: Sequence[str], w: Sequence[int]) -> str:
    flow = cells[0] if len(cells[0]) <= w[0] else cells[0][: w[0] - 1] + "…"
    parts = [flow.ljust(w[0]), cells[1].ljust(w[1]), cells[2].ljust(w[2])]
    parts += [cells[3].rjust(w[3]), cells[4].rjust(w[4]), cells[5][: w[5]]]
    return " ".join(parts).rstrip()


def render_live(
    stats: Sequence[FlowStat],
    info: WindowInfo,
    names: Names,
    size: tuple[int, int] = (120, 40),
    clock: str | None = None,
    by: str = "flow",
) -> str:
    """One frame of the live table, with ANSI codes, cut to the terminal's size."""
    cols, lines = size
    now = clock if clock is not None else time.strftime("%H:%M:%S")
    flows = _flows(stats)
    grouped = _grouped(stats, names, by)
    services = _services(grouped)
    dropped = info.dropped_text()
    head = [
        f"meridian sentinel  {now}  {info.mode} mode  every {info.seconds:.1f}s  "
        f"source: {info.source}",
        f"samples/s {info.samples_per_sec:.0f}  scale {info.scales_text()}  flows {flows}"
        + (f"  services {services}" if by == "service" else "")
        + (f"  events {','.join(info.events)}" if info.events else "")
        + ("  THROTTLED" if info.throttled else "")
        + (f"  dropped: {dropped}" if dropped else ""),
        "",
    ]
    rows = [_cells(s, names) for s in grouped[: max(0, lines - len(head) - 2)]]
    header = _header(by)
    w = _widths(rows, cols, header)
    body = [_line(header, w)] + [_line(r, w) for r in rows]
    if not rows:
        body.append("(no samples in this window)")
    return frame(head + body, cols)


def _flow_fields(s: FlowStat, names: Names) -> dict[str, Any]:
    """The flow's id (16 hex digits; null for no flow) and 5-tuple; the label of a
    row of no flow."""
    if not s.flow_id:
        return {"flow": None, "label": row_label(s, names)}
    out: dict[str, Any] = {"flow": f"{s.flow_id:016x}"}
    key = names.flow(s.flow_id)
    if key is not None:
        out.update(src=key.src, dst=key.dst, sport=key.sport, dport=key.dport, proto=str(key.proto))
        out["label"] = str(key)
    return out


def _service_fields(s: FlowStat, names: Names) -> dict[str, Any]:
    """A service row's service and flow count; for a row of one unnamed flow (or of
    no flow) in the service view, service null and the flow's fields."""
    svc = _service(s)
    if svc is None or svc.service is None:
        return {"service": None, **_flow_fields(s, names)}
    k = svc.service
    out = {"service": str(k), "addr": k.addr, "port": k.port, "proto": k.proto}
    return {**out, "flows": svc.flows, "more_flows": svc.more_flows}


def _row_json(s: FlowStat, names: Names, stacks: int = 0) -> dict[str, Any]:
    out = _service_fields(s, names) if isinstance(s, ServiceStat) else _flow_fields(s, names)
    out.update(
        direction=_direction(s) or None,
        event=event_name(s.event),
        samples=s.samples,
        norm_cost=round(s.norm_cost, 6),
        functions=[
            {"function": names.function(f), "norm_cost": round(c, 6)}
            for f, c in _functions(s, names, 3)
        ],
    )
    if stacks:
        out["stacks"] = [
            {
                "rank": rank,
                "stack_id": _stack_ref(sid),
                "norm_cost": round(c, 6),
                "frames": names.stack(sid),
            }
            for rank, (sid, c) in enumerate(_stacks(s, names, stacks), 1)
        ]
    return out


def window_json(
    index: int,
    stats: Sequence[FlowStat],
    info: WindowInfo,
    names: Names,
    top: int = 50,
    by: str = "flow",
) -> dict[str, Any]:
    """The `--json` object of one flush window: its state and its top flows (and
    services, by="service")."""
    out = {
        "type": "window",
        "window": index,
        "wall_ns": info.wall_ns,
        "seconds": round(info.seconds, 6),
        "mode": info.mode,
        "source": info.source,
        "events": list(info.events),
        "samples": info.samples,
        "samples_per_sec": round(info.samples_per_sec, 3),
        "scales": dict(info.scales),
        "throttled": info.throttled,
        "dropped": dict(info.dropped),
        "flows_total": _flows(stats),
        "flows": [_row_json(s, names) for s in stats[:top]],
    }
    if by == "service":
        services = _grouped(stats, names, by)
        out["services_total"] = _services(services)
        out["services"] = [_row_json(s, names) for s in services[:top]]
    return out


def summary_json(
    totals: Totals,
    seconds: float,
    info: WindowInfo,
    names: Names,
    top: int = 20,
    services: ServiceTotals | None = None,
) -> dict[str, Any]:
    """The `--json` object on exit: the whole run's top flows with stacks (and top
    services, when given)."""
    out = {
        "type": "summary",
        "seconds": round(seconds, 6),
        "windows": totals.windows,
        "source": info.source,
        "mode": info.mode,
        "samples": totals.samples,
        "norm_cost": round(totals.norm_cost, 6),
        "dropped": dict(info.dropped),
        "flows": [_row_json(s, names, stacks=3) for s in totals.top(top)],
    }
    if services is not None:
        out["services"] = [_row_json(s, names, stacks=3) for s in services.top(top)]
    return out


SUMMARY_HEADER = ("FLOW", "DIR", "EVENT", "SAMPLES", "NORM COST", "SHARE", "HOTTEST FUNCTION")


def render_summary(
    totals: Totals,
    seconds: float,
    info: WindowInfo,
    names: Names,
    out: TextIO,
    top: int = 20,
    detailed: int = 3,
    functions: int = 3,
    stacks: int = 2,
    depth: int = 8,
    services: ServiceTotals | None = None,
) -> None:
    """The exit summary as text: a table of the `top` services (when `services` is
    given) or flows, then the `detailed` costliest ones with their hottest functions
    and stacks (leaf first, `depth` frames)."""
    rows: Sequence[FlowStat] = totals.top(top) if services is None else services.top(top)
    print(
        f"\nmeridian sentinel: {_count(totals.samples)} in {seconds:.1f}s "
        f"({_count(totals.windows, 'window')}), source: {info.source}, "
        f"last mode: {info.mode}",
        file=out,
    )
    if services is not None:
        print(BY_SERVICE, file=out)
    if not rows:
        print("no samples attributed (no traffic, or every sample was filtered)", file=out)
    else:
        total = totals.norm_cost or 1.0
        table = [
            [*cells[:5], f"{100 * s.norm_cost / total:.1f}%", cells[5]]
            for s in rows
            for cells in [_cells(s, names)]
        ]
        print(file=out)
        header = _header("flow" if services is None else "service", SUMMARY_HEADER)
        print_table(header, table, out, numeric=(3, 4, 5))
        for s in rows[:detailed]:
            _detail(s, names, out, functions, stacks, depth)
    dropped = info.dropped_text()
    if dropped:
        print(f"dropped: {dropped}", file=out)


def _detail(
    s: FlowStat, names: Names, out: TextIO, functions: int, stacks: int, depth: int
) -> None:
    """One row of the summary in detail: its hottest functions, and its hottest stacks
    by rank."""
    head = " ".join(x for x in (_label(s, names), _direction(s), event_name(s.event)) if x)
    print(
        f"\n{head}: {_count(s.samples)}, norm cost {fmt_scaled(s.norm_cost)}",
        file=out,
    )
    for f, c in _functions(s, names, functions):
        share = 100 * c / s.norm_cost if s.norm_cost else 0.0
        print(f"  {share:5.1f}%  {names.function(f)}", file=out)
    for rank, (sid, c) in enumerate(_stacks(s, names, stacks), 1):
        frames = names.stack(sid)
        if not frames:
            continue
        share = 100 * c / s.norm_cost if s.norm_cost else 0.0
        print(f"  stack #{rank} ({share:.1f}%):", file=out)
        for line in frames[:depth]:
            print(f"      {line}", file=out)
        if len(frames) > depth:
            print(f"      ... {len(frames) - depth} more", file=out)


class LiveView:
    """The live table on a terminal: alternate screen, redrawn every window."""

    def __init__(
        self,
        out: TextIO,
        names: Names,
        size: Callable[[], tuple[int, int]] = terminal_size,
        by: str = "flow",
    ) -> None:
        self.screen = Screen(out, size)
        self.names = names
        self.by = by

    def start(self) -> None:
        self.screen.enter()

    def on_window(self, window: Window) -> None:
        if not self.screen.entered or window.final:
            return
        size = self.screen.size()
        self.screen.draw(render_live(window.stats, window.info, self.names, size, by=self.by))

    def close(self) -> None:
        self.screen.leave()


class JsonView:
    """`--json`: one object per flush window, one line each."""

    def __init__(self, out: TextIO, names: Names, top: int = 50, by: str = "flow") -> None:
        self.out = out
        self.names = names
        self.top = top
        self.by = by

    def on_window(self, window: Window) -> None:
        obj = window_json(window.index, window.stats, window.info, self.names, self.top, self.by)
        if window.final:
            obj["final"] = True
        self.out.write(dumps(obj) + "\n")
        self.out.flush()

    def close(self) -> None:
        pass
