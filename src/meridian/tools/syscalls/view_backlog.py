"""Raw records drained from the ring but not shown yet, when recording: the view takes
them a slice at a time, so a slow view never holds up the drain."""

from __future__ import annotations

import collections
from typing import Any

from .event import Syscall
from .kernel import Capture
from .ring_records import decode_frames, frames, rows_by_content

__all__ = ["BACKLOG_BYTES", "VIEW_SLICE", "Backlog"]

VIEW_SLICE = 0.02  # seconds the view may take between two drains (raw recording)
BACKLOG_BYTES = 16 << 20  # raw records waiting for the view, at most


class Backlog:
    """Raw records the view has not shown yet, when recording: the view takes them a
    slice at a time between drains, so a slow view never holds up the drain (and the
    kernel never drops for it). A chunk is kept as drained and its frames are walked
    only as the view takes records, so pushing costs nothing. Past `limit` bytes the
    oldest chunks are skipped by the view and counted; they are in the recording."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # [bytes, next record's byte offset, records not taken yet]
        self._chunks: collections.deque[list[Any]] = collections.deque()
        self.bytes = 0
        self.skipped = 0
        self._rows = rows_by_content()  # a traced loop's few calls, decoded once

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def push(self, chunk: bytes, records: int) -> None:
        if not chunk:
            return
        self._chunks.append([chunk, 0, records])
        self.bytes += len(chunk)
        while self.bytes > self.limit and len(self._chunks) > 1:
            buf, _, left = self._chunks.popleft()
            self.bytes -= len(buf)
            self.skipped += left

    def take(self, cap: Capture, n: int) -> list[Syscall]:
        """Up to `n` of the oldest records, decoded."""
        c = self._chunks[0]
        fr = frames(c[0], c[1], n)
        c[1], c[2] = fr.used, max(0, c[2] - len(fr))
        if len(fr) < n or fr.used >= len(c[0]):
            self._chunks.popleft()
            self.bytes -= len(c[0])
        return decode_frames(fr, cap.dtype, cap.offset_ns, contents=self._rows)
