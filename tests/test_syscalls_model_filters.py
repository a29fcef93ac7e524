"""The filters of `meridian syscalls` without a kernel: substrings and their case rule,
regular expressions, results, PIDs, syscalls and paths, and the spans they match."""

from __future__ import annotations

import pytest
from syscall_events import cat_opens, end, start

from meridian.errors import UsageError
from meridian.tools.syscalls.compact import CompactLog
from meridian.tools.syscalls.filtered import FilteredLog
from meridian.tools.syscalls.filters import (
    AllOf,
    Match,
    PathFilter,
    PidFilter,
    ResultFilter,
    SyscallFilter,
    TextFilter,
)
from meridian.tools.syscalls.full_log import Aggregator

pytestmark = pytest.mark.usefixtures("utc")


def _sample() -> Aggregator:
    agg = Aggregator()
    agg.add(cat_opens(0, "/etc/passwd"))
    agg.add(end(1, "cat", 812, "openat", 3))
    agg.add(cat_opens(2, "/nope/Missing"))
    agg.add(end(3, "cat", 812, "openat", -2, "-2 ENOENT"))
    agg.add(start(4, "Nautilus", 900, "stat", ('"/home/PASSWD"', "0x1"), paths=("/home/PASSWD",)))
    return agg


def test_substring_spans_and_case_rule() -> None:
    agg = _sample()
    f = FilteredLog(agg.log, TextFilter("pen"))
    assert [r.index for r in f] == [0, 1, 2, 3]
    assert f.matches(0) == [Match("name", 1, 3)]
    # all lower case: any case
    f.set_filter(TextFilter("passwd"))
    assert [r.index for r in f] == [0, 4]
    assert f.matches(0) == [Match("arguments", 16, 6)]
    assert f.matches(1) == [Match("arguments", 7, 6)]
    # a capital: exact case
    f.set_filter(TextFilter("PASSWD"))
    assert [r.index for r in f] == [4]
    f.set_filter(TextFilter("nautilus"))
    assert f.matches(0) == [Match("comm", 0, 8)]


def test_regex_spans() -> None:
    agg = _sample()
    f = FilteredLog(agg.log, TextFilter(r"/\w+/", regex=True, fields=("arguments",)))
    assert [r.index for r in f] == [0, 2, 4]
    assert f.matches(1) == [Match("arguments", 11, 6)]  # "/nope/" in AT_FDCWD, "/nope/Missing"
    with pytest.raises(UsageError, match="bad regular expression"):
        TextFilter("(", regex=True)


def test_result_filter_matches_the_start_when_the_end_arrives() -> None:
    agg = Aggregator()
    f = FilteredLog(agg.log, ResultFilter())
    changes: list[tuple[str, int]] = []
    f.on_change(lambda what, row: changes.append((what, row)))
    agg.add(start(0, "cat", 1, "openat", ("AT_FDCWD", '"/nope"', "O_RDONLY")))
    assert len(f) == 0
    agg.add(end(1, "cat", 1, "openat", -2, "-2 ENOENT"))
    assert [r.index for r in f] == [0, 1]
    assert changes == [("appended", 0), ("inserted", 0)]
    assert f.matches(0) == []  # the start row has no result text
    assert f.matches(1) == [Match("result", 0, 9)]
    f.set_filter(ResultFilter(["eacces"]))
    assert len(f) == 0
    f.set_filter(ResultFilter(["ENOENT"]))
    assert len(f) == 2


def test_result_filter_on_compact_rows() -> None:
    agg = _sample()
    compact = CompactLog(agg.log)
    f = FilteredLog(compact, ResultFilter())
    assert [r.index for r in f] == [2]
    assert f.matches(0) == [Match("result", 0, 9)]


def test_pid_syscall_path_filters() -> None:
    agg = _sample()
    compact = CompactLog(agg.log)
    f = FilteredLog(compact, PidFilter([900]))
    assert [r.index for r in f] == [4]
    assert f.matches(0) == [Match("pid", 0, 3), Match("tid", 0, 3)]
    f.set_filter(SyscallFilter(["stat", "close"]))
    assert [r.index for r in f] == [4] and f.matches(0) == [Match("name", 0, 4)]
    f.set_filter(PathFilter("etc"))
    assert [r.index for r in f] == [0]
    assert f.matches(0) == [Match("arguments", 12, 3)]
    f.set_filter(AllOf([SyscallFilter(["openat"]), ResultFilter()]))
    assert [r.index for r in f] == [2]
    assert f.matches(0) == [Match("name", 0, 6), Match("result", 0, 9)]


def test_filter_removes_a_row_that_stops_matching() -> None:
    agg = Aggregator()
    compact = CompactLog(agg.log)
    f = FilteredLog(compact, TextFilter("?", fields=("result",)))
    agg.add(start(0, "a", 1, "close", ("3",)))
    assert len(f) == 1
    changes: list[tuple[str, int]] = []
    f.on_change(lambda what, row: changes.append((what, row)))
    agg.add(end(1, "a", 1, "close", 0))
    assert len(f) == 0 and changes == [("removed", 0)]
