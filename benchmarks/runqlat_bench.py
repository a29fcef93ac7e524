"""runqlat overhead: round trips per second of two processes bouncing a byte over a
pair of pipes (every round trip is two wake-ups and two context switches), untraced,
with `meridian runqlat` attached, and with bpftrace running the classic runqlat.bt,
interleaved round by round in the same run. Ratios are medians of traced / untraced
round trips per second of the neighbouring untraced rounds.

Run as root from the repository: .venv/bin/python benchmarks/runqlat_bench.py [rounds]
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
    "floor (runqlat's hooks, empty)": floor("runqlat"),
    "meridian runqlat": [*MERIDIAN, "runqlat", "-v"],
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


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    seconds = 3.0
    results = interleaved(lambda: pingpong(seconds), CONFIGS, rounds)
    print_ratios(results, f"pipe ping-pong, {seconds:g} s per run", "round trips/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
