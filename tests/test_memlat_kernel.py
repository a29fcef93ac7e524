"""memlat against a page-touch child whose answer is known: 64 MiB of fresh private
anonymous memory touched page by page is 16,384 minor faults in that child."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from children import reap
from memlat_children import MINOR_TOUCHER, options
from strategies import every, run_or_skip

from meridian.bpf import BpfObject, object_path
from meridian.errors import NotSupported
from meridian.hist import slot_of
from meridian.tools.memlat import STRATEGIES, Memlat, Options
from meridian.tools.memlat.cli import run_options
from meridian.tools.memlat.kernel import FROM_EXCEPTION, FROM_HANDLE_MM_FAULT
from meridian.tools.memlat.model import KINDS, Snapshot
from meridian.tools.memlat.validate import page_toucher, run_toucher, validate
from meridian.tools.memlat.views import report_json

pytestmark = pytest.mark.kernel
PAGES = (64 << 20) // 4096  # 16,384
# Both start points (--from): the tests whose faults are all exceptions that finish
EVERY_STRATEGY = every(STRATEGIES)
# --from exception only: the tests of faults that fail before handle_mm_fault (no VMA),
# which --from handle_mm_fault does not see at all
FROM_EXCEPTION_STRATEGIES = every(FROM_EXCEPTION)


@pytest.mark.parametrize("strategy", ["tp_btf+perf", "tracepoint+perf"])
def test_faults_of_a_page_toucher_are_attributed_to_its_pid(strategy: str) -> None:
    opts = Options(per_process=True, strategy=strategy)
    with Memlat(opts) as tool, page_toucher(64) as child:
        before = tool.snapshot()
        result = run_toucher(child)
        cumulative = tool.snapshot()
        snap = cumulative.since(before)
    # The largest latency of each histogram lies in its highest non-empty slot (the
    # usec slot comes from a multiply and a shift, max_ns from the same latency).
    for cell in cumulative.cells.values():
        top = int(np.flatnonzero(cell.hist("usecs", 1000).slots)[-1])
        max_us = cell.max_ns // 1000
        assert (top == 0 and max_us <= 1) or (1 << top) <= max_us < (1 << (top + 1))
    pid = result["pid"]
    assert result["pages"] == PAGES
    mine = snap.total(opts.unit, pid=pid)
    assert abs(mine.count - PAGES) <= 0.05 * PAGES, mine.count
    assert snap.total(opts.unit, kind=0, pid=pid).count >= PAGES  # all minor faults
    comms = {c for (p, _, c) in snap.cells if p == pid}
    assert len(comms) == 1 and comms.pop().startswith("python")  # -P: pid and comm
    # Histogram totals are the sums of their buckets.
    total = snap.total(opts.unit)
    j = total.as_dict(opts)
    assert j["count"] == sum(b["count"] for b in j["hist"]["buckets"])
    assert j["count"] == sum(c.count for c in snap.cells.values())
    assert snap.counters["hists_full"] == 0
    assert j["tail_count"] <= j["count"]


def test_pid_filter_in_the_kernel_and_nanosecond_slots() -> None:
    with page_toucher(64) as child:
        opts = Options(pids=[child.pid], ns=True)
        with Memlat(opts) as tool:
            before = tool.snapshot()
            result = run_toucher(child)
            cumulative = tool.snapshot()
            snap = cumulative.since(before)
    assert result["pid"] == child.pid
    # Without -P the key has no pid: the filter alone makes these the child's faults.
    total = snap.total(opts.unit)
    assert abs(total.count - PAGES) <= 0.05 * PAGES, total.count
    assert total.hist.unit == "nsecs"
    # Nanosecond buckets: the largest fault since attach (max_ns, exact) lies in the
    # highest non-empty nsec slot, counted without a unit conversion.
    whole = cumulative.total(opts.unit)
    assert int(np.flatnonzero(whole.hist.slots)[-1]) == slot_of(whole.max_ns)
    out = report_json(snap, opts, "x")
    assert out["histograms"][0]["kind"] == KINDS[0]
    assert out["total"]["count"] == total.count


def test_json_report_of_a_timed_run() -> None:
    buf = io.StringIO()
    assert run_options(Options(duration=0.5, json=True), buf) == 0
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert len(lines) == 1
    rep = lines[0]
    assert rep["unit"] == "usecs" and rep["strategy"] in {s.name for s in STRATEGIES}
    assert set(rep["lost"]) == {"failed", "unmatched", "evicted", "hists_full", "nested"}
    assert rep["from"] == "exception"


def test_validate_passes_here() -> None:
    ok, report = validate(Options(), seconds=1.5, megabytes=64)
    assert ok, report
    off, on = report["cases"]
    assert on["count"] > off["count"] and on["tail_count"] > off["tail_count"]
    assert report["workload"]["error"] <= 0.05


def test_strategy_choice_and_every_program_compiled() -> None:
    with BpfObject(object_path("memlat")) as obj:
        for s in STRATEGIES:
            assert set(s.programs) <= set(obj.programs)
    from host_facts import expected_strategy, features

    # The choice equals the first strategy the independent facts (bpftool, tracefs) grant.
    assert Memlat(Options()).strategy.name == expected_strategy(STRATEGIES)
    assert Memlat(Options()).strategy.name == expected_strategy(FROM_EXCEPTION)
    for s in STRATEGIES:
        if all(features()[f] for f in s.needs):
            assert Memlat(options(s.name)).strategy.name == s.name
        else:
            with pytest.raises(NotSupported):
                Memlat(options(s.name))
    hmf = Options(start="handle_mm_fault")
    if any(all(features()[f] for f in s.needs) for s in FROM_HANDLE_MM_FAULT):
        assert Memlat(hmf).strategy.name == expected_strategy(FROM_HANDLE_MM_FAULT)
    else:
        with pytest.raises(NotSupported, match="run without --from"):
            Memlat(hmf)


def faults_of(
    script: str, *args: str, ns: bool = False, strategy: str | None = None
) -> tuple[str, Snapshot]:
    """Run `python -c script args` under memlat -p (its PID), with `strategy` (else the
    best): from its "ready" line until the line it prints once told to go on. That
    line, and the interval."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        with Memlat(options(strategy, pids=[child.pid], ns=ns)) as tool:
            before = tool.snapshot()
            child.stdin.write("go\n")
            child.stdin.flush()
            line = child.stdout.readline()
            return line, tool.snapshot().since(before)
    finally:
        reap(child)


