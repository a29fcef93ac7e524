"""Start-up and exit: how long io and syscalls take to load and attach their programs,
and to detach them, per strategy this host allows; and the command line's own start
(`meridian --help`, `meridian syscalls -- /bin/true`). The verifier's work is most of
a load: a program it walks 286,000 instructions of costs ~0.4 s (fdpath.bpf.h).

    .venv/bin/python benchmarks/startup_bench.py [--rounds 5]

Old code against new in one run: a worktree of the old commit on PYTHONPATH, with
MERIDIAN_BPF_DIR at its objects (RESULTS.md says how each entry was made).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from meridian.session import Session
from meridian.tools.io.kernel import STRATEGIES as IO_STRATEGIES
from meridian.tools.io.kernel import FileIO
from meridian.tools.io.options import Options as IoOptions
from meridian.tools.syscalls.kernel import STRATEGIES as SYSCALLS_STRATEGIES
from meridian.tools.syscalls.kernel import Capture
from meridian.tools.syscalls.options import Options as SyscallsOptions

TOOLS: dict[str, tuple[Any, Callable[[str], Session]]] = {
    "io": (IO_STRATEGIES, lambda s: FileIO(IoOptions(pids=[os.getpid()], strategy=s))),
    "syscalls": (SYSCALLS_STRATEGIES, lambda s: Capture(SyscallsOptions(strategy=s))),
}
COMMANDS = {
    "meridian --help": ["--help"],
    "meridian syscalls -- /bin/true": ["syscalls", "--", "/bin/true"],
}


def session_times(make: Callable[[str], Session], strategy: str) -> tuple[float, float]:
    """Seconds to enter (load, attach) and to leave (detach, close) one session."""
    t0 = time.monotonic()
    with make(strategy):  # a failed attach detaches what it made
        t1 = time.monotonic()
    return t1 - t0, time.monotonic() - t1


def command_time(args: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "meridian", *args], check=True, capture_output=True)
    return time.monotonic() - t0


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.rounds < 1:
        print("error: --rounds takes 1 or more", file=sys.stderr)
        return 2
    print("| what | load and attach | detach and close |")
    print("| --- | --- | --- |")
    for tool, (strategies, make) in TOOLS.items():
        for strategy in strategies:
            if strategy.missing():
                continue
            times = [session_times(make, strategy.name) for _ in range(args.rounds)]
            enter, leave = zip(*times, strict=True)
            print(f"| {tool} {strategy.name} | {spread(list(enter))} | {spread(list(leave))} |")
    for what, argv in COMMANDS.items():
        print(f"| {what} | {spread([command_time(argv) for _ in range(args.rounds)])} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
