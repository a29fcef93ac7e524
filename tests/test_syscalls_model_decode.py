"""Decoding and formatting of `meridian syscalls` without a kernel: open flags,
arguments, results, times and durations, and the syscall number table."""

from __future__ import annotations

from pathlib import Path

import pytest
from syscall_events import T0

from meridian.errors import UsageError
from meridian.tools.syscalls.decode import decode_args, decode_result, open_flags, quote
from meridian.tools.syscalls.numbers import BY_NAME, FILE_SYSCALLS, NUMBERS, generate, resolve_names
from meridian.tools.syscalls.render import fmt_duration, fmt_time

pytestmark = pytest.mark.usefixtures("utc")


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
