"""The document's names beside ours (docs/requirements/sentinel.md, "Names kept from the
document"), issue 25 item 6: SQL written with its column names (ms_flow_rollup's
function_hash, pmu_event, bucket; ms_raw_samples' pmu_event, tsc, lbr; ms_callstacks'
binary, function, file, line) gives the answers of the same SQL with ours, in chDB and
on Debian's clickhouse-server (18.16), on a store made by this version and on one made
before the names existed (a writer adds them, a reader adds nothing); and the config
keys it names otherwise are taken by either name.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clickhouse_server import (
    PASSWORD,
    READER,
    READER_PASSWORD,
    ClickHouseServer,
    running_server,
)
from sentinel_store import SAMPLE_DTYPE

from meridian.errors import UsageError
from meridian.tools.sentinel.config import dump_config
from meridian.tools.sentinel.config.load import parse_config
from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE
from meridian.tools.sentinel.storage import (
    Backend,
    BatchingSink,
    ChdbBackend,
    HttpBackend,
    Reporter,
    StoreUnavailable,
    schema,
)
from meridian.tools.sentinel.storage import backend as backend_module
from meridian.tools.sentinel.storage.backend import add_seed_names
from meridian.tools.sentinel.symbols.symbolizer import Frame

LBR_DTYPE = np.dtype(
    [
        ("time_ns", "<u8"),
        ("cpu", "<u4"),
        ("nr", "<u4"),
        ("entries", [("from", "<u8"), ("to", "<u8")], (32,)),
    ]
)
T0 = 1_750_000_000 * 10**9  # a fixed day: both stores get the very same rows
SEED_COLUMNS = {
    "ms_flow_rollup": {"function_hash", "pmu_event", "bucket"},
    "ms_raw_samples": {"pmu_event", "tsc", "lbr"},
    "ms_callstacks": {"binary", "function", "file", "line"},
}

# (SQL with the document's names, the same with ours): each pair must give the same rows
PAIRS = [
    (
        "SELECT flow_id, function_hash AS f, pmu_event AS e, bucket AS b, sum(samples) AS n, "
        "sum(norm_cost) AS c FROM ms_flow_rollup WHERE pmu_event = 6 "
        "GROUP BY flow_id, function_hash, pmu_event, bucket ORDER BY flow_id, f, b",
        "SELECT flow_id, function_id AS f, event AS e, time_bucket AS b, sum(samples) AS n, "
        "sum(norm_cost) AS c FROM ms_flow_rollup WHERE event = 6 "
        "GROUP BY flow_id, function_id, event, time_bucket ORDER BY flow_id, f, b",
    ),
    (
        "SELECT pmu_event AS e, flow_id, sum(norm_cost) AS c FROM ms_flow_rollup "
        "WHERE bucket >= {t1} GROUP BY pmu_event, flow_id ORDER BY c DESC, flow_id LIMIT 3",
        "SELECT event AS e, flow_id, sum(norm_cost) AS c FROM ms_flow_rollup "
        "WHERE time_bucket >= {t1} GROUP BY event, flow_id ORDER BY c DESC, flow_id LIMIT 3",
    ),
    (
        "SELECT stack_id, binary AS b, function AS f, file AS s, line AS l "
        "FROM ms_callstacks ORDER BY stack_id",
        "SELECT stack_id, binaries AS b, functions AS f, files AS s, lines AS l "
        "FROM ms_callstacks ORDER BY stack_id",
    ),
    (  # one row per frame
        "SELECT stack_id, function AS f, line AS l FROM ms_callstacks "
        "ARRAY JOIN function, line ORDER BY stack_id, f",
        "SELECT stack_id, f, l FROM ms_callstacks "
        "ARRAY JOIN functions AS f, lines AS l ORDER BY stack_id, f",
    ),
    (  # the stacks of one event's rollups
        "SELECT stack_id, function AS f FROM ms_callstacks WHERE stack_id IN "
        "(SELECT callstack_id FROM ms_flow_rollup WHERE pmu_event = 2) ORDER BY stack_id",
        "SELECT stack_id, functions AS f FROM ms_callstacks WHERE stack_id IN "
        "(SELECT callstack_id FROM ms_flow_rollup WHERE event = 2) ORDER BY stack_id",
    ),
    (
        "SELECT tsc AS t, pmu_event AS e, length(lbr) AS nr FROM ms_raw_samples ORDER BY t",
        "SELECT ktime_ns AS t, event AS e, length(lbr_from) AS nr FROM ms_raw_samples ORDER BY t",
    ),
    (  # one row per branch: the document's lbr is a list of [from, to] pairs
        "SELECT tsc AS t, b[1] AS src, b[2] AS dst FROM ms_raw_samples "
        "ARRAY JOIN lbr AS b ORDER BY t, src",
        "SELECT ktime_ns AS t, src, dst FROM ms_raw_samples "
        "ARRAY JOIN lbr_from AS src, lbr_to AS dst ORDER BY t, src",
    ),
]


def fill(backend: Backend, spool: Path) -> None:
    """Rollups of 3 flows, 2 events and 2 buckets, 3 raw samples (one with 2
    branches) and 2 stacks, through the agent's sink (which opens the backend, and
    closes it)."""
    sink = BatchingSink(backend, spool_dir=str(spool), run_id=7, host="h", flush_interval=0.05)
    rows = np.zeros(12, dtype=ROLLUP_DTYPE)
    for i, r in enumerate(rows):
        r["flow_id"], r["event"] = 1 + i % 3, (2, 6)[i % 2]
        r["function_id"], r["callstack_id"] = 10 + i % 4, 1 + i % 2
        r["time_bucket"] = T0 + (i // 6) * 10**9
        r["samples"], r["norm_cost"] = i + 1, (i + 1) * 0.25
    samples = np.zeros(3, dtype=SAMPLE_DTYPE)
    samples["time_ns"] = [300, 100, 200]
    samples["event"] = [2, 6, 6]
    lbr = np.zeros(1, dtype=LBR_DTYPE)
    lbr["time_ns"], lbr["nr"] = 200, 2
    lbr["entries"]["from"][0, :2] = [11, 10]
    lbr["entries"]["to"][0, :2] = [21, 20]
    handle = Frame("/bin/srv", "handle", "srv.c", 42, 0x4020)
    main = Frame("/bin/srv", "main", "", 0, 1)
    memcpy = Frame("/lib/libc.so.6", "memcpy", "", 0, 0x7F00)
    stacks = [(1, (handle, main)), (2, (memcpy,))]
    try:
        sink.write_rollups(rows)
        sink.write_raw(samples, lbr=lbr, wall_ns=np.full(3, T0, dtype=np.uint64))
        sink.write_stacks(stacks)
        assert sink.flush(timeout=60), sink.stats()
        assert sink.stats().rows_written == 12 + 3 + 2
    finally:
        sink.close()


def opened(backend: Backend) -> Backend:
    backend.open()
    return backend


def answers(backend: Backend) -> list[list[dict[str, Any]]]:
    """Each pair's rows, checked equal: what the document's SQL answers."""
    out = []
    for seed, ours in PAIRS:
        t1 = T0 + 10**9
        got = backend.query(seed.format(t1=t1))
        assert got, seed
        assert got == backend.query(ours.format(t1=t1)), seed
        out.append(got)
    return out


def seed_columns(backend: Backend) -> dict[str, set[str]]:
    """The document's columns each table has."""
    out: dict[str, set[str]] = {}
    for row in backend.query(schema.columns_sql()):
        table, name = str(row["table"]), str(row["name"])
        if name in SEED_COLUMNS.get(table, ()):
            out.setdefault(table, set()).add(name)
    return out


