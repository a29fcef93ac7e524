"""Storage's spool and sender where mutants survived (docs/testing.md, "Storage"): the
words said of a spool full, in use, unwritable or lost, and each message's key; the size
estimate at the bound; the restart's odd files; drain's budget; the stats. No threads."""

from __future__ import annotations

import ctypes
import errno
import io
import itertools
import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from sentinel_store import FakeStore

from meridian.errors import EnvironmentProblem
from meridian.tools.sentinel.storage import BatchInfo, Reporter, StoreUnavailable
from meridian.tools.sentinel.storage import sender as sender_module
from meridian.tools.sentinel.storage.schema import FLOWS, TABLES
from meridian.tools.sentinel.storage.sender import MAX_REJECTS, Sender, SinkStats
from meridian.tools.sentinel.storage.spool import Spool, _size

RUN = 77


def batch(batch_id: int, n: int, first: int = 0) -> tuple[BatchInfo, bytes]:
    """A batch of ms_flows rows (found by their run): its id opens every line."""
    lines = [
        json.dumps({"batch_id": batch_id, "flow_id": f, "run_id": RUN}) + "\n"
        for f in range(first, first + n)
    ]
    return BatchInfo(FLOWS, batch_id, n, 0, RUN), "".join(lines).encode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Keyed(Reporter):
    """Says every line (no minute between two of a key) and keeps each one's key."""

    def __init__(self) -> None:
        super().__init__(err=io.StringIO(), interval=0.0)
        self.said: list[tuple[str, str]] = []

    def say(self, key: str, message: str) -> bool:
        self.said.append((key, message))
        return super().say(key, message)


def keyed_sender(spool: Spool, store: FakeStore) -> tuple[Sender, Keyed]:
    """A sender with a clock of its own (at 1000 s) and a Keyed reporter."""
    reporter = Keyed()
    return Sender(store, spool, reporter, 0.5, Clock()), reporter


def due(s: Sender) -> None:
    """Moves the sender's clock to the end of its backoff."""
    cast(Clock, s.clock).now = s.next_try


def retry(s: Sender, drains: int) -> None:
    """What the sender thread does: each drain once the backoff is over."""
    for _ in range(drains):
        due(s)
        s.drain(time_budget=5.0)


def wait_note(directory: Path) -> str:
    return f"; rows wait in the spool {directory}, retried with backoff (at most 0.5 s apart)"


# -- the spool ------------------------------------------------------------------------


def test_a_spool_in_use_is_refused_naming_the_holder_and_the_way_out(tmp_path: Path) -> None:
    """A second agent on the same spool would send its batches twice: it is told who
    holds it and which option gives it its own; once closed (twice is harmless), the
    spool is free for the next run. A directory that cannot be made says the OS's
    words (its strerror, not the errno's repr)."""
    first = Spool(tmp_path, 1 << 20)
    with pytest.raises(EnvironmentProblem) as held:
        Spool(tmp_path, 1 << 20)
    assert str(held.value) == (
        f"storage spool {tmp_path} is in use by another agent (pid {os.getpid()}): "
        "give this one its own (--spool-dir DIR, or clickhouse.spool_dir)"
    )
    assert held.value.__cause__ is None and held.value.__suppress_context__
    first.close()
    fds = len(os.listdir("/proc/self/fd"))
    first.close()  # twice: closes no descriptor (the lock's number may be another's now)
    assert len(os.listdir("/proc/self/fd")) == fds
    Spool(tmp_path, 1 << 20).close()
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(EnvironmentProblem) as bad:
        Spool(tmp_path / "file" / "spool", 1 << 20)
    assert (
        str(bad.value) == f"storage spool {tmp_path}/file/spool cannot be created: Not a directory"
    )
    assert bad.value.__cause__ is None and bad.value.__suppress_context__


def test_a_spool_dir_given_from_home_or_relative_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages and the summary name a directory a user finds from anywhere."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert Spool("~/spool", 4096).dir == tmp_path / "home" / "spool"
    assert Spool("rel", 4096).dir == tmp_path / "rel"


