"""`meridian sentinel query` as a ClickHouse user whose profile has readonly=1, on
Debian's clickhouse-server: such a user may read the tables but neither run DDL nor
send a setting with a query. The rows an agent stored (as `writer`, through its own
sink) come back exactly; before any agent stored, the query is one line and exit
code 2. An embedded store without tables is said the same way."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_server import PASSWORD, READER, READER_PASSWORD, ClickHouseServer, running_server
from sentinel_store import rollups

from meridian.tools.sentinel.config import ClickHouseConfig
from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.query.cli import add_query_parser, run_query
from meridian.tools.sentinel.storage import HttpBackend, open_sink
from meridian.tools.sentinel.storage.chdb_backend import LOCK_NAME

A = FlowKey("10.0.0.1", "10.0.0.2", 5201, 43012, "tcp")
B = FlowKey("fd00::1", "fd00::2", 443, 50000, "udp")
C = 0xFEDCBA9876543210  # above 2**63, and never named
ERROR = "meridian sentinel query: error: "


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ClickHouseServer]:
    yield from running_server(tmp_path / "clickhouse")


def secret(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    return str(path)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """run_query on a parser of our own (the sentinel command hooks it in the same way)."""
    p = argparse.ArgumentParser(prog="meridian sentinel")
    add_query_parser(p.add_subparsers(dest="command"))
    code = run_query(p.parse_args(["query", *argv]))
    return code, *capsys.readouterr()


def store_as_agent(url: str, password_file: str, spool: Path) -> None:
    """Two named flows and one unnamed, through the agent's sink, as `writer`."""
    cfg = ClickHouseConfig(
        url=url, user="writer", password_file=password_file, spool_dir=str(spool),
        retention_days=0,  # Debian's server has no TTL: the agent would say so on stderr
    )  # fmt: skip
    sink = open_sink(cfg, run_id=1)
    try:
        sink.write_flows(
            [(k.flow_id, k.src, k.dst, k.sport, k.dport, str(k.proto)) for k in (A, B)]
        )
        rows = rollups(0, 4)
        rows["flow_id"] = [A.flow_id, A.flow_id, B.flow_id, C]
        rows["samples"] = [4, 2, 5, 3]
        rows["norm_cost"] = [8.0, 4.0, 2.5, 3.0]
        sink.write_rollups(rows)
        assert sink.flush(timeout=60), sink.stats()
        assert sink.stats().rows_written == 6
    finally:
        sink.close()


def test_readonly_user_queries_what_an_agent_stored(
    server: ClickHouseServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reader_pw = secret(tmp_path / "reader", READER_PASSWORD)
    remote = ["--clickhouse-url", server.url, "--clickhouse-user", READER]
    remote += ["--clickhouse-password-file", reader_pw]

    code, out, err = cli(capsys, "top-flows", *remote)  # nothing stored yet
    expect = (
        f"no sentinel tables in database default at {server.url}: has an agent stored there yet?"
    )
    assert (code, out, err) == (2, "", f"{ERROR}{expect}\n")
    reader = HttpBackend(server.url, READER, reader_pw)
    assert reader.query("SELECT value FROM system.settings WHERE name = 'readonly'") == [
        {"value": "1"}
    ]  # the profile is in force: no DDL, no setting sent with a query
    assert reader.query("SELECT name FROM system.tables WHERE database = 'default'") == []

    store_as_agent(server.url, secret(tmp_path / "writer", PASSWORD), tmp_path / "spool")
    code, out, err = cli(capsys, "top-flows", *remote, "--json")
    assert (code, err) == (0, "")
    assert [json.loads(line) for line in out.splitlines()] == [
        {**{"flow": f"{A.flow_id:016x}", "src": "10.0.0.1", "dst": "10.0.0.2"},
         **{"sport": 5201, "dport": 43012, "proto": "tcp", "samples": 6, "norm_cost": 12.0}},
        {**{"flow": f"{C:016x}", "src": None, "dst": None, "sport": None, "dport": None},
         **{"proto": None, "samples": 3, "norm_cost": 3.0}},
        {**{"flow": f"{B.flow_id:016x}", "src": "fd00::1", "dst": "fd00::2"},
         **{"sport": 443, "dport": 50000, "proto": "udp", "samples": 5, "norm_cost": 2.5}},
    ]  # fmt: skip

    code, out, err = cli(capsys, "top-flows", *remote)
    assert (code, err) == (0, "")
    head, columns, *rows = out.splitlines()
    assert head == "top flows by norm cost, last 10m, all events"
    start = columns.index("FLOW", 4)  # the 5-tuples line up under their header
    assert [r[start:].split("  ")[0] for r in rows] == [str(A), "(5-tuple not stored)", str(B)]
    assert [(r.split()[0], int(r.split()[-2]), float(r.split()[-1])) for r in rows] == [
        (f"{A.flow_id:016x}", 6, 12.0),
        (f"{C:016x}", 3, 3.0),
        (f"{B.flow_id:016x}", 5, 2.5),
    ]

    code, out, err = cli(capsys, "flow", f"{C:016x}", *remote, "--json")
    assert (code, err) == (0, "")
    head = json.loads(out.splitlines()[0])
    assert (head["flow"], head["samples"], head["norm_cost"]) == (f"{C:016x}", 3, 3.0)


def test_embedded_store_without_tables_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("chdb", reason="chDB is not installed (pip install chdb)")
    store = tmp_path / "store"
    store.mkdir()
    (store / LOCK_NAME).touch()  # an agent took it, and stopped before any table was made
    code, out, err = cli(capsys, "top-flows", "--data-dir", str(store))
    expect = (
        f"no sentinel tables in database default at chdb:{store}: has an agent stored there yet?"
    )
    assert (code, out, err) == (2, "", f"{ERROR}{expect}\n")
