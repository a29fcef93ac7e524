"""Record (-w) and replay (-r). A recording starts with a header line (JSON) naming
the format and its version; a name ending in .zst is compressed with the zstd program
(a separate process, so compression runs beside the capture). Two encodings:

- version 1, JSON lines (files named *.jsonl or *.json): every event as one JSON
  object per line (decoded Syscall fields). Readable by anything. Decoding and
  encoding are far slower than the kernel makes events, so a live capture records
  raw to a spool and converts it when it ends (`jsonl_spool.py`).
- version 2, raw (any other name): after the header line (which holds the record
  layout from BTF and the offset from CLOCK_MONOTONIC to wall time), the kernel's
  ring buffer records unchanged, in the chunks the reader drained (see `ring_records.py`).
  Capture only copies bytes, so it keeps up with the kernel; decoding happens on
  replay.

Replay feeds the same events to a fresh Aggregator, so it pairs exactly as live
capture did. A truncated or foreign file is an error naming the line (JSON) or the
record and byte offset (raw)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple, TypeVar

import numpy as np

from ...errors import UsageError
from ...output import dumps, iso_now
from .event import Syscall
from .ring_records import (
    Frames,
    decode_frames,
    dtype_from_json,
    dtype_to_json,
    frames,
    rows_by_content,
)

__all__ = [
    "FORMAT",
    "RAW_VERSION",
    "VERSION",
    "RawBlock",
    "Recorder",
    "is_jsonl_name",
    "json_line",
    "read_blocks",
    "read_events",
    "read_header",
    "read_until_damage",
]

FORMAT = "meridian-syscalls"
VERSION = 1  # JSON lines
RAW_VERSION = 2  # raw kernel records
_BLOCK = 4 << 20  # raw replay reads this much at a time
_HEADER_MAX = 1 << 20
T = TypeVar("T")

# The short key of each Syscall field in a JSON lines recording; the first seven are
# in every line (`_REQUIRED`), the others only when set.
_FIELDS = {
    "i": "index",
    "n": "name",
    "t": "timestamp_ns",
    "c": "comm",
    "p": "pid",
    "k": "tid",
    "s": "is_start",
    "a": "args",
    "ps": "paths",
    "f": "fd_path",
    "r": "result",
    "rt": "result_text",
    "hr": "have_result",
    "raw": "raw",
}
_REQUIRED = ("i", "n", "t", "c", "p", "k", "s")


def _zstd() -> str:
    exe = shutil.which("zstd")
    if exe is None:
        raise UsageError("a .zst recording needs the zstd program: apt-get install zstd")
    return exe


def _create(path: Path, buffering: int) -> IO[bytes]:
    """The file, made empty; a usage error naming it if it cannot be."""
    try:
        return open(path, "wb", buffering=buffering)
    except OSError as exc:
        raise UsageError(
            f"-w {path}: cannot write it ({exc.strerror}): name a file in a writable directory"
        ) from None


def encode(sc: Syscall) -> dict[str, Any]:
    d: dict[str, Any] = {
        "i": sc.index,
        "n": sc.name,
        "t": sc.timestamp_ns,
        "c": sc.comm,
        "p": sc.pid,
        "k": sc.tid,
        "s": sc.is_start,
    }
    if sc.args:
        d["a"] = list(sc.args)
    if sc.paths:
        d["ps"] = list(sc.paths)
    if sc.fd_path:
        d["f"] = sc.fd_path
    if sc.have_result:
        d["hr"] = True
        d["r"] = sc.result
        d["rt"] = sc.result_text
    if sc.raw:
        d["raw"] = list(sc.raw)
    return d


def json_line(sc: Syscall) -> str:
    """The line of `sc` in a JSON lines recording (what every writer must match)."""
    return dumps(encode(sc)) + "\n"


def decode(d: dict[str, Any]) -> Syscall:
    kw: dict[str, Any] = {_FIELDS[k]: v for k, v in d.items() if k in _FIELDS}
    for key in ("args", "paths", "raw"):
        if key in kw:
            kw[key] = tuple(kw[key])
    kw["is_end"] = not kw["is_start"]
    return Syscall(**kw)


def is_jsonl_name(path: str | Path) -> bool:
    """Recordings named *.jsonl / *.json (optionally .zst) are JSON lines; others raw."""
    return str(path).removesuffix(".zst").endswith((".jsonl", ".json"))


class Recorder:
    """Writes the header, then `write(sc)` per event (JSON lines) or `write_raw(chunk)`
    per drained run of ring buffer records (raw, when `raw_dtype` is given)."""

    def __init__(
        self,
        path: str | Path,
        tool_args: list[str] | None = None,
        raw_dtype: np.dtype[Any] | None = None,
        wall_offset_ns: int = 0,
        created: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.created = created or iso_now()
        self.raw = raw_dtype is not None
        self._proc: subprocess.Popen[bytes] | None = None
        self._file: IO[bytes] | None = None
        if self.path.suffix == ".zst":
            zstd = _zstd()  # before any file is made
            self._file = _create(self.path, -1)
            self._proc = subprocess.Popen(
                [zstd, "-q", "-c", "-3"], stdin=subprocess.PIPE, stdout=self._file
            )
            assert self._proc.stdin is not None
            self._out: IO[bytes] = self._proc.stdin
        else:
            self._out = _create(self.path, 1 << 20)
        header: dict[str, Any] = {
            "format": FORMAT,
            "version": RAW_VERSION if raw_dtype is not None else VERSION,
            "created": self.created,
        }
        if raw_dtype is not None:
            header["encoding"] = "ring buffer records: u32 len, u32 pad, record, 8-aligned"
            header["record"] = dtype_to_json(raw_dtype)
            header["wall_offset_ns"] = wall_offset_ns
        if tool_args is not None:
            header["args"] = tool_args
        self._line(header)
        self.count = 0
        self.bytes = 0

    def _line(self, obj: dict[str, Any]) -> None:
        self._out.write(dumps(obj).encode() + b"\n")

    def write(self, sc: Syscall) -> None:
        assert not self.raw, "a raw recording takes write_raw()"
        self._out.write(json_line(sc).encode())
        self.count += 1

    def write_many(self, events: list[Syscall]) -> None:
        """write() for a batch, in one call to the file."""
        assert not self.raw, "a raw recording takes write_raw()"
        self._out.write("".join([json_line(sc) for sc in events]).encode())
        self.count += len(events)

    def write_lines(self, lines: bytes, events: int) -> None:
        """`events` lines made elsewhere as write() makes them (jsonl_bulk.JsonLines)."""
        assert not self.raw, "a raw recording takes write_raw()"
        self._out.write(lines)
        self.count += events

    def write_raw(self, chunk: bytes, records: int) -> None:
        """Framed records as drained from the ring (RingBuffer.drain_bytes)."""
        assert self.raw, "a JSON lines recording takes write()"
        if chunk:
            self._out.write(chunk)
            self.count += records
            self.bytes += len(chunk)

    def close(self) -> None:
        self._out.close()
        if self._proc is not None:
            self._proc.wait()
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(path: Path) -> tuple[IO[bytes], Callable[[bool], None]]:
    """The recording's bytes (decompressed), and the close to call at its end (which
    checks that zstd succeeded when asked to)."""
    if path.suffix == ".zst":
        proc = subprocess.Popen(
            [_zstd(), "-q", "-d", "-c", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None

        def done(check: bool) -> None:
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            if not check:
                proc.kill()
            err = proc.stderr.read().decode(errors="replace").strip()
            proc.stderr.close()
            if proc.wait() != 0 and check:
                raise UsageError(f"{path}: zstd could not decompress it ({err or 'error'})")

        return proc.stdout, done
    f = open(path, "rb")  # noqa: SIM115 - closed by done()
    return f, lambda check: f.close()


def _header(p: Path, stream: IO[bytes]) -> tuple[dict[str, Any], int]:
    """The header line of a recording (checked) and its length in bytes."""
    first = stream.readline(_HEADER_MAX)
    if not first:
        raise UsageError(f"{p}: line 1: empty file, not a meridian syscalls recording")
    header = _parse(p, 1, first)
    if header.get("format") != FORMAT:
        raise UsageError(
            f"{p}: line 1 is not a meridian syscalls header "
            "(recorded by another tool?): record with meridian syscalls -w"
        )
    version = header.get("version")
    if version not in (VERSION, RAW_VERSION):
        raise UsageError(
            f"{p}: line 1: format version {version!r}, "
            f"this meridian reads versions {VERSION} and {RAW_VERSION}"
        )
    return header, len(first)


def _exists(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"recording {p} does not exist")
    return p


def read_header(path: str | Path) -> dict[str, Any]:
    """A recording's header (format, version, created, args, ...), checked."""
    p = _exists(path)
    stream, done = _open(p)
    try:
        return _header(p, stream)[0]
    finally:
        done(False)