@pytest.fixture
def chdb_ok() -> None:
    pytest.importorskip("chdb", reason="chDB is not installed (pip install chdb)")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ClickHouseServer]:
    yield from running_server(tmp_path / "clickhouse")


def password(tmp_path: Path, text: str = PASSWORD) -> str:
    path = tmp_path / f"pw-{len(text)}"
    path.write_text(text + "\n")
    return str(path)


@pytest.mark.usefixtures("chdb_ok")
def test_seed_sql_answers_as_ours_in_chdb_and_on_the_server(
    server: ClickHouseServer, tmp_path: Path
) -> None:
    writer = ChdbBackend(tmp_path / "store", "seed")
    fill(writer, tmp_path / "spool-chdb")
    assert writer.notice == ""
    embedded = opened(ChdbBackend(tmp_path / "store", "seed", read_only=True))
    try:
        assert seed_columns(embedded) == SEED_COLUMNS
        in_chdb = answers(embedded)
    finally:
        embedded.close()
    remote = HttpBackend(server.url, "writer", password(tmp_path), database="seed")
    fill(remote, tmp_path / "spool-server")
    assert seed_columns(remote) == SEED_COLUMNS and remote.notice == ""
    assert answers(remote) == in_chdb
    # the lbr pairs themselves: [from, to] in branch order, the same in both stores
    (row,) = remote.query("SELECT lbr FROM ms_raw_samples WHERE length(lbr) > 0")
    assert row["lbr"] == [[11, 21], [10, 20]]


