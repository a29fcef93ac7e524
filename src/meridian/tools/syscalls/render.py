"""Human-readable fields (Mortadelo's util.cs): HH:MM:SS.uuuuuu local timestamps,
durations in µs, and the one-line renderings of the plain views. `field_text` is the
text of each field as displayed; filter spans are offsets into exactly that text."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from .event import Syscall

__all__ = [
    "FIELDS",
    "compact_line",
    "field_text",
    "fmt_duration",
    "fmt_time",
    "full_line",
    "result_cell",
    "to_json",
]


def fmt_time(ns: int) -> str:
    """HH:MM:SS.uuuuuu in local time."""
    sec, rem = divmod(ns, 1_000_000_000)
    return f"{_clock_text(sec, time.tzname)}.{rem // 1000:06d}"


@functools.lru_cache(maxsize=256)
def _clock_text(sec: int, zone: tuple[str, str]) -> str:
    """HH:MM:SS of a second since the epoch in local time (`zone`: the time zone it
    was made in, so a tzset() is not answered from before): once per second shown, not
    once per row."""
    return time.strftime("%H:%M:%S", time.localtime(sec))


def fmt_duration(ns: int) -> str:
    """Whole microseconds: `9us`; '' when unknown."""
    return f"{ns // 1000}us" if ns >= 0 else ""


def result_cell(sc: Syscall) -> str:
    """The result as shown: the decoded result, `?` for a call still open, else ''."""
    if sc.have_result:
        return sc.result_text
    if sc.is_start and sc.end_index < 0:
        return "?"
    return ""


_FIELD_TEXT: dict[str, Callable[[Syscall], str]] = {
    "index": lambda sc: str(sc.index),
    "time": lambda sc: fmt_time(sc.timestamp_ns),
    "comm": lambda sc: sc.comm,
    "pid": lambda sc: str(sc.pid),
    "tid": lambda sc: str(sc.tid),
    "name": lambda sc: sc.name,
    "arguments": lambda sc: sc.arguments,
    "result": result_cell,
    "duration": lambda sc: fmt_duration(sc.duration_ns),
}
FIELDS = tuple(_FIELD_TEXT)


def field_text(sc: Syscall, field: str) -> str:
    try:
        text = _FIELD_TEXT[field]
    except KeyError:
        raise ValueError(f"no field {field!r}") from None
    return text(sc)


def compact_line(sc: Syscall) -> str:
    """strace-like: `12:02:36.269753 cat(812:812) openat(AT_FDCWD, "/etc/passwd",
    O_RDONLY) = 3 <9us>`; a call still open ends in `= ?`, an end without its start
    shows `name(...)`."""
    args = sc.arguments if sc.is_start else "..."
    head = f"{fmt_time(sc.timestamp_ns)} {sc.comm}({sc.pid}:{sc.tid}) {sc.name}({args})"
    if not sc.have_result:
        return f"{head} = ?"
    dur = f" <{fmt_duration(sc.duration_ns)}>" if sc.duration_ns >= 0 else ""
    return f"{head} = {sc.result_text}{dur}"


def full_line(sc: Syscall) -> str:
    """One event of the full log, with its index and its partner's."""
    who = f"{fmt_time(sc.timestamp_ns)} {sc.comm}({sc.pid}:{sc.tid})"
    if sc.is_start:
        other = f"end #{sc.end_index}" if sc.end_index >= 0 else "no end yet"
        return f"#{sc.index} {who} {sc.name}({sc.arguments}) ... [{other}]"
    other = f"start #{sc.start_index}" if sc.start_index >= 0 else "start unknown"
    result = sc.result_text if sc.have_result else "?"
    return f"#{sc.index} {who} {sc.name}() = {result} [{other}]"


def to_json(sc: Syscall) -> dict[str, Any]:
    """One JSON object per event (or compact row), stable field names."""
    out: dict[str, Any] = {
        "index": sc.index,
        "time": fmt_time(sc.timestamp_ns),
        "timestamp_ns": sc.timestamp_ns,
        "comm": sc.comm,
        "pid": sc.pid,
        "tid": sc.tid,
        "syscall": sc.name,
        "is_start": sc.is_start,
        "is_end": sc.is_end,
        "start_index": sc.start_index,
        "end_index": sc.end_index,
    }
    if sc.is_start:
        out["args"] = list(sc.args)
        out["paths"] = list(sc.paths)
        if sc.fd_path:
            out["fd_path"] = sc.fd_path
    if sc.have_result:
        out["result"] = sc.result
        out["result_text"] = sc.result_text
    if sc.duration_ns >= 0:
        out["duration_us"] = sc.duration_ns / 1000
    return out
