"""ClickHouse storage of meridian sentinel: the line format, the batcher's exactly-once
and spool logic (against a fake store), a real ClickHouse server (Debian's
clickhouse-server, started here as a child on a free port and stopped in a finally)
and the embedded chDB store."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meridian.errors import UsageError
from meridian.tools.sentinel.aggregator import ROLLUP_DTYPE, Rollup
from meridian.tools.sentinel.storage import (
    TABLES,
    BatchInfo,
    BatchingSink,
    ChdbBackend,
    HttpBackend,
    Reporter,
    StoreUnavailable,
    holder_pid,
    open_backend,
    statements,
)
from meridian.tools.sentinel.storage.rows import DAY_NS, raw_lines, rollup_lines, stack_lines
from meridian.tools.sentinel.symbolizer import DataObject, Frame

SERVER = shutil.which("clickhouse-server") or "/usr/sbin/clickhouse-server"
PASSWORD = "s3cret pass"

SAMPLE_DTYPE = np.dtype(
    [
        ("time_ns", "<u8"),
        ("ip", "<u8"),
        ("data_addr", "<u8"),
        ("flow_id", "<u8"),
        ("cgroup_id", "<u8"),
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("cpu", "<u4"),
        ("ifindex", "<u4"),
        ("user_stack_id", "<i4"),
        ("kernel_stack_id", "<i4"),
        ("event", "<u2"),
        ("gso_segs", "<u2"),
        ("direction", "u1"),
        ("flow_source", "u1"),
        ("lbr_nr", "u1"),
        ("pad", "u1"),
        ("numa_node", "<u4"),
        ("raw_code", "<u4"),
    ]
)
LBR_DTYPE = np.dtype(
    [
        ("time_ns", "<u8"),
        ("cpu", "<u4"),
        ("nr", "<u4"),
        ("entries", [("from", "<u8"), ("to", "<u8")], (32,)),
    ]
)


def rollups(first: int, n: int, when_ns: int | None = None) -> np.ndarray[Any, Any]:
    """n rollups with flow ids first..first+n-1 (each row told apart by its flow)."""
    t = time.time_ns() if when_ns is None else when_ns
    a = np.zeros(n, dtype=ROLLUP_DTYPE)
    a["flow_id"] = np.arange(first, first + n, dtype=np.uint64)
    a["time_bucket"] = t - t % 1_000_000_000
    a["samples"] = 1
    a["norm_cost"] = 0.5
    a["function_id"] = 3
    a["callstack_id"] = 7
    return a


def say_lines(reporter: Reporter, word: str) -> list[str]:
    return [line for line in reporter.lines if word in line]


def wait_stored(sink: BatchingSink, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not sink.flush(timeout=2.0):
        assert time.monotonic() < deadline, f"not stored in {timeout}s: {sink.stats()}"
        time.sleep(0.1)


# -- lines --------------------------------------------------------------------------


def test_schema_has_the_four_tables_with_sorting_keys() -> None:
    sql = statements()
    assert len(sql) == 4
    for table, stmt in zip(TABLES, sql, strict=True):
        assert stmt.startswith(f"CREATE TABLE IF NOT EXISTS {table}")
        assert "ENGINE = MergeTree()" in stmt and "ORDER BY" in stmt
    # time range first (5-minute slots), then the flow
    assert "ORDER BY (toStartOfFiveMinute(ts), flow_id, time_bucket" in sql[0]


def test_rollup_lines_are_json_with_every_field() -> None:
    a = rollups(10, 3)
    a["norm_cost"][1] = np.inf
    a["flow_id"][2] = 2**64 - 1
    chunks = rollup_lines(a, run_id=5, host='h"1')
    assert len(chunks) == 1
    rows = [json.loads('{"batch_id":1,' + line) for line in chunks[0][1]]
    assert rows[0]["flow_id"] == 10 and rows[0]["norm_cost"] == 0.5
    assert rows[1]["norm_cost"] == 0.0  # JSON has no inf
    assert rows[2]["flow_id"] == 2**64 - 1
    assert rows[0]["host"] == 'h"1' and rows[0]["run_id"] == 5
    assert set(rows[0]) >= set(ROLLUP_DTYPE.names or ())


def test_rollup_objects_and_midnight_split() -> None:
    def at(flow_id: int, time_bucket: int) -> Rollup:
        return Rollup(flow_id, 0, 0, 0, 0, 0, 0, 0, time_bucket, samples=1, norm_cost=1.0, pid=0)

    day = 20_000
    chunks = rollup_lines([at(1, day * DAY_NS - 1), at(2, day * DAY_NS)], run_id=1, host="h")
    assert [(d, len(lines)) for d, lines in chunks] == [(day - 1, 1), (day, 1)]


def test_raw_lines_join_lbr_and_cost() -> None:
    s = np.zeros(3, dtype=SAMPLE_DTYPE)
    s["time_ns"] = [100, 200, 300]
    s["cpu"] = [0, 1, 0]
    s["gso_segs"] = [0, 4, 2]
    lbr = np.zeros(1, dtype=LBR_DTYPE)
    lbr["time_ns"], lbr["cpu"], lbr["nr"] = 200, 1, 2
    lbr["entries"]["from"][0, :2] = [10, 11]
    lbr["entries"]["to"][0, :2] = [20, 21]
    wall = np.array([5, 6, 7], dtype=np.uint64) + 3 * DAY_NS
    (chunk,) = raw_lines(s, 9, "h", lbr=lbr, scale=2.0, wall_ns=wall)
    assert chunk[0] == 3
    rows = [json.loads("{" + line) for line in chunk[1]]
    assert [r["norm_cost"] for r in rows] == [2.0, 0.5, 1.0]
    assert rows[1]["lbr_from"] == [10, 11] and rows[1]["lbr_to"] == [20, 21]
    assert rows[0]["lbr_from"] == [] and rows[0]["ktime_ns"] == 100
    assert rows[2]["time_ns"] == 3 * DAY_NS + 7


def test_stack_lines_escape_names() -> None:
    frames = (Frame("/bin/x", 'f"\\n\u00e9', "x.c", 3, 2**64 - 1, 8),)
    (chunk,) = stack_lines([(4, frames)], 1, "h", seen_ns=5)
    row = json.loads("{" + chunk[1][0])
    assert row["functions"] == ['f"\\n\u00e9'] and row["addrs"] == [2**64 - 1]
    assert row["offsets"] == [8] and row["stack_id"] == 4


# -- the batcher, against a fake store ------------------------------------------------


class FakeStore:
    """Stores batches by id; `fail` makes the next inserts fail in a given way."""

    name = "fake://store"

    def __init__(self) -> None:
        self.batches: dict[int, tuple[BatchInfo, bytes]] = {}
        self.inserts = 0
        self.fail: list[str] = []  # "down", "lost-answer" (stored, then no answer)
        self.down = False
        self.gate = threading.Event()  # inserts wait for it: a slow store
        self.gate.set()
        self.mu = threading.Lock()

    def open(self) -> None:
        if self.down:
            raise StoreUnavailable("fake store is down", kind="unreachable")

    def insert(self, info: BatchInfo, payload: bytes) -> None:
        self.gate.wait(30)
        with self.mu:
            self.inserts += 1
            how = self.fail.pop(0) if self.fail else ""
            if self.down or how == "down":
                raise StoreUnavailable("fake store is down", kind="unreachable")
            self.batches[info.batch_id] = (info, payload)
            if how == "lost-answer":
                raise StoreUnavailable("fake: no answer", kind="unreachable", ambiguous=True)

    def stored_rows(self, info: BatchInfo) -> int:
        if self.down:
            raise StoreUnavailable("fake store is down", kind="unreachable")
        return self.batches[info.batch_id][0].rows if info.batch_id in self.batches else 0

    def query(self, sql: str) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass

    def flows(self) -> list[int]:
        out = []
        for _, payload in self.batches.values():
            out += [json.loads(line)["flow_id"] for line in payload.decode().splitlines()]
        return sorted(out)


def fake_sink(tmp_path: Path, store: FakeStore, **kw: Any) -> tuple[BatchingSink, Reporter]:
    reporter = Reporter(err=io.StringIO())
    opts: dict[str, Any] = {"batch_rows": 100, "flush_interval": 0.05, "max_backoff": 0.05}
    opts.update(kw)
    sink = BatchingSink(store, spool_dir=str(tmp_path / "spool"), reporter=reporter, **opts)
    return sink, reporter


def test_batches_by_size_and_time(tmp_path: Path) -> None:
    store = FakeStore()
    sink, _ = fake_sink(tmp_path, store, flush_interval=0.3)
    try:
        sink.write_rollups(rollups(0, 250))
        deadline = time.monotonic() + 5
        while len(store.batches) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        # two full batches go at once; the 50 left wait for the interval
        assert sorted(i.rows for i, _ in store.batches.values()) == [100, 100]
        while len(store.batches) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(i.rows for i, _ in store.batches.values()) == [50, 100, 100]
        assert store.flows() == list(range(250))
    finally:
        sink.close()


def test_lost_answer_is_not_sent_twice(tmp_path: Path) -> None:
    store = FakeStore()
    store.fail = ["lost-answer", "down"]
    sink, _ = fake_sink(tmp_path, store)
    try:
        sink.write_rollups(rollups(0, 100))
        sink.write_rollups(rollups(100, 100))
        wait_stored(sink, 10)
        assert store.flows() == list(range(200))  # each row once
        st = sink.stats()
        assert st.rows_written == 200 and st.dropped_rows == 0 and st.flush_errors == 2
    finally:
        sink.close()


def test_spool_full_drops_are_counted_and_said_once(tmp_path: Path) -> None:
    store = FakeStore()
    store.down = True
    sink, reporter = fake_sink(tmp_path, store, spool_max_bytes=150_000)
    try:
        for i in range(20):
            sink.write_rollups(rollups(i * 100, 100))
            sink.flush(timeout=1.0)
        st = sink.stats()
        assert st.dropped_rows > 0 and st.spooled_rows > 0
        assert st.dropped_rows + st.spooled_rows == 2000
        assert len(say_lines(reporter, "is full")) == 1
        assert len(say_lines(reporter, "fake store is down")) == 1
        store.down = False
        wait_stored(sink, 10)
        assert len(store.flows()) == st.spooled_rows  # what was kept arrives, once
        assert sink.stats().dropped_rows == st.dropped_rows
    finally:
        sink.close()


def test_bad_rows_and_full_disk_never_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FakeStore()
    store.down = True
    sink, reporter = fake_sink(tmp_path, store)

    def full(*args: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    try:
        sink.write_rollups([object()])  # type: ignore[list-item]
        assert sink.stats().dropped_rows == 1
        monkeypatch.setattr(sink.spool, "_write", full)
        for i in range(5):
            sink.write_rollups(rollups(i * 10, 10))
            sink.flush(timeout=2.0)
        assert sink.stats().dropped_rows == 51
        (line,) = say_lines(reporter, "No space left on device")
        assert "dropping rows" in line and "51 rows dropped in all" not in line
        assert all("\n" not in line for line in reporter.lines)
    finally:
        sink.close()


def test_slow_store_overflow_goes_to_disk(tmp_path: Path) -> None:
    store = FakeStore()
    store.gate.clear()
    sink, _ = fake_sink(tmp_path, store, max_pending_rows=250)
    try:
        for i in range(10):
            sink.write_rollups(rollups(i * 100, 100))  # returns at once
        assert sink.stats().spooled_rows >= 500  # past the bound: on disk, not in memory
        store.gate.set()
        wait_stored(sink, 10)
        assert store.flows() == list(range(1000))
    finally:
        store.gate.set()
        sink.close()


def test_spool_outlives_the_agent(tmp_path: Path) -> None:
    store = FakeStore()
    store.down = True
    sink, _ = fake_sink(tmp_path, store)
    sink.write_rollups(rollups(0, 150))
    sink.close(timeout=2.0)
    sink.write_rollups(rollups(150, 5))  # after close: counted, not raised
    assert sink.stats().dropped_rows == 5
    assert not store.batches
    store.down = False
    again, _ = fake_sink(tmp_path, store)
    try:
        wait_stored(again, 10)
        assert store.flows() == list(range(150))
    finally:
        again.close()


# -- a real ClickHouse server ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ClickHouseServer:
    """Debian's clickhouse-server as a child of this test, on 127.0.0.1 only, with its
    config, data and logs under one temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.http_port = free_port()
        self.tcp_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.xml").write_text(
            f"""<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><console>0</console>
    <log>{root}/server.log</log><errorlog>{root}/server.err.log</errorlog></logger>
  <listen_host>127.0.0.1</listen_host>
  <http_port>{self.http_port}</http_port>
  <tcp_port>{self.tcp_port}</tcp_port>
  <path>{root}/data/</path>
  <tmp_path>{root}/tmp/</tmp_path>
  <user_files_path>{root}/user_files/</user_files_path>
  <format_schema_path>{root}/format_schemas/</format_schema_path>
  <mark_cache_size>16777216</mark_cache_size>
  <max_concurrent_queries>20</max_concurrent_queries>
  <users_config>{root}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <timezone>UTC</timezone>
</yandex>
"""
        )
        (root / "users.xml").write_text(
            f"""<?xml version="1.0"?>
<yandex>
  <profiles><default><max_memory_usage>1000000000</max_memory_usage></default></profiles>
  <users><writer><password>{PASSWORD}</password>
    <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
    <profile>default</profile><quota>default</quota></writer></users>
  <quotas><default><interval><duration>3600</duration><queries>0</queries>
    <errors>0</errors><result_rows>0</result_rows><read_rows>0</read_rows>
    <execution_time>0</execution_time></interval></default></quotas>
</yandex>
"""
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        with open(self.root / "stderr.log", "ab") as err:
            self.proc = subprocess.Popen(
                [SERVER, f"--config-file={self.root}/config.xml"],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.root / "stderr.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"clickhouse-server exited {self.proc.returncode}: {log}")
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as r:
                    if r.read().strip() == b"Ok.":
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("clickhouse-server did not answer /ping in 60 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def running_server(root: Path) -> Iterator[ClickHouseServer]:
    if not os.access(SERVER, os.X_OK):
        pytest.skip("clickhouse-server is not installed (apt-get install clickhouse-server)")
    srv = ClickHouseServer(root)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


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


def counts(backend: HttpBackend | ChdbBackend, table: str = "ms_flow_rollup") -> tuple[int, int]:
    (row,) = backend.query(f"SELECT count() AS n, uniqExact(flow_id) AS u FROM {table}")
    return int(row["n"]), int(row["u"])


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


# -- the embedded store (chDB) --------------------------------------------------------


@pytest.fixture
def chdb_ok() -> None:
    pytest.importorskip("chdb", reason="chDB is not installed (pip install chdb)")


@dataclass
class Cfg:
    data_dir: str | None = None
    url: str | None = None
    user: str = "default"
    password_file: str | None = None
    database: str = "default"
    batch_rows: int = 1000
    flush_interval: float = 0.2
    spool_max_bytes: int = 1 << 24


@pytest.mark.usefixtures("chdb_ok")
def test_chdb_persists_across_reopen(tmp_path: Path) -> None:
    data = tmp_path / "store"
    backend = open_backend(Cfg(data_dir=str(data)))
    assert isinstance(backend, ChdbBackend)
    sink = BatchingSink(backend, spool_dir=str(data / "spool"), batch_rows=1000)
    try:
        sink.write_rollups(rollups(0, 2500))
        sink.write_stacks([(1, (Frame("/bin/x", "main", "x.c", 3, 4096),))])
        wait_stored(sink, 30)
        assert holder_pid(data) == os.getpid()
    finally:
        sink.close()
    assert holder_pid(data) is None
    again = ChdbBackend(data)
    again.open()  # the schema applied once more
    try:
        assert counts(again) == (2500, 2500)
        (row,) = again.query("SELECT functions FROM ms_callstacks")
        assert row == {"functions": ["main"]}
    finally:
        again.close()


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.usefixtures("chdb_ok")
def test_chdb_in_use_names_the_holder(tmp_path: Path) -> None:
    data = tmp_path / "store"
    data.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(data / ".meridian-sentinel.lock")],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"held\n"
        assert holder_pid(data) == child.pid
        holder = re.escape(f"in use by another process (pid {child.pid})")
        with pytest.raises(StoreUnavailable, match=holder):
            ChdbBackend(data).open()
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.usefixtures("chdb_ok")
def test_chdb_corrupt_dir_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "store"
    first = ChdbBackend(data)
    first.open()
    first.close()
    # damage the catalog: the database's metadata link becomes a directory of garbage
    meta = data / "metadata" / "default"
    meta.unlink() if meta.is_symlink() else shutil.rmtree(meta)
    meta.mkdir()
    (meta / "ms_flow_rollup.sql").write_text("garbage (((")
    reporter = Reporter(err=io.StringIO())
    sink = BatchingSink(
        ChdbBackend(data), spool_dir=str(tmp_path / "spool"), reporter=reporter, max_backoff=0.1
    )
    try:
        for i in range(5):
            sink.write_rollups(rollups(i * 10, 10))  # never raises
            sink.flush(timeout=1.0)
        st = sink.stats()
        assert st.spooled_rows == 50 and st.flush_errors >= 1
        (line,) = reporter.lines
        assert f"embedded store {data} cannot be used: " in line
        assert "--data-dir" in line and "\n" not in line
    finally:
        sink.close()
    with pytest.raises(StoreUnavailable) as err:
        ChdbBackend(data).open()
    assert "\n" not in str(err.value) and len(str(err.value)) < 600
    # a data directory that is a file, a database that is not a name: said at start
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is not a directory"):
        open_backend(Cfg(data_dir=str(tmp_path / "file")))
    with pytest.raises(UsageError, match=r"clickhouse\.database"):
        open_backend(Cfg(data_dir=str(data), database="a;DROP"))
