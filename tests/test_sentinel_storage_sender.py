"""ClickHouse storage of meridian sentinel: the batcher's exactly-once and spool logic,
against a fake store (sentinel_store.FakeStore) that can be down, slow, or lose its
answers, and that keeps a batch inserted twice twice, as ClickHouse does."""

from __future__ import annotations

import errno
import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sentinel_store import FakeStore, rollups, say_lines, wait_stored

from meridian.tools.sentinel.storage import BatchInfo, BatchingSink, Reporter
from meridian.tools.sentinel.storage.sender import Sender
from meridian.tools.sentinel.storage.spool import Spool
from meridian.tools.sentinel.storage.writer import StoreWriter


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
        assert sorted(i.rows for i, _ in store.batches) == [100, 100]
        while len(store.batches) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(i.rows for i, _ in store.batches) == [50, 100, 100]
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
        assert store.duplicates == 0
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


def wait_spooled(sink: BatchingSink, rows: int, timeout: float) -> float:
    """Seconds until `rows` rows are on disk and none in memory (fails after timeout)."""
    start = time.monotonic()
    while True:
        st = sink.stats()
        if st.spooled_rows == rows and st.pending_rows == 0:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, st
        time.sleep(0.005)


def test_a_hung_store_leaves_every_row_on_disk(tmp_path: Path) -> None:
    store = FakeStore()
    store.gate.clear()  # an insert that never answers (a server that hangs)
    sink, _ = fake_sink(tmp_path, store, flush_interval=0.1)
    try:
        for i in range(10):
            sink.write_rollups(rollups(i * 100, 100))  # returns at once
        wait_spooled(sink, 1000, 2.0)  # the batch being sent is on disk too
        store.gate.set()
        wait_stored(sink, 10)
        assert store.flows() == list(range(1000))
    finally:
        store.gate.set()
        sink.close()


def test_rows_reach_disk_within_a_flush_interval_during_a_long_backoff(tmp_path: Path) -> None:
    """The store is down and the next try a minute away: rows written meanwhile are not
    held in memory until then."""
    store = FakeStore()
    store.down = True
    sink, _ = fake_sink(tmp_path, store, flush_interval=0.2, max_backoff=60.0)
    try:
        sink.write_rollups(rollups(0, 10))
        assert not sink.flush(timeout=5.0)  # tried, down
        sink.sender.next_try = sink.clock() + 60.0
        for i in range(1, 6):
            sink.write_rollups(rollups(i * 10, 10))
            assert wait_spooled(sink, 10 * (i + 1), 2.0) < 1.0  # within the interval (+ CI)
        assert store.inserts == 0
    finally:
        sink.close()


def test_commit_spools_at_once(tmp_path: Path) -> None:
    store = FakeStore()
    store.gate.clear()
    sink, _ = fake_sink(tmp_path, store, flush_interval=3600.0)
    try:
        sink.write_rollups(rollups(0, 10))
        time.sleep(0.3)
        assert sink.stats().pending_rows == 10  # a partial batch waits for the interval
        assert sink.commit()  # returns once the rows are on disk
        st = sink.stats()
        assert st.spooled_rows == 10 and st.pending_rows == 0
    finally:
        store.gate.set()
        sink.close()


def test_a_disk_that_does_not_keep_up_drops_rows_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FakeStore()
    sink, reporter = fake_sink(tmp_path, store, max_pending_rows=250)
    disk, entered = threading.Event(), threading.Event()
    write = sink.spool._write

    def hung(*args: Any) -> int:
        entered.set()
        disk.wait(30)
        return write(*args)

    monkeypatch.setattr(sink.spool, "_write", hung)
    try:
        sink.write_rollups(rollups(0, 100))
        assert entered.wait(5)  # the spooler is stuck writing the first batch
        t0 = time.monotonic()
        for i in range(1, 10):
            sink.write_rollups(rollups(i * 100, 100))  # never waits for the disk
        assert time.monotonic() - t0 < 1.0
        st = sink.stats()
        # 100 being written and 100 in memory fit under 250; the other 800 are dropped
        assert st.pending_rows == 200 and st.dropped_rows == 800
        (line,) = say_lines(reporter, "does not keep up")
        assert "[100 rows dropped in all]" in line  # said once, at the first drop
        disk.set()
        wait_stored(sink, 10)
        assert store.flows() == list(range(200))
    finally:
        disk.set()
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
        assert store.flows() == list(range(150)) and store.duplicates == 0
    finally:
        again.close()


def test_a_store_that_is_down_is_tried_with_backoff_up_to_max_backoff(tmp_path: Path) -> None:
    """Doubling from 0.25 s within the jitter (±20%) up to max_backoff, nothing tried
    before it is due, and back to 0.25 s once the store answered."""
    store = FakeStore()
    store.down = True
    clock = [100.0]
    spool = Spool(tmp_path / "spool", 1 << 20)
    sender = Sender(store, spool, Reporter(err=io.StringIO()), 2.0, lambda: clock[0])
    for n in range(8):
        clock[0] = sender.next_try
        assert not sender.ensure_open()
        nominal = min(0.25 * 2**n, 2.0)
        wait = sender.next_try - clock[0]  # a difference of floats: 2.0 can be 2.0000...04
        assert 0.8 * nominal - 1e-9 <= wait <= min(1.2 * nominal, 2.0) + 1e-9
    opens = store.inserts
    clock[0] = sender.next_try - 0.01
    store.down = False
    assert not sender.ensure_open()  # not due yet: not even tried
    clock[0] += 0.01
    assert sender.ensure_open() and sender.stats(0).flush_errors == 8
    store.down = True
    sender.to_spool(BatchInfo("flows", 1, 1, 0, 0), b"{}\n")
    sender.drain(time_budget=1.0)  # fails: stays in the spool
    assert 0.2 <= sender.next_try - clock[0] <= 0.3
    assert store.inserts == opens + 1 and len(spool) == 1


def test_the_metrics_say_stored_spooled_unsent_and_dropped(tmp_path: Path) -> None:
    store = FakeStore()
    store.down = True
    sink, _ = fake_sink(tmp_path, store, spool_max_bytes=40_000)
    writer = StoreWriter(sink, symbols=None, flow_name=lambda _: None)  # type: ignore[arg-type]

    def metrics() -> dict[str, float]:
        out: dict[str, float] = {}
        for family in writer.families():
            for point in family.points:
                out[family.name] = out.get(family.name, 0) + point.value  # type: ignore[union-attr]
        return out

    try:
        for i in range(4):
            sink.write_rollups(rollups(i * 100, 100))
            sink.commit()
        got = metrics()
        spooled = got["ms_clickhouse_spooled_rows"]
        assert 0 < spooled < 400  # the spool holds what fits in 40 kB, the rest is dropped
        assert got["ms_clickhouse_dropped_rows"] == 400 - spooled
        assert got["ms_clickhouse_backlog_rows"] == spooled
        assert got["ms_clickhouse_rows_written"] == 0 and got["ms_clickhouse_connected"] == 0
        store.down = False
        wait_stored(sink, 10)
        got = metrics()
        assert got["ms_clickhouse_rows_written"] == spooled and got["ms_clickhouse_connected"] == 1
        assert got["ms_clickhouse_spooled_rows"] == got["ms_clickhouse_backlog_rows"] == 0
    finally:
        sink.close()
