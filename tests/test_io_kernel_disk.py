"""meridian io on a loop-device ext4 file system with workloads whose answer is known:
the page cache against the disk, direct and buffered writes, and the block requests
of each process (in the events, the aggregates and the exit summary)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from children import patience, reap, wait_attached
from conftest import LoopDevice
from io_trace import OPS, drain

from meridian.bpf import hook_exists
from meridian.tools.io.event_format import EventFormatter
from meridian.tools.io.kernel import FileIO
from meridian.tools.io.model import PidSummary, summarize
from meridian.tools.io.options import Options

pytestmark = pytest.mark.kernel
MiB = 1 << 20
SIZE = 32 * MiB


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def dd(*args: str) -> int:
    """Run dd; returns its PID (the PID the kernel saw). Not for counting a process's
    block requests: dd's own text and libraries may be read from the root disk as it
    runs (DirectIO below)."""
    p = subprocess.Popen(["dd", *args, "status=none"])
    assert p.wait(60) == 0
    return p.pid


def needs_block_io_start() -> None:
    """io attributes block requests from block_io_start (6.5+); a kernel without it
    (Debian 12's 6.1) has none to check."""
    if not hook_exists("tp_btf/block_io_start"):
        pytest.skip("kernel refuses block_io_start: a 6.5+ tracepoint, absent here")


def pid_summary(tool: FileIO, pid: int) -> PidSummary:
    return summarize(*tool.stats())[pid]


@pytest.mark.parametrize("strategy", ["tracepoint", "tp_btf"])
def test_cold_read_is_disk_warm_read_is_cached(ext4: Path, strategy: str) -> None:
    path = ext4 / "data.bin"
    dd("if=/dev/urandom", f"of={path}", "bs=1M", f"count={SIZE // MiB}", "conv=fsync")
    ino = path.stat().st_ino
    drop_caches()
    with FileIO(Options(strategy=strategy)) as tool:
        cold = dd(f"if={path}", "of=/dev/null", "bs=128k")
        cold_events = drain(tool, cold, SIZE // (128 << 10) + 1)
        warm = dd(f"if={path}", "of=/dev/null", "bs=128k")
        warm_events = drain(tool, warm, SIZE // (128 << 10) + 1)
        first, second = pid_summary(tool, cold), pid_summary(tool, warm)
        lost = tool.counters()
        assert lost["events_lost"] == 0 and lost["recursion_misses"] == 0

    # dd's own start-up reads (libc, locale) are regular-file reads too: the file's
    # reads are told apart by inode in the stream, which agrees with the aggregates.
    n = SIZE // (128 << 10) + 1  # 256 reads of 128 KiB, then the 0-byte read at EOF
    for ev, pid, summ in ((cold_events, cold, first), (warm_events, warm, second)):
        assert summ.comm == "dd"
        assert set(ev["pid"].tolist()) == {pid}
        assert len(ev) == summ.total("read").ops
        assert int(ev["bytes"].sum()) == summ.total("read").bytes
        assert int(ev["disk_bytes"].sum()) == summ.total("read").disk_bytes
        on_file = ev[ev["ino"] == ino]
        assert len(on_file) == n
        assert int(on_file["bytes"].sum()) == SIZE

    # First pass: every byte came in a disk read, disk_bytes is the file within 1%.
    cold_file = cold_events[cold_events["ino"] == ino]
    assert int(cold_file[cold_file["cached"] == 0]["bytes"].sum()) == SIZE
    assert abs(int(cold_file["disk_bytes"].sum()) - SIZE) <= SIZE // 100
    assert abs(first.total("read").disk_bytes - SIZE) <= SIZE // 100
    assert first.total("read", cached=False).bytes >= SIZE  # and start-up reads after the drop
    # Second pass: the page cache served it.
    warm_file = warm_events[warm_events["ino"] == ino]
    assert warm_file["cached"].all()
    assert int(warm_file["disk_bytes"].sum()) == 0
    ratio = second.hit_ratio("read")
    assert ratio is not None and ratio >= 0.99
    assert second.total("read").disk_bytes == 0


def test_direct_writes_are_disk_buffered_writes_cached(ext4: Path) -> None:
    # The blocks are allocated before: a write that allocates also reads the block
    # bitmap and group descriptors from the disk in the writer's thread (1 KiB blocks on
    # this small file system), which would be disk bytes of the write beside its data.
    dd("if=/dev/zero", f"of={ext4 / 'direct.bin'}", "bs=64k", "count=64", "conv=fsync")
    with FileIO(Options()) as tool:
        direct = dd(
            "if=/dev/zero", f"of={ext4 / 'direct.bin'}", "bs=64k", "count=64", "oflag=direct",
            "conv=notrunc",
        )  # fmt: skip
        buffered = dd("if=/dev/zero", f"of={ext4 / 'buffered.bin'}", "bs=64k", "count=64")
        d, b = pid_summary(tool, direct), pid_summary(tool, buffered)

    assert d.total("write").ops == 64 and d.total("write").bytes == 64 * 65536
    assert d.total("write", cached=True).ops == 0
    # O_DIRECT: each write is its own block request of exactly its bytes.
    assert d.total("write").disk_bytes == 64 * 65536
    assert b.total("write").ops == 64 and b.total("write").bytes == 64 * 65536
    assert b.total("write", cached=False).ops == 0
    assert b.total("write").disk_bytes == 0
    # /dev/zero is not a regular file: dd's 64 reads of 64 KiB from it are not there
    # (only its start-up reads of libc and locale files, a few KiB).
    assert d.total("read").bytes < 65536 and b.total("read").bytes < 65536


def disk_summary(tool: FileIO, pid: int) -> dict[str, tuple[int, int, int]]:
    """(requests, bytes, histogram count) of the block requests `pid` submitted, by op."""
    keys, vals = tool.disk_stats()
    out = {}
    for k, v in zip(keys, vals, strict=True):
        if int(k["pid"]) == pid:
            v = np.atleast_1d(v)
            out[OPS[int(k["op"])]] = (
                int(v["requests"].sum()),
                int(v["bytes"].sum()),
                int(v["buckets"].sum()),
            )
    return out


# 16 O_DIRECT reads or writes of 64 KiB (argv: path, "read" or "write"), after "go" on
# stdin. Everything mapped is locked first: this VM's DAMON pages out cold pages (its
# pageout scheme), and a page of the process's own text or libraries read back from the
# root disk is a block request of its PID too (a traced dd once had 17 where its file's
# were 16, after an untraced warm-up run).
DIRECT_IO = r"""
import ctypes, mmap, os, sys
if ctypes.CDLL(None, use_errno=True).mlockall(3):  # MCL_CURRENT | MCL_FUTURE
    sys.exit(f"mlockall: {os.strerror(ctypes.get_errno())}")
buf = mmap.mmap(-1, 65536)  # page-aligned, as O_DIRECT wants
write = sys.argv[2] == "write"
fd = os.open(sys.argv[1], (os.O_WRONLY if write else os.O_RDONLY) | os.O_DIRECT)
print("ready", flush=True)
if sys.stdin.readline() != "go\n":
    sys.exit(0)
for i in range(16):
    (os.pwritev if write else os.preadv)(fd, [buf], i * 65536)
print("done", flush=True)
"""


class DirectIO:
    """The DIRECT_IO process: started (and locked in memory) untraced, `go()` once the
    tracer is attached."""

    def __init__(self, path: Path, op: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DIRECT_IO, str(path), op],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.pid = self.proc.pid
        try:
            assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"
        except BaseException:
            self.close()
            raise

    def go(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "done\n"
        return self.pid

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # one that has not had go() exits at EOF
        try:
            self.proc.wait(patience(10))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@contextlib.contextmanager
def direct_io(path: Path) -> Iterator[tuple[DirectIO, DirectIO]]:
    """A reader and a writer of `path` (DirectIO), each a process of its own, both
    closed at the end whatever happens."""
    with contextlib.ExitStack() as stack:
        reader = DirectIO(path, "read")
        stack.callback(reader.close)
        writer = DirectIO(path, "write")
        stack.callback(writer.close)
        yield reader, writer


def test_block_requests_attributed_to_the_pid(ext4: Path) -> None:
    """O_DIRECT on the loop device's ext4: each 64 KiB read and write is one block
    request submitted by its process, with its device latency, in the per-PID disk
    aggregates and in the operation's event."""
    needs_block_io_start()
    path = ext4 / "direct.bin"
    dd("if=/dev/urandom", f"of={path}", "bs=1M", "count=1", "conv=fsync")
    ino = path.stat().st_ino
    with direct_io(path) as (reader, writer), FileIO(Options()) as tool:
        events = drain(tool, reader.go(), 16)
        wevents = drain(tool, writer.go(), 16)
        rd, wr = disk_summary(tool, reader.pid), disk_summary(tool, writer.pid)
    assert rd == {"read": (16, 1 << 20, 16)}
    assert wr == {"write": (16, 1 << 20, 16)}
    for ev, op in ((events, 0), (wevents, 1)):
        on_file = ev[(ev["ino"] == ino) & (ev["bytes"] > 0) & (ev["op"] == op)]
        assert len(on_file) == 16
        assert (on_file["disk_requests"] == 1).all()
        assert (on_file["disk_latency_ns"] > 0).all()
        assert (on_file["disk_latency_ns"] <= on_file["latency_ns"]).all()
    # Operations that submitted nothing carry no device time.
    assert (events[events["ino"] != ino]["disk_requests"] == 0).all()


FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap)
FIEMAP_FLAG_SYNC = 1
FIEMAP_EXTENT_LAST = 1


def physical(path: Path, offset: int) -> int:
    """Where byte `offset` of the file lies on its device, in bytes (FIEMAP)."""
    n = 32  # extents asked for at once
    head = struct.Struct("=QQIIII")  # struct fiemap, then n struct fiemap_extent
    ext = struct.Struct("=QQQQQI12x")  # logical, physical, length, reserved, flags
    with open(path, "rb") as f:
        buf = bytearray(head.pack(offset, 1, FIEMAP_FLAG_SYNC, 0, n, 0) + bytes(n * ext.size))
        fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf)
    mapped = head.unpack_from(buf)[3]
    for i in range(mapped):
        logical, phys, length, _, _, _ = ext.unpack_from(buf, head.size + i * ext.size)
        if logical <= offset < logical + length:
            return int(phys) + offset - int(logical)
    raise AssertionError(f"FIEMAP: byte {offset} of {path} is not mapped")


@pytest.mark.parametrize("strategy", ["tracepoint", "tp_btf"])
def test_block_events_carry_the_files_sectors(
    ext4: Path, loop_device: LoopDevice, strategy: str
) -> None:
    """O_DIRECT reads and writes of 64 KiB at known offsets: each event's `sector` is
    where FIEMAP puts that offset of the file on the loop device (no partition, so the
    disk's sector is the file system's), exactly; an operation with no block I/O of its
    direction has -1. From block_bio_queue: every kernel, both kinds of disk signal
    (the tracepoint, and tp_btf reading the bio)."""
    path = ext4 / "direct.bin"
    dd("if=/dev/urandom", f"of={path}", "bs=1M", "count=1", "conv=fsync")
    ino = path.stat().st_ino
    assert path.stat().st_dev == os.stat(loop_device.path).st_rdev  # a whole disk: from 0
    want = [physical(path, i * 65536) // 512 for i in range(16)]
    with direct_io(path) as (reader, writer), FileIO(Options(strategy=strategy)) as tool:
        events = drain(tool, reader.go(), 16)
        wevents = drain(tool, writer.go(), 16)
    for ev, op in ((events, 0), (wevents, 1)):
        on_file = ev[(ev["ino"] == ino) & (ev["bytes"] > 0) & (ev["op"] == op)]
        on_file = on_file[np.argsort(on_file["ts_ns"], kind="stable")]  # one thread
        assert on_file["sector"].tolist() == want, OPS[op]
        lines = [json.loads(x) for x in EventFormatter().json_lines(on_file).splitlines()]
        assert [x["sector"] for x in lines] == want
        assert (ev[(ev["ino"] != ino) | (ev["op"] != op)]["sector"] == -1).all()


IO_CMD = [sys.executable, "-m", "meridian", "io"]


def test_block_requests_in_the_summary_and_retired_with_the_process(ext4: Path) -> None:
    """The exit summary reports the block requests per submitting process (JSON
    `type: block`, exact counts), and an exited submitter is retired from `disk_io`
    after the grace period but stays in the summary."""
    needs_block_io_start()
    path = ext4 / "direct.bin"
    dd("if=/dev/urandom", f"of={path}", "bs=1M", "count=1", "conv=fsync")
    direct = DirectIO(path, "read")
    proc = subprocess.Popen(
        [*IO_CMD, "-v", "--no-events", "--grace", "0", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_attached(proc)
        reader = direct.go()
        direct.close()  # exited: to be retired
        time.sleep(1.0)  # several table intervals: the exited dd is retired meanwhile
        dump = subprocess.run(
            ["bpftool", "-j", "map", "dump", "name", "disk_io"],
            capture_output=True,
            text=True,
            check=True,
        )
        # Raw keys: struct fileio_disk_key starts with the u32 pid (little-endian).
        live = {
            int.from_bytes(bytes(int(b, 16) for b in e["key"][:4]), "little")
            for e in json.loads(dump.stdout)
        }
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    finally:
        reap(proc)
        direct.close()
    assert proc.returncode == 0, err
    block = [json.loads(x) for x in out.splitlines() if '"type":"block"' in x.replace(" ", "")]
    mine = [b for b in block if b["pid"] == reader]
    assert len(mine) == 1
    assert (mine[0]["op"], mine[0]["requests"], mine[0]["bytes"]) == ("read", 16, 1 << 20)
    assert mine[0]["latency"]["count"] == 16
    assert reader not in live  # retired from the kernel map, kept for the summary
