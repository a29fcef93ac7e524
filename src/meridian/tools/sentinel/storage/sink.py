"""The storage writer the runtime calls: rows in, batches out, nothing raised.

`write_*` turn rows into JSONEachRow lines in the caller's thread and return. The
spooler thread forms batches (`batch_rows` rows of one table, or what has waited
`flush_interval` seconds, or everything at `commit`, whichever comes first) and writes
each to the on-disk spool; the sender thread (sender.py) stores the spool exactly once,
oldest first. So a row is on disk within one flush interval of its write (at once
after `commit`) however long the store is down or slow, and a killed agent loses only
what was not yet written to the spool: the next agent on the same spool sends the rest.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .backend import Backend, BatchInfo
from .report import Reporter
from .rows import (
    Chunk,
    data_object_lines,
    flow_lines,
    function_lines,
    raw_lines,
    rollup_lines,
    stack_lines,
)
from .schema import DATA_OBJECTS, FLOWS, FUNCTIONS, RAW, ROLLUP, STACKS, TABLES
from .sender import Batch, Sender, SinkStats
from .spool import Spool

if TYPE_CHECKING:  # types only
    from ..model.dataobjects import DataObject
    from ..model.frames import Frame
    from ..model.rollup import Rollup

__all__ = ["BatchingSink", "Sink", "SinkStats"]

Array = np.ndarray[Any, Any]

# rows per insert at most: an insert stays one block, so one part, stored whole or not
# at all (ClickHouse cuts blocks at max_insert_block_size, 1,048,576 rows)
MAX_BATCH_ROWS = 100_000


class Sink(ABC):
    """What the runtime writes to. Rows become lines here, in the caller's thread, and
    a failure is counted and said, never raised: storage must not stop the agent."""

    run_id: int
    host: str

    def write_rollups(self, rollups: Sequence[Rollup] | Array) -> None:
        """A flush window's rollups (Aggregator.flush or flush_array)."""
        self._guard(ROLLUP, len(rollups), lambda: rollup_lines(rollups, self.run_id, self.host))

    def write_raw(
        self,
        samples: Array,
        *,
        lbr: Array | None = None,
        scale: float | Array = 1.0,
        wall_ns: Array | None = None,
        callstack_ids: Array | None = None,
    ) -> None:
        """Raw samples (sample_dtype) with their LBR records (lbr_dtype)."""
        self._guard(
            RAW,
            len(samples),
            lambda: raw_lines(
                samples,
                self.run_id,
                self.host,
                lbr=lbr,
                scale=scale,
                wall_ns=wall_ns,
                callstack_ids=callstack_ids,
            ),
        )

    def write_stacks(self, stacks: Sequence[tuple[int, Sequence[Frame]]]) -> None:
        """New call stacks (Symbolizer.consume_stacks)."""
        self._guard(
            STACKS, len(stacks), lambda: stack_lines(stacks, self.run_id, self.host, time.time_ns())
        )

    def write_data_objects(self, objects: Sequence[DataObject]) -> None:
        """New data objects (Symbolizer.consume_data_objects)."""
        self._guard(
            DATA_OBJECTS,
            len(objects),
            lambda: data_object_lines(objects, self.run_id, self.host, time.time_ns()),
        )

    def write_flows(self, flows: Sequence[tuple[int, str, str, int, int, str]]) -> None:
        """Flows named for the first time: (flow_id, src, dst, sport, dport, proto)."""
        self._guard(
            FLOWS, len(flows), lambda: flow_lines(flows, self.run_id, self.host, time.time_ns())
        )

    def write_functions(self, functions: Sequence[tuple[int, str, str]]) -> None:
        """Functions named for the first time: (function_id, binary, function)."""
        self._guard(
            FUNCTIONS,
            len(functions),
            lambda: function_lines(functions, self.run_id, self.host, time.time_ns()),
        )

    def _guard(self, table: str, rows: int, make: Callable[[], list[Chunk]]) -> None:
        """Lines from `make`, queued; a failure is counted and said, never raised."""
        try:
            chunks = make()
        except Exception as exc:  # a bad record must not stop the agent
            self._drop(rows, f"cannot store {rows} rows of {table}: {exc}", "convert")
            return
        if chunks:
            self._queue(table, chunks)

    @abstractmethod
    def _queue(self, table: str, chunks: list[Chunk]) -> None:
        """Take a table's lines (never raises)."""

    @abstractmethod
    def _drop(self, rows: int, message: str, key: str) -> None:
        """Count rows lost, and say why."""

    @abstractmethod
    def commit(self) -> bool:
        """What was written so far is due now, not after the flush interval; returns
        once it is on disk (True), or after the flush interval at most."""

    @abstractmethod
    def flush(self, timeout: float = 10.0) -> bool:
        """Send what is buffered; True when nothing waits, in memory or in the spool
        (rows dropped are counted in stats, not waited for). Returns early, False,
        when the store is down."""

    @abstractmethod
    def close(self, timeout: float = 10.0) -> None:
        """Flush, stop the writer, keep what could not be sent in the spool."""

    @abstractmethod
    def stats(self) -> SinkStats: ...


