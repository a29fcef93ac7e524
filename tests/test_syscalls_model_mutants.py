"""The log model of `meridian syscalls` (full_log.py, compact.py, filtered.py) where
mutation testing found it untested (issue 36): listeners that unsubscribe, dropping
the front one row at a time and twice in a row, event lookups at position 0 and past
a drop, the execve pairing's limits, what an end copies onto its start, the outputs a
compact row takes from its end, and the FilteredLog calls the TUI makes (narrow,
row_of, close)."""

from __future__ import annotations

import pytest
from syscall_events import end, event, start

from meridian.tools.syscalls.compact import CompactLog, merge
from meridian.tools.syscalls.event import Syscall
from meridian.tools.syscalls.filtered import FilteredLog
from meridian.tools.syscalls.filters import Match, PidFilter, TextFilter
from meridian.tools.syscalls.full_log import Aggregator, Log, Source


def _closes(n: int) -> Aggregator:
    """`n` close calls of thread 7, each start paired with its end: events 0..2n-1."""
    agg = Aggregator()
    for i in range(n):
        agg.add(start(2 * i, "a", 7, "close", (str(i),)))
        agg.add(end(2 * i + 1, "a", 7, "close", 0))
    return agg


class _Seen:
    """What a log told its listeners, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def appended(self, pos: int) -> None:
        self.calls.append(("appended", pos))

    def modified(self, pos: int) -> None:
        self.calls.append(("modified", pos))

    def dropped(self, first: int) -> None:
        self.calls.append(("dropped", first))


# ---- full_log: Notifier, Rows, Log ---------------------------------------------------


def test_unsubscribe_stops_only_the_listener_that_subscribed_with_that_function() -> None:
    """A view being replaced unsubscribes; the views that stay must still be told."""
    log = Log()
    gone, kept = _Seen(), _Seen()
    log.subscribe(gone.appended, gone.modified, gone.dropped)
    log.subscribe(kept.appended, kept.modified, kept.dropped)
    log.unsubscribe(gone.appended)
    log.append(start(0, "a", 1, "read"))
    log.modified(0)
    assert gone.calls == []
    assert kept.calls == [("appended", 0), ("modified", 0)]


def test_reading_a_dropped_row_names_the_row_and_the_oldest_held() -> None:
    """The IndexError of a dropped row says which row and what is still held."""
    agg = _closes(3)
    agg.drop_before(3)
    with pytest.raises(IndexError, match=r"^row 2 was dropped \(oldest held: 3\)$"):
        agg.log[2]


def test_dropping_twice_moves_first_by_what_each_drop_forgot() -> None:
    """Positions stay absolute across drops: the second drop counts from the first's end."""
    agg = _closes(4)  # positions 0..7
    log = agg.log
    seen = _Seen()
    log.subscribe(seen.appended, seen.modified, seen.dropped)
    log.drop_before(2)
    log.drop_before(5)
    assert (log.first, len(log)) == (5, 8)
    assert [sc.index for sc in log] == [5, 6, 7]
    assert seen.calls == [("dropped", 2), ("dropped", 5)]
    assert [log.position(i) for i in range(8)] == [-1, -1, -1, -1, -1, 5, 6, 7]


def test_dropping_one_row_drops_it_and_dropping_none_tells_no_one() -> None:
    """A drop of exactly one row happens; a drop of nothing (at or before `first`, or
    of a log already dropped there) sends no `dropped`."""
    agg = _closes(2)
    log = agg.log
    seen = _Seen()
    log.subscribe(seen.appended, seen.modified, seen.dropped)
    log.drop_before(1)
    assert (log.first, [sc.index for sc in log]) == (1, [1, 2, 3])
    log.drop_before(1)
    log.drop_before(0)
    assert seen.calls == [("dropped", 1)]
    log.drop_before(99)  # past the end: everything, once
    assert (log.first, len(log), list(log)) == (4, 4, [])
    assert seen.calls == [("dropped", 1), ("dropped", 4)]


