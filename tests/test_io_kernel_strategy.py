"""meridian io's strategies on the real kernel: sendfile and copy_file_range under each
tracepoint strategy, the kprobe programs through the verifier, the choice of the
first strategy that works, and threads sharing one in-flight slot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from children import patience, reap
from io_trace import OPS, drain, end_child, go, io_cli, ready_child
from strategies import every, run_or_skip

from meridian.tools.io.kernel import STRATEGIES, FileIO
from meridian.tools.io.model import summarize
from meridian.tools.io.options import Options

pytestmark = pytest.mark.kernel


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
]
try:
    got.append(os.sendfile(d3, z, None, 8192))  # /dev/zero -> file: a write
except OSError:  # EINVAL before 6.2: /dev/zero could not splice
    got.append(0)
sys.stdout.write(" ".join(map(str, got)) + " %d %d %d %d\n" % (s, d, d2, d3))
sys.stdout.flush()
sys.stdin.readline()
"""


@pytest.mark.parametrize("strategy", every(STRATEGIES))
def test_dd_reads_of_one_file_under_every_strategy(tmp_path: Path, strategy: str) -> None:
    """dd's 256 reads of 4 KiB: 256 read events of 4096 bytes on that file, and the
    process's aggregate equal to its events, under every strategy this kernel allows."""
    run_or_skip(STRATEGIES, strategy)
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(256 * 4096))
    dd = ["dd", f"if={data}", "of=/dev/null", "bs=4096", "count=256", "status=none"]
    # Waits until traced, then becomes dd (the same PID): its reads from its first.
    becomes_dd = "import os, sys; sys.stdin.readline(); os.execvp('dd', sys.argv[1:])"
    p = subprocess.Popen([sys.executable, "-c", becomes_dd, *dd], stdin=subprocess.PIPE)
    try:
        with FileIO(Options(pids=[p.pid], strategy=strategy)) as tool:
            assert tool.strategy.name == strategy
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.close()
            assert p.wait(60) == 0
            events = drain(tool, p.pid, 10_000, timeout=3.0)  # all of them (ld.so's too)
            stats = summarize(*tool.stats())
            # wb_unattributed: the host's own writeback by kernel threads, not a loss
            lost = {k: v for k, v in tool.counters().items() if v and k != "wb_unattributed"}
    finally:
        reap(p)
    on_file = events[events["ino"] == data.stat().st_ino]
    assert len(on_file) == 256, lost
    assert {(OPS[int(e["op"])], int(e["bytes"])) for e in on_file} == {("read", 4096)}
    reads = events[events["op"] == OPS.index("read")]
    assert stats[p.pid].total("read").ops == len(reads)
    assert stats[p.pid].total("read").bytes == int(reads["bytes"].sum())
    assert not lost


@pytest.mark.parametrize("strategy", every(STRATEGIES))
def test_sendfile_and_copy_file_range(tmp_path: Path, strategy: str) -> None:
    """The regular-file side of a copy: the source's bytes as a read, the target's as a
    write, exact, with the right fd and inode; sockets and /dev/zero are not there."""
    run_or_skip(STRATEGIES, strategy)
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(65536))
    dst, dst2, dst3 = (tmp_path / n for n in ("dst.bin", "dst2.bin", "dst3.bin"))
    with ready_child(COPIER, [src, dst, dst2, dst3]) as p:
        with FileIO(Options(pids=[p.pid], strategy=strategy)) as tool:
            said = go(p)
            n_file, n_sock, n_copy, n_zero, fs, fd, fd2, fd3 = map(int, said.split())
            events = drain(tool, p.pid, 5 + (n_zero > 0), timeout=patience(3.0))
            stats = summarize(*tool.stats())
        end_child(p)
    assert (n_file, n_sock, n_copy) == (65536, 12288, 32768) and n_zero in (0, 8192)
    ino = {f: f.stat().st_ino for f in (src, dst, dst2, dst3)}
    got = sorted((OPS[int(e["op"])], int(e["fd"]), int(e["ino"]), int(e["bytes"])) for e in events)
    assert got == sorted(
        [
            ("read", fs, ino[src], 65536),
            ("write", fd, ino[dst], 65536),
            ("read", fs, ino[src], 12288),
            ("read", fs, ino[src], 32768),
            ("write", fd2, ino[dst2], 32768),
        ]
        + [("write", fd3, ino[dst3], 8192)] * (n_zero > 0)
    )
    ps = stats[p.pid]
    assert ps.total("read").ops == 3 and ps.total("read").bytes == 65536 + 12288 + 32768
    writes = 2 + (n_zero > 0)
    assert ps.total("write").ops == writes and ps.total("write").bytes == 65536 + 32768 + n_zero
    # The source was just written: in the page cache; the targets only dirty pages.
    assert ps.total("read").disk_bytes == 0 and ps.total("write").disk_bytes == 0


# cat's copy (coreutils): copy_file_range asked for 0x7fffffffc0000000 bytes, until it
# returns 0
CAT_COPY = r"""
import os, sys
s = os.open(sys.argv[1], os.O_RDONLY)
d = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
got = [os.copy_file_range(s, d, 0x7FFFFFFFC0000000) for _ in range(3)]
sys.stdout.write(" ".join(map(str, got)) + "\n"); sys.stdout.flush()
sys.stdin.readline()
"""
MAX_RW_COUNT = 0x7FFFF000  # what the kernel moves in one call at most