BAD_WRITES = 100
# Two ways for a fault to fail, each a write(2) whose copy from user memory faults and
# gets EFAULT: at an address with no VMA (before handle_mm_fault), and in a VMA past
# the end of its file (handle_mm_fault returns VM_FAULT_SIGBUS). How many faults a
# failed copy takes is the kernel's: 1 on 6.12, 2 on 6.1 (its copy_user tail retries
# the copy). The child counts them with the kernel's own counter of page-fault
# exceptions on user addresses (the software perf event page-faults, in user and
# kernel mode), which fires for failed faults too, unlike ru_minflt/ru_majflt.
FAILING_SETUP = """
import ctypes, json, mmap, os, resource, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
fd = os.memfd_create("memlat-test")
os.ftruncate(fd, 2 * 4096)
beyond = mmap.mmap(fd, 2 * 4096)
past_eof = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(beyond, 4096)))
os.ftruncate(fd, 4096)  # the mapping's second page now lies past the end of the file
no_vma = ctypes.c_void_p(0x1000)
count = ctypes.c_uint64()

def fault_counter():
    # perf_event_open(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS): this thread
    attr = ctypes.create_string_buffer(struct.pack("IIQ", 1, 128, 2), 128)
    fd = libc.syscall(298, attr, 0, -1, -1, 8)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    return fd

def faults(fd):
    assert libc.read(fd, ctypes.byref(count), 8) == 8  # into memory touched already
    return count.value
"""
FAILING_CHILD = f"""{FAILING_SETUP}
def accounted():
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return ru.ru_minflt + ru.ru_majflt

pf = fault_counter()
faults(pf), accounted()  # every call below ran once before "go"
print("ready", flush=True)
sys.stdin.readline()
ok0, pf0 = accounted(), faults(pf)
for _ in range({BAD_WRITES}):
    assert libc.write(w, no_vma, 1) == -1
    assert libc.write(w, past_eof, 1) == -1
m = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m[0] = 1  # a fault that finishes, after the last failed one
pf1, ok1 = faults(pf), accounted()
print(json.dumps({{"faults": pf1 - pf0, "failed": pf1 - pf0 - (ok1 - ok0)}}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("strategy", FROM_EXCEPTION_STRATEGIES)
def test_failed_faults_are_counted_exactly(strategy: str) -> None:
    """Each failed fault is counted once, under every strategy: at the error return
    (fexit, kretprobe: the VM_FAULT_SIGBUS ones) or when the thread's next fault
    starts (every strategy: the ones with no VMA; the perf strategies: all). The
    kernel's count: the child's page-fault exceptions less those it accounted as
    minor or major (getrusage)."""
    run_or_skip(STRATEGIES, strategy)
    line, snap = faults_of(FAILING_CHILD, strategy=strategy)
    child = json.loads(line)
    assert child["failed"] >= 2 * BAD_WRITES, child  # each bad write faulted
    assert snap.counters["failed"] == child["failed"], (child, dict(snap.counters))
    assert snap.counters["unmatched"] == 0
    assert snap.total("usecs").count >= 1


def test_output_file_gets_the_report(tmp_path: Path) -> None:
    out = tmp_path / "faults.json"
    p = subprocess.run(
        [sys.executable, "-m", "meridian", "memlat", "--duration", "0.5", "--json", "-o", str(out)],
        capture_output=True,
        text=True,
        # Not 60: in the kernel matrix's TCG guests the command line alone takes 40-160
        # s to import every tool's modules over 9p.
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    saved = out.read_text()
    assert saved == p.stdout
    assert json.loads(saved)["unit"] == "usecs"


MAJOR_PAGES = 256
MAJOR_CHILD = f"""
import json, mmap, os, resource, sys
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, {MAJOR_PAGES} * 4096, prot=mmap.PROT_READ)
m.madvise(mmap.MADV_RANDOM)  # no read-ahead: every page is read from the disk
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache
print("ready", flush=True)
sys.stdin.readline()
r0 = resource.getrusage(resource.RUSAGE_SELF)
total = sum(m[i * 4096] for i in range({MAJOR_PAGES}))
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"majflt": r1.ru_majflt - r0.ru_majflt}}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("strategy", EVERY_STRATEGY)
def test_major_faults_that_sleep_on_the_disk_are_measured(ext4: Path, strategy: str) -> None:
    """Faults that wait for I/O (and may resume on another CPU) are matched by thread:
    the major histogram holds exactly the child's own count of major faults, under
    every strategy. The file is on ext4 on a loop device (a /tmp on tmpfs, as in the
    kernel matrix's guests, has no disk to drop its pages to). With --from
    handle_mm_fault a fault whose first call returned VM_FAULT_RETRY (the I/O waited
    for with the mmap lock dropped) ends at its retry's return, once."""
    run_or_skip(STRATEGIES, strategy)
    data = ext4 / "data.bin"
    data.write_bytes(os.urandom(MAJOR_PAGES * 4096))
    with open(data, "rb") as disk_file:
        os.fsync(disk_file.fileno())
    line, snap = faults_of(MAJOR_CHILD, str(data), ns=True, strategy=strategy)
    result = json.loads(line)
    major = snap.total("nsecs", kind=KINDS.index("major"))
    assert result["majflt"] >= MAJOR_PAGES // 2, result  # the disk was read
    assert major.count == result["majflt"], (major.count, result, snap.counters)
    assert snap.counters["unmatched"] == 0
    # A read from the disk takes longer than a minor fault: over 1 us each.
    assert int(major.hist.slots[:10].sum()) == 0


