"""OTLP logs at the speed of the event stream: records encoded in protobuf batches
(wire.py) by the thread that emits them, queued (bounded), and sent by a background
thread over gRPC or HTTP/protobuf (transport.py).

Nothing is lost silently. A full queue (the collector is slower than the events, or
away) drops the new records and counts them; a request that fails with a retryable
error stays at the head of the queue and is tried again with backoff (doubling from
0.25 s up to 30 s, with jitter: backoff.py), so a collector that goes away and comes
back costs no records as long as the queue holds them; one that refuses a request for
good (HTTP 400, gRPC INVALID_ARGUMENT) has its records counted as rejected. `close()`
sends what is queued until a deadline, then counts what is left as unsent. `lost()`
says all of it, for the tool's summary; a failure is said once on stderr when it
first happens.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

import numpy as np

from .. import __version__
from ..backoff import Backoff
from .otlp import resource_attrs
from .transport import Endpoint, FirstFailure, Sent, Transport
from .wire import Column, LogEncoder

__all__ = ["MAX_QUEUE_RECORDS", "OtlpLogs"]

MAX_QUEUE_RECORDS = 1 << 18  # ~170 MB of io records at most; past it, new ones drop
BACKOFF_S = (0.25, 30.0)  # the first retry's delay, the longest


def _rejected(response: bytes) -> int:
    """partial_success.rejected_log_records of an ExportLogsServiceResponse (0 if none)."""
    if not response:
        return 0
    try:
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
            ExportLogsServiceResponse,
        )
    except ImportError:
        return 0
    try:
        r = ExportLogsServiceResponse.FromString(response)
    except Exception:  # a body that is not one: nothing to count
        return 0
    return int(r.partial_success.rejected_log_records)


class OtlpLogs:
    """Log records for one tool: `emit()` from the event loop, `close()` at the end."""

    def __init__(
        self,
        tool: str,
        endpoint: str,
        protocol: str = "grpc",
        headers: Mapping[str, str] | None = None,
        resource: Mapping[str, str | int | bool] | None = None,
        err: TextIO | None = None,
        max_queue: int = MAX_QUEUE_RECORDS,
    ) -> None:
        self.endpoint = endpoint
        self.failure = FirstFailure(
            f"OTLP logs export to {endpoint} ({protocol})",
            "records wait in a bounded queue",
            err,
        )
        self.encoder = LogEncoder(
            resource_attrs(tool) if resource is None else resource,
            f"meridian.{tool}",
            __version__,
            f"meridian.{tool}",
        )
        self.transport = Transport("logs", Endpoint.parse(endpoint), protocol, headers or {})
        self.max_queue = max_queue
        self.emitted = self.sent = self.dropped = self.rejected = self.unsent = 0
        self.failures = 0
        self.last_error = ""
        self._queue: collections.deque[tuple[bytes, int]] = collections.deque()
        self._queued = 0  # records in the queue
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._deadline: float | None = None  # set by close(): send until then
        self._closed = False
        self._closing = threading.Event()
        self._backoff = Backoff(*BACKOFF_S)
        self._thread = threading.Thread(target=self._run, name="otlp-logs", daemon=True)
        self._thread.start()

    # ---- the emitting thread ------------------------------------------------------------

    def emit(
        self, bodies: Sequence[bytes], time_ns: np.ndarray, attrs: Sequence[tuple[str, Column]]
    ) -> None:
        """Records with these bodies, Unix times in ns and attribute columns (one value
        per record in each); observed now. Dropped and counted when the queue is full."""
        n = len(bodies)
        if not n:
            return
        self.emitted += n
        with self._lock:
            room = self.max_queue - self._queued
        if room < n:  # not even encoded: the collector is behind or away
            self.dropped += n
            return
        recs = self.encoder.records(bodies, time_ns, time.time_ns(), attrs)
        with self._lock:
            for body, count in self.encoder.requests(recs):
                self._queue.append((body, count))
                self._queued += count
            self._wake.notify()

    # ---- the sending thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                body, count = self._queue[0]
                deadline = self._deadline
            timeout = 10.0 if deadline is None else deadline - time.monotonic()
            if timeout <= 0:
                return  # close() counts what is left
            r: Sent = self.transport.send(body, min(timeout, 10.0))
            if r.ok or not r.retry:
                with self._lock:
                    self._queue.popleft()
                    self._queued -= count
                if r.ok:
                    bad = min(_rejected(r.response), count)
                    self.sent += count - bad
                    self.rejected += bad
                    self._backoff.reset()
                    continue
                self.rejected += count
            self.failures += 1
            self.last_error = r.error
            self.failure.say(r.error)
            if r.retry:
                if deadline is not None:  # closing: a few more tries until the deadline
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    time.sleep(min(0.2, left))
                    continue
                self._closing.wait(self._backoff.failed())  # close() cuts it short

    def close(self, deadline: float | None = None) -> None:
        """Send what is queued until `deadline` (time.monotonic(); default 2 s from
        now), then stop; what is still queued is counted as unsent."""
        end = time.monotonic() + 2.0 if deadline is None else deadline
        with self._lock:
            self._deadline, self._closed = end, True
            self._wake.notify()
        self._closing.set()
        self._thread.join(max(0.0, end - time.monotonic()) + 0.5)
        with self._lock:
            self.unsent = self._queued
            self._queue.clear()
            self._queued = 0
        self.transport.close()

    def lost(self) -> dict[str, int]:
        """The records that did not arrive, by why (for the tool's summary): with
        `sent` they add up to `emitted` once closed."""
        return {
            "otlp_logs_dropped": self.dropped,
            "otlp_logs_rejected": self.rejected,
            "otlp_logs_unsent": self.unsent,
        }

    def summary(self) -> str:
        """One line for stderr when records did not arrive, else ''."""
        lost = self.dropped + self.rejected + self.unsent
        if not lost:
            return ""
        why = (f"; last error: {self.last_error}") if self.last_error else ""
        return (
            f"meridian: {lost} of {self.emitted} OTLP log records were not delivered "
            f"({self.dropped} dropped with the queue full, {self.rejected} rejected, "
            f"{self.unsent} unsent at the end{why})"
        )
