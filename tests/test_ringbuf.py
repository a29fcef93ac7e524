from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import pytest
from ringfake import BUSY, DISCARD, FakeRing

from meridian.bpf.ringbuf import RingBuffer

REC = np.dtype([("seq", "<u8"), ("value", "<u4"), ("tag", "S4")])
SIZE = 4096


def _pair(size: int) -> Iterator[tuple[FakeRing, RingBuffer]]:
    """A fake kernel ring of `size` data bytes and a reader on it, closed after."""
    fake = FakeRing(size)
    reader = RingBuffer(fake.fd, size, REC)
    try:
        yield fake, reader
    finally:
        reader.close()
        fake.close()


@pytest.fixture
def ring() -> Iterator[tuple[FakeRing, RingBuffer]]:
    yield from _pair(SIZE)


def rec(seq: int) -> bytes:
    return struct.pack("<QI4s", seq, seq * 10, b"ab")


def test_drains_every_record_in_order_and_frees_the_space(
    ring: tuple[FakeRing, RingBuffer],
) -> None:
    fake, reader = ring
    for i in range(50):
        fake.write(rec(i))
    out = reader.drain()
    assert out["seq"].tolist() == list(range(50))
    assert out["value"].tolist() == [i * 10 for i in range(50)]
    assert fake.consumer() == fake.prod
    assert len(reader.drain()) == 0


def test_records_that_wrap_around_the_end_decode_whole(ring: tuple[FakeRing, RingBuffer]) -> None:
    fake, reader = ring
    seq = 0
    for _ in range(5):  # 5 x 100 records of 24 bytes cross the 4 KiB end several times
        for _ in range(100):
            fake.write(rec(seq))
            seq += 1
        out = reader.drain()
        assert out["seq"].tolist() == list(range(seq - 100, seq))


