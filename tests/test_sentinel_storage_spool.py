"""The spool and the sender, stepped by hand (no threads, a clock of our own) against
the strict fake store: every batch stored once across a restart and a lost answer, a
spool that never grows past spool_max_bytes, and the rows of a batch stored in part
counted as dropped. Each test guards one bookkeeping rule a bug once broke unseen."""

from __future__ import annotations

import io
import json
from pathlib import Path

from sentinel_store import FakeStore

from meridian.tools.sentinel.storage import BatchInfo, Reporter
from meridian.tools.sentinel.storage.schema import FLOWS, ROLLUP
from meridian.tools.sentinel.storage.sender import MAX_REJECTS, Sender
from meridian.tools.sentinel.storage.spool import Spool

RUN = 77
DAY = 20_000  # an epoch day
T0 = DAY * 86_400 * 1_000_000_000 + 3_600 * 1_000_000_000  # ns, in that day


def batch(table: str, batch_id: int, n: int, first: int = 0) -> tuple[BatchInfo, bytes]:
    """A batch as the batcher forms it: its id opens every line; a rollup row carries
    its time, the others their run."""
    lines = []
    for flow in range(first, first + n):
        row = {"batch_id": batch_id, "flow_id": flow, "run_id": RUN}
        if table == ROLLUP:
            row["time_bucket"] = T0
        lines.append(json.dumps(row) + "\n")
    day = DAY if table == ROLLUP else 0
    return BatchInfo(table, batch_id, n, day, RUN), "".join(lines).encode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sender(spool: Spool, store: FakeStore, clock: Clock) -> Sender:
    return Sender(store, spool, Reporter(err=io.StringIO()), 0.5, clock)


def drain(s: Sender, clock: Clock, rounds: int = 10) -> None:
    """What the sender thread does: drain, and after a failure, once the backoff is
    over, drain again."""
    for _ in range(rounds):
        if not len(s.spool):
            return
        clock.now = max(clock.now, s.next_try)
        s.drain(time_budget=5.0)


def test_a_batch_stored_just_before_a_crash_is_not_stored_again_after_the_restart(
    tmp_path: Path,
) -> None:
    """An agent killed between the store's answer and the unlink leaves a batch that
    is stored: the next run on the spool takes its oldest batch as uncertain, looks
    for it, finds it, and removes it without a second insert."""
    store = FakeStore()
    first = Spool(tmp_path, 1 << 20)
    stored, payload = batch(ROLLUP, 11, 40)
    assert first.put(stored, payload)
    assert first.put(*batch(ROLLUP, 12, 30, first=40))
    store.insert(stored, payload)  # the killed agent's insert: it got this far
    first.close()  # no pop: the crash

    again = Spool(tmp_path, 1 << 20)
    got = again.peek()
    assert got is not None and got[0].info == stored and got[0].uncertain
    assert again.inherited_rows == 70
    clock = Clock()
    s = sender(again, store, clock)
    s.drain(time_budget=5.0)  # one drain: found, removed, and the next sent
    assert len(again) == 0
    assert store.duplicates == 0 and store.inserts == 2  # the killed agent's, and batch 12
    assert store.flows() == list(range(70))
    st = s.stats(0)
    assert st.rows_written == 70 and st.dropped_rows == 0 and st.flush_errors == 0
    assert not s.reporter.lines  # found whole: nothing said, nothing "stored in part"


def test_a_batch_left_unsent_by_a_crash_is_stored_once_after_the_restart(
    tmp_path: Path,
) -> None:
    """The same restart when the store lacks the oldest batch: looked for, not found,
    sent, once; only the oldest batch is uncertain."""
    store = FakeStore()
    first = Spool(tmp_path, 1 << 20)
    assert first.put(*batch(FLOWS, 21, 5))
    assert first.put(*batch(FLOWS, 22, 6, first=5))
    first.close()

    again = Spool(tmp_path, 1 << 20)
    got = again.peek()
    assert got is not None and got[0].uncertain
    clock = Clock()
    s = sender(again, store, clock)
    drain(s, clock)
    assert len(again) == 0 and store.duplicates == 0 and store.inserts == 2
    assert store.flows(FLOWS) == list(range(11))
    assert s.stats(0).rows_written == 11


def test_a_lost_answer_makes_the_batch_uncertain_so_it_is_looked_for_not_sent_again(
    tmp_path: Path,
) -> None:
    """The connection broke after the rows went out (StoreUnavailable.ambiguous): the
    store has them. The retry looks first, and the batch is stored once; the mark is
    on disk, so a restart before the retry looks first too."""
    store = FakeStore()
    store.fail = ["lost-answer"]
    spool = Spool(tmp_path, 1 << 20)
    clock = Clock()
    s = sender(spool, store, clock)
    s.to_spool(*batch(ROLLUP, 31, 25))
    s.drain(time_budget=5.0)  # the insert: stored, no answer
    assert len(spool) == 1 and store.inserts == 1
    spool.close()
    head = json.loads((next(tmp_path.glob("*.batch"))).read_bytes().split(b"\n", 1)[0])
    assert head["uncertain"] is True
    again = Spool(tmp_path, 1 << 20)
    s = sender(again, store, clock)
    drain(s, clock)
    assert len(again) == 0 and store.inserts == 1 and store.duplicates == 0
    assert s.stats(0).rows_written == 25