def test_a_copy_asking_for_everything_requests_what_the_kernel_moves(tmp_path: Path) -> None:
    """Three such calls (the data, then 0 twice): each requests MAX_RW_COUNT bytes, as
    the kernel clamps it; their sum no longer wraps around 2^64 (two of cat's did)."""
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(12288))
    with ready_child(CAT_COPY, [src, tmp_path / "dst.bin"]) as p:
        with FileIO(Options(pids=[p.pid])) as tool:
            assert go(p) == b"12288 0 0\n"
            drain(tool, p.pid, 6, timeout=patience(3.0))
            stats = summarize(*tool.stats())
        end_child(p)
    read, write = stats[p.pid].total("read"), stats[p.pid].total("write")
    assert (read.ops, read.bytes, read.bytes_requested) == (3, 12288, 3 * MAX_RW_COUNT)
    assert (write.ops, write.bytes, write.bytes_requested) == (3, 12288, 3 * MAX_RW_COUNT)


# Each read and write syscall io traces, a few times on a file of its own (its index
# in CALLS names the file): what the child says it returned, per call.
CALLS = {
    "read": "len(os.read(f, 4096))",
    "pread64": "len(os.pread(f, 4096, 0))",
    "readv": "os.readv(f, [bytearray(1024), bytearray(3072)])",
    "preadv": "os.preadv(f, [bytearray(4096)], 0)",
    "preadv2": "os.preadv(f, [bytearray(4096)], 0, os.RWF_HIPRI)",
    "write": "os.write(f, b'w' * 512)",
    "pwrite64": "os.pwrite(f, b'w' * 512, 0)",
    "writev": "os.writev(f, [b'w' * 256, b'w' * 256])",
    "pwritev": "os.pwritev(f, [b'w' * 512], 0)",
    "pwritev2": "os.pwritev(f, [b'w' * 512], 0, os.RWF_DSYNC)",
}
TIMES = 7
CALLER = f"""
import os, sys
calls = {list(CALLS.values())!r}
fds = [os.open(p, os.O_RDWR) for p in sys.argv[1:]]
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
for f, call in zip(fds, calls):
    for _ in range({TIMES}):
        os.lseek(f, 0, os.SEEK_SET)
        assert eval(call) > 0, call
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


@pytest.mark.parametrize("strategy", every(STRATEGIES))
def test_every_read_and_write_syscall_under_every_strategy(tmp_path: Path, strategy: str) -> None:
    """Each syscall's calls, exactly, on its own file: a strategy that hooks a function
    the kernel has inlined into its syscall (Debian's 6.1 and 6.12 inline ksys_pread64
    into pread64) attaches and never runs, and its file would show no calls."""
    run_or_skip(STRATEGIES, strategy)
    files = [tmp_path / f"{name}.bin" for name in CALLS]
    for f in files:
        f.write_bytes(os.urandom(4096))
    with ready_child(CALLER, files) as p:
        with FileIO(Options(pids=[p.pid], strategy=strategy)) as tool:
            assert go(p) == b"done\n"
            events = drain(tool, p.pid, len(CALLS) * TIMES, timeout=patience(3.0))
        end_child(p)
    by_file = {f.stat().st_ino: name for name, f in zip(CALLS, files, strict=True)}
    got: dict[str, list[tuple[str, int]]] = {name: [] for name in CALLS}
    for e in events:
        if int(e["ino"]) in by_file:
            got[by_file[int(e["ino"])]].append((OPS[int(e["op"])], int(e["bytes"])))
    want = {name: [("write", 512) if "write" in name else ("read", 4096)] * TIMES for name in CALLS}
    assert got == want


def test_kprobe_strategy_passes_the_verifier() -> None:
    """kprobes cannot attach on this kernel, but their programs load: the verifier
    accepts the kprobe path (ksyscall wrappers, real fds) as it is shipped."""
    from meridian.bpf import BpfObject, object_path
    from meridian.tools.io.kernel import STRATEGIES, signals

    kprobe = next(s for s in STRATEGIES if s.name == "kprobe")
    with BpfObject(object_path("io")) as obj:
        obj.select([*kprobe.programs, *signals(kprobe)])
        obj.load()


def test_strategy_falls_through_and_is_named() -> None:
    """choose() skips what this kernel refuses (fentry: EPERM, kprobe: no kprobe events
    here) and takes the first that works; -v says which, as does meridian doctor."""
    from host_facts import expected_strategy

    from meridian.bpf import choose
    from meridian.tools.io import STRATEGIES

    chosen = choose(STRATEGIES)
    assert chosen.name == expected_strategy(STRATEGIES)  # bpftool and tracefs say so
    before = STRATEGIES[: STRATEGIES.index(chosen)]
    with FileIO(Options(no_events=True)) as tool:
        assert tool.strategy is chosen
        assert set(chosen.programs) & set(tool.selected)
    r = io_cli("-v", "--no-events", "--duration", "0.2")
    assert r.returncode == 0
    assert f"strategy: {chosen.name} (" in r.stderr
    doctor = subprocess.run(
        [sys.executable, "-m", "meridian", "doctor"], capture_output=True, text=True, timeout=60
    )
    assert any(line.split()[:2] == ["io", chosen.name] for line in doctor.stdout.splitlines())
    for s in before:  # forcing a refused strategy: one line, exit 2
        r = io_cli("--strategy", s.name, "--duration", "0.2")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


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
        end_child(p)
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