def test_by_index_finds_the_row_at_position_zero_and_after_a_drop() -> None:
    """`by_index` is how an end's start and a start's end are found: position 0 is a
    row like any other, and after a drop a row is found at its new place in memory."""
    agg = _closes(3)
    log = agg.log
    assert log.by_index(0) is log.rows[0]
    assert log.by_index(99) is None  # never logged
    agg.drop_before(2)
    assert log.by_index(1) is None  # dropped
    assert log.by_index(2) is log.rows[0]
    assert log.by_index(5) is log.rows[3]


def test_result_row_of_a_start_whose_end_the_log_does_not_hold_is_none() -> None:
    """A result filter on the full log asks for the start's end; a start naming an
    end that is not in the log has no result yet (and must not raise)."""
    log = Log()
    sc = start(0, "a", 1, "read")
    sc.end_index = 7
    log.append(sc)
    assert log.result_row(sc) is None


# ---- full_log: Aggregator ------------------------------------------------------------


def test_an_aggregator_fills_the_log_it_is_given() -> None:
    """The TUI and the plain view hand the Aggregator the log their views follow."""
    log = Log()
    agg = Aggregator(log)
    agg.add(start(0, "a", 1, "read"))
    assert agg.log is log and [sc.index for sc in log] == [0]


def test_exit_group_closes_the_call_left_open_on_its_thread() -> None:
    """A start whose end was lost stays pending until the thread exits: exit_group
    takes it out of the in-progress calls."""
    agg = Aggregator()
    agg.add(start(0, "a", 7, "read"))
    agg.add(start(1, "b", 8, "poll"))
    agg.add(start(2, "a", 7, "exit_group", ("0",)))
    assert agg.pending == {8: 1}
    assert [sc.index for sc in agg.open_calls()] == [1]


def test_every_end_without_a_start_is_counted() -> None:
    """`unmatched_ends` counts them all, not only whether there was one."""
    agg = Aggregator()
    agg.add(end(0, "a", 7, "read", 1))
    agg.add(end(1, "a", 7, "write", 1))
    agg.add(end(2, "b", 8, "close", 0))
    assert agg.unmatched_ends == 3


def test_a_path_read_at_entry_is_not_replaced_by_the_ends_copy() -> None:
    """The end's arguments fill a start only when the end holds more paths than the
    start could read; a start with as many paths keeps its own."""
    agg = Aggregator()
    args = ("AT_FDCWD", '"/a"', "O_RDONLY")
    agg.add(start(0, "cat", 5, "openat", args, paths=("/a",)))
    agg.add(end(1, "cat", 5, "openat", 3, args=("AT_FDCWD", '"/b"', "O_RDONLY"), paths=("/b",)))
    assert (agg.log[0].args, agg.log[0].paths) == (args, ("/a",))


def test_the_fd_path_of_the_end_fills_only_a_start_without_one() -> None:
    """The fd's path resolved at exit goes to a start that had none; a start's own
    path stays; an end without one leaves the start's as it was."""
    agg = Aggregator()
    agg.add(event(0, "a", 7, "read", None, is_start=True))
    agg.add(event(1, "a", 7, "read", None, is_end=True, have_result=True, fd_path="/x"))
    agg.add(event(2, "a", 7, "read", None, is_start=True, fd_path="/own"))
    agg.add(event(3, "a", 7, "read", None, is_end=True, have_result=True, fd_path="/other"))
    agg.add(event(4, "a", 7, "read", None, is_start=True, fd_path="/kept"))
    agg.add(event(5, "a", 7, "read", None, is_end=True, have_result=True))
    assert [agg.log[p].fd_path for p in (0, 2, 4)] == ["/x", "/own", "/kept"]


