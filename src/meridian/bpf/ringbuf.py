"""Ring buffer reader over the map's mmap'ed pages, decoding every available record
in one numpy operation instead of one Python callback per record.

Layout (kernel/bpf/ringbuf.c): page 0 holds consumer_pos (ours to write); from page 1
on, producer_pos, then the data area mapped twice in a row, so any run of records is
contiguous in memory. Each record starts with `struct bpf_ringbuf_hdr`:

    u32 len      bit 31 BUSY (reserved, not yet committed), bit 30 DISCARD
    u32 pg_off   kernel-internal
    ...data, padded to 8 bytes

Programs submit with BPF_RB_NO_WAKEUP and only force a wake-up when the ring fills
past a threshold (each wake-up costs microseconds); the reader drains on a short
timer, so a quiet ring costs nothing and a busy one is read in large batches.

Ordering: a record's header is read before its data and the consumer position is
written after the copy; on x86 (TSO) plain loads and stores keep that order. The
positions are read and written as single aligned 8-byte accesses (a memoryview of
format 'Q'), never byte by byte: `struct.pack_into` zeroes its target first and then
writes a byte at a time, so the kernel could read a consumer position of 0 or 16 MiB
too low, find the ring "full" and drop a record (a few per million at 100k/s). Weaker
memory models (arm64) would need acquire/release accesses, which Python lacks.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import struct
from typing import Any

import numpy as np

from ..system import kernel_btf_has
from .maps import Map

__all__ = ["RingBuffer", "count_records"]

BUSY = 1 << 31
DISCARD = 1 << 30
HDR_SIZE = 8


def count_records(framed: bytes | memoryview) -> int:
    """How many records a run of committed framed records holds (their headers
    walked: the lengths chain them)."""
    if len(framed) % 8:
        raise ValueError("framed records are 8-aligned")
    words = memoryview(framed).cast("B").cast("I")
    end, at, n = len(words), 0, 0
    length = ~(BUSY | DISCARD)
    while at < end:  # in 32-bit words: (header + data + padding to 8 bytes) / 4
        at += ((words[at] & length) + HDR_SIZE + 7) >> 3 << 1
        n += 1
    return n


class RingBuffer:
    def __init__(self, fd: int, size: int, dtype: np.dtype[Any]) -> None:
        """`fd` is a ring buffer map of `size` data bytes; `dtype` is the record layout
        (from BTF). Every record has that size; others are skipped and counted."""
        self.dtype = dtype
        self.size = size
        self.mask = self.size - 1
        self.page = mmap.PAGESIZE
        self.stride = (HDR_SIZE + dtype.itemsize + 7) & ~7
        self.bad_records = 0  # records of another size: skipped and counted
        self._cons = mmap.mmap(fd, self.page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._data = mmap.mmap(
            fd, self.page + 2 * self.size, mmap.MAP_SHARED, mmap.PROT_READ, offset=self.page
        )
        # One aligned 8-byte load or store each (see the module docstring).
        self._cons_pos = memoryview(self._cons)[:8].cast("Q")
        self._prod_pos = memoryview(self._data)[:8].cast("Q")
        # The kernel's pending_pos follows producer_pos (struct bpf_ringbuf), where the
        # kernel has it (its BTF names the member).
        self._pend_pos = (
            memoryview(self._data)[8:16].cast("Q") if kernel_btf_has("pending_pos") else None
        )
        self._words = memoryview(self._data).cast("I")
        self._framed = np.dtype(
            {
                "names": ["len", "rec"],
                "formats": ["<u4", dtype],
                "offsets": [0, HDR_SIZE],
                "itemsize": self.stride,
            }
        )
        self._epoll = select.epoll()
        with contextlib.suppress(PermissionError):  # a plain file (tests) cannot be polled
            # Edge-triggered: report only the kernel's wake-ups (the ring passing its
            # fill mark), not "data pending", so poll() waits for its timer and drains
            # large batches instead of spinning on a few records.
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLET)
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake, select.EPOLLIN)
        self.closed = False

    @classmethod
    def of_map(cls, ring: Map, dtype: np.dtype[Any]) -> RingBuffer:
        return cls(ring.fd, ring.max_entries, dtype)

    # ---- positions ----------------------------------------------------------------

    def _consumer(self) -> int:
        return int(self._cons_pos[0])

    def _producer(self) -> int:
        return int(self._prod_pos[0])

    def pending_bytes(self) -> int:
        return self._producer() - self._consumer()

    # ---- reading ------------------------------------------------------------------

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for a wake-up (or close)."""
        if not self.closed:
            self._epoll.poll(timeout)

    def fill(self) -> float:
        """The share of the ring that holds records not read yet."""
        return 0.0 if self.closed else (self._producer() - self._consumer()) / self.size

    def poll(self, timeout: float, limit: int | None = None) -> np.ndarray[Any, Any]:
        """Wait up to `timeout` seconds for a wake-up (or close), then drain."""
        self.wait(timeout)
        return self.drain(limit)

    def drain(self, limit: int | None = None) -> np.ndarray[Any, Any]:
        """Every committed record (at most `limit`: the rest stays in the ring for the
        next call, so a reader behind holds one bounded batch, not the whole ring),
        copied out, and the space handed back to the kernel."""
        if self.closed:
            return np.empty(0, dtype=self.dtype)
        cons = self._consumer()
        avail = self._producer() - cons
        if avail <= 0:
            return np.empty(0, dtype=self.dtype)
        start = self.page + (cons & self.mask)
        n = avail // self.stride
        if limit is not None and n >= limit:
            n, avail = limit, limit * self.stride  # what is past it: the next call's
        if n:
            framed = np.frombuffer(self._data, dtype=self._framed, count=n, offset=start)
            ok = framed["len"] == self.dtype.itemsize
            if ok.all():
                out: np.ndarray[Any, Any] = framed["rec"].copy()
                self._advance(cons + n * self.stride)
                if n * self.stride == avail:
                    return out
                return np.concatenate([out, self._walk(None if limit is None else limit - n)])
            first_bad = int(np.argmin(ok))
            head = framed["rec"][:first_bad].copy()
            self._advance(cons + first_bad * self.stride)
            rest = None if limit is None else limit - first_bad
            return np.concatenate([head, self._walk(rest)]) if first_bad else self._walk(limit)
        return self._walk(limit)

    def _walk(self, limit: int | None = None) -> np.ndarray[Any, Any]:
        """Record by record: stops at a busy record (or `limit` records), skips
        discarded ones."""
        cons = self._consumer()
        prod = self._producer()
        recs: list[bytes] = []
        while cons < prod and (limit is None or len(recs) < limit):
            off = self.page + (cons & self.mask)
            (hdr,) = struct.unpack_from("<I", self._data, off)
            if hdr & BUSY:
                break
            length = hdr & ~(BUSY | DISCARD)
            if not hdr & DISCARD:
                if length == self.dtype.itemsize:
                    recs.append(self._data[off + HDR_SIZE : off + HDR_SIZE + length])
                else:
                    self.bad_records += 1
            cons += (HDR_SIZE + length + 7) & ~7
        self._advance(cons)
        out: np.ndarray[Any, Any] = np.frombuffer(b"".join(recs), dtype=self.dtype).copy()
        return out

    def drain_bytes(self) -> tuple[bytes, int]:
        """For variable-size records: every committed record as the ring holds them
        (each an 8-byte header `len`, `pg_off`, then the data padded to 8 bytes;
        discarded ones included, flagged in `len`), copied out in one piece, and the
        number of records. Stops at the first busy record. The data is copied once (the
        data area is mapped twice in a row, so the run is contiguous even where it
        wraps). Before the kernel's pending mark (`_pending`) every record is committed:
        those headers are only counted, in the copy; past it each is read for its busy
        bit."""
        if self.closed:
            return b"", 0
        cons = self._consumer()
        prod = self._producer()
        if prod - cons > self.size:  # cannot happen: the kernel never overruns us
            prod = cons + self.size
        mark = self._pending()
        if not cons <= mark <= prod or mark & 7:
            mark = cons  # no mark (or not one): every header is read here
        end, n = self._walk_committed(mark, prod)
        if end == cons:
            return b"", 0
        start = self.page + (cons & self.mask)
        out = self._data[start : start + end - cons]
        self._advance(end)
        if mark > cons:
            n += count_records(memoryview(out)[: mark - cons])
        return out, n

    def _pending(self) -> int:
        """The kernel's `pending_pos`: the oldest record not committed, as it last
        looked when reserving one (kernels with the 6.10 reservation fix, and stable
        kernels it went back to); 0 where the field does not exist."""
        return int(self._pend_pos[0]) if self._pend_pos is not None else 0

    def _walk_committed(self, pos: int, prod: int) -> tuple[int, int]:
        """From `pos` (a record's header), where the run of committed records ends
        (the first busy record, or `prod`) and how many it holds: the hot loop at a
        million records a second where the kernel has no pending mark."""
        words, page, mask, length = self._words, self.page, self.mask, ~(BUSY | DISCARD)
        n = 0
        while pos < prod:
            hdr = words[(page + (pos & mask)) >> 2]
            if hdr & BUSY:
                break
            pos += ((hdr & length) + HDR_SIZE + 7) & ~7
            n += 1
        return pos, n

    def _advance(self, pos: int) -> None:
        self._cons_pos[0] = pos

    # ---- closing ------------------------------------------------------------------

    def wake(self) -> None:
        """Wake a reader blocked in poll() (from a signal handler or another thread)."""
        os.eventfd_write(self._wake, 1)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.wake()
        self._epoll.close()
        os.close(self._wake)
        self._cons_pos.release()
        self._prod_pos.release()
        if self._pend_pos is not None:
            self._pend_pos.release()
        self._words.release()
        self._cons.close()
        self._data.close()

    def __enter__(self) -> RingBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