def _reading(
    path: str | Path, body: Callable[[Path, dict[str, Any], int, IO[bytes]], Iterator[T]]
) -> Iterator[T]:
    """What `body(path, header, offset after it, stream)` yields from a recording;
    UsageError naming the line or record for a bad file."""
    p = _exists(path)
    stream, done = _open(p)
    try:
        header, at = _header(p, stream)
        yield from body(p, header, at, stream)
    except UsageError:
        # At the end of the stream, a failed zstd (a cut-off frame) says why better.
        done(not stream.read(1))
        raise
    except BaseException:
        done(False)
        raise
    done(True)


def read_events(path: str | Path) -> Iterator[Syscall]:
    """The recorded events in order; UsageError naming the line for a bad file."""
    return _reading(path, _events)


def read_blocks(path: str | Path) -> Iterator[RawBlock]:
    """A raw recording's records, whole, a block at a time (for bulk work on them);
    UsageError naming the record for a damaged file, or for JSON lines."""
    return _reading(path, _raw_blocks)


def _events(p: Path, header: dict[str, Any], at: int, stream: IO[bytes]) -> Iterator[Syscall]:
    if header["version"] == RAW_VERSION:
        return _raw_events(p, header, at, stream)
    return _json_events(p, stream)


def read_until_damage(path: str) -> tuple[list[Syscall], UsageError | None]:
    """A recording's events up to any damage, and the damage (a truncated file is
    still worth viewing). A file that is not a recording at all is an error at once."""
    events: list[Syscall] = []
    try:
        events.extend(read_events(path))
    except UsageError as exc:
        if not events:
            raise
        return events, exc
    return events, None