def test_a_call_that_returns_zero_on_another_thread_does_not_pair_by_pid() -> None:
    """Only a successful execve or execveat may end on another thread of the process:
    a close returning 0 on another thread is an end of its own."""
    agg = Aggregator()
    agg.add(start(0, "a", 11, "close", ("3",), pid=10))
    agg.add(end(1, "a", 12, "close", 0, pid=10))
    assert (agg.log[0].end_index, agg.log[1].start_index) == (-1, -1)
    assert agg.pending == {11: 0} and agg.unmatched_ends == 1


def test_a_successful_execveat_from_a_thread_pairs_on_the_leader() -> None:
    """execveat replaces the process like execve: its end comes on the leader's TID."""
    agg = Aggregator()
    agg.add(start(0, "sh", 11, "execveat", ("3", '""'), pid=10))
    agg.add(end(1, "true", 10, "execveat", 0, pid=10))
    assert (agg.log[0].end_index, agg.log[1].start_index) == (1, 0)
    assert agg.pending == {}


def test_an_execve_pairs_only_with_a_start_of_its_own_process() -> None:
    """A successful execve with nothing pending on its thread looks for an execve of
    the same PID: another process's pending execve, or another call of the same
    process, is not its start."""
    agg = Aggregator()
    agg.add(start(0, "sh", 20, "execve", ('"/bin/a"',)))  # process 20
    agg.add(start(1, "sh", 11, "read", ("3",), pid=10))  # process 10, not an execve
    agg.add(end(2, "true", 10, "execve", 0, pid=10))
    assert agg.log[2].start_index == -1
    assert (agg.log[0].end_index, agg.log[1].end_index) == (-1, -1)
    assert agg.pending == {20: 0, 11: 1}


def test_a_call_open_at_the_drop_position_stays_pending() -> None:
    """`drop_before(pos)` keeps the row at `pos`, so a start there still gets its end."""
    agg = _closes(1)
    agg.add(start(2, "a", 7, "read", ("3",)))
    agg.drop_before(2)
    assert agg.pending == {7: 2}
    agg.add(end(3, "a", 7, "read", 5))
    assert (agg.log[2].end_index, agg.log[3].start_index) == (3, 2)


# ---- compact.py ------------------------------------------------------------------------


def test_a_merged_row_has_no_joined_text_of_its_start() -> None:
    """A text filter built the start's joined text; the compact row's text differs
    (result, duration) and must be built again: `hay` is None, not empty."""
    sc = start(0, "cat", 5, "read", ("3",))
    sc.hay = "cat\n5\n5\nread\n3\n?"
    assert merge(sc, None).hay is None
    assert merge(sc, end(1, "cat", 5, "read", 4)).hay is None


def test_a_merged_rows_duration_is_zero_when_the_end_is_not_later() -> None:
    """An end stamped at the start's time (or before it) gives 0 ns, not 1 ns."""
    sc = start(0, "a", 5, "read")
    same, earlier = end(1, "a", 5, "read", 1), end(2, "a", 5, "read", 1)
    same.timestamp_ns = sc.timestamp_ns
    earlier.timestamp_ns = sc.timestamp_ns - 5
    assert merge(sc, same).duration_ns == 0
    assert merge(sc, earlier).duration_ns == 0


def test_a_merged_row_takes_only_the_output_arguments_from_the_end() -> None:
    """fstat's struct stat is known at exit: the compact row shows the end's; its
    fd, an input, stays the start's even when the end's text differs."""
    sc = start(0, "a", 5, "fstat", ("3", "0x7ffd0"))
    e = end(1, "a", 5, "fstat", 0, args=("3</x>", "{st_mode=S_IFREG|0644, st_size=10}"))
    assert merge(sc, e).args == ("3", "{st_mode=S_IFREG|0644, st_size=10}")


def test_arguments_past_the_signature_are_the_starts() -> None:
    """pipe has one argument kind: a second argument is not an output."""
    sc = start(0, "a", 5, "pipe", ("0x7ffd0", "extra"))
    e = end(1, "a", 5, "pipe", 0, args=("[3, 4]", "other"))
    assert merge(sc, e).args == ("[3, 4]", "extra")


