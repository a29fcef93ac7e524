"""Samples counted per key for a detector's open window, in numpy: each batch is
reduced to one row per distinct key at once (no Python call per sample), and the
rows of the window are merged again when they pile up, so memory follows the
distinct keys, not the sample rate. At most `max_keys` keys are kept: past that the
coldest go first (a detector looks for hot ones) and their samples are counted in
`dropped`, never lost silently.

A window opens at the previous flush (or at its first sample) and closes at the first
flush at least `min_window_ns` later (0: every flush), on the samples' clock
(CLOCK_MONOTONIC, as the runtime's). A sample belongs to the window open when it is
observed: one that arrives after its window closed counts in the next.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model.records import take

__all__ = ["Array", "Closed", "WindowCounts"]

Array = np.ndarray[Any, Any]

VALUES = [("hits", "<u8"), ("first_ns", "<u8"), ("last_ns", "<u8"), ("addr", "<u8")]
MERGE_PARTS = 64  # batches held before they are merged (and the key bound applied)


@dataclass(frozen=True)
class Closed:
    """A closed window: one row per key (the key columns, `hits`, `first_ns` and
    `last_ns` of its samples, and `addr`, the data address of its first sample)."""

    start_ns: int
    end_ns: int
    rows: Array


class WindowCounts:
    """Counts per key (`keys`: (column, numpy type) pairs) of the open window.
    `add` from one thread (the consumer), `close` from another (the flush)."""

    def __init__(
        self, keys: Sequence[tuple[str, str]], max_keys: int, min_window_ns: int = 0
    ) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.key_dtype = np.dtype(list(keys))
        self.dtype = np.dtype([*keys, *VALUES])
        self.max_keys = max_keys
        self.min_window_ns = max(0, int(min_window_ns))
        self.dropped = 0  # samples not counted: their keys were over max_keys
        self._parts: list[Array] = []
        self._held = 0  # rows in _parts
        self._opened: int | None = None
        self._lock = threading.Lock()

    def add(self, cols: Mapping[str, Array], time_ns: Array, addr: Array | None = None) -> None:
        """One batch: the key columns, the time of each sample, its data address."""
        n = len(time_ns)
        if n == 0:
            return
        rows = np.zeros(n, dtype=self.dtype)
        for name in self.key_dtype.names or ():
            rows[name] = cols[name]
        rows["hits"] = 1
        rows["first_ns"] = rows["last_ns"] = time_ns
        if addr is not None:
            rows["addr"] = addr
        part = self._reduce(rows)
        with self._lock:
            self._parts.append(part)
            self._held += len(part)
            if len(self._parts) > MERGE_PARTS or self._held > 2 * self.max_keys:
                self._parts = [self._bound(self._reduce(np.concatenate(self._parts)))]
                self._held = len(self._parts[0])

    def close(self, now_ns: int) -> Closed | None:
        """The window's rows if it is at least min_window_ns long at `now_ns` (a new
        window opens), else None (it stays open)."""
        with self._lock:
            if self._opened is None:
                first = [int(p["first_ns"].min()) for p in self._parts if len(p)]
                self._opened = min(first, default=now_ns)
            start = self._opened
            if now_ns - start < self.min_window_ns:
                return None
            parts, self._parts, self._held = self._parts, [], 0
            self._opened = now_ns
        if not parts:
            return Closed(start, now_ns, np.zeros(0, self.dtype))
        rows = self._reduce(np.concatenate(parts))  # outside the lock: add() goes on
        with self._lock:  # the bound here too: a window of few batches, many keys
            rows = self._bound(rows)
        return Closed(start, now_ns, rows)

    def _reduce(self, rows: Array) -> Array:
        """One row per distinct key: hits summed, first_ns the least, last_ns the
        greatest, addr of the key's earliest row. Rows are sorted on the key columns
        (a stable lexsort: faster than sorting whole records) and summed per run."""
        names = self.key_dtype.names or ()
        order = np.lexsort([rows[name] for name in reversed(names)])
        sorted_rows = take(rows, order)
        new_key = np.zeros(len(rows), dtype=bool)
        new_key[:1] = True
        for name in names:
            col = sorted_rows[name]
            new_key[1:] |= col[1:] != col[:-1]
        heads = np.flatnonzero(new_key)
        out = np.empty(len(heads), dtype=self.dtype)
        for name in names:
            out[name] = sorted_rows[name][heads]
        out["hits"] = np.add.reduceat(sorted_rows["hits"], heads)
        out["first_ns"] = np.minimum.reduceat(sorted_rows["first_ns"], heads)
        out["last_ns"] = np.maximum.reduceat(sorted_rows["last_ns"], heads)
        out["addr"] = sorted_rows["addr"][heads]
        return out

    def _bound(self, rows: Array) -> Array:
        """The max_keys hottest rows; the samples of the others counted as dropped."""
        if len(rows) <= self.max_keys:
            return rows
        order = np.argsort(-rows["hits"].astype(np.int64), kind="stable")
        self.dropped += int(rows["hits"][order[self.max_keys :]].sum())
        out: Array = rows[np.sort(order[: self.max_keys])]
        return out
