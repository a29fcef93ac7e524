"""Raw kernel records of `meridian syscalls`, as the ring buffer holds them, and their
decoding to Syscall rows. Each record is an 8-byte frame header (u32 `len` with the
BUSY/DISCARD bits, u32 kernel-internal), then `struct syscalls_event` (bpf/syscalls.h,
its dtype from BTF) followed by its strings packed (`str_len[0]`, `str_len[1]`,
`fd_len` bytes, each NUL-terminated), the whole padded to 8 bytes. The kernel program
sends each traced call as two events, a start (arguments, paths, the path of an fd
argument) and an end (the result). The live capture and the binary recording (`-w
FILE`, format version 2) both carry these bytes unchanged; decoding happens here, for
the live views and on replay. Pure functions of bytes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from .decode import decode_args, decode_result
from .event import Syscall
from .numbers import NUMBERS
from .signatures import string_positions

__all__ = [
    "EV_END",
    "EV_START",
    "REQUIRED_FIELDS",
    "Batch",
    "ByContent",
    "Frames",
    "decode_frames",
    "dtype_from_json",
    "dtype_to_json",
    "frames",
    "rows_by_content",
    "to_syscall",
]

EV_START, EV_END = 0, 1  # enum syscalls_kind
BUSY = 1 << 31
DISCARD = 1 << 30
HDR = 8

REQUIRED_FIELDS = (
    "index", "ts_ns", "pid", "tid", "nr", "kind", "str_ok", "fd_ok", "ret", "args", "comm",
    "str_len", "fd_len",
)  # fmt: skip


class Frames:
    """The records found in a run of framed bytes: offsets of their data and lengths;
    `used` is how many bytes whole records take (the rest is a cut-off record)."""

    __slots__ = ("buf", "lengths", "offsets", "used")

    def __init__(self, buf: bytes, offsets: list[int], lengths: list[int], used: int) -> None:
        self.buf = buf
        self.offsets = offsets
        self.lengths = lengths
        self.used = used

    def __len__(self) -> int:
        return len(self.offsets)


def frames(buf: bytes, start: int = 0, limit: int | None = None) -> Frames:
    """Walk the frame headers of `buf` from byte `start`, for at most `limit` records
    (discarded records skipped; a busy one, which a recording never holds, ends the
    walk). A walk costs about a microsecond per record, so a slow consumer walks only
    what it takes."""
    offsets: list[int] = []
    lengths: list[int] = []
    pos, end = start, len(buf)
    words = memoryview(buf)[: end & ~3].cast("I")  # headers as u32 words: the hot loop
    while pos + HDR <= end and (limit is None or len(offsets) < limit):
        hdr = words[pos >> 2]
        if hdr & BUSY:
            break
        length = hdr & ~DISCARD
        nxt = pos + ((HDR + length + 7) & ~7)
        if pos + HDR + length > end:
            break
        if not hdr & DISCARD:
            offsets.append(pos + HDR)
            lengths.append(length)
        pos = nxt if nxt < end else end
    return Frames(buf, offsets, lengths, pos)


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
    output = bytes(rec.get("out", b""))  # an end's output argument (pipe2's fds)
    if start or str_ok or output:  # an end's arguments: a re-read path, an output
        sc.args = decode_args(name, raw, strings, fd_path, output)
        sc.paths = tuple(paths)
    if not start:
        sc.result = int(rec["ret"])
        sc.have_result = True
        sc.result_text = decode_result(name, sc.result)
    return sc


def _fields(heads: np.ndarray[Any, Any]) -> dict[str, list[Any]]:
    names = REQUIRED_FIELDS + (("out_len",) if "out_len" in heads.dtype.names else ())
    return {name: heads[name].tolist() for name in names}


T = TypeVar("T")

# Fields that differ between two events of the same call made the same way; the rest
# of a record (call, arguments, result, comm, strings) decodes to the same text.
_PER_EVENT = ("index", "ts_ns", "pid", "tid")
_FEW = 32  # distinct records in a batch read one by one, before reading every column


@functools.lru_cache(maxsize=16)
def _per_event_bytes(dtype: np.dtype[Any]) -> int:
    """How many leading bytes of a record hold only `_PER_EVENT` fields: the rest of
    the record is the key of its decoded text (0: the layout does not allow it)."""
    assert dtype.fields is not None
    n = 0
    for name, (fdt, off, *_) in sorted(dtype.fields.items(), key=lambda f: f[1][1]):
        if name not in _PER_EVENT or off != n:
            break
        n = off + fdt.itemsize
    return n


def _heads(buf: bytes, offs: list[int], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """The fixed part of each record at `offs`, gathered into one array (by 8-byte
    words when records are 8-aligned, 8 times fewer indices than by bytes)."""
    size = dtype.itemsize
    at = np.asarray(offs, dtype=np.int64)
    if size % 8 == 0 and not (at & 7).any() and offs[-1] + size <= len(buf) & ~7:
        words = np.frombuffer(buf, dtype=np.uint64, count=len(buf) >> 3)
        got = words[(at >> 3)[:, None] + np.arange(size >> 3)]
    else:
        got = np.frombuffer(buf, dtype=np.uint8)[at[:, None] + np.arange(size)]
    heads: np.ndarray[Any, Any] = got.view(dtype).reshape(len(offs))
    return heads


@dataclass(frozen=True)
class Batch(Generic[T]):
    """ByContent.batch(): the records' fixed headers, what each distinct content was
    made into, and which of those each record is."""

    heads: np.ndarray[Any, Any]
    made: list[T]
    ids: list[int]


class ByContent(Generic[T]):
    """What records decode to, made once per distinct content: a loop repeats the same
    few calls, and two records that differ only in their `_PER_EVENT` fields (index,
    time, ids) decode to the same text. `make` turns the first record of a content,
    decoded as a Syscall (its per-event fields those of that record), into what is kept
    for it: the row itself for the views, a JSON line template for recordings. At most
    `limit` contents are kept across batches (then the table starts over), so a
    workload of ever new paths does not grow it without end."""

    def __init__(self, make: Callable[[Syscall], T], limit: int = 16384) -> None:
        self.make = make
        self.limit = limit
        self._made: dict[bytes, T] = {}

    def batch(
        self, fr: Frames, dtype: np.dtype[Any], start: int = 0, stop: int | None = None
    ) -> Batch[T]:
        """Records `start`..`stop` of `fr`: their fixed headers gathered into one numpy
        array (a column read per field), what each content was made into (`made`, in
        order of first appearance) and which of those each record is (`ids`)."""
        offs = fr.offsets[start:stop]
        if not offs:
            return Batch(np.empty(0, dtype), [], [])
        if len(self._made) > self.limit:
            self._made.clear()
        buf = fr.buf
        heads = _heads(buf, offs, dtype)
        lengths = fr.lengths[start:stop]
        skip = _per_event_bytes(dtype)
        cols: dict[str, list[Any]] | None = None  # every column, once misses are many
        known = self._made
        local: dict[bytes, int] = {}  # content -> its position in `made`
        made: list[T] = []
        ids: list[int] = []
        misses = 0
        for i, off in enumerate(offs):
            key = buf[off + skip : off + lengths[i]] if skip else None
            j = local.get(key) if key is not None else None
            if j is None:
                value = known.get(key) if key is not None else None
                if value is None:
                    if cols is None and misses >= _FEW:
                        cols = _fields(heads)
                    if cols is None:
                        rec = _record(_fields(heads[i : i + 1]), 0, buf, off, dtype.itemsize)
                    else:
                        rec = _record(cols, i, buf, off, dtype.itemsize)
                    misses += 1
                    value = self.make(to_syscall(rec, 0))
                    if key is not None:
                        known[key] = value
                j = len(made)
                made.append(value)
                if key is not None:
                    local[key] = j
            ids.append(j)
        return Batch(heads, made, ids)


def _row(sc: Syscall) -> Syscall:
    return sc


def rows_by_content() -> ByContent[Syscall]:
    """The decoded rows of contents, for decode_frames() calls that share them (a few
    thousand: a row weighs a kilobyte or two)."""
    return ByContent(_row, limit=4096)


def decode_frames(
    fr: Frames,
    dtype: np.dtype[Any],
    wall_offset_ns: int,
    start: int = 0,
    stop: int | None = None,
    contents: ByContent[Syscall] | None = None,
) -> list[Syscall]:
    """Records `start`..`stop` of `fr` as Syscall rows: a record is decoded once per
    distinct content (ByContent; `contents` keeps them from call to call), and the
    others are copies of it with their own index, time and ids."""
    b = (contents or rows_by_content()).batch(fr, dtype, start, stop)
    if not b.ids:
        return []
    index, ts, pid, tid = (b.heads[name].tolist() for name in _PER_EVENT)
    made = b.made
    out = []
    for j, i, t, p, k in zip(b.ids, index, ts, pid, tid, strict=True):
        sc = made[j].copy()
        sc.index = i
        sc.timestamp_ns = t + wall_offset_ns
        sc.pid = p
        sc.tid = k
        out.append(sc)
    return out


def _record(cols: dict[str, list[Any]], i: int, buf: bytes, off: int, size: int) -> dict[str, Any]:
    """Record `i` (at `off` in `buf`) as to_syscall() takes it."""
    l0, l1 = cols["str_len"][i]
    lf = cols["fd_len"][i]
    lo = cols["out_len"][i] if "out_len" in cols else 0  # older recordings: none
    p = off + size
    empty = b""
    return {
        "index": cols["index"][i],
        "ts_ns": cols["ts_ns"][i],
        "pid": cols["pid"][i],
        "tid": cols["tid"][i],
        "nr": cols["nr"][i],
        "kind": cols["kind"][i],
        "str_ok": cols["str_ok"][i],
        "fd_ok": cols["fd_ok"][i],
        "ret": cols["ret"][i],
        "args": cols["args"][i],
        "comm": cols["comm"][i],
        "str": (buf[p : p + l0] if l0 else empty, buf[p + l0 : p + l0 + l1] if l1 else empty),
        "fd_path": buf[p + l0 + l1 : p + l0 + l1 + lf] if lf else empty,
        "out": buf[p + l0 + l1 + lf : p + l0 + l1 + lf + lo] if lo else empty,
    }


def dtype_to_json(dtype: np.dtype[Any]) -> list[Any]:
    """The record dtype as JSON (numpy's array-protocol description)."""
    return [list(f) for f in np.lib.format.dtype_to_descr(dtype)]


def dtype_from_json(descr: Any) -> np.dtype[Any]:
    """Inverse of dtype_to_json; ValueError for a description that is not one, or
    lacks a field the decoder needs."""
    if not isinstance(descr, list):
        raise ValueError("record layout is not a list")
    fields: list[Any] = []
    for f in descr:
        if not isinstance(f, list) or len(f) not in (2, 3):
            raise ValueError(f"bad field {f!r}")
        fields.append(tuple(tuple(x) if isinstance(x, list) else x for x in f))
    try:
        dt: np.dtype[Any] = np.lib.format.descr_to_dtype(fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad record layout: {exc}") from None
    missing = [n for n in REQUIRED_FIELDS if dt.names is None or n not in dt.names]
    if missing:
        raise ValueError(f"record layout lacks {', '.join(missing)}")
    return dt
