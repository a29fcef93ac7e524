"""The FilteredLog (filtered-log.cs): the rows of a full or compact log that a filter
accepts, kept up to date as rows are appended or modified. A start row that did not
match may match once its end arrives (a result filter): it is inserted in place."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from .event import Syscall
from .filters import Filter, Match
from .full_log import Source

__all__ = ["FilteredLog"]

# ("appended" | "inserted" | "modified" | "removed", row), or ("dropped", how many
# rows left the front of the view: every row number moved down by that much)
Changed = Callable[[str, int], None]


class FilteredLog:
    def __init__(self, source: Source, flt: Filter | None = None) -> None:
        self.source = source
        self.filter = flt
        self.visible: list[int] = []  # positions in source, ascending
        self._listeners: list[Changed] = []
        source.subscribe(self._on_appended, self._on_modified, self._on_dropped)
        self.set_filter(flt)

    def close(self) -> None:
        """Stop following the source (a view being replaced)."""
        self.source.unsubscribe(self._on_appended)
        self._listeners.clear()

    def on_change(self, f: Changed) -> None:
        self._listeners.append(f)

    def _emit(self, what: str, row: int) -> None:
        for f in self._listeners:
            f(what, row)

    def set_filter(self, flt: Filter | None) -> None:
        self.filter = flt
        self.visible = [p for p in range(self.source.first, len(self.source)) if self._accepts(p)]

    def narrow(self, flt: Filter | None) -> None:
        """`set_filter` for a filter that accepts a subset of what the current one
        accepts: only the visible rows are checked again."""
        self.filter = flt
        self.visible = [p for p in self.visible if self._accepts(p)]

    def _accepts(self, pos: int) -> bool:
        return self.filter is None or self.filter.matches(self.source[pos], self.source)

    def __len__(self) -> int:
        return len(self.visible)

    def __getitem__(self, row: int) -> Syscall:
        return self.source[self.visible[row]]

    def __iter__(self) -> Iterator[Syscall]:
        return (self.source[p] for p in self.visible)

    def matches(self, row: int) -> list[Match]:
        """GetMatches() of a visible row: the spans to highlight."""
        if self.filter is None:
            return []
        return self.filter.get_matches(self[row], self.source)

    def row_of(self, pos: int) -> int:
        """Visible row of source position `pos`, -1 if filtered out."""
        i = bisect.bisect_left(self.visible, pos)
        return i if i < len(self.visible) and self.visible[i] == pos else -1

    def _on_dropped(self, first: int) -> None:
        n = bisect.bisect_left(self.visible, first)
        if n:
            del self.visible[:n]
            self._emit("dropped", n)

    def _on_appended(self, pos: int) -> None:
        if self._accepts(pos):
            self.visible.append(pos)
            self._emit("appended", len(self.visible) - 1)

    def _on_modified(self, pos: int) -> None:
        ok = self._accepts(pos)
        i = bisect.bisect_left(self.visible, pos)
        present = i < len(self.visible) and self.visible[i] == pos
        if ok and not present:
            self.visible.insert(i, pos)
            self._emit("inserted", i)
        elif present and not ok:
            del self.visible[i]
            self._emit("removed", i)
        elif present:
            self._emit("modified", i)
