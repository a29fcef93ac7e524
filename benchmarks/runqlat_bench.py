"""runqlat overhead: round trips per second of two processes bouncing a byte over a
pair of pipes (every round trip is two wake-ups and two context switches), untraced,
with `meridian runqlat` attached, and with bpftrace running the classic runqlat.bt,
interleaved round by round in the same run. Ratios are medians of traced / untraced
round trips per second of the neighbouring untraced rounds.

Run as root from the repository: .venv/bin/python benchmarks/runqlat_bench.py [rounds]
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
BPFTRACE = """
tracepoint:sched:sched_wakeup, tracepoint:sched:sched_wakeup_new {
  @qtime[args->pid] = nsecs;
}
tracepoint:sched:sched_switch {
  if (args->prev_state == 0) { @qtime[args->prev_pid] = nsecs; }
  $ns = @qtime[args->next_pid];
  if ($ns) { @usecs = hist((nsecs - $ns) / 1000); }
  delete(@qtime[args->next_pid]);
}
"""
CONFIGS = {
    "meridian runqlat": [*MERIDIAN, "runqlat"],
    "bpftrace runqlat.bt": ["bpftrace", "-e", BPFTRACE],
}


def pingpong(seconds: float) -> float:
    """Round trips per second."""
    out = subprocess.run(
        [PY, "-m", "meridian.workloads", "pingpong", "--seconds", str(seconds)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["round_trips"]) / seconds


def traced(cmd: list[str], seconds: float, ready: float = 3.0) -> float:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(ready)  # loaded and attached
        if p.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited: {p.stderr.read() if p.stderr else ''}")
        return pingpong(seconds)
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
        results["untraced"].append(pingpong(seconds))
        for name, cmd in CONFIGS.items():
            results[name].append(traced(cmd, seconds))
    results["untraced"].append(pingpong(seconds))
    base = results["untraced"]
    print(
        f"machine: {platform.node()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs; pipe ping-pong between two processes, {seconds:g} s per run, "
        f"{rounds} rounds"
    )
    print("\n| config | median round trips/s | ratio to untraced (median of rounds) |")
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
