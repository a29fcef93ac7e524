"""meridian io's event stream: numpy columns of `fileio_event` in, JSON lines or text out.

JSON lines are built column by column, never through a dict per event, so one agent
core writes well over a million lines a second:

- events are cut in chunks of `CHUNK` records, so memory stays bounded however large
  the ring buffer's batch is;
- an event's identity (pid, tid, comm, op, fd, file) is formatted once per distinct
  identity in the chunk (`np.unique` over a 64-bit mix of the fields, then checked field
  by field, so a collision cannot mislabel an event);
- each number column is printed in one call (`json_columns`: orjson from the numpy
  array, or `str` without the json extra); a column holding one value in the whole
  chunk is folded into the constant text around it;
- `wall_time` is fixed-width text built in numpy (strftime once per distinct second);
- a line is a template of pieces: constant pieces are laid out by list multiplication,
  per-event pieces dropped in by slice assignment, and one `str.join` makes the chunk.

Record fields this module does not know (added to `struct fileio_event` later) still
appear in the JSON, as numbers under their own names, before `timestamp_ns`: so do
`disk_latency_ns`, `disk_requests` and `sector` (the start sector of the operation's
first bio of its direction, -1 for none; `-` in the text view).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ... import proc
from ...json_columns import Piece, gather, join_lines, numbers
from .model import INTERFACES, OPS
from .names import NameCache

__all__ = ["CHUNK", "TEXT_HEADER", "EventFormatter"]

CHUNK = 4096  # events per join: large enough to amortise, small enough for the caches
CACHE_MAX = 65536  # distinct paths / comms remembered; the tables are cleared past this
# Number fields in output order (record field, JSON name); identity and time are apart.
NUMBERS = (
    ("bytes", "bytes"),
    ("bytes_requested", "bytes_requested"),
    ("disk_bytes", "disk_bytes"),
    ("latency_ns", "latency_ns"),
)
AFTER_CACHED = (("io_wait_ns", "io_wait_ns"),)
KNOWN = {"pid", "tid", "comm", "op", "fd", "dev", "ino", "cached", "ts_ns"}
KNOWN |= {f for f, _ in NUMBERS + AFTER_CACHED}
# The OP column: u (io_uring) before the direction of what was submitted through a ring.
TEXT_OPS = ("read", "write", "uread", "uwrite")
TEXT_HEADER = (
    f"{'TIME':<15} {'COMM':<16} {'PID':>7} {'TID':>7} {'OP':<6} {'BYTES':>8} "
    f"{'LAT(ms)':>9} {'C':<1} {'DISK':>8} {'SECTOR':>12} {'FILE'}"
)
_M1, _M2, _M3, _M4 = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xC2B2AE3D27D4EB4F),
    np.uint64(0x165667B19E3779F9),
    np.uint64(0xD6E8FEB86659FD93),
)

try:
    import orjson

    def _json_str(s: str) -> str:
        return str(orjson.dumps(s).decode())

except ImportError:  # the json extra is optional: the same output, slower

    def _json_str(s: str) -> str:
        return json.dumps(s)


_CACHED = np.array([',"cached":false', ',"cached":true'], dtype=object)


class EventFormatter:
    """Numpy columns of `fileio_event` to JSON lines or text, one batch at a time.
    Strings (comm, file) are JSON-escaped once per distinct value and remembered (at
    most `CACHE_MAX` of each: the tables are emptied when full, never grow without end)."""

    def __init__(self, proc_root: str = "/proc", names: NameCache | None = None) -> None:
        self.proc_root = proc_root
        self.names = names  # the kernel's paths (names.py), first
        self.offset_ns = time.time_ns() - time.monotonic_ns()
        self._comm: dict[bytes, str] = {}
        self._path: dict[tuple[int, int, int, int], str] = {}  # pid, fd, dev, ino
        self._ino: dict[tuple[int, int], str] = {}  # dev, ino (any process)
        self._heads: dict[int, np.ndarray[Any, Any]] = {}  # second -> 19 UCS-4 codes

    # ---- strings, escaped once --------------------------------------------------------

    def comm(self, raw: bytes) -> str:
        s = self._comm.get(raw)
        if s is None:
            if len(self._comm) >= CACHE_MAX:
                self._comm.clear()
            s = self._comm[raw] = _json_str(raw.decode(errors="replace"))
        return s

    def path(self, pid: int, fd: int, dev: int, ino: int, gen: int = -1) -> str:
        """The file's path as the kernel named it (names.py); without it, from
        /proc/PID/fd/FD when that still names the inode, else a path seen before for the
        inode, else MAJOR:MINOR:INODE. JSON-escaped. `gen`: which of a renamed
        inode's names (NameCache.generations)."""
        if self.names is not None:
            named = self.names.get(dev, ino, gen)
            if named is not None:
                return named
        key = (pid, fd, dev, ino)
        s = self._path.get(key)
        if s is not None:
            return s
        if len(self._path) >= CACHE_MAX:
            self._path.clear()
        if len(self._ino) >= CACHE_MAX:
            self._ino.clear()
        found = None
        if fd >= 0:
            link = f"{self.proc_root}/{pid}/fd/{fd}"
            try:
                st = os.stat(link)
                if st.st_ino == ino:
                    found = os.readlink(link)
            except OSError:
                pass
        if found is None:
            cached = self._ino.get((dev, ino))
            if cached is not None:
                self._path[key] = cached
                return cached
            found = f"{proc.dev_major(dev)}:{proc.dev_minor(dev)}:{ino}"
            s = _json_str(found)
        else:
            s = _json_str(found)
            self._ino[(dev, ino)] = s
        self._path[key] = s
        return s

    def cache_sizes(self) -> dict[str, int]:
        return {"comm": len(self._comm), "path": len(self._path), "ino": len(self._ino)}

    # ---- wall-clock time --------------------------------------------------------------

    def wall_text(self, ts: np.ndarray[Any, Any], end: str = "Z") -> list[str]:
        """'YYYY-MM-DDTHH:MM:SS.uuuuuu' (UTC) per monotonic ns, built as fixed-width ASCII
        in numpy (strftime once per distinct second) and cut by one split on `end`."""
        if not len(ts):
            return []
        ns = ts.astype(np.int64) + self.offset_ns
        secs = ns // 1_000_000_000
        micros = ((ns % 1_000_000_000) // 1000).astype(np.uint32)
        lo, hi = int(secs.min()), int(secs.max())
        if hi - lo < 64:  # a batch spans seconds: index a small table without sorting
            uniq, inv = np.arange(lo, hi + 1), secs - lo
        else:
            uniq, inv = np.unique(secs, return_inverse=True)
        table = np.empty((len(uniq), 19), dtype=np.uint8)
        for i, sec in enumerate(uniq.tolist()):
            head = self._heads.get(sec)
            if head is None:
                if len(self._heads) >= 4096:
                    self._heads.clear()
                text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
                head = self._heads[sec] = np.frombuffer(text.encode(), np.uint8)
            table[i] = head
        rows = np.empty((len(ts), 27), dtype=np.uint8)
        rows[:, :19] = table[inv.reshape(-1)]
        rows[:, 19] = ord(".")
        for j in range(25, 19, -1):
            rows[:, j] = micros % 10 + ord("0")
            micros //= 10
        rows[:, 26] = ord(end)
        out = rows.tobytes().decode("ascii").split(end)
        out.pop()  # the empty string after the last separator
        return out

    def wall(self, ts: np.ndarray[Any, Any]) -> list[str]:
        """ISO-8601 UTC with microseconds and a Z, one string per timestamp."""
        return [w + "Z" for w in self.wall_text(ts)]

    # ---- JSON lines -------------------------------------------------------------------

    def identities(self, ev: np.ndarray[Any, Any]) -> Piece:
        """The JSON text from '{' to the file name, once per distinct identity."""
        op = ev["op"] & 3  # enum io_op: the direction, and io_uring
        cols = [ev["pid"], ev["tid"], op, ev["fd"], ev["dev"], ev["ino"]]
        gen = self._generations(ev)
        if gen is not None:  # an inode renamed: its events before and after differ
            cols.append(gen)
        comm = np.frombuffer(np.ascontiguousarray(ev["comm"]).tobytes(), np.uint64)
        comm = comm.reshape(len(ev), -1)
        cols += [comm[:, i] for i in range(comm.shape[1])]
        u64 = [c.astype(np.uint64) for c in cols]
        pid, tid, o, fd, dev, ino = u64[:6]
        h = (pid << np.uint64(32)) | tid
        h ^= ino * _M1
        h ^= ((dev << np.uint64(32)) | (fd & np.uint64(0xFFFFFFFF)) | (o << np.uint64(31))) * _M2
        for i, w in enumerate(u64[6:]):  # comm words (and the name generation)
            h ^= w * (_M3 if i % 2 == 0 else _M4) + np.uint64(i)
        _, first, inv = np.unique(h, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        if not all(np.array_equal(c[first][inv], c) for c in cols):  # a hash collision
            keys = list(zip(*(c.tolist() for c in cols), strict=True))
            index: dict[tuple[int, ...], int] = {}
            inv = np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.intp)
            first = np.unique(inv, return_index=True)[1]  # inv counts up from 0
        rows = zip(
            *(ev[f][first].tolist() for f in ("pid", "tid", "comm", "fd", "dev", "ino")),
            op[first].tolist(),
            (gen[first] if gen is not None else np.full(len(first), -1)).tolist(),
            strict=True,
        )
        texts = [
            f'{{"pid":{p},"tid":{t},"comm":{self.comm(c)},"op":"{OPS[o & 1]}",'
            f'"interface":"{INTERFACES[o >> 1]}",'
            f'"fd":{f},"file":{self.path(p, f, d, i, g)},'
            f'"dev":"{proc.dev_major(d)}:{proc.dev_minor(d)}","ino":{i}'
            for p, t, c, f, d, i, o, g in rows
        ]
        return gather(texts, inv)

    def json_chunks(self, ev: np.ndarray[Any, Any]) -> Iterator[str]:
        """JSON lines of the events, `CHUNK` events per string."""
        names = ev.dtype.names or ()
        extra = [
            (f, f)
            for f in names
            if f not in KNOWN and ev.dtype[f].kind in "iub" and ev.dtype[f].shape == ()
        ]
        for start in range(0, len(ev), CHUNK):
            c = ev[start : start + CHUNK]
            pieces: list[Piece] = [self.identities(c)]
            for field, name in NUMBERS:
                pieces += [f',"{name}":', numbers(c[field])]
            cached = c["cached"] != 0
            if cached.all() or not cached.any():
                pieces.append(f',"cached":{"true" if cached[0] else "false"}')
            else:
                pieces.append(_CACHED[cached.view(np.uint8)].tolist())
            for field, name in (*AFTER_CACHED, *extra):
                pieces += [f',"{name}":', numbers(c[field])]
            pieces += [',"timestamp_ns":', numbers(c["ts_ns"]), ',"wall_time":"']
            pieces += [self.wall_text(c["ts_ns"]), 'Z"}\n']
            yield join_lines(pieces, len(c))

    def json_lines(self, ev: np.ndarray[Any, Any]) -> str:
        return "".join(self.json_chunks(ev))

    # ---- text for people --------------------------------------------------------------

    def _generations(self, ev: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """Which name of its inode each event takes (None: the newest for all)."""
        if self.names is None:
            return None
        start = ev["ts_ns"].astype(np.int64) - ev["latency_ns"].astype(np.int64)
        return self.names.generations(ev["dev"], ev["ino"], start)

    def files(self, ev: np.ndarray[Any, Any]) -> list[str]:
        path = self.path
        gen = self._generations(ev)
        return [
            path(p, f, d, i, g)
            for p, f, d, i, g in zip(
                ev["pid"].tolist(),
                ev["fd"].tolist(),
                ev["dev"].tolist(),
                ev["ino"].tolist(),
                (gen if gen is not None else np.full(len(ev), -1)).tolist(),
                strict=True,
            )
        ]

    def text_lines(self, ev: np.ndarray[Any, Any]) -> str:
        """Aligned columns like bcc's fileslower, one `%` template per line."""
        if not len(ev):
            return ""
        comms: dict[bytes, str] = {}
        names: dict[str, str] = {}
        for c in set(ev["comm"].tolist()):
            comms[c] = c.decode(errors="replace")
        files = [names.get(f) or names.setdefault(f, json.loads(f)) for f in self.files(ev)]
        cols = (
            [w[11:] for w in self.wall_text(ev["ts_ns"])],
            [comms[c] for c in ev["comm"].tolist()],
            ev["pid"].tolist(),
            ev["tid"].tolist(),
            [TEXT_OPS[o] for o in (ev["op"] & 3).tolist()],
            ev["bytes"].tolist(),
            (ev["latency_ns"] / 1e6).tolist(),
            ["C" if c else "D" for c in ev["cached"].tolist()],
            ev["disk_bytes"].tolist(),
            [str(x) if x >= 0 else "-" for x in ev["sector"].tolist()],
            files,
        )
        line = "%-15s %-16s %7d %7d %-6s %8d %9.3f %-1s %8d %12s %s\n"
        return "".join(map(line.__mod__, zip(*cols, strict=True)))
