"""Lossless JSON lines recordings of a live capture. Decoding and encoding JSON cost
about a microsecond per event even in bulk (`jsonl_bulk`; several for calls that are
all different), an openat+fstat+close loop makes over a million and a half a second,
and any time the capture spends encoding is time taken from the traced programs on a
small machine, or time the ring fills up (the kernel then drops). So while capturing,
`SpooledJsonRecorder` writes exactly what `-w FILE.raw` writes, to a spool file beside
the destination, and only when the capture ends converts the spool to the same JSON
lines a direct writer makes, then removes it. A conversion that is interrupted or
fails keeps the spool (a complete raw recording) and says how to finish it:
`meridian syscalls -r SPOOL -w FILE.jsonl` (`convert`)."""

from __future__ import annotations

import gc
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from ...errors import MeridianError, UsageError
from .jsonl_bulk import JsonLines
from .recording_file import (
    RAW_VERSION,
    Recorder,
    is_jsonl_name,
    read_blocks,
    read_events,
    read_header,
)

__all__ = ["SpooledJsonRecorder", "convert", "convert_command"]

_BATCH = 8192  # events decoded and written at a time
QUIET_S = 1.0  # a conversion longer than this says how far it is on stderr
EVERY_S = 5.0  # and again this often (every second on a terminal, in place)


class Progress:
    """Progress of a conversion on `note`: nothing for the first second, then a line
    now and then (rewritten in place on a terminal)."""

    def __init__(self, note: IO[str] | None, dst: Path, total: int | None) -> None:
        self.note, self.dst, self.total = note, dst, total
        self.tty = note is not None and note.isatty()
        self.start = time.monotonic()
        self.next = self.start + QUIET_S
        self.shown = False

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.note is None or now < self.next:
            return
        self.next = now + (1.0 if self.tty else EVERY_S)
        line = f"meridian syscalls: writing {self.dst}: {done}"
        if self.total:
            line += f" of {self.total} events ({100 * done // self.total}%)"
        else:
            line += " events"
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=self.note)
        self.note.flush()
        self.shown = True

    def end(self) -> None:
        if self.shown and self.tty and self.note is not None:
            print(file=self.note)


def convert(
    src: str | Path, dst: str | Path, note: IO[str] | None = None, total: int | None = None
) -> int:
    """Write recording `src` (raw or JSON lines) to `dst` as JSON lines, with the same
    header (`created`, `args`) and so the same bytes as a direct writer would have
    made; `total`: the events in `src` if known (for the progress line). Returns the
    number of events. `dst` is removed if this does not finish."""
    src, dst = Path(src), Path(dst)
    if not is_jsonl_name(dst):
        raise UsageError(f"-r {src} -w {dst}: converting writes JSON lines: name it .jsonl")
    if src.exists() and dst.exists() and src.samefile(dst):
        raise UsageError(f"-r {src} -w {dst}: the same file: name another one")
    header = read_header(src)
    args = header.get("args")
    progress = Progress(note, dst, total)
    out = Recorder(dst, args if isinstance(args, list) else None, created=header.get("created"))
    collect = gc.isenabled()
    gc.disable()  # millions of short-lived rows and no cycles: collections cost 15%
    try:
        if header["version"] == RAW_VERSION:
            _convert_raw(src, out, progress)
        else:
            events = read_events(src)
            while batch := list(itertools.islice(events, _BATCH)):
                out.write_many(batch)
                progress.update(out.count)
        out.close()
    except BaseException:
        out.close()
        dst.unlink(missing_ok=True)
        raise
    finally:
        if collect:
            gc.enable()
        progress.end()
    return out.count


def _convert_raw(src: Path, out: Recorder, progress: Progress) -> None:
    """A raw recording's records as JSON lines, in bulk (jsonl_bulk)."""
    lines = JsonLines()
    for fr, dtype, offset in read_blocks(src):
        for i in range(0, len(fr), _BATCH):
            n = min(_BATCH, len(fr) - i)
            out.write_lines(lines.lines(fr, dtype, offset, i, i + n), n)
            progress.update(out.count)


def convert_command(src: str, dst: str, err: IO[str]) -> int:
    """`meridian syscalls -r SRC -w DST.jsonl`: every event of a recording (a spool a
    conversion left, a raw recording, JSON lines to compress) as JSON lines."""
    n = convert(src, dst, err)
    print(f"meridian syscalls: {n} events written to {dst}", file=err)
    return 0


class SpooledJsonRecorder(Recorder):
    """A JSON lines recording of a live capture: while capturing, a raw recording in a
    spool named `<name>.<random>.part.rec` beside `path` (the same bytes, written as
    fast as `-w FILE.raw`); `close()` converts it to `path` and removes it."""

    def __init__(
        self,
        path: str | Path,
        tool_args: list[str] | None,
        raw_dtype: np.dtype[Any],
        wall_offset_ns: int = 0,
    ) -> None:
        self.final = Path(path)
        # The destination first, as the conversion will write it: a name that cannot
        # be written (a missing directory, no zstd for .zst) is an error now, not after
        # the capture, and leaves no spool behind.
        Recorder(self.final, tool_args).close()
        try:
            fd, name = tempfile.mkstemp(
                prefix=f"{self.final.name}.", suffix=".part.rec", dir=self.final.parent
            )
        except OSError as exc:
            self.final.unlink(missing_ok=True)
            raise UsageError(f"-w {path}: cannot write beside it ({exc.strerror})") from None
        os.close(fd)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(name, 0o666 & ~mask)  # as any recording, not mkstemp's 0600
        self.spool = Path(name)
        try:
            super().__init__(self.spool, tool_args, raw_dtype, wall_offset_ns)
        except BaseException:
            self.spool.unlink(missing_ok=True)
            self.final.unlink(missing_ok=True)
            raise
        self._closed = False

    def close(self, note: IO[str] | None = sys.stderr) -> None:
        """End the spool and convert it to the JSON lines (progress on `note` if that
        takes more than a second). Interrupted or failed, the spool stays: a
        MeridianError says where it is and the command that finishes the job."""
        if self._closed:
            return
        self._closed = True
        super().close()
        try:
            convert(self.spool, self.final, note, self.count)
        except (KeyboardInterrupt, Exception) as exc:
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"failed ({exc})"
            raise MeridianError(
                f"{why} while writing {self.final}: every event is kept in {self.spool}; "
                f"finish with: meridian syscalls -r {self.spool} -w {self.final}"
            ) from None
        self.spool.unlink()
