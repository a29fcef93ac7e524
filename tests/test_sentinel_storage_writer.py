"""storage/writer.py and storage/report.py without a store: what StoreWriter hands the
sink and in which order (names before the rollups that refer to them, each name once,
a provisional function asked again until it has one), its metrics, and the Reporter's
once-a-minute lines."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_sentinel_modes import Clock

from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.rollup import UNRESOLVED
from meridian.tools.sentinel.storage import writer as writer_mod
from meridian.tools.sentinel.storage.report import Reporter
from meridian.tools.sentinel.storage.writer import StoreWriter


class FakeSink:
    """Every call kept, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kw: Any) -> None:
            self.calls.append((name, (args, kw) if kw else args[0] if args else None))

        return call

    def stats(self) -> Any:
        return SimpleNamespace(
            flush_errors=1, dropped_rows=2, rows_by_table={"b": 4, "a": 3}, backlog_rows=5,
            spooled_rows=6, connected=True,
        )  # fmt: skip


class FakeSymbols:
    def __init__(self) -> None:
        self.names: dict[int, tuple[str, str]] = {10: ("/bin/x", "main")}
        self.asked: list[int] = []

    def consume_stacks(self) -> list[str]:
        return ["stacks"]

    def consume_data_objects(self) -> list[str]:
        return ["objects"]

    def function_key(self, function_id: int) -> tuple[str, str] | None:
        self.asked.append(function_id)
        return self.names.get(function_id)


FLOWS = {1: FlowKey("10.0.0.1", "10.0.0.2", 40000, 80, "tcp")}


def window(flows: list[int], functions: list[int]) -> Any:
    rows = {"flow_id": np.array(flows, dtype=np.uint64)}
    rows["function_id"] = np.array(functions, dtype=np.uint64)
    return SimpleNamespace(rows=rows)


def test_a_window_writes_its_new_names_then_stacks_objects_rollups() -> None:
    """Flow 0 and a flow not named yet are not written (the latter is, once named);
    UNRESOLVED is never asked; a provisional function (no name yet) is asked again each
    window, in it or not, and written once it has one; a name is written once."""
    sink, symbols, names = FakeSink(), FakeSymbols(), dict(FLOWS)
    asked: list[int] = []

    def flow_name(flow_id: int) -> FlowKey | None:
        asked.append(flow_id)
        return names.get(
            flow_id, FlowKey("0.0.0.0", "0.0.0.0", 0, 0, "tcp") if not flow_id else None
        )

    w = StoreWriter(sink, symbols, flow_name)  # type: ignore[arg-type]
    first = window([0, 1, 2, 1], [10, UNRESOLVED, 11])
    w.on_window(first)
    assert [c[0] for c in sink.calls] == [
        "write_flows", "write_functions", "write_stacks", "write_data_objects",
        "write_rollups", "commit",
    ]  # fmt: skip
    assert sink.calls[0][1] == [(1, "10.0.0.1", "10.0.0.2", 40000, 80, "tcp")]
    assert sink.calls[1][1] == [(10, "/bin/x", "main")]
    assert sink.calls[2][1] == ["stacks"] and sink.calls[3][1] == ["objects"]
    assert sink.calls[4][1] is first.rows
    assert symbols.asked == [10, 11] and asked == [1, 2]  # flow 0 is no flow: not asked
    sink.calls.clear()
    symbols.asked.clear()
    names[2] = FlowKey("10.0.0.3", "10.0.0.4", 1, 2, "udp")
    symbols.names[11] = ("/bin/y", "f")
    w.on_window(window([1, 2], [10]))  # 11 not in this window's rows
    assert sink.calls[0] == ("write_flows", [(2, "10.0.0.3", "10.0.0.4", 1, 2, "udp")])
    assert sink.calls[1] == ("write_functions", [(11, "/bin/y", "f")])
    assert symbols.asked == [11]
    sink.calls.clear()
    w.on_window(window([1, 2], [10, 11]))
    assert [c[0] for c in sink.calls][:1] == ["write_stacks"]  # nothing new to name