def test_a_lost_answer_then_a_retry_in_the_same_run_stores_the_batch_once(
    tmp_path: Path,
) -> None:
    """The lost answer without a restart: the entry in memory is uncertain too."""
    store = FakeStore()
    store.fail = ["lost-answer", "down"]
    spool = Spool(tmp_path, 1 << 20)
    clock = Clock()
    s = sender(spool, store, clock)
    s.to_spool(*batch(ROLLUP, 41, 10))
    s.to_spool(*batch(ROLLUP, 42, 10, first=10))
    drain(s, clock)
    assert len(spool) == 0 and store.duplicates == 0
    assert store.flows() == list(range(20))
    st = s.stats(0)
    assert st.rows_written == 20 and st.flush_errors == 2 and st.dropped_rows == 0


def test_the_spool_never_holds_more_than_spool_max_bytes(tmp_path: Path) -> None:
    """Checked after every append, on its count (never less than the files hold): a
    batch that would take the spool past its bound is refused (and counted dropped
    by the sender), also when the spool is just under it."""
    limit = 20_000
    spool = Spool(tmp_path, limit)
    clock = Clock()
    store = FakeStore()
    store.down = True
    s = sender(spool, store, clock)
    taken = refused = 0
    for i in range(30):
        info, payload = batch(ROLLUP, 100 + i, 20 + i % 7, first=1000 * i)
        before = s.stats(0).dropped_rows
        s.to_spool(info, payload)
        if s.stats(0).dropped_rows == before:
            taken += 1
        else:
            refused += 1
            assert s.stats(0).dropped_rows == before + info.rows
        in_files = sum(p.stat().st_size for p in tmp_path.glob("*.batch"))
        assert in_files <= spool.bytes <= limit, (i, spool.bytes, in_files)
    assert taken >= 3 and refused > 0
    assert f"storage spool {tmp_path} is full (19.5 KiB, " in spool.last_error
    assert spool.bytes > limit // 2  # it did fill up


def test_a_batch_stored_in_part_counts_its_missing_rows_dropped(tmp_path: Path) -> None:
    """The insert broke between its blocks (half the rows stored) and its answer was
    lost: the lookup finds half, those are counted stored, the other half dropped,
    and the batch is not sent again (that would store the first half twice)."""
    store = FakeStore()
    store.fail = ["partial-lost"]
    spool = Spool(tmp_path, 1 << 20)
    clock = Clock()
    reporter = Reporter(err=io.StringIO())
    s = Sender(store, spool, reporter, 0.5, clock)
    s.to_spool(*batch(ROLLUP, 51, 30))
    s.to_spool(*batch(FLOWS, 52, 8))
    drain(s, clock)
    assert len(spool) == 0 and store.inserts == 2 and store.duplicates == 0
    st = s.stats(0)
    assert st.dropped_rows == 15 and st.rows_written == 15 + 8
    assert st.rows_by_table[ROLLUP] == 15 and st.rows_by_table[FLOWS] == 8
    assert any("stored in part (15 of 30 rows)" in line for line in reporter.lines)


def put_each(spool: Spool, batches: list[tuple[BatchInfo, bytes]]) -> list[int]:
    """Each batch into the spool (each taken); the bytes each one added."""
    sizes = []
    for info, payload in batches:
        before = spool.bytes
        assert spool.put(info, payload)
        sizes.append(spool.bytes - before)
    return sizes


def test_the_spool_counts_follow_its_files_as_batches_leave(tmp_path: Path) -> None:
    """Its bytes and rows are those of the batches it holds, after a batch leaves as
    after one arrives; a batch stored leaves no file behind (a restart would send it
    again); one drain sends every batch a store that answers takes."""
    spool = Spool(tmp_path, 1 << 20)
    sizes = put_each(spool, [batch(ROLLUP, 60 + i, 10 + i, first=100 * i) for i in range(3)])
    got = spool.peek()
    assert got is not None
    spool.pop(got[0])
    files = sorted(tmp_path.glob("*.batch"))
    assert len(files) == len(spool) == 2
    assert spool.bytes == sizes[1] + sizes[2] and spool.rows == 11 + 12
    store, clock = FakeStore(), Clock()
    s = sender(spool, store, clock)
    s.drain(time_budget=5.0)
    assert len(spool) == 0 and spool.bytes == 0 and spool.rows == 0
    assert not list(tmp_path.glob("*.batch"))
    st = s.stats(0)
    assert st.batches_written == 2 and st.rows_written == 23 and st.spool_bytes == 0


