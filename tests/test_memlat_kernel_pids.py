"""memlat's PID set and --from handle_mm_fault against the real kernel, with children
whose faults getrusage counts: -p A,B traces each of its processes exactly and no
other; every handle_mm_fault call is counted, get_user_pages' too."""

from __future__ import annotations

import pytest
from memlat_children import MINOR_TOUCHER, go_and_read, options, waiting_children
from strategies import every, run_or_skip

from meridian.tools.memlat import STRATEGIES, Memlat, Options
from meridian.tools.memlat.kernel import FROM_EXCEPTION, FROM_HANDLE_MM_FAULT
from meridian.tools.memlat.model import KINDS

pytestmark = pytest.mark.kernel
PAGES = (64 << 20) // 4096  # 16,384


SET_PAGES = (4096, 2048, 1024)  # traced A, traced B, untraced C


@pytest.mark.parametrize("strategy", every(FROM_EXCEPTION))
def test_a_pid_set_traces_each_of_its_processes_and_no_other(strategy: str) -> None:
    """-p A,B: the kernel's PID set. Three children touch 4096, 2048 and 1024 fresh
    pages at once; traced with -P -p A,B, A's and B's minor faults are each their own
    getrusage count exactly, and C (touching as they do) has no histogram at all."""
    run_or_skip(STRATEGIES, strategy)
    scripts = [MINOR_TOUCHER.format(pages=n) for n in SET_PAGES]
    with waiting_children(*scripts) as kids:
        a, b, c = (k.pid for k in kids)
        opts = options(strategy, pids=[a, b], per_process=True)
        with Memlat(opts) as tool:
            before = tool.snapshot()
            results = go_and_read(kids)
            snap = tool.snapshot().since(before)
    minor = KINDS.index("minor")
    for pid, n, result in zip((a, b), SET_PAGES, results, strict=False):
        assert result["minflt"] >= n
        got = snap.total(opts.unit, kind=minor, pid=pid).count
        assert got == result["minflt"], (pid, got, result, dict(snap.counters))
        assert snap.total(opts.unit, kind=KINDS.index("major"), pid=pid).count == 0
    assert results[2]["minflt"] >= SET_PAGES[2]  # C faulted meanwhile
    assert snap.total(opts.unit, pid=c).count == 0
    assert {p for (p, _, _) in snap.cells} <= {a, b}
    assert snap.counters["unmatched"] == 0


GUP_PAGES = 512
# The known number of handle_mm_fault() calls: a loop writes one byte in each of PAGES
# fresh anonymous pages (MADV_NOHUGEPAGE: one page a fault, each one exception and one
# call, never retried), then process_vm_writev() writes one byte into each of
# GUP_PAGES other fresh pages of the child itself: the kernel reaches those through
# get_user_pages (pin_user_pages_remote, FOLL_WRITE), which calls handle_mm_fault once
# per missing page with no pt_regs and no exception. mm_account_fault() adds every call
# to the caller's ru_minflt, both kinds; the source buffer was touched before.
GUP_CHILD = f"""
import ctypes, json, mmap, os, resource, sys
libc = ctypes.CDLL(None, use_errno=True)

class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
def fresh(pages):
    m = mmap.mmap(-1, pages * 4096, flags=flags)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))
src = ctypes.create_string_buffer(b"x" * {GUP_PAGES})
local = (iovec * 1)(iovec(ctypes.addressof(src), {GUP_PAGES}))
def touch(m, n):
    for off in range(0, n * 4096, 4096):
        m[off] = 1
def gup(base, n):
    remote = (iovec * n)(*[iovec(base + i * 4096, 1) for i in range(n)])
    got = libc.process_vm_writev(os.getpid(), local, 1, remote, n, 0)
    assert got == n, (got, os.strerror(ctypes.get_errno()))
    return remote
def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
# every call below runs once before "go", on pages of its own
m0, b0 = fresh(16)
touch(m0, 16), gup(b0, 16), minflt(), json.dumps({{}})
m, _ = fresh({PAGES})
g, gbase = fresh({GUP_PAGES})
remote = (iovec * {GUP_PAGES})(*[iovec(gbase + i * 4096, 1) for i in range({GUP_PAGES})])
print("ready", flush=True)
sys.stdin.readline()
r0 = minflt()
touch(m, {PAGES})
r1 = minflt()
got = libc.process_vm_writev(os.getpid(), local, 1, remote, {GUP_PAGES}, 0)
r2 = minflt()
assert got == {GUP_PAGES}, (got, os.strerror(ctypes.get_errno()))
assert bytes(g[i * 4096] for i in range({GUP_PAGES})) == b"x" * {GUP_PAGES}
print(json.dumps({{"touch": r1 - r0, "gup": r2 - r1}}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("strategy", every(FROM_HANDLE_MM_FAULT))
def test_from_handle_mm_fault_counts_every_call_get_user_pages_too(strategy: str) -> None:
    """--from handle_mm_fault (docs/requirements/memlat-runqlat.md, "Delta t"): every
    call of handle_mm_fault is a fault, whoever calls it. The child's workload has a
    known number of calls (see GUP_CHILD): PAGES from its page-touch loop (exceptions)
    and GUP_PAGES from process_vm_writev into its own fresh pages (get_user_pages, no
    exception, which --from exception does not count). memlat's minor count for the
    child equals its getrusage delta over both, exactly, and each part is at least its
    pages; no call nested, none unmatched or failed. Skips where the kernel has neither
    fentry nor kprobes (this VM): the kernel matrix's guests run it."""
    run_or_skip(STRATEGIES, strategy)
    with waiting_children(GUP_CHILD) as kids:
        opts = Options(strategy=strategy, start="handle_mm_fault", pids=[kids[0].pid])
        with Memlat(opts) as tool:
            assert tool.strategy.name == strategy
            before = tool.snapshot()
            (result,) = go_and_read(kids)
            snap = tool.snapshot().since(before)
    assert result["touch"] >= PAGES and result["gup"] >= GUP_PAGES, result
    minor = snap.total(opts.unit, kind=KINDS.index("minor")).count
    major = snap.total(opts.unit, kind=KINDS.index("major")).count
    assert (minor, major) == (result["touch"] + result["gup"], 0), (result, snap.counters)
    for reason in ("nested", "unmatched", "failed", "evicted", "hists_full"):
        assert snap.counters[reason] == 0, (reason, dict(snap.counters))
