"""The full Log (Mortadelo's log.cs) and the Aggregator (aggregator.cs) that pairs
each end with the start pending on the same thread.

A Log is a list of rows addressed by position, with three notifications: `appended`
(a new row), `modified` (an older row changed: a start got its end_index, or its
path arguments were read at exit) and `dropped` (the rows before a position left
memory: positions stay absolute, `first` is the oldest one still held, so dropping
costs what is dropped, not what is kept). Views (CompactLog, FilteredLog) listen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from .event import Syscall

__all__ = ["Aggregator", "Listener", "Log", "Notifier", "Rows", "Source"]

Listener = Callable[[int], None]


class Source(Protocol):
    """What a view needs from the log under it (full or compact). Positions run from
    `first` (older ones were dropped) to len() - 1."""

    first: int

    def __len__(self) -> int: ...

    def __getitem__(self, pos: int) -> Syscall: ...

    def subscribe(
        self, appended: Listener, modified: Listener, dropped: Listener | None = None
    ) -> None: ...

    def unsubscribe(self, appended: Listener) -> None: ...

    def result_row(self, sc: Syscall) -> Syscall | None: ...


class Notifier:
    def __init__(self) -> None:
        self._subs: list[tuple[Listener, Listener, Listener | None]] = []

    def subscribe(
        self, appended: Listener, modified: Listener, dropped: Listener | None = None
    ) -> None:
        self._subs.append((appended, modified, dropped))

    def unsubscribe(self, appended: Listener) -> None:
        """Stop notifying the listener that subscribed with `appended`."""
        self._subs = [s for s in self._subs if s[0] != appended]

    def _emit_appended(self, pos: int) -> None:
        for f, _, _ in self._subs:
            f(pos)

    def _emit_modified(self, pos: int) -> None:
        for _, f, _ in self._subs:
            f(pos)

    def _emit_dropped(self, first: int) -> None:
        for _, _, f in self._subs:
            if f is not None:
                f(first)


class Rows(Notifier):
    """Rows addressed by position: `rows` holds positions `first` to len() - 1 (the
    ones before `first` were dropped)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[Syscall] = []
        self.first = 0

    def __len__(self) -> int:
        return self.first + len(self.rows)

    def __getitem__(self, pos: int) -> Syscall:
        if pos < self.first:
            raise IndexError(f"row {pos} was dropped (oldest held: {self.first})")
        return self.rows[pos - self.first]

    def __iter__(self) -> Iterator[Syscall]:
        return iter(self.rows)

    def _drop_front(self, n: int) -> None:
        """Forget the `n` oldest rows held and tell the listeners."""
        del self.rows[:n]
        self.first += n
        self._emit_dropped(self.first)


class Log(Rows):
    """Every event in arrival order. `by_index` finds a row by its event index."""

    def __init__(self) -> None:
        super().__init__()
        self._pos: dict[int, int] = {}

    def drop_before(self, pos: int) -> None:
        """Forget the rows before position `pos`."""
        n = min(pos, len(self)) - self.first
        if n <= 0:
            return
        for sc in self.rows[:n]:
            self._pos.pop(sc.index, None)
        self._drop_front(n)

    def position(self, index: int) -> int:
        """Row position of event `index`, -1 if not in the log."""
        return self._pos.get(index, -1)

    def by_index(self, index: int) -> Syscall | None:
        pos = self._pos.get(index, -1)
        return self.rows[pos - self.first] if pos >= 0 else None

    def append(self, sc: Syscall) -> int:
        pos = len(self)
        self.rows.append(sc)
        self._pos[sc.index] = pos
        self._emit_appended(pos)
        return pos

    def modified(self, pos: int) -> None:
        self._emit_modified(pos)

    def result_row(self, sc: Syscall) -> Syscall | None:
        """The row holding `sc`'s result: itself (an end) or its end (a start)."""
        if sc.have_result:
            return sc
        if sc.is_start and sc.end_index >= 0:
            end = self.by_index(sc.end_index)
            if end is not None and end.have_result:
                return end
        return None


class Aggregator:
    """Pairs starts and ends per thread and puts every event into the Log.

    - A start becomes the pending call of its TID (a start already pending there lost
      its end, for example to a drop, and stays open).
    - An end takes the pending start of its TID when the names agree: the end gets
      start_index, the start gets end_index and the Log emits `modified` for it.
    - An end without a (matching) start keeps start_index -1.
    - exit and exit_group never return: they stay open and are not pending.
    - A successful execve from a non-leader thread ends on the leader's TID (the
      kernel makes the exec'ing thread the leader): it pairs by PID.
    - A path the kernel could not read at entry, read again at exit, arrives in the
      end's args; it is copied to the start (a `modified` too).
    """

    def __init__(self, log: Log | None = None) -> None:
        self.log = log if log is not None else Log()
        self.pending: dict[int, int] = {}  # tid -> position of its open start
        self.unmatched_ends = 0

    def add(self, sc: Syscall) -> None:
        log = self.log
        if sc.is_start:
            if sc.no_return:
                self.pending.pop(sc.tid, None)
                log.append(sc)
            else:
                self.pending[sc.tid] = log.append(sc)
            return
        start_pos = self._take_start(sc)
        if start_pos < 0:
            self.unmatched_ends += 1
            sc.start_index = -1
            log.append(sc)
            return
        start = log[start_pos]
        sc.start_index = start.index
        log.append(sc)
        start.end_index = sc.index
        if sc.paths and len(sc.paths) > len(start.paths):
            start.args, start.paths = sc.args, sc.paths
        if sc.fd_path and not start.fd_path:
            start.fd_path = sc.fd_path
        start.hay = None
        log.modified(start_pos)

    def _take_start(self, end: Syscall) -> int:
        pos = self.pending.pop(end.tid, -1)
        if pos >= 0:
            if self.log[pos].name == end.name:
                return pos
            return -1  # this start's end and this end's start were both lost
        if end.name in ("execve", "execveat") and end.result == 0:
            for tid, p in list(self.pending.items()):
                start = self.log[p]
                if start.pid == end.pid and start.name == end.name:
                    del self.pending[tid]
                    return p
        return -1

    def drop_before(self, pos: int) -> None:
        """Bound memory: the log forgets its rows before `pos`; a call still open
        there is forgotten too (its end, if it comes, has no start)."""
        self.pending = {tid: p for tid, p in self.pending.items() if p >= pos}
        self.log.drop_before(pos)

    def open_calls(self) -> list[Syscall]:
        """Starts still waiting for their end (for the in-progress panel)."""
        return [self.log[p] for p in self.pending.values()]
