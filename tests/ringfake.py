"""A ring buffer in a memfd laid out as the kernel lays out a BPF ring buffer map, so
the reader can be tested (and benchmarked) without a kernel producer."""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

import numpy as np

BUSY, DISCARD = 1 << 31, 1 << 30
DATA_PG = 3


class FakeRing:
    def __init__(self, size: int) -> None:
        self.size = size
        self.page = mmap.PAGESIZE
        self.fd = os.memfd_create("fake-ringbuf")
        os.ftruncate(self.fd, 2 * self.page + 2 * size)
        self.mem = mmap.mmap(self.fd, 2 * self.page + 2 * size)
        self.prod = 0

    def _put(self, pos: int, data: bytes) -> None:
        """Write at ring position `pos` into both copies of the data area."""
        base = 2 * self.page
        for i in range(0, len(data)):
            off = (pos + i) % self.size
            self.mem[base + off] = data[i]
            self.mem[base + self.size + off] = data[i]

    def put_fast(self, pos: int, data: bytes) -> None:
        """Same as _put for a write that does not wrap (benchmarks)."""
        base = 2 * self.page
        off = pos % self.size
        assert off + len(data) <= self.size
        self.mem[base + off : base + off + len(data)] = data
        self.mem[base + self.size + off : base + self.size + off + len(data)] = data

    def pg_off(self, pos: int) -> int:
        """The header's page as the kernel counts it, from its ring struct (whose data
        area starts at page 3 in 6.x)."""
        return DATA_PG + (pos % self.size) // self.page

    def consumer(self) -> int:
        return int(struct.unpack_from("<Q", self.mem, 0)[0])

    def publish(self) -> None:
        struct.pack_into("<Q", self.mem, self.page, self.prod)

    def write(self, payload: bytes, flags: int = 0, fast: bool = False) -> int:
        """Append one record (header + payload, padded to 8); returns its position."""
        pos = self.prod
        rec = struct.pack("<II", len(payload) | flags, self.pg_off(pos)) + payload
        rec += bytes(-len(rec) % 8)
        (self.put_fast if fast else self._put)(pos, rec)
        self.prod += len(rec)
        self.publish()
        return pos

    def write_many(self, records: np.ndarray[Any, Any]) -> None:
        """Append fixed-size records in one copy (must not wrap)."""
        stride = (8 + records.dtype.itemsize + 7) & ~7
        framed = np.zeros(
            len(records),
            dtype=np.dtype(
                {
                    "names": ["len", "pg", "rec"],
                    "formats": ["<u4", "<u4", records.dtype],
                    "offsets": [0, 4, 8],
                    "itemsize": stride,
                }
            ),
        )
        framed["len"] = records.dtype.itemsize
        framed["pg"] = [self.pg_off(self.prod + i * stride) for i in range(len(records))]
        framed["rec"] = records
        self.put_fast(self.prod, framed.tobytes())
        self.prod += stride * len(records)
        self.publish()

    def set_flags(self, pos: int, length: int, flags: int) -> None:
        self._put(pos, struct.pack("<I", length | flags))

    def close(self) -> None:
        self.mem.close()
        os.close(self.fd)
