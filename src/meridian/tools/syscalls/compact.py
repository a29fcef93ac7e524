"""The CompactLog (compact-log.cs): each start and its end merged into one row with
the result and the duration; an end whose start was never seen is a row of its own,
and a start without an end stays an open row until its end arrives."""

from __future__ import annotations

import bisect
import functools

from .event import Syscall
from .full_log import Log, Rows
from .signatures import OUT_KINDS, signature

__all__ = ["CompactLog", "merge"]


def merge(start: Syscall, end: Syscall | None) -> Syscall:
    """The compact row of a start and (if seen) its end."""
    row = start.copy()
    row.hay = None
    row.is_start, row.is_end, row.start_index = True, False, start.index
    if end is not None:
        row.is_end = True
        row.end_index = end.index
        row.result = end.result
        row.have_result = end.have_result
        row.result_text = end.result_text
        row.duration_ns = max(end.timestamp_ns - start.timestamp_ns, 0)
        if end.args and len(end.args) == len(row.args):
            row.args = _with_outputs(row.args, end.args, signature(row.name))
    return row


def _with_outputs(
    args: tuple[str, ...], end: tuple[str, ...], kinds: tuple[str, ...]
) -> tuple[str, ...]:
    """The start's arguments with its outputs (pipe2's fds) as the end read them."""
    slots = _output_slots(kinds)
    if not slots:
        return args
    out = list(args)
    for i in slots:
        if i < len(out):
            out[i] = end[i]
    return tuple(out)


@functools.cache
def _output_slots(kinds: tuple[str, ...]) -> tuple[int, ...]:
    """Which arguments of a signature are outputs (most calls: none)."""
    return tuple(i for i, kind in enumerate(kinds) if kind in OUT_KINDS)


class CompactLog(Rows):
    def __init__(self, full: Log) -> None:
        super().__init__()
        self.full = full
        self._src: list[int] = []  # full-log position of each row (its start's)
        self._row_of: dict[int, int] = {}  # full-log position of a start -> row
        full.subscribe(self._on_appended, self._on_modified, self._on_dropped)
        for pos in range(full.first, len(full)):
            self._on_appended(pos)

    def _on_dropped(self, full_first: int) -> None:
        """The full log dropped its rows before `full_first`: so do the rows made
        from them."""
        n = bisect.bisect_left(self._src, full_first)
        if n == 0:
            return
        for pos in self._src[:n]:
            self._row_of.pop(pos, None)
        del self._src[:n]
        self._drop_front(n)

    def _on_appended(self, pos: int) -> None:
        sc = self.full[pos]
        if sc.is_start:
            self._row_of[pos] = len(self)
            self.rows.append(merge(sc, self._end_of(sc)))
        elif sc.start_index < 0:
            self.rows.append(sc.copy())
        else:
            return  # joins its start's row (announced by the start's `modified`)
        self._src.append(pos)
        self._emit_appended(len(self) - 1)

    def _on_modified(self, pos: int) -> None:
        row = self._row_of.get(pos)
        if row is None:
            return
        start = self.full[pos]
        self.rows[row - self.first] = merge(start, self._end_of(start))
        self._emit_modified(row)

    def _end_of(self, start: Syscall) -> Syscall | None:
        return self.full.by_index(start.end_index) if start.end_index >= 0 else None

    def result_row(self, sc: Syscall) -> Syscall | None:
        return sc if sc.have_result else None

    def row_of_index(self, index: int) -> int:
        """Row holding event `index` (a start, its end, or an orphan end), -1 if none."""
        pos = self.full.position(index)
        if pos < 0:
            return -1
        sc = self.full[pos]
        if sc.is_end and sc.start_index >= 0:
            pos = self.full.position(sc.start_index)
        if pos in self._row_of:
            return self._row_of[pos]
        return next((self.first + i for i, r in enumerate(self.rows) if r.index == index), -1)
