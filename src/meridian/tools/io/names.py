"""meridian io's file names: the kernel's `fileio_name` records into a bounded
(dev, ino) -> path cache, the source of every event's `file`.

The kernel resolves a file's path while the operation's fd is open (io_names.bpf.h)
and sends it once per inode, before the operation starts, and again when the file is
renamed or unlinked. So a short-lived process's files are named although its fds are
gone when user space formats the event. A batch of events is formatted after all the
names sent meanwhile are in, so an inode that had several names keeps a short history
(the time each was sent) and each event takes the newest name sent before it started.
The cache holds at most `max_entries` paths (the oldest go first); on a miss it asks
the kernel, through `forget`, to send that inode's name again at its next operation.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["DELETED", "HISTORY", "NameCache"]

DELETED = " (deleted)"  # as the kernel's d_path() and /proc/PID/fd show an unlinked file
HISTORY = 8  # names remembered per renamed inode, with the time each was sent
Key = tuple[int, int]  # dev, ino
MASK64 = (1 << 64) - 1


class NameCache:
    """(dev, ino) -> JSON-escaped path; `add` takes the ring's records."""

    def __init__(self, max_entries: int = 65536, forget: Callable[[int, int], None] | None = None):
        self.max_entries = max_entries
        self.forget = forget
        self._paths: dict[Key, str] = {}  # the newest name
        self._history: dict[Key, list[tuple[int, str]]] = {}  # renamed inodes: (ts, name)
        self._forgotten: set[Key] = set()  # asked again, not answered yet

    def __len__(self) -> int:
        return len(self._paths)

    def add(self, recs: np.ndarray[Any, Any]) -> None:
        """Name records (numpy `fileio_name`), in the order the kernel sent them."""
        if not len(recs):
            return
        cols = ("ts_ns", "dev", "ino", "len", "deleted", "path")
        for ts, dev, ino, n, deleted, raw in zip(*(recs[c].tolist() for c in cols), strict=True):
            key = (dev, ino)
            if not n:  # not resolved: the caller's fallback, and no asking again
                self._paths.pop(key, None)
                self._history.pop(key, None)
                if len(self._forgotten) >= self.max_entries:
                    self._forgotten.clear()
                self._forgotten.add(key)
                continue
            self._forgotten.discard(key)
            path = raw[:n].decode(errors="replace")
            if deleted and not path.endswith(DELETED):  # the kernel's walk appends it
                path += DELETED
            text = json.dumps(path, ensure_ascii=False)
            old = self._paths.pop(key, None)  # re-inserted as the newest
            if old is not None and old != text:
                hist = self._history.setdefault(key, [(0, old)])
                hist.append((ts, text))
                del hist[:-HISTORY]
            while len(self._paths) >= self.max_entries:
                gone = next(iter(self._paths))
                del self._paths[gone]
                self._history.pop(gone, None)
            self._paths[key] = text

    def get(self, dev: int, ino: int, gen: int = -1) -> str | None:
        """The JSON-escaped path (`gen`: an index into a renamed inode's history, from
        `generations`), or None; a miss asks the kernel for the name again."""
        key = (dev, ino)
        if gen >= 0:
            hist = self._history.get(key)
            if hist and gen < len(hist):
                return hist[gen][1]
        s = self._paths.get(key)
        if s is None and self.forget is not None and key not in self._forgotten:
            if len(self._forgotten) >= self.max_entries:
                self._forgotten.clear()
            self._forgotten.add(key)
            self.forget(dev, ino)
        return s

    def generations(
        self, dev: np.ndarray[Any, Any], ino: np.ndarray[Any, Any], start: np.ndarray[Any, Any]
    ) -> np.ndarray[Any, Any] | None:
        """Per event, which of its inode's names it takes: the index of the newest name
        sent before the event started, -1 for the newest of all. None: no inode of the
        cache was ever renamed (every event takes its inode's newest name)."""
        if not self._history:
            return None
        out = np.full(len(dev), -1, dtype=np.int64)
        mixed = (dev.astype(np.uint64) << np.uint64(40)) ^ ino.astype(np.uint64)
        known = np.array([((d << 40) ^ i) & MASK64 for d, i in self._history], dtype=np.uint64)
        for j in np.flatnonzero(np.isin(mixed, known)).tolist():
            hist = self._history.get((int(dev[j]), int(ino[j])))
            if hist:
                g = bisect.bisect_right(hist, int(start[j]), key=lambda h: h[0]) - 1
                out[j] = max(g, 0) if g < len(hist) - 1 else -1
        return out
