"""meridian io on a loop-device ext4 file system with workloads whose answer is known."""

from __future__ import annotations

import contextlib
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
from children import reap
from conftest import LoopDevice

from meridian.tools.io.kernel import FileIO
from meridian.tools.io.model import PidSummary, summarize
from meridian.tools.io.options import Options

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
if len(sys.argv) > 2:
    open("/proc/self/comm", "w").write(sys.argv[2])
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


def _child(path: Path, comm: str | None = None) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), *([comm] if comm else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
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


@contextlib.contextmanager
def _children(path: Path, *comms: str | None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One CHILD per comm (None: its own name), reaped at the end whatever happens."""
    children: list[subprocess.Popen[bytes]] = []
    try:
        for comm in comms:
            children.append(_child(path, comm))
        yield children
    finally:
        for p in children:
            reap(p)


def _trace_pair(
    opts: Options, traced: subprocess.Popen[bytes], other: subprocess.Popen[bytes]
) -> tuple[np.ndarray[Any, Any], dict[int, PidSummary]]:
    """Both children's workload under a filter that should let only `traced` through:
    the events of `traced` and the summary of every process the kernel counted."""
    with FileIO(opts) as tool:
        _go(traced)
        _go(other)
        events = drain(tool, traced.pid, 3, timeout=2.0)
        stats = summarize(*tool.stats())
    _end(traced)
    _end(other)
    return events, stats


def test_pid_filter_and_non_regular_files(tmp_path: Path) -> None:
    path = tmp_path / "small.bin"
    path.write_bytes(os.urandom(4096))
    with _children(path, None, None) as (ours, other), FileIO(Options(pids=[ours.pid])) as tool:
        _go(ours)
        _go(other)
        _end(ours)
        _end(other)
        events = drain(tool, ours.pid, 3, timeout=2.0)
        stats = summarize(*tool.stats())
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
            [sys.executable, "-m", "meridian", "io", "-v", "-p", str(child.pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        while "strategy:" not in (line := proc.stderr.readline()):
            assert line, "meridian io exited before attaching"
        _go(child)
        time.sleep(0.5)  # the agent drains on a 50 ms timer; SIGTERM drains the rest
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        _end(child)
    finally:
        reap(child)
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


def test_cgroup_filter_in_the_kernel(tmp_path: Path) -> None:
    """--cgroup: a process moved into a test-made cgroup v2 (here a child of it) is
    traced; the same workload outside it is not."""
    from meridian.tools.io.cli import cgroup_id, cgroup_mounts

    path = tmp_path / "cg.bin"
    path.write_bytes(os.urandom(4096))
    top = Path(cgroup_mounts()[0]) / f"meridian-test-{os.getpid()}"
    inner = top / "inner"
    inner.mkdir(parents=True)
    try:
        with _children(path, None, None) as (inside, outside):
            (inner / "cgroup.procs").write_text(f"{inside.pid}\n")
            # The filter is the parent cgroup: processes in cgroups below it count too.
            events, stats = _trace_pair(Options(cgroup=cgroup_id(str(top))), inside, outside)
    finally:
        for d in (inner, top):
            if d.exists():
                d.rmdir()
    assert set(stats) == {inside.pid}
    assert stats[inside.pid].total("read").ops == 3
    assert stats[inside.pid].total("read").bytes == 3 * 4096
    assert len(events) == 3


def test_bad_cgroup_is_one_line_exit_2() -> None:
    r = _cli("--cgroup", "/no/such/cgroup")
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "not a cgroup v2 directory" in r.stderr


COPIER = r"""
import os, socket, sys
src, dst, dst2, dst3 = sys.argv[1:5]
s = os.open(src, os.O_RDONLY)
d = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
d2 = os.open(dst2, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
d3 = os.open(dst3, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
z = os.open("/dev/zero", os.O_RDONLY)
a, b = socket.socketpair()
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
got = [
    os.sendfile(d, s, 0, 65536),            # file -> file: a read and a write
    os.sendfile(a.fileno(), s, 0, 12288),   # file -> socket: a read
    os.copy_file_range(s, d2, 32768, 0, 0), # file -> file: a read and a write
    os.sendfile(d3, z, None, 8192),         # /dev/zero -> file: a write
]
sys.stdout.write(" ".join(map(str, got)) + " %d %d %d %d\n" % (s, d, d2, d3))
sys.stdout.flush()
sys.stdin.readline()
"""


@pytest.mark.parametrize("strategy", ["tracepoint", "tp_btf"])
def test_sendfile_and_copy_file_range(tmp_path: Path, strategy: str) -> None:
    """The regular-file side of a copy: the source's bytes as a read, the target's as a
    write, exact, with the right fd and inode; sockets and /dev/zero are not there."""
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(65536))
    dst, dst2, dst3 = (tmp_path / n for n in ("dst.bin", "dst2.bin", "dst3.bin"))
    p = subprocess.Popen(
        [sys.executable, "-c", COPIER, *map(str, (src, dst, dst2, dst3))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        with FileIO(Options(pids=[p.pid], strategy=strategy)) as tool:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
            n_file, n_sock, n_copy, n_zero, fs, fd, fd2, fd3 = map(int, p.stdout.readline().split())
            events = drain(tool, p.pid, 6, timeout=3.0)
            stats = summarize(*tool.stats())
        _end(p)
    finally:
        reap(p)
    assert (n_file, n_sock, n_copy, n_zero) == (65536, 12288, 32768, 8192)
    ino = {f: f.stat().st_ino for f in (src, dst, dst2, dst3)}
    got = sorted((OPS_[int(e["op"])], int(e["fd"]), int(e["ino"]), int(e["bytes"])) for e in events)
    assert got == sorted(
        [
            ("read", fs, ino[src], 65536),
            ("write", fd, ino[dst], 65536),
            ("read", fs, ino[src], 12288),
            ("read", fs, ino[src], 32768),
            ("write", fd2, ino[dst2], 32768),
            ("write", fd3, ino[dst3], 8192),
        ]
    )
    ps = stats[p.pid]
    assert ps.total("read").ops == 3 and ps.total("read").bytes == 65536 + 12288 + 32768
    assert ps.total("write").ops == 3 and ps.total("write").bytes == 65536 + 32768 + 8192
    # The source was just written: in the page cache; the targets only dirty pages.
    assert ps.total("read").disk_bytes == 0 and ps.total("write").disk_bytes == 0


OPS_ = ("read", "write")


def disk_summary(tool: FileIO, pid: int) -> dict[str, tuple[int, int, int]]:
    """(requests, bytes, histogram count) of the block requests `pid` submitted, by op."""
    keys, vals = tool.disk_stats()
    out = {}
    for k, v in zip(keys, vals, strict=True):
        if int(k["pid"]) == pid:
            v = np.atleast_1d(v)
            out[OPS_[int(k["op"])]] = (
                int(v["requests"].sum()),
                int(v["bytes"].sum()),
                int(v["slots"].sum()),
            )
    return out


def test_block_requests_attributed_to_the_pid(ext4: Path) -> None:
    """O_DIRECT on the loop device's ext4: each 64 KiB read and write is one block
    request submitted by dd, with its device latency, in the per-PID disk aggregates and
    in the operation's event."""
    path = ext4 / "direct.bin"
    dd("if=/dev/urandom", f"of={path}", "bs=1M", "count=1", "conv=fsync")
    ino = path.stat().st_ino
    with FileIO(Options()) as tool:
        reader = dd(f"if={path}", "of=/dev/null", "bs=64k", "iflag=direct")
        events = drain(tool, reader, 17)
        writer = dd(
            "if=/dev/zero", f"of={path}", "bs=64k", "count=16", "oflag=direct", "conv=notrunc"
        )
        wevents = drain(tool, writer, 16)
        rd, wr = disk_summary(tool, reader), disk_summary(tool, writer)
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


IO_CMD = [sys.executable, "-m", "meridian", "io"]


def test_block_requests_in_the_summary_and_retired_with_the_process(ext4: Path) -> None:
    """The exit summary reports the block requests per submitting process (JSON
    `type: block`, exact counts), and an exited submitter is retired from `disk_io`
    after the grace period but stays in the summary."""
    path = ext4 / "direct.bin"
    dd("if=/dev/urandom", f"of={path}", "bs=1M", "count=1", "conv=fsync")
    proc = subprocess.Popen(
        [*IO_CMD, "-v", "--no-events", "--grace", "0", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        while "strategy:" not in (line := proc.stderr.readline()):
            assert line, "meridian io exited before attaching"
        reader = dd(f"if={path}", "of=/dev/null", "bs=64k", "iflag=direct")
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
    assert proc.returncode == 0, err
    block = [json.loads(x) for x in out.splitlines() if '"type":"block"' in x.replace(" ", "")]
    mine = [b for b in block if b["pid"] == reader]
    assert len(mine) == 1
    assert (mine[0]["op"], mine[0]["requests"], mine[0]["bytes"]) == ("read", 16, 1 << 20)
    assert mine[0]["latency"]["count"] == 16
    assert reader not in live  # retired from the kernel map, kept for the summary


def test_kprobe_strategy_passes_the_verifier() -> None:
    """kprobes cannot attach on this kernel, but their programs load: the verifier
    accepts the kprobe path (ksyscall wrappers, real fds) as it is shipped."""
    from meridian.bpf import BpfObject, object_path
    from meridian.tools.io.kernel import SIGNALS, STRATEGIES

    kprobe = next(s for s in STRATEGIES if s.name == "kprobe")
    with BpfObject(object_path("io")) as obj:
        obj.select([*kprobe.programs, *SIGNALS])
        obj.load()


def test_strategy_falls_through_and_is_named() -> None:
    """choose() skips what this kernel refuses (fentry: EPERM, kprobe: no kprobe events
    here) and takes the first that works; -v says which, as does meridian doctor."""
    from meridian.bpf import choose
    from meridian.tools.io import STRATEGIES

    chosen = choose(STRATEGIES)
    before = STRATEGIES[: STRATEGIES.index(chosen)]
    assert all(s.missing() for s in before)
    with FileIO(Options(no_events=True)) as tool:
        assert tool.strategy is chosen
        assert set(chosen.programs) & set(tool.selected)
    r = _cli("-v", "--no-events", "--duration", "0.2")
    assert r.returncode == 0
    assert f"strategy: {chosen.name} (" in r.stderr
    doctor = subprocess.run(
        [sys.executable, "-m", "meridian", "doctor"], capture_output=True, text=True, timeout=60
    )
    assert any(line.split()[:2] == ["io", chosen.name] for line in doctor.stdout.splitlines())
    for s in before:  # forcing a refused strategy: one line, exit 2
        r = _cli("--strategy", s.name, "--duration", "0.2")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_comm_filter_in_the_kernel(tmp_path: Path) -> None:
    """--comm: of two identical processes only the one with that name is traced."""
    path = tmp_path / "comm.bin"
    path.write_bytes(os.urandom(4096))
    with _children(path, "meridian-comm", None) as (ours, other):
        events, stats = _trace_pair(Options(comms=["meridian-comm"]), ours, other)
    assert set(stats) == {ours.pid}
    assert stats[ours.pid].comm == "meridian-comm"
    assert stats[ours.pid].total("read").ops == 3 and len(events) == 3


# A thread blocked in a read of a regular file (a tracefs instance's trace_pipe, which
# waits for data) while another thread of the process does file I/O.
SHARER = r"""
import os, sys, threading, time
path, inst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
f = os.open(path, os.O_RDONLY)
pipe = os.open(inst + "/trace_pipe", os.O_RDONLY)
marker = os.open(inst + "/trace_marker", os.O_WRONLY)
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
got = []
t = threading.Thread(target=lambda: got.append(os.read(pipe, 4096)))
t.start()
state = os.open("/proc/self/task/%d/syscall" % t.native_id, os.O_RDONLY)
polls = 1
while os.pread(state, 64, 0).split()[0] != b"0":  # until the thread sleeps in read(2)
    time.sleep(0.01)
    polls += 1
for _ in range(n):
    os.pread(f, 4096, 0)
os.write(marker, b"wake\n")  # the blocked read returns
t.join()
sys.stdout.write("%d %d\n" % (polls, len(got[0]))); sys.stdout.flush()
sys.stdin.readline()
"""


def test_threads_sharing_a_slot_are_never_mispaired(tmp_path: Path) -> None:
    """With one in-flight slot for all threads, a thread that starts an operation while
    another's is in flight takes the slot: the other's operation is counted as evicted,
    not measured, and every operation of the taker is exact."""
    path = tmp_path / "small.bin"
    path.write_bytes(os.urandom(4096))
    inst = Path("/sys/kernel/tracing/instances/meridian-io-slots")
    inst.mkdir()
    p = subprocess.Popen(
        [sys.executable, "-c", SHARER, str(path), str(inst), "100"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        with FileIO(Options(pids=[p.pid], thread_slots=1, no_events=True)) as tool:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
            polls, woke = map(int, p.stdout.readline().split())
            stats = summarize(*tool.stats())[p.pid]
            counters = tool.counters()
        _end(p)
    finally:
        reap(p)
        inst.rmdir()
    assert woke > 0
    assert counters["evicted"] == 1  # the blocked read(2)
    # The preads and the polls of the thread's state (procfs files are regular files),
    # all by the main thread; not the evicted read.
    reads = stats.total("read")
    assert reads.ops == 100 + polls
    assert reads.bytes_requested == 100 * 4096 + polls * 64
    assert stats.total("write").ops == 1  # the trace_marker write