def test_only_the_first_copy_of_the_data_area_is_mapped(
    ring: tuple[FakeRing, RingBuffer],
) -> None:
    """The kernel maps the data area twice in a row; the reader maps it once (the
    second copy counted in its RSS again) and puts together what crosses the end:
    here the second copy is garbage, and records across the end still decode."""
    fake, reader = ring
    assert len(reader._data) == fake.page + SIZE
    seq = 0
    alias = 2 * fake.page + SIZE
    for _ in range(4):
        for _ in range(SIZE // (8 + REC.itemsize) // 2 + 7):
            fake.write(rec(seq))
            seq += 1
        fake.mem[alias : alias + SIZE] = b"\xff" * SIZE
        out = reader.drain()
        assert len(out) and out["seq"].tolist() == list(range(seq - len(out), seq))
        assert out["value"].tolist() == [i * 10 for i in out["seq"].tolist()]


def test_stops_at_a_busy_record_and_resumes_after_commit(ring: tuple[FakeRing, RingBuffer]) -> None:
    fake, reader = ring
    fake.write(rec(0))
    busy_pos = fake.write(rec(1), flags=BUSY)
    fake.write(rec(2))
    assert reader.drain()["seq"].tolist() == [0]
    assert fake.consumer() == busy_pos
    fake.set_flags(busy_pos, REC.itemsize, 0)
    assert reader.drain()["seq"].tolist() == [1, 2]


def test_discarded_records_are_skipped(ring: tuple[FakeRing, RingBuffer]) -> None:
    fake, reader = ring
    fake.write(rec(0))
    fake.write(rec(1), flags=DISCARD)
    fake.write(rec(2))
    assert reader.drain()["seq"].tolist() == [0, 2]
    assert fake.consumer() == fake.prod


def test_records_of_another_size_are_counted_not_decoded(ring: tuple[FakeRing, RingBuffer]) -> None:
    fake, reader = ring
    fake.write(rec(0))
    fake.write(b"short")
    fake.write(rec(2))
    assert reader.drain()["seq"].tolist() == [0, 2]
    assert reader.bad_records == 1


def test_batch_write_decodes_in_one_pass(ring: tuple[FakeRing, RingBuffer]) -> None:
    fake, reader = ring
    recs = np.zeros(100, dtype=REC)
    recs["seq"] = np.arange(100)
    fake.write_many(recs)
    assert (reader.drain()["seq"] == np.arange(100)).all()


def test_poll_returns_after_timeout_with_the_records(ring: tuple[FakeRing, RingBuffer]) -> None:
    fake, reader = ring
    assert len(reader.poll(0.01)) == 0
    fake.write(rec(7))
    assert reader.poll(0.01)["seq"].tolist() == [7]


def test_close_is_idempotent_and_drain_after_close_is_empty(
    ring: tuple[FakeRing, RingBuffer],
) -> None:
    fake, reader = ring
    fake.write(rec(1))
    reader.close()
    reader.close()
    assert len(reader.drain()) == 0


def test_a_limited_drain_leaves_the_rest_for_the_next(ring: tuple[FakeRing, RingBuffer]) -> None:
    fake, reader = ring
    for i in range(50):
        fake.write(rec(i))
    stride = 24  # an 8-byte header and the 16-byte record
    assert reader.fill() == 50 * stride / SIZE
    assert reader.drain(20)["seq"].tolist() == list(range(20))
    assert reader.fill() == 30 * stride / SIZE  # the rest still in the ring
    fake.write(rec(50), flags=DISCARD)  # a discarded record: the walk's path, limited too
    fake.write(rec(51))
    assert reader.drain(25)["seq"].tolist() == list(range(20, 45))
    assert reader.drain()["seq"].tolist() == [*range(45, 50), 51]
    assert reader.fill() == 0.0


# -- drain_bytes: records of any length, their headers found with numpy ---------------

BIG = 4 * 4096  # four pages: pg_off differs from page to page


@pytest.fixture
def big() -> Iterator[tuple[FakeRing, RingBuffer]]:
    yield from _pair(BIG)


def _payloads(count: int, start: int = 0) -> list[bytes]:
    """Records of 1..90 bytes: every padding, headers at every offset in a page."""
    return [bytes([(start + i) % 251]) * (1 + (start + i) * 7 % 90) for i in range(count)]


def _framed(payloads: list[bytes]) -> bytes:
    """As drain_bytes hands them out: each header (len, pg_off), data, padding; pg_off
    is not compared (the fake's, as the kernel's, depends on the place)."""
    return b"".join(
        struct.pack("<I", len(p)) + b"?" * 4 + p + bytes(-(len(p)) % 8) for p in payloads
    )


def _unframed(chunk: bytes) -> bytes:
    """The chunk with every pg_off masked, to compare with _framed()."""
    out, at = bytearray(), 0
    while at < len(chunk):
        (length,) = struct.unpack_from("<I", chunk, at)
        size = 8 + ((length & ~(BUSY | DISCARD)) + 7) // 8 * 8
        out += chunk[at : at + 4] + b"?" * 4 + chunk[at + 8 : at + size]
        at += size
    return bytes(out)


def _no_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    def walk(self: RingBuffer, cons: int, prod: int) -> tuple[int, int]:
        raise AssertionError("walked header by header")

    monkeypatch.setattr(RingBuffer, "_walk_headers", walk)


def test_drain_bytes_finds_every_header_with_numpy_across_the_end(
    big: tuple[FakeRing, RingBuffer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seven laps of the ring in drains of 37 records of every length: each drain
    is the records in order, whole across the end, counted, without a walk."""
    fake, reader = big
    _no_walk(monkeypatch)
    for lap in range(7 * BIG // (37 * 56)):
        payloads = _payloads(37, 37 * lap)
        for p in payloads:
            fake.write(p)
        chunk, n = reader.drain_bytes()
        assert n == 37 and _unframed(chunk) == _framed(payloads), lap
        assert fake.consumer() == fake.prod
    assert fake.prod > 7 * BIG  # seven laps: records across the end on the way


def test_drain_bytes_stops_at_a_busy_record_and_counts_discarded_ones(
    big: tuple[FakeRing, RingBuffer], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, reader = big
    _no_walk(monkeypatch)
    payloads = _payloads(30)
    at = [fake.write(p, flags=DISCARD if i == 5 else 0) for i, p in enumerate(payloads)]
    fake.set_flags(at[20], len(payloads[20]), BUSY)
    chunk, n = reader.drain_bytes()
    assert n == 20 and fake.consumer() == at[20]
    assert struct.unpack_from("<I", chunk, at[5])[0] == len(payloads[5]) | DISCARD
    fake.set_flags(at[20], len(payloads[20]), 0)
    chunk, n = reader.drain_bytes()
    assert n == 10 and _unframed(chunk) == _framed(payloads[20:])


def test_payload_that_looks_like_a_header_is_not_taken_for_one(
    big: tuple[FakeRing, RingBuffer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data holding the page number of where it lies, as an fd of 3 does in the
    first page of a kernel ring (pg_off 3), at every offset: the records still come
    out whole and counted, without a walk."""
    fake, reader = big
    _no_walk(monkeypatch)
    payloads = []
    for lap in range(3):
        for i in range(40):
            page = fake.pg_off(fake.prod + 8)
            p = struct.pack("<II", 100 + i, page) * 6  # (len, pg_off) at every 8 bytes
            payloads.append(p[: 8 + i % 40])
            fake.write(payloads[-1])
        chunk, n = reader.drain_bytes()
        assert n == 40 and _unframed(chunk) == _framed(payloads[-40:]), lap


def test_a_chain_that_does_not_hold_is_walked(big: tuple[FakeRing, RingBuffer]) -> None:
    """A header whose pg_off is not its page (no kernel writes one): the numpy chain
    breaks there, and the header-by-header walk still drains every record."""
    fake, reader = big
    payloads = _payloads(25)
    at = [fake.write(p) for p in payloads]
    fake.mem[2 * fake.page + at[9] + 4 : 2 * fake.page + at[9] + 8] = struct.pack("<I", 999)
    assert reader._chain(fake.consumer(), fake.prod) is None
    chunk, n = reader.drain_bytes()
    assert n == 25 and _unframed(chunk) == _framed(payloads)
