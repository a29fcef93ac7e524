from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import pytest
from ringfake import BUSY, DISCARD, FakeRing

from meridian.bpf.ringbuf import RingBuffer

REC = np.dtype([("seq", "<u8"), ("value", "<u4"), ("tag", "S4")])
SIZE = 4096


@pytest.fixture
def ring() -> Iterator[tuple[FakeRing, RingBuffer]]:
    fake = FakeRing(SIZE)
    reader = RingBuffer(fake.fd, SIZE, REC)
    yield fake, reader
    reader.close()
    fake.close()


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
