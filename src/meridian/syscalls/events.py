"""Kernel records (struct syscalls_event of bpf/syscalls.h, decoded through BTF) to
Syscall rows. Pure: a record is anything indexable by field name."""

from __future__ import annotations

from typing import Any

from .decode import decode_args, decode_result
from .numbers import NUMBERS
from .record import Syscall
from .signatures import string_positions

__all__ = ["EV_END", "EV_START", "to_syscall"]

EV_START, EV_END = 0, 1  # enum syscalls_kind


def _text(b: Any) -> str:
    """A C string from a char array (numpy gives bytes already cut at the first NUL)."""
    raw = bytes(b)
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def to_syscall(rec: Any, wall_offset_ns: int) -> Syscall:
    """One start or end event; `wall_offset_ns` turns CLOCK_MONOTONIC into wall time."""
    nr = int(rec["nr"])
    name = NUMBERS.get(nr, f"syscall_{nr}")
    start = int(rec["kind"]) == EV_START
    raw = tuple(rec["args"])
    str_ok = int(rec["str_ok"])
    strings: dict[int, str | None] = {}
    paths = []
    for slot, pos in enumerate(string_positions(name)):
        if str_ok & (1 << slot):
            s = _text(rec["str"][slot])
            strings[pos] = s
            paths.append(s)
        else:
            strings[pos] = None
    fd_path = _text(rec["fd_path"]) if int(rec["fd_ok"]) else ""
    sc = Syscall(
        index=int(rec["index"]),
        name=name,
        timestamp_ns=int(rec["ts_ns"]) + wall_offset_ns,
        comm=_text(rec["comm"]),
        pid=int(rec["pid"]),
        tid=int(rec["tid"]),
        is_start=start,
        is_end=not start,
        fd_path=fd_path,
        raw=raw,
    )
    if start or str_ok:  # an end carries arguments only when it re-read a path
        sc.args = decode_args(name, raw, strings, fd_path)
        sc.paths = tuple(paths)
    if not start:
        sc.result = int(rec["ret"])
        sc.have_result = True
        sc.result_text = decode_result(name, sc.result)
    return sc
