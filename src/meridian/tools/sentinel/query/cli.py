"""`meridian sentinel query`: the stored rollups read back, from the embedded store or a
ClickHouse server: `top-flows`, `top-services` (flows grouped by their listening
side: services.py) and `flow FLOW` (with `--flamegraph`).

An embedded store is one process's at a time (chDB), so while an agent writes it the
query goes through that agent's API (client.py); an agent without one is said in
one line with its pid and the ways that work. Every mistake is one line on stderr
and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ....errors import EnvironmentProblem, MeridianError, UsageError
from ....flags import add_command
from ....output import fmt_scaled, print_table
from ..storage import Backend, StoreUnavailable, default_state_dir, holder_pid, open_store
from ..storage.chdb_backend import LOCK_NAME
from .client import agent_url, fetch_flow, fetch_top_flows, fetch_top_services
from .flamegraph import render
from .services import ServiceRow, top_services
from .store import (
    FlowDetail,
    FlowRow,
    flow_detail,
    fmt_duration,
    parse_event_code,
    parse_flow,
    parse_since,
    top_flows,
)

__all__ = ["EXAMPLES", "add_query_parser", "run_query"]

EXAMPLES = """examples:
  meridian sentinel query top-flows                # the costliest flows of the last 10 minutes
  meridian sentinel query top-flows --since 1h --event llc-misses --json
  meridian sentinel query top-services --since 1h  # flows grouped by server address and port
  meridian sentinel query flow 3a5c0e9f12ab77d0    # its functions, stacks, events over time
  meridian sentinel query flow 3a5c0e9f12ab77d0 --since 30m --flamegraph flow.svg
  meridian sentinel query top-flows --data-dir /var/lib/ms   # a store no agent is writing
  meridian sentinel query top-flows --clickhouse-url http://ch:8123 \\
      --clickhouse-user reader --clickhouse-password-file pw   # a server, even while written
