"""Raw kernel records of `meridian syscalls` without a kernel: variable-size records
(strings packed behind the header) framed as the ring holds them, drained in one
piece, recorded raw (format 2) and replayed to the same Syscall rows; damaged raw
files are errors naming the record and byte; the view's backlog skips (and counts)
what a slow view cannot show."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from ringfake import DISCARD, FakeRing

from meridian.bpf.ringbuf import RingBuffer
from meridian.errors import MeridianError, UsageError
from meridian.tools.syscalls.jsonl_spool import SpooledJsonRecorder
from meridian.tools.syscalls.options import Options
from meridian.tools.syscalls.recording_file import Recorder, is_jsonl_name, read_events
from meridian.tools.syscalls.ring_records import (
    decode_frames,
    dtype_from_json,
    dtype_to_json,
    frames,
)
from meridian.tools.syscalls.view_backlog import Backlog

# struct syscalls_event of bpf/syscalls.h, as BTF gives it (112 bytes)
DTYPE = np.dtype(
    [
        ("index", "<u8"), ("ts_ns", "<u8"), ("pid", "<u4"), ("tid", "<u4"), ("nr", "<u4"),
        ("kind", "u1"), ("str_ok", "u1"), ("fd_ok", "u1"), ("pad", "u1"), ("ret", "<i8"),
        ("args", "<u8", (6,)), ("comm", "S16"), ("str_len", "<u2", (2,)), ("fd_len", "<u2"),
        ("pad2", "<u2"),
    ]
)  # fmt: skip
OPENAT, READ, CLOSE = 257, 0, 3
AT_FDCWD = (1 << 64) - 100


def record(
    index: int,
    nr: int,
    kind: int,
    *,
    strs: tuple[bytes, ...] = (),
    fd_path: bytes = b"",
    args: tuple[int, ...] = (),
    ret: int = 0,
    tid: int = 7,
    comm: bytes = b"cat",
) -> bytes:
    """One record as the kernel sends it: header, then the strings (NUL included)."""
    h = np.zeros(1, DTYPE)
    h["index"], h["ts_ns"], h["pid"], h["tid"], h["nr"], h["kind"] = (
        index,
        index * 1000,
        7,
        tid,
        nr,
        kind,
    )
    h["ret"], h["comm"] = ret, comm
    h["args"][0, : len(args)] = args
    h["str_ok"] = (1 << len(strs)) - 1
    h["fd_ok"] = int(bool(fd_path))
    for i, s in enumerate(strs):
        h["str_len"][0, i] = len(s) + 1
    h["fd_len"] = len(fd_path) + 1 if fd_path else 0
    tail = b"".join(s + b"\0" for s in strs) + (fd_path + b"\0" if fd_path else b"")
    return h.tobytes() + tail


def frame(payload: bytes, flags: int = 0) -> bytes:
    rec = struct.pack("<II", len(payload) | flags, 0) + payload
    return rec + bytes(-len(rec) % 8)


def trace() -> list[bytes]:
    """cat opens /etc/passwd (fd 3), reads it, closes it."""
    return [
        record(0, OPENAT, 0, strs=(b"/etc/passwd",), args=(AT_FDCWD, 0x1000, 0)),
        record(1, OPENAT, 1, ret=3),
        record(2, READ, 0, fd_path=b"/etc/passwd", args=(3, 0x2000, 64)),
        record(3, READ, 1, ret=15),
        record(4, CLOSE, 0, fd_path=b"/etc/passwd", args=(3,)),
        record(5, CLOSE, 1, ret=0),
    ]


def test_records_are_as_long_as_what_they_carry() -> None:
    recs = trace()
    assert len(recs[1]) == DTYPE.itemsize == 112
    assert len(recs[0]) == 112 + len(b"/etc/passwd\0")


def test_frames_decode_to_syscalls() -> None:
    buf = b"".join(frame(r) for r in trace()) + frame(b"x" * 112, DISCARD)
    fr = frames(buf)
    assert len(fr) == 6 and fr.used == len(buf)
    rows = decode_frames(fr, DTYPE, 5)
    assert [(r.index, r.name, r.is_start) for r in rows] == [
        (0, "openat", True), (1, "openat", False), (2, "read", True),
        (3, "read", False), (4, "close", True), (5, "close", False),
    ]  # fmt: skip
    assert rows[0].args == ("AT_FDCWD", '"/etc/passwd"', "O_RDONLY")
    assert rows[0].paths == ("/etc/passwd",) and rows[0].timestamp_ns == 5
    assert rows[2].args[0] == "3</etc/passwd>" and rows[2].fd_path == "/etc/passwd"
    assert rows[3].result_text == "15" and rows[4].args == ("3</etc/passwd>",)
    # a slice of the records
    assert [r.index for r in decode_frames(fr, DTYPE, 0, 2, 4)] == [2, 3]


def test_a_cut_off_record_is_left_for_the_next_block() -> None:
    buf = b"".join(frame(r) for r in trace())
    cut = buf[:-5]
    fr = frames(cut)
    assert len(fr) == 5 and cut[fr.used :] == buf[fr.used : -5]


def test_ring_drain_bytes_copies_committed_records_in_one_piece() -> None:
    ring = FakeRing(1 << 12)
    rb = RingBuffer(ring.fd, ring.size, DTYPE)
    try:
        for r in trace():
            ring.write(r)
        chunk, n = rb.drain_bytes()
        assert n == 6 and [r.index for r in decode_frames(frames(chunk), DTYPE, 0)] == list(
            range(6)
        )
        assert ring.consumer() == ring.prod and rb.drain_bytes() == (b"", 0)
        # records that wrap around the end of the data area come out whole
        for _ in range(40):
            for r in trace():
                ring.write(r)
            chunk, n = rb.drain_bytes()
            assert n == 6 and len(decode_frames(frames(chunk), DTYPE, 0)) == 6
    finally:
        rb.close()
        ring.close()


def test_dtype_round_trips_through_the_header() -> None:
    import json

    assert dtype_from_json(json.loads(json.dumps(dtype_to_json(DTYPE)))) == DTYPE
    with pytest.raises(ValueError, match="lacks"):
        dtype_from_json([["index", "<u8"]])


@pytest.mark.parametrize("suffix", [".rec", ".rec.zst"])
def test_raw_record_then_replay(tmp_path: Path, suffix: str) -> None:
    if suffix.endswith(".zst") and shutil.which("zstd") is None:
        pytest.skip("no zstd program")
    path = tmp_path / f"r{suffix}"
    buf = b"".join(frame(r) for r in trace())
    with Recorder(path, ["syscalls"], raw_dtype=DTYPE, wall_offset_ns=5) as rec:
        rec.write_raw(buf[:200], 1)
        rec.write_raw(buf[200:], 5)
    assert rec.count == 6
    back = list(read_events(path))
    assert back == decode_frames(frames(buf), DTYPE, 5)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_json_lines_are_spooled_raw_then_written(tmp_path: Path, suffix: str) -> None:
    """A live JSON lines recording only spools raw records beside it while capturing
    (as fast as a raw recording), and writes them as JSON lines at the end: the same
    events as decoding live, and the spool is gone."""
    if suffix.endswith(".zst") and shutil.which("zstd") is None:
        pytest.skip("no zstd program")
    path = tmp_path / f"r{suffix}"
    buf = b"".join(frame(r) for r in trace())
    rec = SpooledJsonRecorder(path, ["syscalls"], DTYPE, 5)
    assert rec.spool.parent == tmp_path and rec.spool.name.startswith(f"r{suffix}.")
    rec.write_raw(buf[:200], 1)
    rec.write_raw(buf[200:], 5)
    assert rec.count == 6 and rec.spool.exists()
    rec.close()
    assert not rec.spool.exists() and sorted(tmp_path.iterdir()) == [path]
    data = path.read_bytes()
    if suffix.endswith(".zst"):
        data = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
    assert data.startswith(b'{"format":"meridian-syscalls","version":1,')
    assert list(read_events(path)) == decode_frames(frames(buf), DTYPE, 5)
    rec.close()  # closing again does nothing


def test_interrupted_json_writing_keeps_the_raw_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "r.jsonl"
    rec = SpooledJsonRecorder(path, None, DTYPE)
    rec.write_raw(b"".join(frame(r) for r in trace()), 6)

    def interrupted(self: Recorder, lines: bytes, events: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Recorder, "write_lines", interrupted)
    finish = rf"finish with: meridian syscalls -r {rec.spool} -w {path}$"
    with pytest.raises(MeridianError, match=rf"^interrupted .* kept in {rec.spool}; {finish}"):
        rec.close()
    assert not path.exists()
    monkeypatch.undo()
    assert len(list(read_events(rec.spool))) == 6


def test_damaged_raw_recordings_name_the_record(tmp_path: Path) -> None:
    path = tmp_path / "r.rec"
    buf = b"".join(frame(r) for r in trace())
    with Recorder(path, raw_dtype=DTYPE) as rec:
        rec.write_raw(buf, 6)
    data = path.read_bytes()
    cut = tmp_path / "cut.rec"
    cut.write_bytes(data[:-9])
    header = data.index(b"\n") + 1
    last = header + len(buf) - len(frame(trace()[5]))
    with pytest.raises(UsageError, match=rf"record 6 \(byte {last}\) is truncated"):
        list(read_events(cut))
    short = tmp_path / "short.rec"
    short.write_bytes(data[:header] + frame(b"y" * 16))
    with pytest.raises(UsageError, match=r"record 1 .* shorter than a record header"):
        list(read_events(short))
    foreign = tmp_path / "layout.rec"
    foreign.write_bytes(b'{"format":"meridian-syscalls","version":2,"record":[["a","<u8"]]}\n')
    with pytest.raises(UsageError, match="line 1: record layout lacks index"):
        list(read_events(foreign))


def test_recording_format_follows_the_name() -> None:
    assert is_jsonl_name("a.jsonl") and is_jsonl_name("a.jsonl.zst") and is_jsonl_name("b.json")
    assert not is_jsonl_name("a.rec") and not is_jsonl_name("a.zst")
    assert Options(write="x.rec").raw_recording()
    assert not Options(write="x.jsonl.zst").raw_recording()
    assert not Options(write="x.rec", record_format="jsonl").raw_recording()


def test_kernel_comm_filter_settings() -> None:
    assert Options(comm="nginx").kernel_comm() == (b"nginx", True)
    assert Options(comm="Xorg").kernel_comm() == (b"Xorg", False)
    assert Options(comm="^ng", regex=True).kernel_comm() is None  # user space only
    assert Options(comm="a" * 16).kernel_comm() is None  # longer than a process name


def test_backlog_skips_the_oldest_past_its_limit_and_counts_them() -> None:
    cap: Any = SimpleNamespace(dtype=DTYPE, offset_ns=0)
    chunks = [b"".join(frame(r) for r in trace()[i : i + 2]) for i in (0, 2, 4)]
    b = Backlog(limit=len(chunks[0]) + len(chunks[1]))
    for c in chunks:
        b.push(c, 2)
    assert b.skipped == 2  # the first chunk went past the limit
    got = []
    while b:
        got += [sc.index for sc in b.take(cap, 1)]
    assert got == [2, 3, 4, 5] and b.bytes == 0


def test_a_json_recording_that_cannot_be_made_leaves_no_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("meridian.tools.syscalls.recording_file.shutil.which", lambda name: None)
    with pytest.raises(UsageError, match="needs the zstd program"):
        SpooledJsonRecorder(tmp_path / "r.jsonl.zst", None, DTYPE)
    assert list(tmp_path.iterdir()) == []
