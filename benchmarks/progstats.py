"""Kernel cost of a tool's programs, in ns per program run (bpf_stats), while a
workload runs: the cleanest overhead signal when the cores are shared, since it
counts only the time spent inside the tool's own programs.

It enables kernel.bpf_stats_enabled for the measurement (restoring the previous
value), starts the tool, and reads run_time_ns / run_cnt of the tool's programs
(found by the tool's PID in `bpftool prog show`) before and after the workload. The
kernel's accounting itself costs a few tens of ns per run, included in every number.

Run as root from the repository:
  .venv/bin/python benchmarks/progstats.py memlat [rounds]
  .venv/bin/python benchmarks/progstats.py runqlat [rounds]
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from memlat_bench import touch
from runqlat_bench import pingpong

ROOT = Path(__file__).resolve().parent.parent
MERIDIAN = str(ROOT / ".venv" / "bin" / "meridian")
SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
WORKLOADS: dict[str, Callable[[float], float]] = {"memlat": touch, "runqlat": pingpong}


def prog_ids(pid: int) -> set[int]:
    """The ids of the BPF programs whose fds the process `pid` holds (from fdinfo)."""
    ids = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        with contextlib.suppress(OSError):
            for line in info.read_text().splitlines():
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
    return ids


def prog_stats(pid: int) -> dict[str, tuple[int, int]]:
    """name -> (run_time_ns, run_cnt) of the programs the process `pid` holds."""
    ids = prog_ids(pid)
    out = subprocess.run(
        ["bpftool", "--json", "prog", "show"], check=True, capture_output=True, text=True
    ).stdout
    stats = {}
    for p in json.loads(out):
        if p["id"] in ids:
            stats[p.get("name", str(p["id"]))] = (p.get("run_time_ns", 0), p.get("run_cnt", 0))
    return stats


def measure(tool: str, seconds: float) -> tuple[float, dict[str, tuple[float, int]]]:
    """(workload rate, {program: (ns per run, runs)}) for one run of the workload."""
    p = subprocess.Popen([MERIDIAN, tool], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(3.0)  # loaded and attached
        if p.poll() is not None:
            raise RuntimeError(f"{tool} exited: {p.stderr.read() if p.stderr else ''!r}")
        before = prog_stats(p.pid)
        rate = WORKLOADS[tool](seconds)
        after = prog_stats(p.pid)
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(30)
    per_run = {}
    for name, (ns, cnt) in after.items():
        ns0, cnt0 = before.get(name, (0, 0))
        runs = cnt - cnt0
        if runs:
            per_run[name] = ((ns - ns0) / runs, runs)
    return rate, per_run


def main() -> int:
    tool = sys.argv[1] if len(sys.argv) > 1 else "memlat"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    old = SYSCTL.read_text().strip()
    SYSCTL.write_text("1")
    try:
        for r in range(rounds):
            rate, per_run = measure(tool, 3.0)
            progs = ", ".join(
                f"{name} {ns:.0f} ns x {runs:,}" for name, (ns, runs) in sorted(per_run.items())
            )
            print(f"round {r + 1}: {rate:,.0f}/s; {progs}", flush=True)
    finally:
        SYSCTL.write_text(old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
