"""The Mortadelo model of `meridian syscalls` without a kernel: the seed's examples
(interleaved threads, an end without a start, execve, exit_group), the compact log,
filters and their spans, decoding, formatting, record and replay."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meridian.errors import UsageError
from meridian.tools.syscalls.compact import CompactLog
from meridian.tools.syscalls.decode import decode_args, decode_result, open_flags, quote
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
from meridian.tools.syscalls.fmt import (
    compact_line,
    field_text,
    fmt_duration,
    fmt_time,
    full_line,
)
from meridian.tools.syscalls.log import Aggregator, Log
from meridian.tools.syscalls.numbers import BY_NAME, FILE_SYSCALLS, NUMBERS, generate, resolve_names
from meridian.tools.syscalls.record import Syscall
from meridian.tools.syscalls.recording import Recorder, read_events

T0 = 1_700_000_000_000_000_000  # 2023-11-14 22:13:20 UTC


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


Strings = tuple[str, ...]


def event(index: int, comm: str, tid: int, name: str, pid: int | None, **fields: Any) -> Syscall:
    """Event `index` of thread `tid` (of process `pid`, else its own) at T0 + index µs."""
    return Syscall(index, name, T0 + index * 1000, comm, tid if pid is None else pid, tid, **fields)


def start(
    index: int, comm: str, tid: int, name: str, args: Strings = (), pid: int | None = None,
    paths: Strings = (), raw: tuple[int, ...] = (),
) -> Syscall:  # fmt: skip
    return event(index, comm, tid, name, pid, args=args, paths=paths, raw=raw, is_start=True)


def end(
    index: int, comm: str, tid: int, name: str, result: int, text: str = "",
    pid: int | None = None, args: Strings = (), paths: Strings = (),
) -> Syscall:  # fmt: skip
    return event(
        index, comm, tid, name, pid, args=args, paths=paths, result=result, have_result=True,
        result_text=text or str(result), is_end=True,
    )  # fmt: skip


def cat_opens(index: int, path: str, raw: tuple[int, ...] = ()) -> Syscall:
    """The start of `cat` (812) opening `path` read-only."""
    args = ("AT_FDCWD", f'"{path}"', "O_RDONLY")
    return start(index, "cat", 812, "openat", args, paths=(path,), raw=raw)


class Recorded:
    def __init__(self, log: Log) -> None:
        self.appended: list[int] = []
        self.modified: list[int] = []
        log.subscribe(self.appended.append, self.modified.append)


# ---- the Aggregator: the seed's table ----------------------------------------------


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


# ---- filters -----------------------------------------------------------------------


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


# ---- decoding and formatting ---------------------------------------------------------


def test_open_flags() -> None:
    assert open_flags(0) == "O_RDONLY"
    assert open_flags(0o2000000) == "O_RDONLY|O_CLOEXEC"
    assert open_flags(0o1101) == "O_WRONLY|O_CREAT|O_TRUNC"
    assert open_flags(0o4010002) == "O_RDWR|O_SYNC"
    assert open_flags(0o20200002) == "O_RDWR|O_TMPFILE"
    assert open_flags(0o200000 | 0o20000000000) == "O_RDONLY|O_DIRECTORY|0x80000000"


def test_decode_args() -> None:
    at = (-100) & 0xFFFFFFFFFFFFFFFF
    assert decode_args("openat", (at, 0x1000, 0o2000000, 0, 0, 0), {1: "/etc/passwd"}) == (
        "AT_FDCWD",
        '"/etc/passwd"',
        "O_RDONLY|O_CLOEXEC",
    )
    assert decode_args("openat", (3, 0x1000, 0o1101, 0o644, 0, 0), {1: "x"}, "/tmp") == (
        "3</tmp>",
        '"x"',
        "O_WRONLY|O_CREAT|O_TRUNC",
        "0644",
    )
    assert decode_args("read", (3, 0x7FFD0, 4096, 0, 0, 0), {}, "/etc/passwd") == (
        "3</etc/passwd>",
        "0x7ffd0",
        "4096",
    )
    assert decode_args("openat", (at, 0xDEAD, 0, 0, 0, 0), {1: None}) == (
        "AT_FDCWD",
        "0xdead",
        "O_RDONLY",
    )
    assert decode_args("faccessat2", (at, 1, 6, 0x100, 0, 0), {1: "/a"}) == (
        "AT_FDCWD",
        '"/a"',
        "R_OK|W_OK",
        "AT_SYMLINK_NOFOLLOW",
    )
    assert decode_args("lseek", (3, -1 & (2**64 - 1), 2), {}) == ("3", "-1", "SEEK_END")
    assert decode_args("mmap", (0, 4096, 1, 2, 3, 0), {}, "/lib/x.so") == (
        "NULL",
        "4096",
        "PROT_READ",
        "MAP_PRIVATE",
        "3</lib/x.so>",
        "0",
    )
    assert decode_args("renameat2", (at, 1, at, 2, 1, 0), {1: "a", 3: "b"}) == (
        "AT_FDCWD",
        '"a"',
        "AT_FDCWD",
        '"b"',
        "RENAME_NOREPLACE",
    )
    assert decode_args("getpid", (1, 2, 3, 4, 5, 6), {})[0] == "0x1"


def test_decode_result_and_quote() -> None:
    assert decode_result("openat", -2 & (2**64 - 1)) == "-2 ENOENT"
    assert decode_result("openat", -13) == "-13 EACCES"
    assert decode_result("read", 42) == "42"
    assert decode_result("mmap", 0x7F0000001000) == "0x7f0000001000"
    assert decode_result("mmap", -12) == "-12 ENOMEM"
    assert quote('a"b\\c\n\x01') == '"a\\"b\\\\c\\n\\x01"'


def test_time_and_duration() -> None:
    assert fmt_time(T0 + 269_753_123) == "22:13:20.269753"
    assert fmt_duration(9_999) == "9us" and fmt_duration(-1) == ""


def test_numbers_table_matches_the_header() -> None:
    header = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    if not header.exists():
        pytest.skip("no <asm/unistd_64.h> here")
    assert generate(header.read_text()) == NUMBERS
    assert BY_NAME["openat"] == 257 and NUMBERS[0] == "read"
    assert {"openat", "read", "renameat2", "execve", "exit_group", "mmap"} <= FILE_SYSCALLS


def test_unknown_syscall_lists_close_matches() -> None:
    assert resolve_names(["openat", " read"]) == ["openat", "read"]
    with pytest.raises(UsageError, match=r"unknown syscall 'opnat'; did you mean openat"):
        resolve_names(["opnat"])
    with pytest.raises(UsageError, match=r"^unknown syscall 'zzzzzz'$"):
        resolve_names(["zzzzzz"])


# ---- record and replay ---------------------------------------------------------------


def _events() -> list[Syscall]:
    return [
        cat_opens(0, "/etc/passwd", raw=(1, 2)),
        start(1, "nautilus", 900, "stat", ('"/home"', "0x1")),
        end(2, "nautilus", 900, "stat", 0),
        end(3, "cat", 812, "openat", 3),
        end(4, "x", 5, "read", -2, "-2 ENOENT"),
        start(5, "x", 5, "exit_group", ("0",)),
    ]


def _compact_lines(events: list[Syscall]) -> list[str]:
    agg = Aggregator()
    compact = CompactLog(agg.log)
    for e in events:
        agg.add(dataclasses.replace(e))
    return [compact_line(r) for r in compact]


def _record(path: Path) -> bytes:
    """_events() recorded as JSON lines at `path`: the file's bytes."""
    with Recorder(path) as rec:
        for e in _events():
            rec.write(e)
    return path.read_bytes()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_record_then_replay_is_identical(tmp_path: Path, suffix: str) -> None:
    if suffix.endswith(".zst") and shutil.which("zstd") is None:
        pytest.skip("no zstd program")
    path = tmp_path / f"rec{suffix}"
    _record(path)
    back = list(read_events(path))
    assert back == _events()
    assert _compact_lines(back) == _compact_lines(_events())


