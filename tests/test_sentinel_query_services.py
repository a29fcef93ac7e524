"""`meridian sentinel query top-services`: a store filled through the agent's own writer
(BatchingSink) with 100 short connections to one server (each flow and its reply a
sample or three), another service, a flow the store never named and samples on no
flow, by two agent runs that both named the connections (so ms_flows has each twice).
The store's answer is one row per service and direction whose samples are the sum of
its flows', the same as the agent's own grouping of the same rollups; on chDB and on
Debian's clickhouse-server (18.16), through the command line as text and --json."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clickhouse_server import PASSWORD, ClickHouseServer, running_server
from conftest import pin_query_clock

from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.records import RX, TX
from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE, Rollup
from meridian.tools.sentinel.model.services import server_side, service_stats
from meridian.tools.sentinel.model.window import flow_stats
from meridian.tools.sentinel.query.cli import add_query_parser, run_query
from meridian.tools.sentinel.query.services import UNNAMED, top_services
from meridian.tools.sentinel.storage import Backend, BatchingSink, ChdbBackend, HttpBackend

CPU, LLC = 6, 2  # events cpu-clock, llc-misses
T = int(time.time()) // 10 * 10


@pytest.fixture(autouse=True)
def now_is_t(monkeypatch: pytest.MonkeyPatch) -> None:
    pin_query_clock(monkeypatch, T + 5)


KEYS = [FlowKey("10.0.0.2", "10.0.0.1", 40000 + i, 8080, "tcp") for i in range(100)]
REPLIES = [k.reversed() for k in KEYS]
OTHER = FlowKey("10.0.0.2", "10.0.0.3", 40500, 5201, "tcp")
NEVER_NAMED = 0x1234567890ABCDEF

# (time s, flow, direction, event, samples, cost)
ROWS = [(T - 30, k.flow_id, RX, CPU, i % 3 + 1, (i % 3 + 1) * 0.5) for i, k in enumerate(KEYS)]
ROWS += [(T - 20, k.flow_id, TX, CPU, 1, 0.5) for k in REPLIES]
ROWS += [
    (T - 10, KEYS[0].flow_id, RX, LLC, 5, 10.0),
    (T - 20, OTHER.flow_id, RX, CPU, 50, 25.0),
    (T - 20, NEVER_NAMED, RX, CPU, 7, 3.5),
    (T - 20, 0, RX, CPU, 9, 4.5),  # no flow: never listed
    (T - 7200, KEYS[1].flow_id, RX, CPU, 1000, 1000.0),  # 2 h ago
]
RUN_NAMES = {1: KEYS + REPLIES + [OTHER], 2: KEYS}  # run 2 names the connections again

# (service, direction, flows, samples, cost) of the last 10 minutes
SVC = "10.0.0.1:8080 tcp"
TOP_10M = [
    (SVC, "rx", 100, 199 + 5, 99.5 + 10.0),
    (SVC, "tx", 100, 100, 50.0),
    ("10.0.0.3:5201 tcp", "rx", 1, 50, 25.0),
    (UNNAMED, "rx", 1, 7, 3.5),
]


def fill(make_backend: Callable[[], Backend], spool: Path) -> None:
    for run_id, keys in RUN_NAMES.items():
        sink = BatchingSink(make_backend(), spool_dir=str(spool / str(run_id)), run_id=run_id)
        try:
            sink.write_flows([(k.flow_id, k.src, k.dst, k.sport, k.dport, "tcp") for k in keys])
            if run_id == 1:
                rows = np.zeros(len(ROWS), dtype=ROLLUP_DTYPE)
                names = ("time_bucket", "flow_id", "direction", "event", "samples", "norm_cost")
                for name, col in zip(names, zip(*ROWS, strict=True), strict=True):
                    rows[name] = col
                rows["time_bucket"] *= 10**9
                sink.write_rollups(rows)
            assert sink.flush(timeout=60), sink.stats()
            assert sink.stats().dropped_rows == 0
        finally:
            sink.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("chdb", reason="chDB is not installed (pip install chdb)")
    root = tmp_path_factory.mktemp("services")
    fill(lambda: ChdbBackend(root / "store"), root / "spool")
    return root / "store"


def got(rows: list[Any]) -> list[tuple[str, str, int, int, float]]:
    return [(r.label, r.direction, r.flows, r.samples, r.norm_cost) for r in rows]


def check(backend: Backend) -> None:
    assert got(top_services(backend, 600)) == TOP_10M
    assert got(top_services(backend, 600, limit=1)) == TOP_10M[:1]
    assert got(top_services(backend, 600, event="llc-misses")) == [(SVC, "rx", 1, 5, 10.0)]
    assert got(top_services(backend, 3 * 3600))[0] == (SVC, "rx", 100, 1204, 1109.5)
    assert top_services(backend, 600, event="hitm") == []


def test_top_services_exact_on_chdb(store: Path) -> None:
    db = ChdbBackend(store)
    db.open()
    try:
        check(db)
        (row, *_) = top_services(db, 600)
        assert row.as_json() == {
            "addr": "10.0.0.1", "port": 8080, "proto": "tcp", "direction": "rx",
            "flows": 100, "samples": 204, "norm_cost": 109.5,
        }  # fmt: skip
    finally:
        db.close()


def test_the_same_sums_as_the_agents_grouping() -> None:
    """The agent's grouping (model/services.py) of the same rollups of the last 10
    minutes: the same rows, the same sums."""
    names = {k.flow_id: k for k in RUN_NAMES[1]}
    rollups = [
        Rollup(f, 0, 0, 0, e, 0, d, 0, t, n, c, 0) for t, f, d, e, n, c in ROWS if t > T - 600
    ]
    rows = service_stats(
        flow_stats(rollups), lambda f: server_side(names[f]) if f in names else None
    )
    # the agent keeps the event apart, top-services sums the events (--event: one)
    mine: dict[tuple[str, str], tuple[set[int], int, float]] = {}
    for s in rows:
        if s.service is not None:
            k = (str(s.service), "rx" if s.direction == RX else "tx")
            ids, n, c = mine.get(k, (set(), 0, 0.0))
            mine[k] = (ids | s.flow_ids, n + s.samples, c + s.norm_cost)
    ranked = sorted(mine.items(), key=lambda kv: -kv[1][2])
    assert [(*k, len(v[0]), v[1], v[2]) for k, v in ranked] == [
        r for r in TOP_10M if r[0] != UNNAMED
    ]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    p = argparse.ArgumentParser(prog="meridian sentinel")
    add_query_parser(p.add_subparsers(dest="command"))
    code = run_query(p.parse_args(["query", *argv]))
    return code, *capsys.readouterr()


def test_cli_text_and_json(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "top-services", "--data-dir", str(store))
    assert (code, err) == (0, "")
    head, columns, *lines = out.splitlines()
    assert head == "top services by norm cost, last 10m, all events"
    assert columns.split() == ["SERVICE", "DIR", "FLOWS", "SAMPLES", "NORM", "COST"]
    assert [line.rsplit(None, 4)[0] for line in lines] == [r[0] for r in TOP_10M]
    assert [tuple(line.rsplit(None, 4)[1:]) for line in lines] == [
        (d, str(f), str(n), f"{c:.1f}") for _, d, f, n, c in TOP_10M
    ]
    code, out, err = cli(capsys, "top-services", "--data-dir", str(store), "--json")
    assert (code, err) == (0, "")
    objs = [json.loads(line) for line in out.splitlines()]
    assert [(o["service"], o["flows"], o["samples"]) for o in objs] == [
        (SVC, 100, 204), (SVC, 100, 100), ("10.0.0.3:5201 tcp", 1, 50), (None, 1, 7),
    ]  # fmt: skip
    code, out, err = cli(capsys, "top-services", "--data-dir", str(store), "--limit", "0")
    assert code == 2 and "--limit" in err


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ClickHouseServer]:
    yield from running_server(tmp_path / "clickhouse")


def test_remote_server(server: ClickHouseServer, tmp_path: Path) -> None:
    """The same rows on Debian's clickhouse-server (18.16): the same answers."""
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    fill(lambda: HttpBackend(server.url, "writer", str(pw)), tmp_path / "spool")
    backend = HttpBackend(server.url, "writer", str(pw))
    backend.open()
    try:
        check(backend)
    finally:
        backend.close()
