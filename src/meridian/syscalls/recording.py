"""Record (-w) and replay (-r): every event as one JSON object per line after a header
line naming the format and its version; a name ending in .zst is compressed with the
zstd program. Replay feeds the same events to a fresh Aggregator, so it pairs exactly
as live capture did. A truncated or foreign file is an error naming the line."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import UsageError
from ..output import dumps, iso_now
from .record import Syscall

__all__ = ["FORMAT", "VERSION", "Recorder", "read_events"]

FORMAT = "meridian-syscalls"
VERSION = 1

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


def decode(d: dict[str, Any]) -> Syscall:
    kw: dict[str, Any] = {_FIELDS[k]: v for k, v in d.items() if k in _FIELDS}
    for key in ("args", "paths", "raw"):
        if key in kw:
            kw[key] = tuple(kw[key])
    kw["is_end"] = not kw["is_start"]
    return Syscall(**kw)


class Recorder:
    """Writes the header, then `write(sc)` per event, as they arrive (not paired)."""

    def __init__(self, path: str | Path, tool_args: list[str] | None = None) -> None:
        self.path = Path(path)
        self._proc: subprocess.Popen[bytes] | None = None
        self._raw: IO[bytes] | None = None
        if self.path.suffix == ".zst":
            self._raw = open(self.path, "wb")  # noqa: SIM115 - closed in close()
            self._proc = subprocess.Popen(
                [_zstd(), "-q", "-c"], stdin=subprocess.PIPE, stdout=self._raw
            )
            assert self._proc.stdin is not None
            self._out: IO[bytes] = self._proc.stdin
        else:
            self._out = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        header = {"format": FORMAT, "version": VERSION, "created": iso_now()}
        if tool_args is not None:
            header["args"] = tool_args
        self._line(header)
        self.count = 0

    def _line(self, obj: dict[str, Any]) -> None:
        self._out.write(dumps(obj).encode() + b"\n")

    def write(self, sc: Syscall) -> None:
        self._line(encode(sc))
        self.count += 1

    def close(self) -> None:
        self._out.close()
        if self._proc is not None:
            self._proc.wait()
        if self._raw is not None:
            self._raw.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lines(path: Path) -> Iterator[bytes]:
    if path.suffix == ".zst":
        proc = subprocess.Popen(
            [_zstd(), "-q", "-d", "-c", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None
        yield from proc.stdout
        proc.stdout.close()
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace").strip()
        proc.stderr.close()
        if proc.wait() != 0:
            raise UsageError(f"{path}: zstd could not decompress it ({err or 'error'})")
        return
    with open(path, "rb") as f:
        yield from f


def read_events(path: str | Path) -> Iterator[Syscall]:
    """The recorded events in order; UsageError naming the line for a bad file."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"recording {p} does not exist")
    n = 0
    for n, line in enumerate(_lines(p), 1):
        truncated = not line.endswith(b"\n")
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except ValueError:
            what = "truncated" if truncated else "not a JSON object"
            raise UsageError(f"{p}: line {n} is {what}: the recording is damaged") from None
        if n == 1:
            if obj.get("format") != FORMAT:
                raise UsageError(
                    f"{p}: line 1 is not a meridian syscalls header "
                    "(recorded by another tool?): record with meridian syscalls -w"
                )
            if obj.get("version") != VERSION:
                raise UsageError(
                    f"{p}: line 1: format version {obj.get('version')!r}, "
                    f"this meridian reads version {VERSION}"
                )
            continue
        missing = [k for k in _REQUIRED if k not in obj]
        if missing:
            raise UsageError(f"{p}: line {n} is not a syscall event (no {', '.join(missing)})")
        if truncated:
            raise UsageError(f"{p}: line {n} is truncated: the recording is damaged")
        try:
            yield decode(obj)
        except TypeError as exc:
            raise UsageError(f"{p}: line {n} has a bad field: {exc}") from None
    if n == 0:
        raise UsageError(f"{p}: line 1: empty file, not a meridian syscalls recording")