class BatchingSink(Sink):
    """A Sink over one Backend: the spooler and sender threads around an on-disk
    spool."""

    def __init__(
        self,
        backend: Backend,
        *,
        spool_dir: str,
        spool_max_bytes: int = 1 << 30,
        batch_rows: int = 10_000,
        flush_interval: float = 1.0,
        max_backoff: float = 30.0,
        max_pending_rows: int | None = None,
        run_id: int | None = None,
        host: str | None = None,
        reporter: Reporter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.batch_rows = min(max(1, int(batch_rows)), MAX_BATCH_ROWS)
        self.flush_interval = float(flush_interval)
        # memory's bound while the spool's disk does not keep up: past it rows are dropped
        # (counted), the runtime is never blocked on a disk
        self.max_pending_rows = max_pending_rows or max(10 * self.batch_rows, 200_000)
        self.run_id = int(run_id if run_id is not None else time.time_ns())
        self.host = host if host is not None else socket.gethostname()
        self.clock = clock
        self.spool = Spool(spool_dir, spool_max_bytes)
        self.sender = Sender(backend, self.spool, reporter or Reporter(), max_backoff, clock)

        self._cv = threading.Condition()  # guards what follows; both threads wait on it
        self._buf: dict[str, deque[Chunk]] = {t: deque() for t in TABLES}
        self._buf_rows = dict.fromkeys(TABLES, 0)
        self._since: dict[str, float | None] = dict.fromkeys(TABLES)
        self._inflight = 0  # rows taken out of memory, being written to the spool
        self._commits = 0  # commit() and flush() calls: everything in memory is due
        self._on_disk = 0  # the last of them whose rows the spooler has written
        self._stopping = False  # close(): the spooler takes the rest and ends
        self._stop_sending = False  # close(), after the spooler: the sender ends
        self._spooler = threading.Thread(target=self._spool_loop, name="sentinel-spooler")
        self._sender = threading.Thread(target=self._send_loop, name="sentinel-storage")
        for thread in (self._spooler, self._sender):
            thread.daemon = True
            thread.start()

    def _queue(self, table: str, chunks: list[Chunk]) -> None:
        rows = sum(len(lines) for _, lines in chunks)
        if self._stopping:
            self._drop(rows, f"{rows} rows of {table} written after close", "closed")
            return
        with self._cv:
            full = self._pending() + rows > self.max_pending_rows
            if not full:
                buf = self._buf[table]
                for chunk in chunks:
                    if chunk[1]:
                        buf.append(chunk)
                        self._buf_rows[table] += len(chunk[1])
                if self._since[table] is None and self._buf_rows[table]:
                    self._since[table] = self.clock()
                    self._cv.notify_all()  # the spooler's next deadline is this one
                elif self._buf_rows[table] >= self.batch_rows:
                    self._cv.notify_all()
        if full:
            self._drop(
                rows,
                f"{self.max_pending_rows} rows wait for the spool {self.spool.dir}, whose "
                "disk does not keep up: dropping rows",
                "slow-disk",
            )

    def _drop(self, rows: int, message: str, key: str) -> None:
        self.sender.drop(rows, message, key)

    def _pending(self) -> int:
        return sum(self._buf_rows.values()) + self._inflight

    def commit(self) -> bool:
        """A window's rows: printed after this, so a killed agent loses at most the
        window being built. A disk that hangs holds the caller a second at most."""
        deadline = time.monotonic() + min(self.flush_interval, 1.0)
        with self._cv:
            self._commits += 1
            mine = self._commits
            self._cv.notify_all()
            while self._on_disk < mine and self._spooler.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return self._on_disk >= mine

    def flush(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cv:
            self._commits += 1
            self._cv.notify_all()
            while True:
                # done: memory spooled, and the spool stored or the store tried and down
                down = not self.sender.connected and self.sender.attempts > 0
                if self._pending() == 0 and (len(self.spool) == 0 or down):
                    break
                left = deadline - time.monotonic()
                if left <= 0 or not self._spooler.is_alive():
                    break
                self._cv.wait(min(left, 0.5))
            return self._pending() == 0 and len(self.spool) == 0

    def close(self, timeout: float = 10.0) -> None:
        if self._stopping:
            return
        self.flush(timeout)
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._spooler.join(timeout)
        with self._cv:
            self._stop_sending = True
            self._cv.notify_all()
            stuck = 0
            if self._spooler.is_alive():  # the spool's disk hangs: these are lost
                stuck = sum(self._buf_rows.values())
                for t in TABLES:
                    self._buf[t].clear()
                    self._buf_rows[t] = 0
        if stuck:
            self._drop(stuck, f"{stuck} rows not written to the spool at exit", "closed")
        self._sender.join(timeout)
        if not self._spooler.is_alive() and not self._sender.is_alive():
            self.backend.close()
            self.spool.close()

    def stats(self) -> SinkStats:
        with self._cv:
            pending = self._pending()
        return self.sender.stats(pending)

    # -- batches ----------------------------------------------------------------------

    def _take(self, table: str) -> Batch:
        """Up to batch_rows lines of one day from the head of a table's buffer, as one
        batch (lock held)."""
        buf = self._buf[table]
        day = buf[0][0]
        lines: list[str] = []
        while buf and buf[0][0] == day and len(lines) < self.batch_rows:
            d, chunk = buf.popleft()
            room = self.batch_rows - len(lines)
            if len(chunk) > room:
                buf.appendleft((d, chunk[room:]))
                chunk = chunk[:room]
            lines.extend(chunk)
        self._buf_rows[table] -= len(lines)
        self._since[table] = self.clock() if buf else None
        info = BatchInfo(table, secrets.randbits(63), len(lines), day, self.run_id)
        head = f'{{"batch_id":{info.batch_id},'
        payload = "".join(f"{head}{line}\n" for line in lines).encode()
        return info, payload

    def _due(self, now: float, everything: bool) -> list[Batch]:
        """Batches to spool now (lock held): full ones, and the rest of a table whose
        oldest row waited flush_interval (or all, on commit, flush and close)."""
        out = []
        for t in TABLES:
            since = self._since[t]
            old = since is not None and now - since >= self.flush_interval
            while self._buf_rows[t] and (self._buf_rows[t] >= self.batch_rows or old or everything):
                out.append(self._take(t))
        return out

    def _next_deadline(self, now: float) -> float:
        waits = [s + self.flush_interval - now for s in self._since.values() if s is not None]
        return max(0.0, min(waits, default=1.0))

    # -- the threads ----------------------------------------------------------------

    def _spool_loop(self) -> None:
        """Memory to disk: every batch as it becomes due, whatever the store does."""
        while True:
            with self._cv:
                while True:
                    now = self.clock()
                    stopping = self._stopping
                    committed = self._commits
                    everything = stopping or committed != self._on_disk
                    batches = self._due(now, everything)
                    if batches or everything:
                        break
                    self._cv.wait(self._next_deadline(now))
                self._inflight += sum(info.rows for info, _ in batches)
            for batch in batches:
                self.sender.to_spool(*batch)  # a spool that cannot take it: counted dropped
            with self._cv:
                self._inflight -= sum(info.rows for info, _ in batches)
                self._on_disk = committed
                self._cv.notify_all()  # the sender, and flush
                if stopping:
                    return

    def _send_loop(self) -> None:
        """Disk to the store: the spool, oldest first, while the store takes it."""
        sender = self.sender
        while True:
            try:
                if sender.attempts == 0:
                    sender.ensure_open()  # the schema is applied at start, not at a batch
                else:
                    sender.drain(time_budget=0.5)
            except Exception as exc:  # a bug here must not end storage for the run
                sender.note_error(f"storage sender: {type(exc).__name__}: {exc}", "writer")
            with self._cv:
                self._cv.notify_all()  # flush
                while not self._stop_sending and not sender.spool_due(self.clock()):
                    wait = sender.next_try - self.clock() if len(self.spool) else 1.0
                    self._cv.wait(min(max(wait, 0.01), 1.0))
                if self._stop_sending:
                    return