def test_a_new_spool_is_empty_and_numbers_its_files_from_one(tmp_path: Path) -> None:
    """Files are `<seq, 16 digits>.batch`, so their names sort in the order they
    came; the header line holds the batch's info and a certain batch says so."""
    spool = Spool(tmp_path, 1 << 20)
    assert (len(spool), spool.bytes, spool.rows, spool.inherited_rows) == (0, 0, 0, 0)
    assert (spool.unreadable, spool.last_error, spool.max_bytes) == (0, "", 1 << 20)
    assert spool.peek() is None
    info, payload = batch(80, 2)
    assert spool.put(info, payload)
    assert spool.put(*batch(81, 3, first=2))
    names = sorted(p.name for p in tmp_path.glob("*.batch"))
    assert names == ["0000000000000001.batch", "0000000000000002.batch"]
    head = (tmp_path / names[0]).read_bytes().split(b"\n", 1)[0]
    assert json.loads(head) == {
        "info": {"table": FLOWS, "batch_id": 80, "rows": 2, "day": 0, "run_id": RUN},
        "uncertain": False}  # fmt: skip
    got = spool.peek()
    assert got is not None and got[1] == payload
    assert (got[0].seq, got[0].info, got[0].size, got[0].uncertain) == (1, info, 4096, False)


def test_a_batch_fits_when_its_estimate_reaches_the_bound_not_past_it(tmp_path: Path) -> None:
    """The estimate is the payload plus 256 bytes of header, in 4 KiB blocks: in a
    spool of one block a payload 256 bytes short of it fits, exactly filling it, and
    one byte more does not; the message names the bound and the setting."""
    spool = Spool(tmp_path, 4096)
    info = BatchInfo(FLOWS, 1, 1, 0, RUN)
    assert not spool.put(info, b"x" * 3841)
    full = f"storage spool {tmp_path} is full (4.0 KiB, clickhouse.spool_max_bytes)"
    assert spool.last_error == full
    assert len(spool) == 0 and not list(tmp_path.glob("*.batch"))
    assert spool.put(info, b"x" * 3840)
    assert spool.bytes == 4096 and spool.rows == 1
    assert not spool.put(info, b"")


def test_sizes_are_said_in_bytes_kib_mib_or_gib() -> None:
    """The bound in the "is full" message, in the unit a user sets it in."""
    assert [_size(n) for n in (0, 1023, 1024, 1536)] == ["0 B", "1023 B", "1.0 KiB", "1.5 KiB"]
    assert [_size(n) for n in (5 * 2**20 + 2**19, 2**30, 3 * 2**40)] == [
        "5.5 MiB", "1.0 GiB", "3072.0 GiB"
    ]  # fmt: skip