EXITING_CHILD = f"""{FAILING_SETUP}
import threading, time
seen = [0]
print("ready", flush=True)
sys.stdin.readline()

def fail_and_exit():
    # Faults that fail, then the thread ends at once: the last one never finishes.
    # Every call on the way to SYS_exit ran once before (a write of nothing, getpid),
    # so that no page of its code or stack faults in between: such a fault would close
    # the open one before the exit does.
    write, syscall = libc.write, libc.syscall
    pf = fault_counter()
    write(w, no_vma, 0), syscall(39), faults(pf)
    pf0 = faults(pf)
    write(w, past_eof, 1)  # VM_FAULT_SIGBUS: fexit/kretprobe close it, perf does not
    write(w, no_vma, 1)  # open until the thread exits, under every strategy
    seen[0] = faults(pf) - pf0
    syscall(60, 0)  # SYS_exit: this thread only, with no more user code

t = threading.Thread(target=fail_and_exit)
t.start()
while len(os.listdir("/proc/self/task")) > 1:
    time.sleep(0.01)
print(json.dumps({{"faults": seen[0]}}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("strategy", FROM_EXCEPTION_STRATEGIES)
def test_a_thread_that_exits_with_a_fault_open_is_counted(strategy: str) -> None:
    """Every fault of the thread's last moments failed (the kernel's count of its
    page-fault exceptions), the last one closed by the thread's exit."""
    run_or_skip(STRATEGIES, strategy)
    line, snap = faults_of(EXITING_CHILD, strategy=strategy)
    child = json.loads(line)
    assert child["faults"] >= 2, child
    assert snap.counters["failed"] == child["faults"], (child, dict(snap.counters))
    assert snap.inflight == 0


