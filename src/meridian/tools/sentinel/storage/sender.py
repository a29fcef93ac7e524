"""The store's side of storage: the sender thread sends the spool (spool.py), where
every batch is written first, to the backend oldest batch first, and removes each batch
the store acknowledged. A store that is down or slow never holds rows in memory: they
are on disk already.

A store that fails is tried again with exponential backoff (from 0.25 s, with jitter,
up to `max_backoff`: meridian/backoff.py). Every failed insert or reconnect counts in
`flush_errors`; rows are lost only when the spool is full or cannot be written, and
then they are counted (`dropped_rows`). What goes wrong is said on stderr at most once
a minute per kind.

Exactly once: each batch carries a random `batch_id` in its rows. An insert whose
answer was lost (connection broken after the rows went out), and the oldest batch a
killed agent left, are not sent again blindly: the batch is looked for first, and sent
only when the store does not hold it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field

from ....backoff import Backoff
from .backend import Backend, BatchInfo, StoreUnavailable
from .report import Reporter
from .schema import TABLES
from .spool import Spool, Spooled

__all__ = ["Batch", "Sender", "SinkStats"]

Batch = tuple[BatchInfo, bytes]  # one insert: what and where, and its JSONEachRow lines

# a batch the store rejected for its content this many times is dropped, counted,
# instead of blocking the spool behind it forever (other errors are retried)
MAX_REJECTS = 3
# ClickHouse codes that say the rows themselves are wrong for the table: cannot parse,
# type mismatch, no such column, incorrect data, argument out of bound, ...
REJECT_CODES = frozenset((6, 16, 26, 27, 32, 38, 41, 53, 62, 69, 70, 72, 117))


@dataclass(frozen=True)
class SinkStats:
    """Counters since start; `backlog_rows` is what is not yet stored (memory + spool)."""

    backend: str
    connected: bool
    rows_written: int
    batches_written: int
    flush_errors: int  # ms_clickhouse_flush_errors_total
    dropped_rows: int  # ms_clickhouse_dropped_rows_total
    pending_rows: int  # in memory, not yet on disk
    spooled_rows: int  # on disk, not yet stored
    spool_bytes: int
    last_error: str
    spool_dir: str = ""
    inherited_rows: int = 0  # in the spool at start: left by an earlier run
    rows_by_table: dict[str, int] = field(default_factory=dict)

    @property
    def backlog_rows(self) -> int:
        return self.pending_rows + self.spooled_rows

    def summary(self) -> dict[str, object]:
        """The run's storage, for the --json summary."""
        return {
            "backend": self.backend,
            "stored_rows": self.rows_written,
            "inherited_rows": self.inherited_rows,
            "unsent_rows": self.backlog_rows,
            "dropped_rows": self.dropped_rows,
            "flush_errors": self.flush_errors,
            "spool_dir": self.spool_dir,
        }

    def summary_lines(self) -> list[str]:
        """The run's storage, for the text summary: what is stored, lost, and left
        unsent with how to send it."""
        earlier = f" ({self.inherited_rows} left by an earlier run)" if self.inherited_rows else ""
        lines = [
            f"storage: {self.rows_written} rows stored in {self.backend}{earlier}, "
            f"{self.dropped_rows} dropped, {self.backlog_rows} unsent"
        ]
        if self.backlog_rows:
            lines.append(
                f"storage: the {self.backlog_rows} unsent rows wait in {self.spool_dir}; the "
                "next `meridian sentinel` on that spool (the same store, or --spool-dir) "
                "sends them first"
            )
        return lines


