"""runqlat against the kernel's own accounting: each task's run-queue waits in
/proc/PID/schedstat (run_delay, and pcount: one per wait that ended on a CPU), for
spinners pinned to one CPU so that they must wait; and against CPU oversubscription,
where more busy processes than CPUs must make runnable tasks wait longer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from children import patience, reap
from strategies import every, run_or_skip

from meridian.tools.runqlat import STRATEGIES, Options, Runqlat
from meridian.tools.runqlat.validate import spinners, validate

pytestmark = pytest.mark.kernel

CPUS = os.cpu_count() or 1


@pytest.mark.parametrize("strategy", ["tp_btf", "tracepoint"])
def test_twice_as_many_busy_processes_as_cpus_wait_longer_than_one(strategy: str) -> None:
    """The validate experiment: 1 busy process vs twice as many as there are CPUs,
    p99 rises. The lone one may never wait (a CPU is always free for it; a full run
    here once saw none in 1.5 s), the crowd must."""
    report = validate(Options(strategy=strategy), seconds=1.5, workers=2 * CPUS)
    assert report["strategy"] == strategy
    off, on = report["cases"]
    assert (off["busy_processes"], on["busy_processes"]) == (1, 2 * CPUS)
    assert on["count"] > 0
    assert on["p99_ns"] > off["p99_ns"], report
    assert report["passed"]


def test_per_process_and_pid_filter() -> None:
    with spinners(2, 3) as pids:
        for pid in pids:  # both on one CPU: each must wait while the other runs
            os.sched_setaffinity(pid, {max(os.sched_getaffinity(0))})
        with Runqlat(Options(per_process=True)) as tool:
            s0 = tool.snapshot()
            time.sleep(1.0)
            snap = tool.snapshot().since(s0)
        assert snap.cells and all(c.count for c in snap.cells.values())
        assert {pid for pid, _ in snap.cells} & set(pids)  # the spinners waited
        with Runqlat(Options(pid=pids[0], per_process=True)) as tool:
            s0 = tool.snapshot()
            time.sleep(1.0)
            snap = tool.snapshot().since(s0)
        assert {pid for pid, _ in snap.cells} == {pids[0]}  # it waited, and only it is seen


CLOCK_GAP_S = 5e-6  # per wait: the rq clock read before the tracepoint, ktime in it
SPINNERS = 3  # on one CPU: each waits while the other two run
SPIN = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end:\n    pass\n"


def _schedstat(pid: int) -> tuple[int, int]:
    """(run_delay ns, pcount) of a single-threaded process, zombie or alive."""
    assert [t.name for t in Path(f"/proc/{pid}/task").iterdir()] == [str(pid)]
    _, run_delay, pcount = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(run_delay), int(pcount)


def _recursion_misses() -> int:
    """Runs of this process's BPF programs the kernel skipped because the program was
    already running on that CPU (a wake-up in an interrupt while one in a task was in
    the program): the kernel counts them per program, shown in each fd's fdinfo."""
    total = 0
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            text = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if "prog_id" in fields:
            total += int(fields.get("recursion_misses", "0"))
    return total


@pytest.mark.parametrize("strategy", every(STRATEGIES))
def test_each_process_waits_what_its_schedstat_says(strategy: str) -> None:
    """Spinners pinned to one CPU (taskset), whole lives inside the measurement: runqlat
    attached before they start, read after they exit and before they are reaped (a
    zombie keeps its schedstat). The kernel adds one to pcount and the wait to
    run_delay whenever a task that was queued gets a CPU, the same moments runqlat
    closes a wait (wake-up, or switched out still runnable, until switched in). Slots
    are tid % 32768 (pid_max here is 32768: no two live threads share one).

    runqlat never counts a wait the kernel did not (count <= pcount), and counts the
    rest: on an idle host equal (tp_btf and tracepoint), under the other engineers'
    load the kernel's pcount has had one or two more per ~100 waits, where bpftrace on
    the same sched_switch tracepoint saw exactly runqlat's switch-ins (one switch-out
    more than switch-ins: an event no BPF program received, not in the programs'
    recursion_misses). So the bound is 5% of a process's waits, and the sum (which
    a missed wait of several ms would move) is checked where the counts are equal:
    within 1% and 5 us a wait (times the guest's slowdown), the difference of two
    clocks (the kernel's rq clock, read before the tracepoint; bpf_ktime_get_ns() in
    it): a few microseconds per wait, 0.03% here.

    The histogram map allocates an entry at a process's first wait, in the scheduler's
    tracepoint (BPF_F_NO_PREALLOC: preallocated per-CPU entries would take hundreds of
    MB on a big host); the kernel's BPF allocator refills its per-CPU free lists later,
    in irq_work, and may have none at that moment: the likely cause of the one failed
    insert (counted in hists_full, its sample dropped) seen in a run on the Debian 6.12
    guest under TCG, with 10,240 entries and a few hundred processes. None on this
    host."""
    run_or_skip(STRATEGIES, strategy)
    cpu = max(os.sched_getaffinity(0))
    kids: list[subprocess.Popen[bytes]] = []
    try:
        with Runqlat(Options(per_process=True, strategy=strategy)) as tool:
            s0, m0 = tool.snapshot(), _recursion_misses()
            cmd = ["taskset", "-c", str(cpu), sys.executable, "-c", SPIN]
            kids = [subprocess.Popen(cmd) for _ in range(SPINNERS)]
            kernel = {}
            for kid in kids:
                os.waitid(os.P_PID, kid.pid, os.WEXITED | os.WNOWAIT)  # a zombie, kept
                kernel[kid.pid] = _schedstat(kid.pid)
            snap = tool.snapshot().since(s0)
            misses = _recursion_misses() - m0
            assert tool.strategy.name == strategy
    finally:
        for kid in kids:
            reap(kid)
    assert [k.returncode for k in kids] == [0] * SPINNERS
    for pid, (run_delay, pcount) in kernel.items():
        cells = [c for (p, _), c in snap.cells.items() if p == pid]
        count, sum_ns = sum(c.count for c in cells), sum(c.sum_ns for c in cells)
        assert pcount >= 10, (pid, pcount)  # pinned together, they had to wait
        assert 0 <= pcount - count <= pcount // 20, (pid, count, pcount, misses)
        if count == pcount:
            # 1 %, and the two clocks' gap per wait: microseconds here, emulated in a
            # guest (6.1 under TCG once: 1.26 % over a few hundred waits)
            bound = run_delay // 100 + count * round(patience(CLOCK_GAP_S) * 1e9)
            assert abs(sum_ns - run_delay) <= bound, (pid, sum_ns, run_delay, count)
    # failed inserts are counted, and rare: under 1 % of the waits seen (3 of thousands
    # once on 6.1 under TCG); the spinners' own counts above are exact all the same
    waits = sum(c.count for c in snap.cells.values())
    assert snap.counters["hists_full"] <= max(1, waits // 100), (snap.counters, waits)
