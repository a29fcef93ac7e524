"""memlat overhead: page-fault throughput of the built-in page-touch workload (a
256 MiB fresh private anonymous region touched page by page, again and again: one
minor fault per page), untraced, with `meridian memlat` attached, with bpftrace
counting tracepoint:exceptions:page_fault_user, and with bpftrace doing the same
entry/exit histogram as memlat, interleaved round by round in the same run. Ratios are
medians of traced / untraced pages per second of the neighbouring untraced rounds.

Run as root from the repository: .venv/bin/python benchmarks/memlat_bench.py [rounds]
"""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

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
    "meridian memlat": [*MERIDIAN, "memlat"],
    "bpftrace count page_fault_user": ["bpftrace", "-e", BPFTRACE_COUNT],
    "bpftrace entry/exit histogram": ["bpftrace", "-e", BPFTRACE_LATENCY],
}


def touch(seconds: float) -> float:
    """Pages per second of the page-touch workload."""
    out = subprocess.run(
        [PY, "-m", "meridian.workloads", "page-touch", "--mb", "256", "--seconds", str(seconds)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return float(r["pages"]) / float(r["seconds"])


def traced(cmd: list[str], seconds: float, ready: float = 3.0) -> float:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(ready)  # loaded and attached
        if p.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited: {p.stderr.read() if p.stderr else ''}")
        return touch(seconds)
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    seconds = 3.0
    results: dict[str, list[float]] = {"untraced": [], **{name: [] for name in CONFIGS}}
    for _ in range(rounds):
        results["untraced"].append(touch(seconds))
        for name, cmd in CONFIGS.items():
            results[name].append(traced(cmd, seconds))
    results["untraced"].append(touch(seconds))
    base = results["untraced"]
    print(
        f"machine: {platform.node()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs; page-touch 256 MiB regions, {seconds:g} s per run, "
        f"{rounds} rounds"
    )
    print("\n| config | median pages/s | ratio to untraced (median of rounds) |")
    print("| --- | ---: | ---: |")
    print(f"| untraced | {statistics.median(base):,.0f} | 1.00 |")
    for name in CONFIGS:
        ratios = [v / ((base[i] + base[i + 1]) / 2) for i, v in enumerate(results[name])]
        print(
            f"| {name} | {statistics.median(results[name]):,.0f} | "
            f"{statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
