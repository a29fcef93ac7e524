"""ClickHouse storage of meridian sentinel against a real ClickHouse server (Debian's
clickhouse-server, started here as a child on a free port and stopped in a finally):
every row once across a restart and lost answers, and each failure said once. The
retention (clickhouse.retention_days) as the timed tables' TTL: on a server that has
TTL (chDB's ClickHouse 26; Debian's 18.16 has none, which the agent says), in the
CREATE and changed at start when the setting changed."""

from __future__ import annotations

import io
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clickhouse_server import PASSWORD, ClickHouseServer, free_port, running_server
from sentinel_store import SAMPLE_DTYPE, counts, rollups, say_lines, wait_stored

from meridian.errors import UsageError
from meridian.tools.sentinel.storage import (
    TABLES,
    BatchingSink,
    ChdbBackend,
    HttpBackend,
    Reporter,
    StoreUnavailable,
)
from meridian.tools.sentinel.storage.schema import (
    statements,
    ttl_changes,
    ttl_missing,
    ttl_supported,
)
from meridian.tools.sentinel.symbols.symbolizer import DataObject, Frame


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    """One server for the tests that leave it running (each uses its own database)."""
    yield from running_server(tmp_path_factory.mktemp("clickhouse"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ClickHouseServer]:
    """A server of the test's own, which it may stop and start."""
    yield from running_server(tmp_path / "clickhouse")


def password_file(tmp_path: Path, text: str = PASSWORD) -> str:
    path = tmp_path / "password"
    path.write_text(text + "\n")
    return str(path)


def remote_sink(
    tmp_path: Path, url: str, pw: str, database: str = "sentinel", **kw: Any
) -> tuple[BatchingSink, HttpBackend, Reporter]:
    backend = HttpBackend(url, "writer", pw, database=database, timeout=5.0)
    reporter = Reporter(err=io.StringIO(), interval=1e9)  # once per run: the counts are exact
    opts: dict[str, Any] = {"batch_rows": 500, "flush_interval": 0.2, "max_backoff": 0.5}
    opts.update(kw)
    sink = BatchingSink(backend, spool_dir=str(tmp_path / "spool"), reporter=reporter, **opts)
    return sink, backend, reporter


def test_remote_rows_arrive_exactly_once(shared_server: ClickHouseServer, tmp_path: Path) -> None:
    pw = password_file(tmp_path)
    sink, backend, reporter = remote_sink(tmp_path, shared_server.url, pw, "once")
    try:
        deadline = time.monotonic() + 30
        while not sink.stats().connected:  # the schema is applied at start, before any row
            assert time.monotonic() < deadline
            time.sleep(0.05)
        tables = backend.query("SELECT name FROM system.tables WHERE database = 'once'")
        assert sorted(r["name"] for r in tables) == sorted(TABLES)
        for i in range(7):
            sink.write_rollups(rollups(i * 300, 300))
        sink.write_raw(np.zeros(40, dtype=SAMPLE_DTYPE), wall_ns=np.full(40, time.time_ns()))
        sink.write_stacks([(1, (Frame("/bin/x", "main", "x.c", 3, 4096),))])
        sink.write_data_objects([DataObject(1, 42, 0x7000, "arena", "struct a", 64)])
        wait_stored(sink, 30)
        assert counts(backend) == (2100, 2100)
        assert counts(backend, "ms_raw_samples")[0] == 40
        (stack,) = backend.query("SELECT functions, files, lines FROM ms_callstacks")
        assert stack == {"functions": ["main"], "files": ["x.c"], "lines": [3]}
        (obj,) = backend.query("SELECT name, type, size FROM ms_data_objects")
        assert obj == {"name": "arena", "type": "struct a", "size": 64}
        st = sink.stats()
        assert st.rows_written == 2142 and st.flush_errors == 0 and not reporter.lines
        assert backend.server_version.startswith(("18.", "19.", "2"))
        backend.open()  # the schema again: nothing changes
        assert counts(backend) == (2100, 2100)
    finally:
        sink.close()


def test_remote_restart_every_row_once(server: ClickHouseServer, tmp_path: Path) -> None:
    sink, backend, reporter = remote_sink(tmp_path, server.url, password_file(tmp_path))
    written = 0

    def write(n_calls: int) -> None:
        nonlocal written
        for _ in range(n_calls):
            sink.write_rollups(rollups(written, 97))
            written += 97
            time.sleep(0.02)

    try:
        write(20)
        server.stop(signal.SIGKILL)  # mid-run, without warning
        write(40)  # the writer meets a dead server: rows go to the spool
        assert not sink.flush(timeout=2.0)
        st = sink.stats()
        assert st.spooled_rows > 0 and st.flush_errors >= 1
        server.start()  # same data directory, same port
        write(20)
        wait_stored(sink, 60)
        assert counts(backend) == (written, written)
        st = sink.stats()
        assert st.dropped_rows == 0 and st.spooled_rows == 0 and st.rows_written == written
        # said once, not per batch: the key "unreachable" covers a refused connection
        # ("is unreachable") and a request killed before its answer ("did not answer")
        down = [
            line for line in reporter.lines if "unreachable" in line or "did not answer" in line
        ]
        assert len(down) == 1, reporter.lines
    finally:
        sink.close()


class LossyProxy:
    """Passes HTTP requests to the server, but for the next `drops` inserts it waits
    for the server's answer (the rows are stored) and closes the connection instead
    of passing it on: the agent cannot know whether its rows were stored."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.drops = 0
        self.dropped = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(client,), daemon=True).start()

    def handle(self, client: socket.socket) -> None:
        with client:
            client.settimeout(10)
            request = b""
            while b"\r\n\r\n" not in request:
                if not (data := client.recv(65536)):
                    return  # the client went away
                request += data
            head, _, body = request.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(body) < length:
                if not (data := client.recv(65536)):
                    return
                body += data
            with socket.create_connection(("127.0.0.1", self.upstream_port), 10) as up:
                up.sendall(head + b"\r\n\r\n" + body)
                answer = b""
                while chunk := up.recv(65536):
                    answer += chunk
            if b"query=INSERT" in head.split(b"\r\n")[0] and self.drops > 0:
                self.drops -= 1
                self.dropped += 1
                return  # stored, but the agent never hears so
            client.sendall(answer)

    def close(self) -> None:
        self.sock.close()


def test_remote_lost_answers_store_once(shared_server: ClickHouseServer, tmp_path: Path) -> None:
    proxy = LossyProxy(shared_server.http_port)
    pw = password_file(tmp_path)
    sink, _, reporter = remote_sink(tmp_path, proxy.url, pw, "lossy", max_backoff=0.2)
    direct = HttpBackend(shared_server.url, "writer", pw, "lossy")
    try:
        sink.write_rollups(rollups(0, 10))
        wait_stored(sink, 30)  # the schema is there, the connection works
        proxy.drops = 3
        for i in range(1, 9):
            sink.write_rollups(rollups(i * 250, 250))
        wait_stored(sink, 60)
        assert proxy.dropped == 3
        assert counts(direct) == (2010, 2010)  # each row once, though sent with no answer
        st = sink.stats()
        assert st.rows_written == 2010 and st.dropped_rows == 0 and st.flush_errors >= 3
        assert len(say_lines(reporter, "did not answer")) == 1
    finally:
        sink.close()
        proxy.close()


def test_remote_wrong_password_said_once(shared_server: ClickHouseServer, tmp_path: Path) -> None:
    pw = password_file(tmp_path, "wrong")
    sink, backend, reporter = remote_sink(tmp_path, shared_server.url, pw, "password")
    try:
        for i in range(10):
            sink.write_rollups(rollups(i * 100, 100))  # never raises
            assert not sink.flush(timeout=1.0)
        time.sleep(1.5)  # retried with backoff meanwhile
        st = sink.stats()
        assert st.flush_errors >= 2 and st.spooled_rows == 1000 and st.dropped_rows == 0
        (line,) = reporter.lines
        assert "refused user 'writer'" in line and "password_file" in line
        assert "\n" not in line and "Stack trace" not in line
        password_file(tmp_path)  # fixed: read again, the spool goes out
        wait_stored(sink, 30)
        assert counts(backend) == (1000, 1000)
    finally:
        sink.close()


def test_remote_table_of_another_schema_is_said(
    shared_server: ClickHouseServer, tmp_path: Path
) -> None:
    backend = HttpBackend(shared_server.url, "writer", password_file(tmp_path), "old")
    backend.open()
    backend.query("DROP TABLE ms_data_objects")
    backend.query(
        "CREATE TABLE ms_data_objects (run_id UInt64) ENGINE = MergeTree() ORDER BY run_id"
    )
    with pytest.raises(StoreUnavailable) as err:
        backend.open()
    assert err.value.kind == "schema"
    assert "table ms_data_objects lacks columns object_id, pid" in str(err.value)


def test_remote_unreachable_said_once(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sink, _, reporter = remote_sink(tmp_path, url, password_file(tmp_path))
    try:
        for i in range(10):
            sink.write_rollups(rollups(i * 100, 100))
            sink.flush(timeout=1.0)
        time.sleep(1.5)
        st = sink.stats()
        assert st.flush_errors >= 2 and st.spooled_rows == 1000 and not st.connected
        (line,) = reporter.lines
        assert f"ClickHouse at {url} is unreachable (connection refused)" in line
        assert "spool" in line
    finally:
        sink.close()


def test_bad_url_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"clickhouse\.url"):
        HttpBackend("localhost:8123")


def test_ttl_only_where_the_server_has_it() -> None:
    assert [ttl_supported(v) for v in ("18.16.1", "19.5.4", "19.6.2.11", "24.8.1", "")] == [
        False, False, True, True, False,
    ]  # fmt: skip
    timed = [sql for sql in statements(14) if "TTL" in sql]
    assert [sql.split()[5] for sql in timed] == ["ms_flow_rollup", "ms_raw_samples"]
    assert all(sql.endswith("\nTTL ts + toIntervalDay(14)") for sql in timed)
    assert not any("TTL" in sql for sql in statements(0))
    assert ttl_missing("24.8.1", 14) == ttl_missing("18.16.1", 0) == ""
    assert "ClickHouse 18.16.1 has no table TTL" in ttl_missing("18.16.1", 14)


def test_ttl_changes_only_what_differs() -> None:
    engine = (
        "MergeTree PARTITION BY toYYYYMMDD(ts) ORDER BY (x){} SETTINGS index_granularity = 8192"
    )
    found: list[dict[str, object]] = [
        {"name": "ms_raw_samples", "engine_full": engine.format("")},
        {"name": "ms_flow_rollup", "engine_full": engine.format(" TTL ts + toIntervalDay(14)")},
    ]
    assert ttl_changes(found, 14) == [
        "ALTER TABLE ms_raw_samples MODIFY TTL ts + toIntervalDay(14)"
    ]
    assert ttl_changes(found, 7) == [
        "ALTER TABLE ms_flow_rollup MODIFY TTL ts + toIntervalDay(7)",
        "ALTER TABLE ms_raw_samples MODIFY TTL ts + toIntervalDay(7)",
    ]
    assert ttl_changes(found, 0) == ["ALTER TABLE ms_flow_rollup REMOVE TTL"]


def test_remote_server_without_ttl_says_the_retention_is_not_applied(
    shared_server: ClickHouseServer, tmp_path: Path
) -> None:
    backend = HttpBackend(shared_server.url, "writer", password_file(tmp_path), "nottl",
                          retention_days=14)  # fmt: skip
    backend.open()
    assert backend.notice == ttl_missing(backend.server_version, 14)
    if ttl_supported(backend.server_version):  # a newer server than Debian's
        (row,) = backend.query("SHOW CREATE TABLE ms_flow_rollup")
        assert "TTL ts + toIntervalDay(14)" in row["statement"]
    else:
        assert "no table TTL" in backend.notice
        (row,) = backend.query("SHOW CREATE TABLE ms_flow_rollup")
        assert "TTL" not in row["statement"]
    assert HttpBackend(shared_server.url, "writer", password_file(tmp_path), "nottl").notice == ""


def show_create(backend: ChdbBackend, table: str) -> str:
    (row,) = backend.query(f"SHOW CREATE TABLE {table}")
    return str(row["statement"])


def test_embedded_server_keeps_the_retention_as_ttl(tmp_path: Path) -> None:
    """chDB (ClickHouse 26): the TTL in SHOW CREATE TABLE, in the CREATE of a new store
    and changed at the next start when retention_days changed; 0 removes it."""
    pytest.importorskip("chdb", reason="chDB is not installed (pip install chdb)")
    for days, want in ((14, "TTL ts + toIntervalDay(14)"), (3, "TTL ts + toIntervalDay(3)")):
        backend = ChdbBackend(tmp_path / "store", "ttl", retention_days=days)
        backend.open()
        try:
            assert backend.notice == ""
            for table in ("ms_flow_rollup", "ms_raw_samples"):
                assert want in show_create(backend, table)
            assert "TTL" not in show_create(backend, "ms_callstacks")  # names stay
        finally:
            backend.close()
    backend = ChdbBackend(tmp_path / "store", "ttl", retention_days=0)
    backend.open()
    try:
        assert "TTL" not in show_create(backend, "ms_flow_rollup")
    finally:
        backend.close()