@dataclass(eq=False)
class Sender:
    """Sends a Spool to one Backend, and keeps the counts. `ensure_open` and `drain`
    run in the sender thread only; `to_spool`, `drop` and `stats` from any thread."""

    backend: Backend
    spool: Spool
    reporter: Reporter
    max_backoff: InitVar[float]
    clock: Callable[[], float]
    connected: bool = field(init=False, default=False)
    next_try: float = field(init=False, default=0.0)  # no reconnect before (of `clock`)
    attempts: int = field(init=False, default=0)  # connects tried (flush waits for one)
    _backoff: Backoff = field(init=False)
    _was_down: bool = field(init=False, default=False)
    # batch id -> times the store rejected it
    _rejects: dict[int, int] = field(init=False, default_factory=dict)
    # the counters, under _mu
    _mu: threading.Lock = field(init=False, default_factory=threading.Lock)
    _rows_by_table: dict[str, int] = field(init=False)
    _batches: int = field(init=False, default=0)
    _flush_errors: int = field(init=False, default=0)
    _dropped: int = field(init=False, default=0)
    _last_error: str = field(init=False, default="")

    def __post_init__(self, max_backoff: float) -> None:
        self._backoff = Backoff(0.25, float(max_backoff))
        self._rows_by_table = dict.fromkeys(TABLES, 0)
        spool = self.spool
        if spool.unreadable:
            self.reporter.say(
                "spool-read",
                f"{spool.unreadable} unreadable spool files in {spool.dir} set aside as *.bad",
            )

    def spool_due(self, now: float) -> bool:
        """The spool holds batches and the store may take them now."""
        return len(self.spool) > 0 and (self.connected or now >= self.next_try)

    def ensure_open(self) -> bool:
        """Connected, or (re)connected now; False while backing off or on failure."""
        if self.connected:
            return True
        if self.clock() < self.next_try:
            return False
        try:
            self.backend.open()
        except StoreUnavailable as exc:
            self._failed(exc)
            return False
        finally:
            self.attempts += 1
        self.connected = True
        self._backoff.reset()
        notice = getattr(self.backend, "notice", "")  # a fake store in tests has none
        if notice:
            self.reporter.say("seed-names", notice)
        if self._was_down:
            self._was_down = False
            self.reporter.say(
                "recovered",
                f"{self.backend.name} answers again; sending {self.spool.rows} spooled rows",
            )
        return True

    def drain(self, time_budget: float) -> None:
        """Send spooled batches, oldest first, while the store takes them."""
        end = time.monotonic() + time_budget  # real time, whatever `clock` is
        while len(self.spool) and time.monotonic() < end and self.ensure_open():
            got = self.spool.peek()
            if got is None:
                return
            entry, payload = got
            if not payload:
                self.drop(entry.info.rows, self.spool.last_error, "spool-read")
                continue
            if not self._send_spooled(entry, payload):
                return

    def _send_spooled(self, entry: Spooled, payload: bytes) -> bool:
        info = entry.info
        try:
            if entry.uncertain:
                have = self.backend.stored_rows(info)
                if have:
                    self._stored(info, min(have, info.rows))
                    if have < info.rows:
                        self.drop(
                            info.rows - have,
                            f"a batch of {info.table} was stored in part ({have} of "
                            f"{info.rows} rows) before a failure",
                            "partial",
                        )
                    self.spool.pop(entry)
                    return True
            self.backend.insert(info, payload)
        except StoreUnavailable as exc:
            self._failed(exc)
            if exc.ambiguous:
                self.spool.mark_uncertain(entry, payload)
            elif exc.code in REJECT_CODES:
                self._rejected(entry, exc)
            return False
        self._rejects.pop(info.batch_id, None)
        # counted before it leaves the spool: flush() is done once the spool is empty,
        # and the counts must say so by then
        self._stored(info, info.rows)
        self.spool.pop(entry)
        return True

    def _rejected(self, entry: Spooled, exc: StoreUnavailable) -> None:
        """The store refused the rows themselves: dropped the MAX_REJECTS-th time."""
        info = entry.info
        n = self._rejects[info.batch_id] = self._rejects.get(info.batch_id, 0) + 1
        if n >= MAX_REJECTS:
            self._rejects.pop(info.batch_id, None)
            self.spool.pop(entry)
            self.drop(
                info.rows,
                f"{self.backend.name} rejected a batch of {info.rows} rows of "
                f"{info.table} {n} times ({exc}); dropped",
                "rejected",
            )

    # -- accounting -------------------------------------------------------------------

    def _stored(self, info: BatchInfo, rows: int) -> None:
        with self._mu:
            self._rows_by_table[info.table] += rows
            self._batches += 1

    def _failed(self, exc: StoreUnavailable) -> None:
        """A failed insert or reconnect: counted, said once a minute, backed off."""
        self.connected = False
        self._was_down = True
        self.next_try = self.clock() + self._backoff.failed()
        with self._mu:
            self._flush_errors += 1
        spool = (
            f"; rows wait in the spool {self.spool.dir}, retried with backoff "
            f"(at most {self._backoff.cap:g} s apart)"
        )
        self.note_error(f"{exc}{spool}", exc.kind)

    def to_spool(self, info: BatchInfo, payload: bytes, uncertain: bool = False) -> None:
        """Keep a batch on disk; counted as dropped when the spool cannot take it."""
        if not self.spool.put(info, payload, uncertain):
            self.drop(
                info.rows,
                f"{self.spool.last_error}: dropping rows (ms_clickhouse_dropped_rows_total)",
                "dropped",
            )

    def drop(self, rows: int, message: str, key: str) -> None:
        """Rows lost: counted, and said (once a minute per `key`) with the total."""
        with self._mu:
            self._dropped += rows
            total = self._dropped
        self.note_error(f"{message} [{total} rows dropped in all]", key)

    def note_error(self, message: str, key: str) -> None:
        with self._mu:
            self._last_error = message
        self.reporter.say(key, message)

    def stats(self, pending_rows: int) -> SinkStats:
        """The counters, with the rows the batcher holds in memory."""
        with self._mu:
            return SinkStats(
                backend=self.backend.name,
                connected=self.connected,
                rows_written=sum(self._rows_by_table.values()),
                batches_written=self._batches,
                flush_errors=self._flush_errors,
                dropped_rows=self._dropped,
                pending_rows=pending_rows,
                spooled_rows=self.spool.rows,
                spool_bytes=self.spool.bytes,
                last_error=self._last_error,
                spool_dir=str(self.spool.dir),
                inherited_rows=self.spool.inherited_rows,
                rows_by_table=dict(self._rows_by_table),
            )
