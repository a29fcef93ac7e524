"""One process per directory: an exclusive flock on a file that holds the holder's pid,
so whoever is kept out can be told which process is in the way. The lock goes with
the file descriptor (closing it, or the process ending, releases it)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["LockHeld", "holder", "take"]


class LockHeld(Exception):
    """Another process holds the lock; `pid` is what it wrote ("?" when nothing)."""

    def __init__(self, pid: str) -> None:
        super().__init__(pid)
        self.pid = pid


def take(path: Path) -> int:
    """Lock `path` (made with its directory when missing) and write our pid in it;
    the descriptor to close when done. LockHeld when taken, OSError when it cannot be
    made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise LockHeld(other) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def holder(path: Path) -> int | None:
    """The pid of the process holding the lock on `path` (-1: one whose pid cannot be
    read), None when free or missing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
