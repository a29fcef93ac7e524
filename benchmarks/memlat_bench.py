"""memlat overhead: page-fault throughput of the built-in page-touch workload (a
256 MiB fresh private anonymous region touched page by page, again and again: one
minor fault per page), untraced, with `meridian memlat` attached, with bpftrace
counting tracepoint:exceptions:page_fault_user, and with bpftrace doing the same
entry/exit histogram as memlat, interleaved round by round in the same run. Ratios are
medians of traced / untraced pages per second of the neighbouring untraced rounds.

With --cpu the measure is pages per CPU second of the workload (its user + system
time, which includes the time spent in the probes of its faults, but not the time it
waited for a CPU): steadier than pages per second when other work shares the cores.

Run as root from the repository: .venv/bin/python benchmarks/memlat_bench.py [rounds] [--cpu]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _rounds import floor, interleaved, print_ratios

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python")
MERIDIAN = [str(ROOT / ".venv" / "bin" / "meridian")]
BPFTRACE_COUNT = "tracepoint:exceptions:page_fault_user { @faults[comm] = count(); }"
BPFTRACE_LATENCY = """
tracepoint:exceptions:page_fault_user { @start[tid] = nsecs; }
software:minor-faults:1 /@start[tid]/ {
  @usecs = hist((nsecs - @start[tid]) / 1000); delete(@start[tid]);
}
software:major-faults:1 /@start[tid]/ {
  @usecs_major = hist((nsecs - @start[tid]) / 1000); delete(@start[tid]);
}
"""
CONFIGS = {
    "floor (memlat's hooks, empty)": floor("memlat"),
    "latency floor (memlat's hooks, two clock reads)": floor("memlat", clock=True),
    "meridian memlat": [*MERIDIAN, "memlat", "-v"],
    "bpftrace count page_fault_user": ["bpftrace", "-e", BPFTRACE_COUNT],
    "bpftrace entry/exit histogram": ["bpftrace", "-e", BPFTRACE_LATENCY],
}


def touch(seconds: float, per_cpu_second: bool = False) -> float:
    """Pages per second of the page-touch workload (or per CPU second it used)."""
    out = subprocess.run(
        [PY, "-m", "meridian.workloads", "page-touch", "--mb", "256", "--seconds", str(seconds)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return float(r["pages"]) / float(r["cpu_seconds" if per_cpu_second else "seconds"])


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    cpu = "--cpu" in sys.argv[1:]
    rounds = int(args[0]) if args else 5
    seconds = 3.0
    results = interleaved(lambda: touch(seconds, cpu), CONFIGS, rounds)
    what = f"page-touch 256 MiB regions, {seconds:g} s per run"
    print_ratios(results, what, "pages per CPU second" if cpu else "pages/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
