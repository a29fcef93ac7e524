"""The Mortadelo model of `meridian syscalls` without a kernel: the examples of
docs/requirements/syscalls.md (interleaved threads, an end without a start, execve,
exit_group) in the Aggregator, and the compact log over it."""

from __future__ import annotations

import pytest
from syscall_events import Recorded, end, start

from meridian.tools.syscalls.compact import CompactLog
from meridian.tools.syscalls.filtered import FilteredLog
from meridian.tools.syscalls.filters import ResultFilter, TextFilter
from meridian.tools.syscalls.full_log import Aggregator
from meridian.tools.syscalls.render import compact_line, field_text, full_line

pytestmark = pytest.mark.usefixtures("utc")


# ---- the Aggregator: the table of docs/requirements/syscalls.md --------------------


def test_interleaved_threads_pair_both_ways() -> None:
    agg = Aggregator()
    seen = Recorded(agg.log)
    agg.add(start(0, "cat", 812, "open", ('"/etc/passwd"', "O_RDONLY"), paths=("/etc/passwd",)))
    agg.add(start(1, "nautilus", 900, "stat", ('"/home/username"', "0x7ffd0")))
    agg.add(end(2, "nautilus", 900, "stat", 0))
    agg.add(end(3, "cat", 812, "open", 42))
    rows = agg.log.rows
    assert [(r.index, r.is_start, r.end_index, r.is_end, r.start_index) for r in rows] == [
        (0, True, 3, False, -1),
        (1, True, 2, False, -1),
        (2, False, -1, True, 1),
        (3, False, -1, True, 0),
    ]
    assert seen.appended == [0, 1, 2, 3]
    assert seen.modified == [1, 0]  # each start row changed when its end arrived
    assert not rows[0].have_result and rows[3].have_result
    assert agg.pending == {}


def test_end_without_start_keeps_minus_one() -> None:
    agg = Aggregator()
    agg.add(end(0, "cat", 812, "read", 5))
    agg.add(start(1, "cat", 812, "close", ("3",)))
    agg.add(end(2, "cat", 812, "close", 0))
    assert agg.log[0].start_index == -1
    assert agg.unmatched_ends == 1
    assert (agg.log[1].end_index, agg.log[2].start_index) == (2, 1)
    compact = CompactLog(agg.log)
    assert [(r.index, r.is_start, r.is_end, r.result) for r in compact] == [
        (0, False, True, 5),
        (1, True, True, 0),
    ]
    assert compact_line(compact[0]) == "22:13:20.000000 cat(812:812) read(...) = 5"


def test_end_of_another_call_does_not_pair() -> None:
    """A drop lost read's end and write's start: neither pairs."""
    agg = Aggregator()
    agg.add(start(0, "cat", 7, "read"))
    agg.add(end(1, "cat", 7, "write", 3))
    assert (agg.log[0].end_index, agg.log[1].start_index) == (-1, -1)
    assert agg.pending == {}


def test_exit_group_stays_open() -> None:
    agg = Aggregator()
    compact = CompactLog(agg.log)
    agg.add(start(0, "prog", 50, "exit_group", ("0",)))
    assert agg.pending == {}
    assert compact[0].is_open and compact[0].no_return
    assert compact_line(compact[0]) == "22:13:20.000000 prog(50:50) exit_group(0) = ?"
    assert field_text(compact[0], "result") == "?"


def test_execve_pairs_also_from_another_thread() -> None:
    agg = Aggregator()
    # A failed execve returns normally.
    agg.add(start(0, "sh", 10, "execve", ('"/nope"',)))
    agg.add(end(1, "sh", 10, "execve", -2, "-2 ENOENT"))
    # A successful one from a non-leader thread: the end arrives on the leader's TID.
    agg.add(start(2, "sh", 11, "execve", ('"/bin/true"',), pid=10))
    agg.add(end(3, "true", 10, "execve", 0, pid=10))
    assert [(r.start_index, r.end_index) for r in agg.log] == [(-1, 1), (0, -1), (-1, 3), (2, -1)]
    compact = CompactLog(agg.log)
    assert [c.result_text for c in compact] == ["-2 ENOENT", "0"]
    # A successful execve whose start came before capture: an end alone.
    agg.add(end(4, "ls", 99, "execve", 0))
    assert agg.log[4].start_index == -1


