"""The on-disk queue of batches not yet stored: a FIFO of files in one directory, at
most `max_bytes` together, counted as the disk blocks the files take (what `du` and
the kubelet's emptyDir sizeLimit count: a batch of a few rows takes a whole block, so
counting its bytes let a quiet node's spool take up to 10x more). Every batch is
written here before it is sent, and removed once the store has it; the spool outlives
the agent, so the next run on it sends what the last one could not.

One file per batch, `<seq>.batch`: a JSON header line (the BatchInfo and whether the
batch may already be stored) and the JSONEachRow payload. A file is written under a
temporary name, synced and renamed, so a crash leaves a whole batch or none. A lock
file keeps a second agent out of a spool in use.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from ....errors import EnvironmentProblem
from . import lockfile
from .backend import BatchInfo

__all__ = ["Spool", "Spooled"]

LOCK_NAME = ".lock"
SUFFIX = ".batch"


@dataclass(frozen=True)
class Spooled:
    seq: int
    info: BatchInfo
    size: int  # bytes on disk
    uncertain: bool  # an insert of it had no answer: look for it before sending again


class Spool:
    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        self.dir = Path(directory).expanduser().absolute()
        self.max_bytes = int(max_bytes)
        self.last_error = ""  # why the last put failed
        self.unreadable = 0  # files set aside as .bad at start
        self._mu = threading.Lock()
        self._entries: list[Spooled] = []
        self._bytes = 0
        self._rows = 0
        self._next = 1
        self._lock_fd = self._take_lock()
        self._scan()
        self.inherited_rows = self._rows  # what an earlier run left

    def _take_lock(self) -> int:
        try:
            return lockfile.take(self.dir / LOCK_NAME)
        except lockfile.LockHeld as held:
            raise EnvironmentProblem(
                f"storage spool {self.dir} is in use by another agent (pid {held.pid}): "
                "give this one its own (--spool-dir DIR, or clickhouse.spool_dir)"
            ) from None
        except OSError as exc:
            raise EnvironmentProblem(
                f"storage spool {self.dir} cannot be created: {exc.strerror or exc}"
            ) from None

    def _scan(self) -> None:
        for path in sorted(self.dir.glob(f"*{SUFFIX}")):
            try:
                seq = int(path.stem)
                with open(path, "rb") as f:
                    head = json.loads(f.readline())
                info = BatchInfo(**head["info"])
                entry = Spooled(seq, info, _on_disk(path), bool(head["uncertain"]))
            except (OSError, ValueError, KeyError, TypeError):
                with contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".bad"))
                self.unreadable += 1
                continue
            self._entries.append(entry)
            self._bytes += entry.size
            self._rows += info.rows
            self._next = max(self._next, seq + 1)
        for tmp in self.dir.glob("*.tmp"):  # a write the last run did not finish
            with contextlib.suppress(OSError):
                tmp.unlink()
        if self._entries:  # the last run may have died between storing it and its unlink
            self._entries[0] = replace(self._entries[0], uncertain=True)

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:016d}{SUFFIX}"

    def _write(self, seq: int, info: BatchInfo, payload: bytes, uncertain: bool) -> int:
        head = json.dumps({"info": info.__dict__, "uncertain": uncertain}).encode() + b"\n"
        tmp = self.dir / f"{seq:016d}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(seq))
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return _on_disk(self._path(seq))

    def put(self, info: BatchInfo, payload: bytes, uncertain: bool = False) -> bool:
        """Append a batch; False when it does not fit under max_bytes or cannot be
        written (`last_error` says which): the caller counts its rows as dropped."""
        with self._mu:
            size = _blocks(len(payload) + 256)  # the header is a few dozen bytes
            if self._bytes + size > self.max_bytes:
                self.last_error = (
                    f"storage spool {self.dir} is full ({_size(self.max_bytes)}, "
                    "clickhouse.spool_max_bytes)"
                )
                return False
            seq = self._next
            try:
                size = self._write(seq, info, payload, uncertain)
            except OSError as exc:
                self.last_error = f"storage spool {self.dir}: {exc.strerror or exc}"
                return False
            self._next += 1
            self._entries.append(Spooled(seq, info, size, uncertain))
            self._bytes += size
            self._rows += info.rows
            return True

    def peek(self) -> tuple[Spooled, bytes] | None:
        """The oldest batch and its payload; one that cannot be read is removed and
        returned with an empty payload (its rows are then counted dropped)."""
        with self._mu:
            if not self._entries:
                return None
            entry = self._entries[0]
        try:
            with open(self._path(entry.seq), "rb") as f:
                f.readline()
                return entry, f.read()
        except OSError as exc:
            self.last_error = f"storage spool {self.dir}: {exc.strerror or exc}"
            self.pop(entry)
            return entry, b""

    def pop(self, entry: Spooled) -> None:
        with self._mu:
            for i, e in enumerate(self._entries):
                if e.seq == entry.seq:
                    del self._entries[i]
                    self._bytes -= e.size
                    self._rows -= e.info.rows
                    break
        with contextlib.suppress(OSError):
            self._path(entry.seq).unlink()

    def mark_uncertain(self, entry: Spooled, payload: bytes) -> Spooled:
        """Remember (on disk too) that an insert of this batch had no answer."""
        if entry.uncertain:
            return entry
        new = replace(entry, uncertain=True)
        with self._mu:
            # Kept in memory even when the header cannot be rewritten (the file still
            # holds the rows): the next send looks the batch up before inserting it.
            self._entries = [new if e.seq == entry.seq else e for e in self._entries]
            with contextlib.suppress(OSError):
                self._write(entry.seq, entry.info, payload, True)
        return new

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        """Release the lock; the batches stay for the next run."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


BLOCK = 4096  # the allocation unit of the file systems a spool lives on (ext4, xfs, tmpfs)


def _blocks(n: int) -> int:
    """`n` bytes as the whole blocks a file of them takes."""
    return -(-n // BLOCK) * BLOCK


def _on_disk(path: Path) -> int:
    """What a file takes on disk: its allocated blocks (at least its size in blocks)."""
    st = path.stat()
    return max(st.st_blocks * 512, _blocks(st.st_size))


def _size(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB"):
        if x < 1024:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} GiB"