def old_store(make: Callable[[], Backend], monkeypatch: pytest.MonkeyPatch, spool: Path) -> None:
    """A store as an older version made it: the tables without the document's names."""
    with monkeypatch.context() as m:
        m.setattr(backend_module, "seed_names_missing", lambda found: [])
        fill(make(), spool)


def check_reader_then_writer(
    reader: Callable[[], Backend], writer: Callable[[], Backend]
) -> Backend:
    """A reader of an old store uses our names and adds nothing; a writer adds the
    document's names; returns the writer, open."""
    r = reader()
    r.open()
    try:
        assert len(r.query(PAIRS[0][1])) == 6
        with pytest.raises(StoreUnavailable, match=r"function_hash|pmu_event|bucket"):
            r.query(PAIRS[0][0])
        assert seed_columns(r) == {}
    finally:
        r.close()
    w = writer()
    w.open()
    assert getattr(w, "notice", None) == ""
    assert seed_columns(w) == SEED_COLUMNS
    answers(w)
    return w


@pytest.mark.usefixtures("chdb_ok")
def test_old_chdb_store_gets_the_seed_names_from_a_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    old_store(lambda: ChdbBackend(path, "old"), monkeypatch, tmp_path / "spool")
    w = check_reader_then_writer(
        lambda: ChdbBackend(path, "old", read_only=True), lambda: ChdbBackend(path, "old")
    )
    before = answers(w)
    w.close()
    again = opened(ChdbBackend(path, "old", read_only=True))  # kept in the catalog
    try:
        assert answers(again) == before
    finally:
        again.close()