def test_path_read_at_exit_fills_the_start() -> None:
    agg = Aggregator()
    seen = Recorded(agg.log)
    agg.add(start(0, "cat", 5, "openat", ("AT_FDCWD", "0x5555", "O_RDONLY")))
    agg.add(
        end(
            1,
            "cat",
            5,
            "openat",
            3,
            args=("AT_FDCWD", '"/etc/passwd"', "O_RDONLY"),
            paths=("/etc/passwd",),
        )
    )
    assert agg.log[0].args == ("AT_FDCWD", '"/etc/passwd"', "O_RDONLY")
    assert agg.log[0].paths == ("/etc/passwd",)
    assert seen.modified == [0]


# ---- compact log -------------------------------------------------------------------


def test_compact_log_merges_and_updates_live() -> None:
    agg = Aggregator()
    compact = CompactLog(agg.log)
    changes: list[tuple[str, int]] = []
    compact.subscribe(
        lambda p: changes.append(("appended", p)), lambda p: changes.append(("modified", p))
    )
    agg.add(start(0, "cat", 812, "openat", ("AT_FDCWD", '"/etc/passwd"', "O_RDONLY")))
    assert compact[0].is_open and compact_line(compact[0]).endswith("= ?")
    agg.add(start(1, "ls", 813, "close", ("3",)))
    agg.add(end(9, "cat", 812, "openat", 3))
    assert changes == [("appended", 0), ("appended", 1), ("modified", 0)]
    row = compact[0]
    assert (row.is_start, row.is_end, row.start_index, row.end_index) == (True, True, 0, 9)
    assert row.duration_ns == 9000
    assert compact_line(row) == (
        '22:13:20.000000 cat(812:812) openat(AT_FDCWD, "/etc/passwd", O_RDONLY) = 3 <9us>'
    )
    assert len(compact) == 2
    assert compact.row_of_index(9) == 0 and compact.row_of_index(1) == 1


def test_dropping_the_front_keeps_positions_and_views_in_step() -> None:
    agg = Aggregator()
    compact = CompactLog(agg.log)
    failed = FilteredLog(compact, ResultFilter([]))
    changes: list[tuple[str, int]] = []
    failed.on_change(lambda what, row: changes.append((what, row)))
    agg.add(start(0, "cat", 7, "openat", ('"/a"',)))
    agg.add(end(1, "cat", 7, "openat", -2, "-2 ENOENT"))
    agg.add(start(2, "ls", 8, "stat", ('"/b"',)))  # still open at the cut
    agg.add(start(3, "cat", 7, "openat", ('"/c"',)))
    agg.add(end(4, "cat", 7, "openat", -2, "-2 ENOENT"))
    assert [compact[p].index for p in failed.visible] == [0, 3]
    agg.drop_before(3)
    log = agg.log
    assert (log.first, len(log), [sc.index for sc in log]) == (3, 5, [3, 4])
    assert log[3].index == 3 and log.position(0) == -1
    with pytest.raises(IndexError):
        log[2]
    assert compact.first == 2 and [r.index for r in compact] == [3]
    assert failed.visible == [2] and changes[-1] == ("dropped", 1)
    assert failed[0].index == 3
    agg.add(end(5, "ls", 8, "stat", 0))  # its start was dropped: an end on its own
    assert log[5].start_index == -1 and [r.index for r in compact] == [3, 5]


def test_text_filter_sees_a_row_change_after_it_was_matched() -> None:
    """Rows keep their joined text for the next filter; a start that gets its end
    (its result "?" becomes "") is matched on its new text."""
    agg = Aggregator()
    still_open = FilteredLog(agg.log, TextFilter("?"))
    agg.add(start(0, "cat", 7, "openat", ('"/a"',)))
    assert still_open.visible == [0] and agg.log[0].hay is not None
    agg.add(end(1, "cat", 7, "openat", 3, "3"))
    assert still_open.visible == []


def test_compact_of_a_full_log_built_earlier() -> None:
    agg = Aggregator()
    agg.add(start(0, "a", 1, "close", ("3",)))
    agg.add(end(1, "a", 1, "close", 0))
    assert [r.index for r in CompactLog(agg.log)] == [0]


def test_full_lines() -> None:
    agg = Aggregator()
    agg.add(start(0, "cat", 812, "close", ("3</etc/passwd>",)))
    agg.add(end(1, "cat", 812, "close", 0))
    assert full_line(agg.log[0]) == (
        "#0 22:13:20.000000 cat(812:812) close(3</etc/passwd>) ... [end #1]"
    )
    assert full_line(agg.log[1]) == "#1 22:13:20.000001 cat(812:812) close() = 0 [start #0]"