def test_a_write_that_fails_leaves_no_file_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: the half-written temporary file is removed, nothing is counted, the
    reason is the OS's words (or the error's own, when it has no strerror), and the
    batch number is not used up."""
    spool = Spool(tmp_path, 1 << 20)

    errors = [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), OSError("the disk went away")]

    def failing(fd: int) -> None:
        raise errors.pop(0)

    monkeypatch.setattr(os, "fsync", failing)
    assert not spool.put(*batch(1, 4))
    assert spool.last_error == f"storage spool {tmp_path}: No space left on device"
    assert not spool.put(*batch(1, 4))
    assert spool.last_error == f"storage spool {tmp_path}: the disk went away"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]
    assert (len(spool), spool.bytes, spool.rows) == (0, 0, 0)
    monkeypatch.undo()
    assert spool.put(*batch(1, 4))
    assert [p.name for p in tmp_path.glob("*.batch")] == ["0000000000000001.batch"]


def test_a_reopened_spool_keeps_each_batchs_mark_and_numbers_after_the_last(
    tmp_path: Path,
) -> None:
    """The `uncertain` in each header is read back (the oldest is taken as uncertain
    whatever it says); a new batch is numbered after the highest file, not after the
    count of files."""
    first = Spool(tmp_path, 1 << 20)
    for i in range(4):
        assert first.put(*batch(i + 1, 1, first=i), uncertain=i == 1)
    first.close()
    (tmp_path / "0000000000000003.batch").unlink()
    again = Spool(tmp_path, 1 << 20)
    assert again.put(*batch(5, 1, first=4))
    assert (tmp_path / "0000000000000005.batch").exists()
    flags = []
    while (got := again.peek()) is not None:
        flags.append(got[0].uncertain)
        again.pop(got[0])
    assert flags == [True, True, False, False]


def test_files_that_cannot_be_set_aside_or_removed_do_not_stop_the_spool(tmp_path: Path) -> None:
    """An unreadable batch whose `.bad` name is taken by a directory stays where it is,
    counted unreadable as every other; a `.tmp` that is a directory stays too: the
    spool opens all the same, and a write in its way fails with the reason, no raise."""
    bad = tmp_path / "0000000000000003.batch"
    bad.write_bytes(b"not a header\n")
    (tmp_path / "0000000000000003.bad").mkdir()
    (tmp_path / "abc.batch").write_bytes(b"{}\n")
    (tmp_path / "0000000000000001.tmp").mkdir()
    spool = Spool(tmp_path, 1 << 20)
    assert spool.unreadable == 2 and len(spool) == 0 and spool.bytes == 0
    assert bad.exists() and (tmp_path / "abc.bad").exists()
    assert not spool.put(*batch(1, 1))
    assert spool.last_error == f"storage spool {tmp_path}: Is a directory"
    assert (tmp_path / "0000000000000001.tmp").is_dir()


def test_a_batch_counts_the_blocks_allocated_to_its_file_beyond_its_size(tmp_path: Path) -> None:
    """Blocks a file system allocated past the end of a file (preallocation) are
    counted, as `du` counts them."""
    first = Spool(tmp_path, 1 << 20)
    assert first.put(*batch(1, 1))
    first.close()
    path = next(tmp_path.glob("*.batch"))
    fd = os.open(path, os.O_RDWR)
    try:  # fallocate(FALLOC_FL_KEEP_SIZE): 16 KiB allocated, the size kept
        assert ctypes.CDLL(None).fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(16384)) == 0
    finally:
        os.close(fd)
    assert path.stat().st_size < 4096 and path.stat().st_blocks * 512 == 16384
    assert Spool(tmp_path, 1 << 20).bytes == 16384


def test_marking_a_batch_uncertain_rewrites_its_header_and_only_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark is on disk (a restart looks for the batch too) with the payload kept;
    a batch marked already is not written again; a write that fails still hands the
    caller a marked entry."""
    spool = Spool(tmp_path, 1 << 20)
    assert spool.put(*batch(1, 2))
    assert spool.put(*batch(2, 3, first=2))
    got = spool.peek()
    assert got is not None
    entry, payload = got
    new = spool.mark_uncertain(entry, payload)
    assert new == replace(entry, uncertain=True)
    assert spool.peek() == (new, payload)
    lines = (tmp_path / "0000000000000001.batch").read_bytes().split(b"\n", 1)
    assert json.loads(lines[0])["uncertain"] is True and lines[1] == payload

    def broken(*args: object) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(spool, "_write", broken)
    assert spool.mark_uncertain(new, payload) is new
    spool.pop(new)
    second = spool.peek()
    assert second is not None and not second[0].uncertain  # the other one is not marked
    assert spool.mark_uncertain(second[0], second[1]) == replace(second[0], uncertain=True)
    assert spool.peek() == (replace(second[0], uncertain=True), second[1])  # kept in memory


# -- the sender -----------------------------------------------------------------------


def test_stats_carry_every_count_and_where_the_spool_is(tmp_path: Path) -> None:
    """What the metrics, the status and the summary read: the rows an earlier run left,
    the spool's directory, whether connected, and a copy of the per-table counts."""
    first = Spool(tmp_path, 1 << 20)
    assert first.put(*batch(1, 2))
    assert first.put(*batch(2, 3, first=2))
    first.close()
    spool = Spool(tmp_path, 1 << 20)
    s, _ = keyed_sender(spool, FakeStore())
    zero = dict.fromkeys(TABLES, 0)
    expected = SinkStats("fake://store", False, 0, 0, 0, 0, 7, 5, 8192, "", str(tmp_path), 5, zero)
    before = s.stats(7)
    assert before == expected
    s.drain(time_budget=5.0)
    assert s.stats(0) == replace(
        expected, connected=True, rows_written=5, batches_written=2, pending_rows=0,
        spooled_rows=0, spool_bytes=0, rows_by_table={**zero, FLOWS: 5},
    )  # fmt: skip
    assert before.rows_by_table == zero  # a snapshot, not the live counts


def test_the_summary_says_stored_dropped_unsent_and_where_they_wait() -> None:
    """The run's last words on storage (--json, and the text a user reads)."""
    st = SinkStats("fake://store", True, 90, 3, 2, 4, 6, 10, 8192, "x", "/var/spool", 12)
    assert st.backlog_rows == 16
    assert st.summary() == {
        "backend": "fake://store", "stored_rows": 90, "inherited_rows": 12, "unsent_rows": 16,
        "dropped_rows": 4, "flush_errors": 2, "spool_dir": "/var/spool",
    }  # fmt: skip
    assert st.summary_lines() == [
        "storage: 90 rows stored in fake://store (12 left by an earlier run), 4 dropped, 16 unsent",
        "storage: the 16 unsent rows wait in /var/spool; the next `meridian sentinel` on "
        "that spool (the same store, or --spool-dir) sends them first",
    ]
    done = SinkStats("fake://store", True, 90, 3, 2, 4, 0, 0, 0, "")
    assert (done.spool_dir, done.inherited_rows, done.rows_by_table) == ("", 0, {})
    assert done.summary_lines() == ["storage: 90 rows stored in fake://store, 4 dropped, 0 unsent"]


