"""Filters (Mortadelo's filter.cs, ISyscallFilter) and their GetMatches() spans.

A filter decides whether a row matches and returns (field, start, length) spans into
the displayed text of each field (`fmt.field_text`), which the views highlight.

Text patterns follow Mortadelo: a pattern with no capital letter matches without
regard to case; one with a capital matches case exactly. The same rule applies to
regular expressions. Result filters look at the row holding the result (for a start
in the full log, its end), so a failing call's start row matches once its end is in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

from ...errors import UsageError
from .event import Syscall
from .full_log import Source
from .render import field_text

__all__ = [
    "TEXT_FIELDS",
    "AllOf",
    "Filter",
    "Match",
    "PathFilter",
    "PidFilter",
    "ResultFilter",
    "SyscallFilter",
    "TextFilter",
    "all_of",
    "compile_pattern",
]

TEXT_FIELDS = ("comm", "pid", "tid", "name", "arguments", "result")


class Match(NamedTuple):
    field: str
    start: int
    length: int


class Filter(Protocol):
    def matches(self, sc: Syscall, source: Source) -> bool: ...

    def get_matches(self, sc: Syscall, source: Source) -> list[Match]: ...


def compile_pattern(pattern: str, regex: bool = False) -> re.Pattern[str]:
    """Case-insensitive when the pattern is all lower case (Mortadelo's rule)."""
    flags = re.IGNORECASE if pattern == pattern.lower() else 0
    try:
        return re.compile(pattern if regex else re.escape(pattern), flags)
    except re.error as exc:
        raise UsageError(f"bad regular expression {pattern!r}: {exc}") from None


def _spans(rx: re.Pattern[str], field: str, text: str) -> list[Match]:
    return [
        Match(field, m.start(), m.end() - m.start())
        for m in rx.finditer(text)
        if m.end() > m.start()
    ]


class TextFilter:
    """A substring (or regex) in any of `fields`."""

    def __init__(
        self, pattern: str, regex: bool = False, fields: Sequence[str] = TEXT_FIELDS
    ) -> None:
        self.rx = compile_pattern(pattern, regex)
        self.fields = tuple(fields)
        self.pattern = pattern
        self.regex = regex

    def get_matches(self, sc: Syscall, source: Source) -> list[Match]:
        out: list[Match] = []
        for f in self.fields:
            out += _spans(self.rx, f, field_text(sc, f))
        return out

    def matches(self, sc: Syscall, source: Source) -> bool:
        if not self.regex:  # one search over the fields joined: a literal has no newline
            if self.fields != TEXT_FIELDS:
                return (
                    self.rx.search("\n".join([field_text(sc, f) for f in self.fields])) is not None
                )
            hay = sc.hay
            if hay is None:  # built once per row, kept for the next filter
                hay = sc.hay = "\n".join([field_text(sc, f) for f in TEXT_FIELDS])
            return self.rx.search(hay) is not None
        return any(self.rx.search(field_text(sc, f)) for f in self.fields)

    def narrows(self, other: TextFilter | None) -> bool:
        """Does every row this filter accepts pass `other` too (a literal containing
        `other`'s literal)? Then it need only look at the rows `other` accepted."""
        return (
            other is not None
            and not self.regex
            and not other.regex
            and self.fields == other.fields
            and other.pattern in self.pattern
        )


class SyscallFilter:
    """The syscall name is one of `names` (exact)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)

    def matches(self, sc: Syscall, source: Source) -> bool:
        return sc.name in self.names

    def get_matches(self, sc: Syscall, source: Source) -> list[Match]:
        return [Match("name", 0, len(sc.name))] if sc.name in self.names else []


class PidFilter:
    """The PID or the TID is one of `ids`."""

    def __init__(self, ids: Iterable[int]) -> None:
        self.ids = frozenset(ids)

    def matches(self, sc: Syscall, source: Source) -> bool:
        return sc.pid in self.ids or sc.tid in self.ids

    def get_matches(self, sc: Syscall, source: Source) -> list[Match]:
        out = []
        if sc.pid in self.ids:
            out.append(Match("pid", 0, len(str(sc.pid))))
        if sc.tid in self.ids:
            out.append(Match("tid", 0, len(str(sc.tid))))
        return out


class PathFilter:
    """A pattern in a path argument (or the path of the fd argument); the spans are
    the occurrences inside those paths in the arguments text."""

    def __init__(self, pattern: str, regex: bool = False) -> None:
        self.rx = compile_pattern(pattern, regex)

    def _paths(self, sc: Syscall) -> list[str]:
        return [p for p in (*sc.paths, sc.fd_path) if p]

    def matches(self, sc: Syscall, source: Source) -> bool:
        return any(self.rx.search(p) for p in self._paths(sc))

    def get_matches(self, sc: Syscall, source: Source) -> list[Match]:
        text = sc.arguments
        out: list[Match] = []
        seen: set[int] = set()
        for p in self._paths(sc):
            if not self.rx.search(p):
                continue
            at = text.find(p)
            while at >= 0 and at not in seen:
                seen.add(at)
                for m in self.rx.finditer(p):
                    if m.end() > m.start():
                        out.append(Match("arguments", at + m.start(), m.end() - m.start()))
                at = text.find(p, at + 1)
        return sorted(set(out))


class ResultFilter:
    """Failed calls (result -4095..-1), optionally only these errno names."""

    def __init__(self, errnos: Iterable[str] = ()) -> None:
        self.errnos = frozenset(e.upper() for e in errnos)

    def _ok(self, row: Syscall | None) -> bool:
        if row is None or not row.failed:
            return False
        return not self.errnos or row.result_text.split(" ", 1)[-1] in self.errnos

    def matches(self, sc: Syscall, source: Source) -> bool:
        return self._ok(source.result_row(sc))

    def get_matches(self, sc: Syscall, source: Source) -> list[Match]:
        if sc.have_result and self._ok(sc):
            return [Match("result", 0, len(field_text(sc, "result")))]
        return []


class AllOf:
    """Every filter matches; the spans of all of them."""

    def __init__(self, filters: Iterable[Filter]) -> None:
        self.filters = list(filters)

    def matches(self, sc: Syscall, source: Source) -> bool:
        return all(f.matches(sc, source) for f in self.filters)

    def get_matches(self, sc: Syscall, source: Source) -> list[Match]:
        out: list[Match] = []
        for f in self.filters:
            out += f.get_matches(sc, source)
        return sorted(set(out))


def all_of(filters: Sequence[Filter | None]) -> Filter | None:
    """One filter for all of `filters` (None ones left out): None when none is left."""
    parts = [f for f in filters if f is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else AllOf(parts)