def test_names_past_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_UNNAMED provisional ids the rest are not kept to ask again; past
    MAX_NAMED the written ids are forgotten and written again."""
    monkeypatch.setattr(writer_mod, "MAX_UNNAMED", 2)
    monkeypatch.setattr(writer_mod, "MAX_NAMED", 2)
    sink, symbols = FakeSink(), FakeSymbols()
    w = StoreWriter(sink, symbols, FLOWS.get)  # type: ignore[arg-type]
    w.on_window(window([], [21, 22, 23]))
    assert symbols.asked == [21, 22, 23]
    symbols.asked.clear()
    w.on_window(window([], []))
    assert symbols.asked == [21, 22]  # 23 was past the bound
    symbols.names.update({30: ("b", "f"), 31: ("b", "g"), 32: ("b", "h")})
    w.on_window(window([], [30, 31]))  # two written: MAX_NAMED, kept
    sink.calls.clear()
    w.on_window(window([], [30]))
    assert not [c for c in sink.calls if c[0] == "write_functions"]
    w.on_window(window([], [32]))  # a third: past MAX_NAMED, all forgotten
    sink.calls.clear()
    w.on_window(window([], [30]))
    assert ("write_functions", [(30, "b", "f")]) in sink.calls


def test_raw_samples_only_when_on_and_close() -> None:
    batch = SimpleNamespace(samples="s", lbr="l", scale=2.0, wall_ns="w")
    sink = FakeSink()
    StoreWriter(sink, FakeSymbols(), FLOWS.get).on_samples(batch)  # type: ignore[arg-type]
    assert sink.calls == []
    w = StoreWriter(sink, FakeSymbols(), FLOWS.get, raw_samples=True)  # type: ignore[arg-type]
    w.on_samples(batch)
    w.close()
    assert sink.calls == [
        ("write_raw", (("s",), {"lbr": "l", "scale": 2.0, "wall_ns": "w"})),
        ("close", None),
    ]


def test_the_store_s_metrics() -> None:
    w = StoreWriter(FakeSink(), FakeSymbols(), FLOWS.get)  # type: ignore[arg-type]
    got = {
        f.name: (f.kind, f.unit, f.description, [(p.attrs, p.value) for p in f.points])  # type: ignore[union-attr]
        for f in w.families()
    }
    one: list[tuple[dict[str, str], int]] = [({}, 1)]
    assert got == {
        "ms_clickhouse_flush_errors": (
            "counter", "", "inserts that failed (each retried or spooled)", one
        ),
        "ms_clickhouse_dropped_rows": (
            "counter", "", "rows lost: past the spool limit, or not convertible", [({}, 2)]
        ),
        "ms_clickhouse_rows_written": (
            "counter", "", "rows stored, by table", [({"table": "a"}, 3), ({"table": "b"}, 4)]
        ),
        "ms_clickhouse_backlog_rows": (
            "gauge", "", "rows not stored yet (memory and spool)", [({}, 5)]
        ),
        "ms_clickhouse_spooled_rows": (
            "gauge", "", "rows on disk in the spool, not stored yet", [({}, 6)]
        ),
        "ms_clickhouse_connected": ("gauge", "", "1 while the store answers", one),
    }  # fmt: skip


def test_the_reporter_says_each_kind_once_a_minute_with_the_count_between() -> None:
    err, clock = io.StringIO(), Clock()
    r = Reporter(err, clock=clock)
    assert r.say("down", "the store is down")
    clock.now += 59
    assert not r.say("down", "the store is down")
    assert not r.say("down", "the store is down")
    assert r.say("full", "the spool is full")  # another kind: its own minute
    clock.now += 1  # exactly a minute after the first
    assert r.say("down", "still down")
    assert (
        err.getvalue().splitlines()
        == r.lines
        == [
            "meridian sentinel: storage: the store is down",
            "meridian sentinel: storage: the spool is full",
            "meridian sentinel: storage: still down (2 more since the last report)",
        ]
    )
    clock.now += 60
    assert r.say("down", "down again")
    assert r.lines[-1] == "meridian sentinel: storage: down again"  # none between


def test_the_reporter_keeps_100_lines_and_survives_a_closed_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = io.StringIO()
    r = Reporter(err, interval=0.0, prefix="")
    for i in range(105):
        r.say("k", str(i))
    assert r.lines == [str(i) for i in range(5, 105)]
    err.close()
    assert r.say("k", "after")  # said, nowhere to print it

    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    assert Reporter(Broken(), interval=0.0).say("k", "a pipe closed")

    class Flushed(io.StringIO):
        flushes = 0

        def flush(self) -> None:
            self.flushes += 1

    out = Flushed()
    Reporter(out, interval=0.0).say("k", "now")
    assert out.flushes >= 1 and out.getvalue() == "meridian sentinel: storage: now\n"
    Reporter(interval=0.0, prefix="p: ").say("k", "to stderr")
    assert capsys.readouterr().err == "p: to stderr\n"