def test_an_end_whose_arguments_do_not_line_up_leaves_the_starts() -> None:
    """An end with another number of arguments (or none) is not merged into them."""
    sc = start(0, "a", 5, "pipe2", ("0x7ffd0", "O_CLOEXEC"))
    assert merge(sc, end(1, "a", 5, "pipe2", 0, args=("[3, 4]",))).args == sc.args
    assert merge(sc, end(1, "a", 5, "pipe2", 0)).args == sc.args


def test_a_compact_log_built_after_a_drop_starts_at_the_full_logs_first_row() -> None:
    """The TUI builds the compact view over a full log that may have dropped rows."""
    agg = _closes(3)
    agg.drop_before(2)
    compact = CompactLog(agg.log)
    assert [r.index for r in compact] == [2, 4]
    assert (compact.first, len(compact)) == (0, 2)


def test_dropping_one_compact_row_and_an_orphan_ends_row() -> None:
    """A drop of one row drops it; an end without a start has a row but no start
    position, and dropping it must not fail; the dropped starts are forgotten."""
    agg = Aggregator()
    compact = CompactLog(agg.log)
    agg.add(end(0, "a", 7, "read", 1))  # orphan end: row 0
    agg.add(start(1, "a", 7, "close", ("3",)))  # row 1
    agg.add(end(2, "a", 7, "close", 0))
    agg.add(start(3, "a", 7, "close", ("4",)))  # row 2
    agg.add(end(4, "a", 7, "close", 0))
    agg.drop_before(1)
    assert (compact.first, [r.index for r in compact]) == (1, [1, 3])
    agg.drop_before(3)
    assert (compact.first, [r.index for r in compact]) == (2, [3])
    assert compact._row_of == {3: 2}


def test_an_end_after_a_drop_updates_its_own_compact_row() -> None:
    """After the front was dropped, row numbers are absolute: the end of a call still
    open changes that call's row, not another."""
    agg = _closes(2)  # rows 0, 1 (events 0..3)
    compact = CompactLog(agg.log)
    agg.add(start(4, "a", 7, "read", ("3",)))  # row 2
    agg.add(start(5, "b", 8, "read", ("4",)))  # row 3
    seen = _Seen()
    compact.subscribe(seen.appended, seen.modified, seen.dropped)
    agg.drop_before(2)
    assert compact.first == 1
    agg.add(end(6, "a", 7, "read", 9))
    assert seen.calls == [("dropped", 1), ("modified", 2)]
    assert [(r.index, r.result, r.is_open) for r in compact] == [
        (2, 0, False),
        (4, 9, False),
        (5, 0, True),
    ]


def test_an_open_compact_row_has_no_result_row() -> None:
    """A result filter on the compact log looks at the row itself: open, no result."""
    agg = Aggregator()
    compact = CompactLog(agg.log)
    agg.add(start(0, "a", 7, "read"))
    agg.add(end(1, "b", 8, "read", 4))
    assert compact.result_row(compact[0]) is None
    assert compact.result_row(compact[1]) is compact[1]


def test_row_of_index_finds_starts_ends_and_orphans_or_minus_one() -> None:
    """The TUI follows an event to its compact row: a start and its end are the same
    row, an orphan end has its own, row numbers count from `first`, and an event not
    held (never logged, dropped, or an end whose start was dropped) has -1."""
    agg = Aggregator()
    compact = CompactLog(agg.log)
    agg.add(start(0, "a", 7, "read", ("3",)))  # row 0
    agg.add(start(1, "b", 8, "close", ("3",)))  # row 1
    agg.add(end(2, "a", 7, "read", 1))
    agg.add(end(3, "c", 9, "write", 1))  # orphan: row 2
    agg.add(end(4, "d", 10, "poll", 1))  # orphan: row 3
    agg.add(end(5, "b", 8, "close", 0))
    assert [compact.row_of_index(i) for i in range(6)] == [0, 1, 0, 2, 3, 1]
    assert compact.row_of_index(99) == -1
    agg.drop_before(1)  # read's start goes: its end (2) stays in the full log
    assert compact.first == 1
    assert [compact.row_of_index(i) for i in range(6)] == [-1, 1, -1, 2, 3, 1]


