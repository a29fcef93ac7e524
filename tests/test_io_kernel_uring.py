"""meridian io and io_uring: fio `--ioengine=io_uring` on a loop-device ext4 file
system, whose own count of operations and bytes is the answer. Reads and writes
submitted through a ring make no read or write syscall; io follows each request from
submission to completion (bpf/io_uring.bpf.h)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from children import reap
from io_trace import drain
from test_io_kernel_disk import dd, drop_caches, pid_summary

from meridian.tools.io.kernel import FileIO
from meridian.tools.io.options import Options

pytestmark = pytest.mark.kernel
MiB = 1 << 20
SIZE = 8 * MiB


def fio(path: Path, rw: str, *args: str) -> tuple[int, dict[str, Any]]:
    """fio through io_uring, its job a thread of its own process: (the PID, fio's
    numbers for the job's direction)."""
    cmd = ["fio", "--name=uring", f"--filename={path}", "--ioengine=io_uring", f"--rw={rw}"]
    cmd += ["--bs=4k", f"--size={SIZE}", "--thread", "--output-format=json", *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        out, _ = p.communicate(timeout=300)
    finally:
        reap(p)  # killed if it overran
    assert p.returncode == 0, out
    job = json.loads(out)["jobs"][0]
    return p.pid, job["write" if "write" in rw else "read"]


@pytest.mark.parametrize("strategy", ["tracepoint", "tp_btf"])
def test_io_uring_reads_and_writes_equal_fios_and_say_where_they_went(
    ext4: Path, strategy: str
) -> None:
    path = ext4 / "uring.bin"
    dd("if=/dev/urandom", f"of={path}", "bs=1M", f"count={SIZE // MiB}", "conv=fsync")
    with FileIO(Options(strategy=strategy)) as tool:
        assert tool.uring, "this kernel has io_uring's tracepoints (6.1+)"
        direct_read, dr = fio(path, "randread", "--direct=1", "--iodepth=8")
        direct_write, dw = fio(path, "randwrite", "--direct=1", "--iodepth=8")
        # Handed to io-wq workers (IOSQE_ASYNC), one at a time: the worker's block I/O is
        # the request the process handed over last (io_uring_queue_async_work).
        worker, wk = fio(path, "randread", "--direct=1", "--iodepth=1", "--force_async=1")
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
        warm, wr = fio(path, "read", "--invalidate=0", "--iodepth=8")
        drop_caches()
        cold, cr = fio(path, "read", "--invalidate=1", "--iodepth=1")
        events = drain(tool, cold, cr["total_ios"])
        pids = (direct_read, direct_write, worker, warm, cold)
        got = {pid: pid_summary(tool, pid) for pid in pids}
        lost = tool.counters()
    assert lost["uring_untracked"] == 0 and lost["events_lost"] == 0

    cases = [(direct_read, "read", dr), (direct_write, "write", dw), (worker, "read", wk)]
    cases += [(warm, "read", wr), (cold, "read", cr)]
    for pid, op, theirs in cases:
        ours = got[pid].total(op, interface="io_uring")
        assert (ours.ops, ours.bytes) == (theirs["total_ios"], theirs["io_bytes"]), (pid, op)
        assert ours.bytes == SIZE
    # O_DIRECT: each request is its own block I/O of exactly its bytes, never cached.
    for pid, op in ((direct_read, "read"), (direct_write, "write"), (worker, "read")):
        assert got[pid].total(op, cached=True, interface="io_uring").ops == 0
        assert got[pid].total(op, interface="io_uring").disk_bytes == SIZE
    # Buffered, warm: the page cache served every read.
    assert got[warm].total("read", cached=False, interface="io_uring").ops == 0
    assert got[warm].total("read", interface="io_uring").disk_bytes == 0
    # Buffered, cold, one request in flight at a time: the reads brought the file in
    # (readahead included, credited to the reads it served), within 1 %.
    cold_uring = got[cold].total("read", interface="io_uring")
    assert abs(cold_uring.disk_bytes - SIZE) <= SIZE // 100
    # The events of the cold pass, marked io_uring (op 2: enum io_op's bit 1).
    on_file = events[events["ino"] == os.stat(path).st_ino]
    assert len(on_file) == cr["total_ios"] and set(on_file["op"].tolist()) == {2}
    assert int(on_file["bytes"].sum()) == SIZE
    assert int(on_file["disk_bytes"].sum()) == cold_uring.disk_bytes