def test_old_server_store_gets_the_seed_names_from_a_writer(
    server: ClickHouseServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pw, ro = password(tmp_path), password(tmp_path, READER_PASSWORD)
    old_store(
        lambda: HttpBackend(server.url, "writer", pw, database="old"),
        monkeypatch,
        tmp_path / "spool",
    )
    w = check_reader_then_writer(  # the reader has readonly=1: no DDL at all
        lambda: HttpBackend(server.url, READER, ro, database="old", read_only=True),
        lambda: HttpBackend(server.url, "writer", pw, database="old"),
    )
    before = answers(w)
    server.stop()  # 18.16 reads the aliases back from its metadata after a restart
    server.start()
    reader = opened(HttpBackend(server.url, READER, ro, database="old", read_only=True))
    assert answers(reader) == before


def test_seed_names_in_schema_sql() -> None:
    assert len(schema.statements()) == 6  # the CREATEs, as before
    found: dict[str, set[str]] = {}
    for table, column, sql in schema.seed_names():
        assert sql.startswith(f"ALTER TABLE {table} ADD COLUMN {column} ") and " ALIAS " in sql
        assert "IF NOT EXISTS" not in sql and "Tuple" not in sql  # neither works in 18.16
        found.setdefault(table, set()).add(column)
    assert found == SEED_COLUMNS
    # not needed: a store without them is used by our names
    rows: list[dict[str, object]] = [
        {"table": t, "name": c} for t, cs in schema.columns().items() for c in cs
    ]
    assert schema.schema_problem(rows) == ""
    assert len(schema.seed_names_missing(rows)) == 10
    rows += [{"table": t, "name": c} for t, c, _ in schema.seed_names()]
    assert schema.seed_names_missing(rows) == []


def test_seed_names_not_added_are_said_not_fatal() -> None:
    rows: list[dict[str, Any]] = [
        {"table": t, "name": c} for t, cs in schema.columns().items() for c in cs
    ]
    ran: list[str] = []

    def refuse(sql: str) -> None:
        ran.append(sql)
        if "ms_callstacks" in sql:  # another agent added these meanwhile
            raise StoreUnavailable("Code: 44. column with this name already exists", code=44)
        raise StoreUnavailable("Code: 497. Not enough privileges", code=497)

    notice = add_seed_names(refuse, rows)
    assert len(ran) == 10
    assert "ms_flow_rollup: function_hash, pmu_event, bucket" in notice
    assert "ms_raw_samples: pmu_event, tsc, lbr" in notice and "ms_callstacks" not in notice
    assert "Not enough privileges" in notice and "\n" not in notice
    assert add_seed_names(lambda sql: None, rows) == ""

    def down(sql: str) -> None:
        raise StoreUnavailable("unreachable", kind="unreachable", ambiguous=False)

    with pytest.raises(StoreUnavailable):
        add_seed_names(down, rows)


class NoticeStore:
    """A store that opens with a notice and takes every batch."""

    name = "fake://notice"
    notice = "could not add the seed's column names (ms_callstacks: line): refused"

    def open(self) -> None:
        pass

    def insert(self, info: Any, payload: bytes) -> None:
        pass

    def stored_rows(self, info: Any) -> int:
        return 0

    def query(self, sql: str) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


def test_sender_says_the_notice(tmp_path: Path) -> None:
    reporter = Reporter(err=io.StringIO())
    sink = BatchingSink(NoticeStore(), spool_dir=str(tmp_path), reporter=reporter)
    try:
        deadline = time.monotonic() + 10
        while not sink.stats().connected:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        sink.close()
    assert [line for line in reporter.lines if "seed's column names" in line] == [
        "meridian sentinel: storage: " + NoticeStore.notice
    ]


# -- config -----------------------------------------------------------------------


def test_config_takes_the_seed_key_names() -> None:
    cfg = parse_config("clickhouse:\n  endpoint: http://ch:8123\nperf:\n  samples_per_sec: 77\n")
    assert cfg.clickhouse.url == "http://ch:8123"
    assert cfg.perf.sentinel_samples_per_sec == 77
    ours = parse_config("clickhouse:\n  url: http://ch:8123\nperf:\n  sentinel_samples_per_sec: 77")
    assert cfg == ours
    text = dump_config(cfg)  # our names, the document's said; read back the same
    assert "  # remote ClickHouse HTTP endpoint, instead of data_dir (seed: endpoint)\n" in text
    assert "(seed: samples_per_sec)\n  sentinel_samples_per_sec: 77\n" in text
    assert parse_config(text) == cfg


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        (
            "clickhouse:\n  endpoint: http://a:1\n  url: http://b:2\n",
            "config: clickhouse.endpoint is the seed's name of clickhouse.url: "
            "give one of them, not both",
        ),
        (
            "perf:\n  samples_per_sec: 5\n  sentinel_samples_per_sec: 5\n",
            "config: perf.samples_per_sec is the seed's name of perf.sentinel_samples_per_sec: "
            "give one of them, not both",
        ),
        (  # a mistake names the key as the file wrote it
            "clickhouse:\n  endpoint: 5\n",
            "config: clickhouse.endpoint: expected a string or null, got 5",
        ),
        (
            "perf:\n  samples_per_sec: 0\n",
            "config: perf.samples_per_sec: a budget is samples per second per CPU",
        ),
        (
            "clickhouse:\n  endpont: http://a:1\n",
            "config: unknown key clickhouse.endpont: did you mean clickhouse.endpoint?",
        ),
        (
            "perf:\n  endpoint: http://a:1\n",
            "config: unknown key perf.endpoint: did you mean clickhouse.endpoint?",
        ),
    ],
)
def test_config_seed_key_mistakes_are_one_line(yaml: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_config(yaml)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
