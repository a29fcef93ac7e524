"""Provisional ids: what the consumer keys an address or a stack by while its symbols
wait for a slow read, so that its samples are named once the read is done.

The consumer must keep up with the ring, so in cheap mode (Symbolizer.function_ids
and stack_id with cheap=True) an address whose answer needs a slow read (a binary's
symbols or line table, a perf map, kallsyms) is not answered with its function: it
is given a provisional id, the same for the same (pid, ip) (or (pid, ips) for a
stack) until it is resolved, and left to the symbols thread. That thread (warm())
does the read, then tries the pending ids again cheaply (`Symbolizer._settle`): an id
whose answer is now loaded is resolved to the interned id of its function (or
stack). From then on the names of the provisional id are those of the interned one
(`Symbolizer.function_key`, `stack`, `canonical_function`), the outputs merge the two
when they rank (FlowStat.hottest's `merge`), and storage gets a name row (and a stack
row) for the provisional id as for any other.

Ids count up from PROVISIONAL_BASE (model/rollup.py), apart from the interned ones
(from 1) and the labels (at the top of the 64 bits). Bounded: at most `max_pending`
ids wait at once (past it, the caller's UNRESOLVED, as before provisional ids), and
the `max_resolved` most recent resolutions are remembered (an older one's id is
named as unresolved again). Not locked: the Symbolizer calls it under its own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from ..model.rollup import PROVISIONAL_BASE, PROVISIONAL_END, is_provisional
from .symcache import Lru

__all__ = ["Provisional"]

K = TypeVar("K", bound=Hashable)


class Provisional(Generic[K]):
    """Provisional ids for keys (pid, ip) or (pid, ips): given, pending, resolved."""

    def __init__(self, max_pending: int, max_resolved: int) -> None:
        self.max_pending = max(1, max_pending)
        self._ids: dict[K, int] = {}  # pending key -> its id
        self._pending: OrderedDict[int, K] = OrderedDict()  # id -> key, next to try first
        self._resolved: Lru[int, int] = Lru(max_resolved)  # id -> the interned id
        self._next = PROVISIONAL_BASE
        self.given = 0  # ids given so far
        self.refused = 0  # keys answered None: max_pending ids were waiting

    def __len__(self) -> int:
        """Ids pending now."""
        return len(self._pending)

    def id_for(self, key: K) -> int | None:
        """The pending id of `key`, a new one, or None past `max_pending`."""
        found = self._ids.get(key)
        if found is not None:
            return found
        if len(self._pending) >= self.max_pending or self._next >= PROVISIONAL_END:
            self.refused += 1
            return None
        ident = self._next
        self._next += 1
        self.given += 1
        self._ids[key] = ident
        self._pending[ident] = key
        return ident

    def pending(self) -> list[tuple[int, K]]:
        """(id, key) of every pending id, oldest (or least recently tried) first."""
        return list(self._pending.items())

    def pending_id(self, key: K) -> int | None:
        """The id of `key` if one is pending (none is made)."""
        return self._ids.get(key)

    def resolve(self, ident: int, interned: int) -> None:
        """`ident` is `interned` from now on."""
        key = self._pending.pop(ident, None)
        if key is not None:
            self._ids.pop(key, None)
        self._resolved.put(ident, interned)

    def later(self, ident: int) -> None:
        """Tried and not resolved: tried again after the others."""
        if ident in self._pending:
            self._pending.move_to_end(ident)

    def canonical(self, ident: int) -> int | None:
        """The interned id a provisional id resolved to; any other id itself; None
        while it is pending (or its resolution was forgotten)."""
        if not is_provisional(ident):
            return ident
        return self._resolved.peek(ident)