def test_replay_errors_name_the_line(tmp_path: Path) -> None:
    data = _record(tmp_path / "rec.jsonl")
    damaged = {  # file name: (content, the error)
        "cut.jsonl": (data[: len(data) - 10], r"line 7 is truncated"),
        "foreign.jsonl": (
            b'{"event": "slow_io", "disk": "vda"}\n',
            r"line 1 is not a meridian syscalls header",
        ),
        "bad.jsonl": (data.splitlines()[0] + b'\n{"i": 1}\n', r"line 2 is not a syscall event"),
        "empty.jsonl": (b"", r"line 1: empty file"),
    }
    for name, (content, error) in damaged.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UsageError, match=error):
            list(read_events(tmp_path / name))
    with pytest.raises(UsageError, match="does not exist"):
        list(read_events(tmp_path / "nope"))


def test_cut_off_zstd_recording_says_zstd_failed(tmp_path: Path) -> None:
    if shutil.which("zstd") is None:
        pytest.skip("no zstd program")
    path = tmp_path / "rec.jsonl.zst"
    data = _record(path)
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match=r"zstd could not decompress it"):
        list(read_events(cut))
    whole = list(read_events(path))
    assert len(whole) == len(_events())
    first = next(iter(read_events(path)))  # a reader that stops early is no error
    assert first == _events()[0]
