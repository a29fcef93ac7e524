"""Syscall events for the tests of the `meridian syscalls` model: starts and ends of
named threads at T0 + index µs, and a recorder of a log's changes. The tests print
times in UTC (the `utc` fixture of conftest.py)."""

from __future__ import annotations

from typing import Any

from meridian.tools.syscalls.event import Syscall
from meridian.tools.syscalls.full_log import Log

T0 = 1_700_000_000_000_000_000  # 2023-11-14 22:13:20 UTC


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
