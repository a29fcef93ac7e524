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

from meridian.bpf import BpfObject, object_path
from meridian.errors import NotSupported
from meridian.hist import slot_of
from meridian.tools.memlat import STRATEGIES, Memlat, Options
from meridian.tools.memlat.cli import run_options
from meridian.tools.memlat.model import KINDS, Snapshot
from meridian.tools.memlat.validate import page_toucher, run_toucher, validate
from meridian.tools.memlat.views import report_json

pytestmark = pytest.mark.kernel
PAGES = (64 << 20) // 4096  # 16,384


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
        opts = Options(pid=child.pid, ns=True)
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
    assert set(rep["lost"]) == {"stale", "unmatched", "failed", "exited", "evicted", "hists_full"}


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
    for s in STRATEGIES:
        if all(features()[f] for f in s.needs):
            assert Memlat(Options(strategy=s.name)).strategy.name == s.name
        else:
            with pytest.raises(NotSupported):
                Memlat(Options(strategy=s.name))


def faults_of(script: str, *args: str, ns: bool = False) -> tuple[str, Snapshot]:
    """Run `python -c script args` under memlat -p (its PID): from its "ready" line
    until the line it prints once told to go on. That line, and the interval."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        with Memlat(Options(pid=child.pid, ns=ns)) as tool:
            before = tool.snapshot()
            child.stdin.write("go\n")
            child.stdin.flush()
            line = child.stdout.readline()
            return line, tool.snapshot().since(before)
    finally:
        reap(child)


BAD_WRITES = 100
FAILING_CHILD = f"""
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
print("ready", flush=True)
sys.stdin.readline()
for _ in range({BAD_WRITES}):
    # The kernel faults on an unmapped user address and fails the copy (EFAULT):
    # the fault never reaches the end of handle_mm_fault.
    assert libc.write(w, ctypes.c_void_p(0x1000), 1) == -1
m = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m[0] = 1  # a fault that finishes, after the last failed one
print("done", flush=True)
sys.stdin.readline()
"""


def test_failed_faults_are_counted_stale_exactly() -> None:
    line, snap = faults_of(FAILING_CHILD)
    assert line.strip() == "done"
    # Each failed fault is overwritten by the thread's next fault: one stale each.
    assert snap.counters["stale"] == BAD_WRITES
    assert snap.counters["unmatched"] == 0
    assert snap.total("usecs").count >= 1


def test_output_file_gets_the_report(tmp_path: Path) -> None:
    out = tmp_path / "faults.json"
    p = subprocess.run(
        [sys.executable, "-m", "meridian", "memlat", "--duration", "0.5", "--json", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
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


def test_major_faults_that_sleep_on_the_disk_are_measured(tmp_path: Path) -> None:
    """Faults that wait for I/O (and may resume on another CPU) are matched by thread:
    the major histogram holds exactly the child's own count of major faults."""
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(MAJOR_PAGES * 4096))
    with open(data, "rb") as disk_file:
        os.fsync(disk_file.fileno())
    line, snap = faults_of(MAJOR_CHILD, str(data), ns=True)
    result = json.loads(line)
    major = snap.total("nsecs", kind=KINDS.index("major"))
    assert result["majflt"] >= MAJOR_PAGES // 2, result  # the disk was read
    assert major.count == result["majflt"], (major.count, result, snap.counters)
    assert snap.counters["unmatched"] == 0
    # A read from the disk takes longer than a minor fault: over 1 us each.
    assert int(major.hist.slots[:10].sum()) == 0


EXITING_CHILD = """
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
print("ready", flush=True)
sys.stdin.readline()

def fail_and_exit():
    # A fault that fails (EFAULT), then the thread ends at once: it never finishes.
    # The path to SYS_exit runs once before (getpid), so that no page of its code or
    # stack faults in between: such a fault would close the open one as `stale`.
    write, syscall, bad = libc.write, libc.syscall, ctypes.c_void_p(0x1000)
    syscall(39)
    write(w, bad, 1)
    syscall(60, 0)  # SYS_exit: this thread only, with no more user code

t = threading.Thread(target=fail_and_exit)
t.start()
while len(os.listdir("/proc/self/task")) > 1:
    time.sleep(0.01)
print("done", flush=True)
sys.stdin.readline()
"""


def test_a_thread_that_exits_with_a_fault_open_is_counted() -> None:
    line, snap = faults_of(EXITING_CHILD)
    assert line.strip() == "done"
    assert snap.counters["exited"] == 1, (dict(snap.counters), snap.inflight)
    assert snap.counters["stale"] == 0
    assert snap.inflight == 0


MINOR_CHILD = f"""
import json, mmap, resource, sys
def touch(m):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for off in range(0, len(m), 4096):
        m[off] = 1
    r1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    return json.dumps({{"minflt": r1 - r0}})
flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
touch(mmap.mmap(-1, 16 * 4096, flags=flags))  # every line above runs once before "go"
m = mmap.mmap(-1, {PAGES} * 4096, flags=flags)
m.madvise(mmap.MADV_NOHUGEPAGE)  # one fault per page
print("ready", flush=True)
sys.stdin.readline()
print(touch(m), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("strategy", ["tp_btf+perf", "tracepoint+perf"])
@pytest.mark.parametrize("per_process", [False, True])
def test_minor_faults_equal_the_childs_getrusage(strategy: str, per_process: bool) -> None:
    """The kernel's own count of the child's minor faults over its touch loop
    (getrusage ru_minflt, which mm_account_fault adds to where it also raises the
    page-faults-min event memlat closes a fault on) is memlat's minor count for that
    PID, exactly. The two differ only for faults without user registers (get_user_pages
    from another process), which the loop has none of; its code around the loop ran
    once before "go", so the memlat window holds no other fault of the child."""
    child = subprocess.Popen(
        [sys.executable, "-c", MINOR_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        opts = Options(strategy=strategy, per_process=per_process)
        if not per_process:
            opts = Options(strategy=strategy, pid=child.pid)  # the filter in the kernel
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