MINOR_CHILD = MINOR_TOUCHER.format(pages=PAGES)


@pytest.mark.parametrize("strategy", EVERY_STRATEGY)
@pytest.mark.parametrize("per_process", [False, True])
def test_minor_faults_equal_the_childs_getrusage(strategy: str, per_process: bool) -> None:
    """The kernel's own count of the child's minor faults over its touch loop
    (getrusage ru_minflt, which mm_account_fault adds to where it also raises the
    page-faults-min event memlat closes a fault on) is memlat's minor count for that
    PID, exactly. The two differ only for faults without user registers (get_user_pages
    from another process), which the loop has none of; its code around the loop ran
    once before "go", so the memlat window holds no other fault of the child."""
    run_or_skip(STRATEGIES, strategy)
    child = subprocess.Popen(
        [sys.executable, "-c", MINOR_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        opts = options(strategy, per_process=per_process)
        if not per_process:
            opts = options(strategy, pids=[child.pid])  # the filter in the kernel
        with Memlat(opts) as tool:
            before = tool.snapshot()
            child.stdin.write("go\n")
            child.stdin.flush()
            minflt = json.loads(child.stdout.readline())["minflt"]
            snap = tool.snapshot().since(before)
            assert tool.strategy.name == strategy
    finally:
        reap(child)
    assert minflt >= PAGES  # the loop faulted every page in (and maybe a page more)
    pid = child.pid if per_process else None
    minor = snap.total(opts.unit, kind=KINDS.index("minor"), pid=pid)
    major = snap.total(opts.unit, kind=KINDS.index("major"), pid=pid)
    assert (minor.count, major.count) == (minflt, 0), (minor.count, minflt, snap.counters)
    assert snap.counters["unmatched"] == 0 and snap.counters["hists_full"] == 0
