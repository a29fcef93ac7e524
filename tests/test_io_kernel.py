"""meridian io on a loop-device ext4 file system with workloads whose answer is known."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import LoopDevice

from meridian.tools.io import FileIO, Options, PidSummary, summarize

pytestmark = pytest.mark.kernel
MiB = 1 << 20
SIZE = 32 * MiB


@pytest.fixture
def ext4(loop_device: LoopDevice, tmp_path: Path) -> Iterator[Path]:
    """An ext4 file system on the loop device, mounted; unmounted even on failure."""
    subprocess.run(["mkfs.ext4", "-q", "-F", loop_device.path], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", loop_device.path, str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def dd(*args: str) -> int:
    """Run dd; returns its PID (the PID the kernel saw)."""
    p = subprocess.Popen(["dd", *args, "status=none"])
    assert p.wait(60) == 0
    return p.pid


def drain(tool: FileIO, pid: int, want: int, timeout: float = 5.0) -> np.ndarray[Any, Any]:
    """Events of `pid` until `want` of them arrived (or the timeout)."""
    got: list[np.ndarray[Any, Any]] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ev = tool.events(0.05)
        if len(ev):
            got.append(ev[ev["pid"] == pid])
        if sum(map(len, got)) >= want:
            break
    return np.concatenate(got) if got else np.empty(0)


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
        assert tool.counters()["events_lost"] == 0

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
    with FileIO(Options()) as tool:
        direct = dd(
            "if=/dev/zero", f"of={ext4 / 'direct.bin'}", "bs=64k", "count=64", "oflag=direct"
        )
        buffered = dd("if=/dev/zero", f"of={ext4 / 'buffered.bin'}", "bs=64k", "count=64")
        d, b = pid_summary(tool, direct), pid_summary(tool, buffered)

    assert d.total("write").ops == 64 and d.total("write").bytes == 64 * 65536
    assert d.total("write", cached=True).ops == 0
    assert d.total("write").disk_bytes >= 64 * 65536
    assert b.total("write").ops == 64 and b.total("write").bytes == 64 * 65536
    assert b.total("write", cached=False).ops == 0
    assert b.total("write").disk_bytes == 0
    # /dev/zero is not a regular file: dd's 64 reads of 64 KiB from it are not there
    # (only its start-up reads of libc and locale files, a few KiB).
    assert d.total("read").bytes < 65536 and b.total("read").bytes < 65536


CHILD = r"""
import os, socket, sys
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
path = sys.argv[1]
r, w = os.pipe(); os.write(w, b"x" * 100); os.read(r, 100)
a, b = socket.socketpair(); a.send(b"y" * 100); os.read(b.fileno(), 100)
z = os.open("/dev/zero", os.O_RDONLY); os.read(z, 4096)
f = os.open(path, os.O_RDONLY)
for _ in range(3):
    os.pread(f, 4096, 0)
os.write(1, b"done\n")
sys.stdin.readline()  # exits when the test closes stdin
"""


def _child(path: Path) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    return p


def _go(p: subprocess.Popen[bytes]) -> None:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(b"go\n")
    p.stdin.flush()
    assert p.stdout.readline() == b"done\n"


def _end(p: subprocess.Popen[bytes]) -> None:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.close()
    assert p.wait(30) == 0
    p.stdout.close()


def _kill(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.kill()
        p.wait()
    for f in (p.stdin, p.stdout):
        if f is not None:
            f.close()


def test_pid_filter_and_non_regular_files(tmp_path: Path) -> None:
    path = tmp_path / "small.bin"
    path.write_bytes(os.urandom(4096))
    ours, other = _child(path), _child(path)
    try:
        with FileIO(Options(pids=[ours.pid])) as tool:
            _go(ours)
            _go(other)
            _end(ours)
            _end(other)
            events = drain(tool, ours.pid, 3, timeout=2.0)
            stats = summarize(*tool.stats())
    finally:
        for p in (ours, other):
            _kill(p)
    # Only the filtered PID, and only its three preads of the regular file: the pipe,
    # the socket, /dev/zero and the pipe to stdout produced nothing.
    assert set(stats) == {ours.pid}
    assert stats[ours.pid].total("read").ops == 3
    assert stats[ours.pid].total("write").ops == 0
    assert len(events) == 3
    assert set(events["ino"].tolist()) == {path.stat().st_ino}
    assert set(events["bytes"].tolist()) == {4096}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meridian", "io", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["-p", "abc"], "process ID"), (["-p", "999999999"], "no process with PID 999999999")],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    r = _cli(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr


def test_cli_events_with_paths_and_summary(tmp_path: Path) -> None:
    """The command end to end: JSON events and one summary line for a traced PID."""
    path = tmp_path / "cli.bin"
    path.write_bytes(os.urandom(3 * 4096))
    child = _child(path)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "meridian", "io", "-p", str(child.pid), "--duration", "3"],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)  # loaded and attached (not a timed assertion: a start-up wait)
        _go(child)
        out, _ = proc.communicate(timeout=30)
        _end(child)
    finally:
        _kill(child)
    assert proc.returncode == 0
    lines = [json.loads(x) for x in out.splitlines()]
    events = [x for x in lines if "type" not in x]
    summary = [x for x in lines if x.get("type") == "summary"]
    assert [e["file"] for e in events] == [str(path)] * 3
    assert [e["bytes"] for e in events] == [4096] * 3
    assert all(e["comm"] == "python3" or e["comm"].startswith("python") for e in events)
    assert {e["pid"] for e in events} == {child.pid}
    assert len(summary) == 1 and summary[0]["read"]["ops"] == 3
    assert summary[0]["read"]["bytes"] == 3 * 4096