"""
DEPTH = 12  # frames of a stack shown in text
UNNAMED = "(5-tuple not stored)"  # a flow whose name no window has stored yet


def _store_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--since",
        default="10m",
        metavar="DURATION",
        help="how far back: 30s, 10m, 2h (default 10m)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--data-dir", metavar="DIR", help="the embedded store (default: the agent's default)"
    )
    where.add_argument("--clickhouse-url", metavar="URL", help="a ClickHouse server over HTTP")
    p.add_argument("--clickhouse-user", metavar="USER", help="ClickHouse user (default: default)")
    p.add_argument(
        "--clickhouse-password-file", metavar="FILE", help="file holding the ClickHouse password"
    )
    p.add_argument(
        "--api-token-file", metavar="FILE", help="the token of the agent whose API is asked"
    )


def add_query_parser(sub: Any) -> argparse.ArgumentParser:
    """`query` with its two questions, on `sub` (the sentinel parser's subparsers);
    the parsed args carry func=run_query."""
    p = add_command(
        sub,
        "query",
        help="read the stored flows back: top flows, one flow's functions, stacks, flame graph",
        description="Query what meridian sentinel stored (--data-dir or --clickhouse-url).",
        examples=EXAMPLES,
    )
    questions = p.add_subparsers(dest="query", metavar="QUESTION")
    questions.required = True
    top = add_command(
        questions,
        "top-flows",
        help="flows by norm cost, highest first, with their 5-tuples",
        description="Flows by norm cost in the last --since, highest first.",
        examples=EXAMPLES,
    )
    _store_flags(top)
    top.add_argument("--event", metavar="E", help="only this event (llc-misses, cpu-clock, ...)")
    top.add_argument("--limit", type=int, default=20, metavar="N", help="flows shown (20)")
    services = add_command(
        questions,
        "top-services",
        help="flows grouped by service (listening address, port, protocol), by norm cost",
        description="Services by norm cost in the last --since, highest first: the flows "
        "grouped by their listening side and direction, with how many flows each has.",
        examples=EXAMPLES,
    )
    _store_flags(services)
    services.add_argument("--event", metavar="E", help="only this event (llc-misses, ...)")
    services.add_argument("--limit", type=int, default=20, metavar="N", help="rows shown (20)")
    flow = add_command(
        questions,
        "flow",
        help="one flow: hottest functions and stacks, events over time, a flame graph",
        description="One flow in the last --since: its hottest functions and stacks, and "
        "samples and cost per event over time.",
        examples=EXAMPLES,
    )
    flow.add_argument("flow", metavar="FLOW", help="flow id, 16 hex digits (see top-flows)")
    _store_flags(flow)
    flow.add_argument("--top", type=int, default=10, metavar="N", help="functions, stacks (10)")
    flow.add_argument(
        "--flamegraph", metavar="FILE", help="write its stacks as an SVG flame graph (norm cost)"
    )
    p.set_defaults(func=run_query)
    return p


def run_query(args: argparse.Namespace) -> int:
    """Run `top-flows`, `top-services` or `flow`; a MeridianError is one line on
    stderr, its exit code."""
    try:
        _run(args, sys.stdout, sys.stderr)
    except MeridianError as exc:
        print(f"meridian sentinel query: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    since = parse_since(args.since)  # every flag is checked before the store is opened
    is_flow = args.query == "flow"
    flow = parse_flow(args.flow) if is_flow else 0
    event = parse_event_code(args.event) if not is_flow and args.event else None
    count, flag = (args.top, "--top") if is_flow else (args.limit, "--limit")
    if count < 1:
        raise UsageError(f"{flag}: expected a whole number above zero, got {count}")
    url = _agent_api(args)  # an embedded store an agent holds: ask that agent
    backend = None if url else open_query_store(args)
    token = args.api_token_file
    try:
        if is_flow:
            if backend is None:
                detail = fetch_flow(str(url), token, f"{flow:016x}", args.since)
            else:
                detail = flow_detail(backend, flow, since)
            if args.flamegraph:
                _write_flamegraph(detail, args.flamegraph, err)
            (_flow_json if args.json else _flow_text)(detail, count, out)
        elif args.query == "top-services":
            if backend is None:
                services = fetch_top_services(str(url), token, args.since, args.event, count)
            else:
                services = top_services(backend, since, event, count)
            (_services_json if args.json else _services_text)(services, since, args.event, out)
        else:
            if backend is None:
                rows = fetch_top_flows(str(url), token, args.since, args.event, count)
            else:
                rows = top_flows(backend, since, event, count)
            (_top_json if args.json else _top_text)(rows, since, args.event, out)
    finally:
        if backend is not None:
            backend.close()


def _store_path(args: argparse.Namespace) -> Path:
    return Path(args.data_dir).expanduser() if args.data_dir else default_state_dir() / "store"


def _agent_api(args: argparse.Namespace) -> str | None:
    """The API of the agent holding the embedded store, None when it is free (or a
    server is asked)."""
    if args.clickhouse_url:
        return None
    path = _store_path(args)
    return agent_url(path) if holder_pid(path) is not None else None


def open_query_store(args: argparse.Namespace) -> Backend:
    """The store the flags name, opened read-only (a server's user may have readonly=1);
    one-line errors for a missing directory, a store an agent holds, a server that does
    not answer, a store no agent has written yet."""
    from ..config import ClickHouseConfig  # pydantic: only when a store is opened

    if args.clickhouse_url:
        cfg = ClickHouseConfig(
            url=args.clickhouse_url,
            user=args.clickhouse_user or "default",
            password_file=args.clickhouse_password_file,
        )
        return open_store(cfg)
    if args.clickhouse_user or args.clickhouse_password_file:
        raise UsageError(
            "--clickhouse-user and --clickhouse-password-file go with --clickhouse-url"
        )
    path = _store_path(args)
    flag = "--data-dir" if args.data_dir else "the default store"
    if not path.is_dir() or not (path / LOCK_NAME).exists():
        raise UsageError(
            f"{flag}: no sentinel store at {path} (meridian sentinel --data-dir {path} writes one)"
        )
    _refuse_held(path)
    try:
        return open_store(ClickHouseConfig(data_dir=str(path)))
    except StoreUnavailable:
        _refuse_held(path)  # taken between the look and the open
        raise


def _refuse_held(path: Path) -> None:
    pid = holder_pid(path)
    if pid is None:
        return
    who = f"pid {pid}" if pid > 0 else "a process whose pid it does not say"
    raise EnvironmentProblem(
        f"embedded store {path} is held by a running agent ({who}) and chDB opens it in one "
        "process only: run the agent with --api-port (queries then go through it), or with "
        "--clickhouse-url to query a server while it writes"
    )


def _heading(what: str, rows: list[Any], since: float, event: str | None, out: TextIO) -> bool:
    """The table's first line (`what`: flows, services), or that there is none: False."""
    events = f"event {event}" if event else "all events"
    if not rows:
        print(f"no flows with samples in the last {fmt_duration(since)} ({events})", file=out)
        return False
    print(f"top {what} by norm cost, last {fmt_duration(since)}, {events}", file=out)
    return True


def _top_text(rows: list[FlowRow], since: float, event: str | None, out: TextIO) -> None:
    if not _heading("flows", rows, since, event, out):
        return
    table = [
        [r.flow, r.label if r.src else UNNAMED, str(r.samples), fmt_scaled(r.norm_cost)]
        for r in rows
    ]
    print_table(("FLOW ID", "FLOW", "SAMPLES", "NORM COST"), table, out, numeric=(2, 3))


def _top_json(rows: list[FlowRow], since: float, event: str | None, out: TextIO) -> None:
    for r in rows:
        print(json.dumps(r.as_json()), file=out)


def _services_text(rows: list[ServiceRow], since: float, event: str | None, out: TextIO) -> None:
    if not _heading("services", rows, since, event, out):
        return
    table = [
        [r.label, r.direction, str(r.flows), str(r.samples), fmt_scaled(r.norm_cost)] for r in rows
    ]
    header = ("SERVICE", "DIR", "FLOWS", "SAMPLES", "NORM COST")
    print_table(header, table, out, numeric=(2, 3, 4))


def _services_json(rows: list[ServiceRow], since: float, event: str | None, out: TextIO) -> None:
    for r in rows:
        print(json.dumps({"service": r.label if r.addr else None, **r.as_json()}), file=out)


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _flow_text(d: FlowDetail, top: int, out: TextIO) -> None:
    f = d.flow
    print(
        f"flow {f.flow} {f.label}: {f.samples} samples, norm cost {fmt_scaled(f.norm_cost)} "
        f"in the last {fmt_duration(d.since_s)}",
        file=out,
    )
    print("\nhottest functions", file=out)
    rows = [
        [_share(x.norm_cost, f.norm_cost), str(x.samples), fmt_scaled(x.norm_cost), x.function]
        for x in d.functions[:top]
    ]
    print_table(("SHARE", "SAMPLES", "NORM COST", "FUNCTION"), rows, out, numeric=(0, 1, 2))
    print("\nhottest stacks (innermost frame first)", file=out)
    for i, s in enumerate(d.stacks[:top], 1):
        share = _share(s.norm_cost, f.norm_cost)
        print(f"  #{i} {share}, {s.samples} samples, norm cost {fmt_scaled(s.norm_cost)}", file=out)
        for frame in s.frames[:DEPTH]:
            print(f"      {frame}", file=out)
        if len(s.frames) > DEPTH:
            print(f"      ... {len(s.frames) - DEPTH} more", file=out)
    print(f"\nevents over time (every {fmt_duration(d.step_s)})", file=out)
    clock = "%H:%M:%S" if d.since_s <= 86_400 else "%m-%d %H:%M"
    rows = [
        [_clock(b.time_ns, clock), b.event, str(b.samples), fmt_scaled(b.norm_cost)]
        for b in d.timeline
    ]
    print_table(("TIME", "EVENT", "SAMPLES", "NORM COST"), rows, out, numeric=(2, 3))


def _clock(time_ns: int, fmt: str) -> str:
    return time.strftime(fmt, time.localtime(time_ns / 1e9))


def _flow_json(d: FlowDetail, top: int, out: TextIO) -> None:
    head = {"type": "flow", **d.flow.as_json(), "since_s": d.since_s, "step_s": d.step_s}
    lines: list[dict[str, Any]] = [head]
    lines += [
        {
            "type": "function",
            "function": x.function,
            "binary": x.binary,
            "samples": x.samples,
            "norm_cost": round(x.norm_cost, 6),
        }
        for x in d.functions[:top]
    ]
    lines += [
        {
            "type": "stack",
            "frames": list(s.frames),
            "samples": s.samples,
            "norm_cost": round(s.norm_cost, 6),
        }
        for s in d.stacks[:top]
    ]
    lines += [
        {
            "type": "bucket",
            "time_ns": b.time_ns,
            "event": b.event,
            "samples": b.samples,
            "norm_cost": round(b.norm_cost, 6),
        }
        for b in d.timeline
    ]
    for line in lines:
        print(json.dumps(line), file=out)


def _write_flamegraph(d: FlowDetail, path: str, err: TextIO) -> None:
    title = f"flow {d.flow.label}: norm cost, last {fmt_duration(d.since_s)}"
    svg = render(d.flame_stacks(), title=title)
    try:
        Path(path).write_text(svg, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--flamegraph: cannot write {path}: {exc.strerror or exc}") from None
    print(f"flame graph of {len(d.stacks)} stacks written to {path}", file=err)