# ---- filtered.py -------------------------------------------------------------------


def test_a_closed_view_no_longer_follows_its_source() -> None:
    """The TUI closes the view it replaces: rows appended later do not reach it."""
    agg = Aggregator()
    view = FilteredLog(agg.log)
    changes: list[tuple[str, int]] = []
    view.on_change(lambda what, row: changes.append((what, row)))
    agg.add(start(0, "a", 7, "read"))
    view.close()
    agg.add(start(1, "b", 8, "read"))
    assert view.visible == [0] and changes == [("appended", 0)]


def test_set_filter_after_a_drop_looks_only_at_the_rows_held() -> None:
    """A new filter on a log whose front was dropped starts at `first`."""
    agg = _closes(3)
    agg.drop_before(3)
    view = FilteredLog(agg.log)
    view.set_filter(TextFilter("close"))
    assert view.visible == [3, 4, 5]


def test_narrow_rechecks_the_visible_rows_and_keeps_the_filter_for_new_ones() -> None:
    """A narrower filter only looks at what was visible, and the rows appended after
    it are checked with it."""
    agg = Aggregator()
    view = FilteredLog(agg.log, TextFilter("ca"))
    agg.add(start(0, "cat", 7, "openat", ('"/a"',)))
    agg.add(start(1, "ls", 8, "openat", ('"/b"',)))
    agg.add(start(2, "scan", 9, "close", ("3",)))
    assert view.visible == [0, 2]
    narrower = TextFilter("cat")
    view.narrow(narrower)
    assert view.filter is narrower and view.visible == [0]
    agg.add(start(3, "scan", 7, "close", ("4",)))
    agg.add(start(4, "cat", 9, "read", ("4",)))
    assert view.visible == [0, 4]


def test_row_of_gives_the_visible_row_of_a_position_or_minus_one() -> None:
    """A hidden position, one before, between or past the visible ones is -1."""
    agg = Aggregator()
    view = FilteredLog(agg.log, PidFilter([8]))
    for i, tid in enumerate((7, 8, 7, 8, 7)):
        agg.add(start(i, "a", tid, "read"))
    assert view.visible == [1, 3]
    assert [view.row_of(p) for p in range(6)] == [-1, 0, -1, 1, -1, -1]


def test_a_visible_row_that_changes_and_still_matches_is_reported_modified() -> None:
    """A start that gets its end and still matches: the view says "modified" and its
    row, so the screen redraws that line."""
    agg = Aggregator()
    view = FilteredLog(agg.log, PidFilter([7]))
    changes: list[tuple[str, int]] = []
    view.on_change(lambda what, row: changes.append((what, row)))
    agg.add(start(0, "a", 8, "read"))
    agg.add(start(1, "a", 7, "read"))
    agg.add(end(2, "a", 7, "read", 3))
    assert changes == [("appended", 0), ("appended", 1), ("modified", 0)]


class _SourceSeen:
    """A filter that matches everything and records the source it is handed."""

    def __init__(self) -> None:
        self.sources: list[object] = []

    def matches(self, sc: Syscall, source: Source) -> bool:
        return True

    def get_matches(self, sc: Syscall, source: Source) -> list[Match]:
        self.sources.append(source)
        return [Match("name", 0, len(sc.name))]


def test_matches_hands_the_filter_the_views_source() -> None:
    """A filter's spans may depend on the log (a result held by another row)."""
    agg = Aggregator()
    flt = _SourceSeen()
    view = FilteredLog(agg.log, flt)
    agg.add(start(0, "a", 7, "read"))
    assert view.matches(0) == [Match("name", 0, 4)]
    assert flt.sources == [agg.log]