def test_a_batch_the_store_rejects_is_dropped_counted_and_the_next_is_stored(
    tmp_path: Path,
) -> None:
    """Rows the store refuses for what they are (code 27: cannot parse) would block
    the spool forever: the batch is tried MAX_REJECTS times, then dropped and counted,
    and the batch behind it goes. A store that is down never drops a batch."""
    store = FakeStore()
    spool = Spool(tmp_path, 1 << 20)
    clock = Clock()
    s = sender(spool, store, clock)
    bad = BatchInfo(FLOWS, 71, 2, 0, RUN)
    s.to_spool(bad, b'{"batch_id":71,"flow_id":1,"run_id":77}\nnot json\n')
    s.to_spool(*batch(FLOWS, 72, 4))
    drain(s, clock)
    assert len(spool) == 0 and store.inserts == MAX_REJECTS + 1
    st = s.stats(0)
    assert st.dropped_rows == 2 and st.rows_written == 4 and st.flush_errors == MAX_REJECTS
    assert store.flows(FLOWS) == list(range(4))
    (line,) = [line for line in s.reporter.lines if "rejected" in line]
    assert f"rejected a batch of 2 rows of {FLOWS} {MAX_REJECTS} times" in line

    store.down = True
    s.to_spool(*batch(FLOWS, 73, 3))
    drain(s, clock, rounds=2 * MAX_REJECTS)
    assert len(spool) == 1 and s.stats(0).dropped_rows == 2  # kept for when it is back


def test_a_spool_file_lost_under_the_agent_counts_its_rows_dropped(tmp_path: Path) -> None:
    """A batch whose file cannot be read any more is counted dropped, said, and the
    spool goes on with the next."""
    store = FakeStore()
    spool = Spool(tmp_path, 1 << 20)
    clock = Clock()
    s = sender(spool, store, clock)
    s.to_spool(*batch(FLOWS, 81, 5))
    s.to_spool(*batch(FLOWS, 82, 6, first=5))
    sorted(tmp_path.glob("*.batch"))[0].unlink()
    s.drain(time_budget=5.0)
    assert len(spool) == 0 and spool.bytes == 0 and spool.rows == 0
    st = s.stats(0)
    assert st.dropped_rows == 5 and st.rows_written == 6
    assert store.flows(FLOWS) == list(range(5, 11))
    assert "No such file or directory" in st.last_error


def test_a_reopened_spool_counts_what_its_files_hold_and_sets_the_unreadable_aside(
    tmp_path: Path,
) -> None:
    """The next run on a spool: its bytes, rows and inherited rows are those of the
    whole batch files left (as the last run counted them); a file that cannot be
    read is set aside as .bad (once, counted, said by the sender) and a half-written
    .tmp removed, neither stopping the scan; a new batch takes a number after every
    file's, so no batch left is overwritten."""
    first = Spool(tmp_path, 1 << 20)
    sizes = put_each(first, [batch(FLOWS, 90 + i, 4 + i, first=10 * i) for i in range(3)])
    first.close()
    files = sorted(tmp_path.glob("*.batch"))
    files[1].write_bytes(b"not a header\n")  # unreadable, between two good ones
    (tmp_path / "0000000000000009.tmp").write_bytes(b"half")
    again = Spool(tmp_path, 1 << 20)
    kept = sorted(tmp_path.glob("*.batch"))
    assert kept == [files[0], files[2]] and len(again) == 2
    assert again.bytes == sizes[0] + sizes[2]
    assert again.rows == again.inherited_rows == 4 + 6
    assert again.unreadable == 1 and files[1].with_suffix(".bad").exists()
    assert not list(tmp_path.glob("*.tmp"))
    assert again.put(*batch(FLOWS, 99, 1, first=99))
    assert len(list(tmp_path.glob("*.batch"))) == len(again) == 3
    s = sender(again, FakeStore(), Clock())
    assert any("1 unreadable spool files" in line for line in s.reporter.lines)
    s.drain(time_budget=5.0)
    assert s.stats(0).rows_written == 4 + 6 + 1 and len(again) == 0


def test_the_spool_counts_the_disk_blocks_du_counts(tmp_path: Path) -> None:
    """Small batches (a quiet node's) take a whole block each: the spool's size, and so
    spool_max_bytes, is what `du` and a kubelet's emptyDir sizeLimit measure, not the
    sum of the files' sizes (which was 1/10 of it for 1-row batches)."""
    spool = Spool(tmp_path, 1 << 20)
    for i in range(20):
        assert spool.put(*batch(ROLLUP, 200 + i, 1, first=i))
    on_disk = sum(p.stat().st_blocks * 512 for p in tmp_path.glob("*.batch"))
    in_files = sum(p.stat().st_size for p in tmp_path.glob("*.batch"))
    assert spool.bytes == on_disk > 4 * in_files
    spool.close()
    assert Spool(tmp_path, 1 << 20).bytes == on_disk  # reopened: counted the same way