def _parse(p: Path, n: int, line: bytes) -> dict[str, Any]:
    truncated = not line.endswith(b"\n")
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("not an object")
    except ValueError:
        what = "truncated" if truncated else "not a JSON object"
        raise UsageError(f"{p}: line {n} is {what}: the recording is damaged") from None
    return obj


def _json_events(p: Path, stream: IO[bytes]) -> Iterator[Syscall]:
    for n, line in enumerate(stream, 2):
        obj = _parse(p, n, line)
        missing = [k for k in _REQUIRED if k not in obj]
        if missing:
            raise UsageError(f"{p}: line {n} is not a syscall event (no {', '.join(missing)})")
        if not line.endswith(b"\n"):
            raise UsageError(f"{p}: line {n} is truncated: the recording is damaged")
        try:
            yield decode(obj)
        except TypeError as exc:
            raise UsageError(f"{p}: line {n} has a bad field: {exc}") from None


class RawBlock(NamedTuple):
    """Whole records of a raw recording, with the layout and the offset from
    CLOCK_MONOTONIC to wall time its header gives."""

    frames: Frames
    dtype: np.dtype[Any]
    wall_offset_ns: int


def _raw_blocks(p: Path, header: dict[str, Any], at: int, stream: IO[bytes]) -> Iterator[RawBlock]:
    """Raw records after the header line; `at`: the byte offset of the first one."""
    if header["version"] != RAW_VERSION:
        raise UsageError(f"{p}: a JSON lines recording, not raw kernel records")
    try:
        dtype = dtype_from_json(header.get("record"))
    except ValueError as exc:
        raise UsageError(f"{p}: line 1: {exc}") from None
    offset = int(header.get("wall_offset_ns", 0))
    pending = b""
    n = 0
    while True:
        block = stream.read(_BLOCK)
        buf = pending + block if pending else block
        if not buf:
            return
        fr = frames(buf)
        if len(fr) and min(fr.lengths) < dtype.itemsize:
            raise UsageError(
                f"{p}: record {n + 1} (byte {at}) is shorter than a record header: "
                "the recording is damaged"
            )
        yield RawBlock(fr, dtype, offset)
        n += len(fr)
        pending = buf[fr.used :]
        at += fr.used
        if not block:
            if pending:
                raise UsageError(
                    f"{p}: record {n + 1} (byte {at}) is truncated: the recording is damaged"
                )
            return


def _raw_events(p: Path, header: dict[str, Any], at: int, stream: IO[bytes]) -> Iterator[Syscall]:
    rows = rows_by_content()
    for fr, dtype, offset in _raw_blocks(p, header, at, stream):
        for i in range(0, len(fr), 8192):
            yield from decode_frames(fr, dtype, offset, i, i + 8192, rows)
