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

from typing import Any

import numpy as np

from .decode import decode_args, decode_result
from .numbers import NUMBERS
from .record import Syscall
from .signatures import string_positions

__all__ = [
    "EV_END",
    "EV_START",
    "REQUIRED_FIELDS",
    "Frames",
    "decode_frames",
    "dtype_from_json",
    "dtype_to_json",
    "frames",
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
        pos = min(nxt, end)
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
    if start or str_ok:  # an end carries arguments only when it re-read a path
        sc.args = decode_args(name, raw, strings, fd_path)
        sc.paths = tuple(paths)
    if not start:
        sc.result = int(rec["ret"])
        sc.have_result = True
        sc.result_text = decode_result(name, sc.result)
    return sc


def _fields(heads: np.ndarray[Any, Any]) -> dict[str, list[Any]]:
    return {name: heads[name].tolist() for name in REQUIRED_FIELDS}


def decode_frames(
    fr: Frames, dtype: np.dtype[Any], wall_offset_ns: int, start: int = 0, stop: int | None = None
) -> list[Syscall]:
    """Records `start`..`stop` of `fr` as Syscall rows. The fixed headers are gathered
    into one numpy array (a column read per field); only the strings are sliced one
    by one, and only where present."""
    offs = fr.offsets[start:stop]
    if not offs:
        return []
    size = dtype.itemsize
    raw = np.frombuffer(fr.buf, dtype=np.uint8)
    at = np.asarray(offs, dtype=np.int64)
    heads = raw[at[:, None] + np.arange(size)].view(dtype).reshape(len(offs))
    cols = _fields(heads)
    buf = fr.buf
    out = []
    empty = b""
    for i, off in enumerate(offs):
        l0, l1 = cols["str_len"][i]
        lf = cols["fd_len"][i]
        p = off + size
        s0 = buf[p : p + l0] if l0 else empty
        s1 = buf[p + l0 : p + l0 + l1] if l1 else empty
        fp = buf[p + l0 + l1 : p + l0 + l1 + lf] if lf else empty
        rec = {
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
            "str": (s0, s1),
            "fd_path": fp,
        }
        out.append(to_syscall(rec, wall_offset_ns))
    return out


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
