"""meridian io's events as OTLP log records (`--otlp-logs`): the body is the event's
JSON line, the attributes follow the semantic conventions where they exist.

The records go to `OtlpLogs.emit` as columns: numbers straight from the event
records' numpy columns, strings (command, direction, file) from the JSON line's
identity part (everything before `"bytes"`), decoded once per distinct identity, so
the attributes say what the body says however the formatter names a file.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ...export.logs import OtlpLogs
    from ...export.wire import Column

__all__ = ["IDENTITY_ATTRS", "NUMBER_ATTRS", "IoLogs"]

# JSON identity fields -> attributes (integers, then strings).
IDENTITY_ATTRS = (
    ("pid", "process.pid"),
    ("tid", "thread.id"),
    ("fd", "meridian.io.fd"),
    ("comm", "process.executable.name"),
    ("op", "disk.io.direction"),
    ("interface", "meridian.io.interface"),  # syscall, or io_uring
    ("file", "file.path"),
)
# Event record fields -> attributes.
NUMBER_ATTRS = (
    ("bytes", "meridian.io.bytes"),
    ("bytes_requested", "meridian.io.bytes_requested"),
    ("disk_bytes", "meridian.io.disk_bytes"),
    ("latency_ns", "meridian.io.latency_ns"),
    ("cached", "meridian.io.cached"),
    ("io_wait_ns", "meridian.io.io_wait_ns"),
    ("sector", "meridian.io.sector"),  # -1: the operation submitted no block I/O
    ("ts_ns", "meridian.io.timestamp_ns"),
)
_SPLIT = b',"bytes":'
_CACHE_MAX = 65536


class IoLogs:
    """Turns batches of events (records and their JSON lines) into log records."""

    def __init__(self, logs: OtlpLogs, offset_ns: int) -> None:
        """`offset_ns`: Unix time minus CLOCK_MONOTONIC (the events' clock)."""
        self.logs, self.offset_ns = logs, offset_ns
        self._ident: dict[bytes, tuple[Any, ...]] = {}

    def _identity(self, head: bytes) -> tuple[Any, ...]:
        got = self._ident.get(head)
        if got is None:
            if len(self._ident) >= _CACHE_MAX:
                self._ident.clear()
            text = head if head.endswith(b"}") else head + b"}"
            d = json.loads(text)
            got = self._ident[head] = tuple(d.get(k) for k, _ in IDENTITY_ATTRS)
        return got

    def emit(self, recs: np.ndarray[Any, Any], json_text: str) -> None:
        """`json_text`: the events' JSON lines (EventFormatter.json_lines(recs))."""
        bodies = json_text.encode().split(b"\n")
        if bodies and not bodies[-1]:
            bodies.pop()
        assert len(bodies) == len(recs), (len(bodies), len(recs))
        if not bodies:
            return
        # Each record's identity as an index into this batch's distinct identities.
        local: dict[bytes, int] = {}
        codes = np.fromiter(
            (local.setdefault(b.partition(_SPLIT)[0], len(local)) for b in bodies),
            dtype=np.intp,
            count=len(bodies),
        )
        rows = [self._identity(head) for head in local]
        attrs: list[tuple[str, Column]] = []
        for i, (_, name) in enumerate(IDENTITY_ATTRS):
            values = ["" if r[i] is None else r[i] for r in rows]
            attrs.append((name, (values, codes)))
        for field, name in NUMBER_ATTRS:
            c = recs[field]
            attrs.append((name, c != 0 if field == "cached" else c))
        ts = recs["ts_ns"].astype(np.int64) + self.offset_ns
        self.logs.emit(bodies, ts, attrs)