def test_connecting_counts_each_try_and_says_the_notice_and_the_recovery(tmp_path: Path) -> None:
    """`attempts` counts the connects tried (the sink waits for the first), not those
    skipped while backing off or connected; a store's notice is said at connect, and
    "answers again" after a failure, with the rows waiting."""

    class NoticeStore(FakeStore):
        notice = "could not add the seed's column names (ms_flows: comm): no ALTER"

    store = NoticeStore()
    store.down = True
    s, reporter = keyed_sender(Spool(tmp_path, 1 << 20), store)
    s.to_spool(*batch(1, 3))
    assert not s.ensure_open() and (s.attempts, s.connected) == (1, False)
    assert 1000.2 <= s.next_try <= 1000.3
    assert not s.ensure_open() and s.attempts == 1  # backing off: not tried
    due(s)
    store.down = False
    assert s.ensure_open() and (s.attempts, s.connected) == (2, True)
    assert s.ensure_open() and s.attempts == 2  # connected: not tried again
    assert reporter.said == [
        ("unreachable", "fake store is down" + wait_note(tmp_path)),
        ("seed-names", NoticeStore.notice),
        ("recovered", "fake://store answers again; sending 3 spooled rows"),
    ]
    st = s.stats(0)
    assert (st.flush_errors, st.last_error) == (1, "fake store is down" + wait_note(tmp_path))


def test_a_drain_stops_when_its_time_budget_is_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender thread drains in slices (0.5 s) so that it can stop and flush: no
    batch starts once the budget is spent, none with a budget of nothing."""
    store, ticks = FakeStore(), itertools.count()  # each look at the time takes a second
    monkeypatch.setattr(sender_module, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    spool = Spool(tmp_path, 1 << 20)
    s, _ = keyed_sender(spool, store)
    for i in range(5):
        s.to_spool(*batch(i, 1, first=i))
    s.drain(time_budget=0.0)
    assert store.inserts == 0 and s.attempts == 0
    s.drain(time_budget=3.0)  # from 2 s to 5 s: batches start at 3 s and 4 s
    assert store.inserts == 2 and len(spool) == 3
    assert store.flows(FLOWS) == [0, 1]


def test_the_spool_is_sent_when_it_holds_batches_and_the_backoff_is_over(
    tmp_path: Path,
) -> None:
    """When the sender thread wakes: a drain of an empty spool does not connect, and
    one during the backoff sends nothing; connected, a batch is due at once."""
    store = FakeStore()
    s, _ = keyed_sender(Spool(tmp_path, 1 << 20), store)
    s.drain(time_budget=5.0)
    assert s.attempts == 0 and not s.connected and not s.spool_due(1000.0)
    store.down = True
    s.to_spool(*batch(1, 2))
    s.drain(time_budget=5.0)
    store.down = False
    s.drain(time_budget=5.0)  # the backoff is not over
    assert store.inserts == 0 and s.attempts == 1 and len(s.spool) == 1
    assert s.spool_due(s.next_try) and not s.spool_due(s.next_try - 0.01)
    due(s)
    s.drain(time_budget=5.0)
    assert store.inserts == 1 and len(s.spool) == 0 and not s.spool_due(1e9)
    s.to_spool(*batch(2, 1))
    assert s.spool_due(0.0)


class Rejecting(FakeStore):
    """Refuses the next `times` inserts with ClickHouse's `code`, then stores."""

    def __init__(self, code: int | None, times: int = 1 << 30) -> None:
        super().__init__()
        self.code, self.times = code, times

    def insert(self, info: BatchInfo, payload: bytes) -> None:
        if self.times <= 0:
            return super().insert(info, payload)
        self.times -= 1
        self.inserts += 1
        raise StoreUnavailable(f"Code: {self.code}. bad rows", code=self.code)


# ClickHouse's codes for rows wrong for the table (REJECT_CODES), written out: a batch
# refused with one of these would block the spool forever if it were retried
REJECTED = (6, 16, 26, 27, 32, 38, 41, 53, 62, 69, 70, 72, 117)


@pytest.mark.parametrize("code", [*REJECTED, None, 60, 241])
def test_only_the_codes_that_say_the_rows_are_wrong_drop_a_batch(
    tmp_path: Path, code: int | None
) -> None:
    """Such a batch is tried MAX_REJECTS times, then dropped, counted and said; any
    other error (a missing table, memory, no code) is retried for ever."""
    store = Rejecting(code)
    s, reporter = keyed_sender(Spool(tmp_path, 1 << 20), store)
    s.to_spool(*batch(9, 2))
    retry(s, MAX_REJECTS + 2)
    st = s.stats(0)
    if code not in REJECTED:
        assert len(s.spool) == 1 and st.dropped_rows == 0 and store.inserts == MAX_REJECTS + 2
        return
    assert len(s.spool) == 0 and st.dropped_rows == 2 and store.inserts == MAX_REJECTS == 3
    message = (
        f"fake://store rejected a batch of 2 rows of {FLOWS} 3 times (Code: {code}. bad rows); "
        "dropped [2 rows dropped in all]"
    )
    assert reporter.said[-1] == ("rejected", message) and st.last_error == message
    assert st.flush_errors == 3 and reporter.said[0][0] == "server"


def test_a_batch_found_twice_counts_its_rows_once_and_one_found_in_part_says_so(
    tmp_path: Path,
) -> None:
    """An uncertain batch the store holds twice (two agents' inserts) counts its own
    rows only; one stored in part counts the rest dropped, said under its own key."""
    store = FakeStore()
    info, payload = batch(5, 4)
    store.insert(info, payload)
    store.insert(info, payload)
    s, reporter = keyed_sender(Spool(tmp_path, 1 << 20), store)
    s.to_spool(info, payload, uncertain=True)
    s.drain(time_budget=5.0)
    st = s.stats(0)
    assert (st.rows_written, st.batches_written, st.dropped_rows, store.inserts) == (4, 1, 0, 2)
    assert reporter.said == []

    store.fail = ["partial-lost"]
    s.to_spool(*batch(6, 8, first=4))
    retry(s, 2)
    st = s.stats(0)
    assert (st.rows_written, st.batches_written, st.dropped_rows) == (8, 2, 4)
    assert reporter.said == [
        ("unreachable", "fake: no answer" + wait_note(tmp_path)),
        ("recovered", "fake://store answers again; sending 8 spooled rows"),
        (
            "partial",
            f"a batch of {FLOWS} was stored in part (4 of 8 rows) before a failure "
            "[4 rows dropped in all]",
        ),
    ]


def test_what_the_spool_cannot_take_or_lost_is_dropped_and_said_under_its_key(
    tmp_path: Path,
) -> None:
    """A full spool (key "dropped") and an unreadable file (key "spool-read", as the
    files set aside at start) are told apart, each with the running total; a batch
    handed over as uncertain stays uncertain in the spool."""
    (tmp_path / "0000000000000007.batch").write_bytes(b"not a header\n")
    spool = Spool(tmp_path, 8192)
    s, reporter = keyed_sender(spool, FakeStore())
    s.to_spool(*batch(1, 3), uncertain=True)
    s.to_spool(BatchInfo(FLOWS, 2, 6, 0, RUN), b"x" * 8000)
    full = (
        f"storage spool {tmp_path} is full (8.0 KiB, clickhouse.spool_max_bytes): "
        "dropping rows (ms_clickhouse_dropped_rows_total) [6 rows dropped in all]"
    )
    got = spool.peek()
    assert got is not None and got[0].uncertain
    next(tmp_path.glob("*.batch")).unlink()
    s.drain(time_budget=5.0)
    lost = f"storage spool {tmp_path}: No such file or directory [9 rows dropped in all]"
    assert reporter.said == [
        ("spool-read", f"1 unreadable spool files in {tmp_path} set aside as *.bad"),
        ("dropped", full),
        ("spool-read", lost),
    ]
    assert s.stats(0).dropped_rows == 9 and s.stats(0).last_error == lost


def test_a_batchs_reject_count_goes_with_the_batch(tmp_path: Path) -> None:
    """Counted per batch id until the batch is stored or dropped: an agent whose store
    refuses a batch now and then does not keep a count of each for ever."""
    store = Rejecting(27, times=1)
    s, _ = keyed_sender(Spool(tmp_path, 1 << 20), store)
    s.to_spool(*batch(1, 2))
    retry(s, 2)
    assert s.stats(0).rows_written == 2 and s._rejects == {}
    store.times = MAX_REJECTS
    s.to_spool(*batch(2, 3, first=2))
    retry(s, MAX_REJECTS)
    assert s.stats(0).dropped_rows == 3 and len(s.spool) == 0 and s._rejects == {}
