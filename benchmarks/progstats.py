"""Kernel cost of a tool's programs, in ns per program run (bpf_stats), while a
workload runs: the cleanest overhead signal when the cores are shared, since it
counts only the time spent inside the tool's own programs.

It enables kernel.bpf_stats_enabled for the measurement (restoring the previous
value), starts the tool, and reads run_time_ns / run_cnt of the tool's programs
(found by the tool's PID in `bpftool prog show`) before and after the workload. The
kernel's accounting itself costs a few tens of ns per run, included in every number.

With --floors, each round also measures the tool's floors at the same hooks
(benchmarks/floor.py): empty programs, and the latency floor (two clock reads).

Arguments after `--` go to the tool (`io ... -- --no-events`); syscalls traces every
process into /dev/null (`-q -w /dev/null`), the loop being the one making calls.

Run as root from the repository:
  .venv/bin/python benchmarks/progstats.py memlat [rounds] [--floors]
  .venv/bin/python benchmarks/progstats.py runqlat [rounds]
  .venv/bin/python benchmarks/progstats.py io [rounds] [--floors] [-- --no-events]
  .venv/bin/python benchmarks/progstats.py syscalls [rounds] [--floors]
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from _rounds import compile_c, floor, wait_ready
from io_bench import LOOP_C, loop
from memlat_bench import touch
from runqlat_bench import pingpong
from syscalls_bench import LOOP_C as SYSCALLS_LOOP_C
from syscalls_bench import build, run_loop

ROOT = Path(__file__).resolve().parent.parent
MERIDIAN = str(ROOT / ".venv" / "bin" / "meridian")
SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


@functools.cache
def pread_loop() -> tuple[Path, Path]:
    """io_bench's pread loop, compiled once, and its 1 MiB file (removed at exit)."""
    work = Path(tempfile.mkdtemp(prefix="progstats-"))
    atexit.register(shutil.rmtree, work, True)
    data = work / "data.bin"
    data.write_bytes(os.urandom(1 << 20))
    return compile_c(LOOP_C, work, "preadloop"), data


def preads(seconds: float) -> float:
    """io_bench's cached 4 KiB pread loop: preads per second."""
    return loop(*pread_loop(), seconds)


@functools.cache
def syscalls_loop() -> tuple[Path, Path]:
    """syscalls_bench's openat+fstat+close loop, compiled once, and its file."""
    work = Path(tempfile.mkdtemp(prefix="progstats-"))
    atexit.register(shutil.rmtree, work, True)
    return build(work, "scloop", SYSCALLS_LOOP_C)


def calls(seconds: float) -> float:
    """syscalls_bench's loop: iterations (openat, fstat, close) per second."""
    exe, target = syscalls_loop()
    return run_loop([str(exe), str(target), str(seconds)])[0]


WORKLOADS: dict[str, Callable[[float], float]] = {
    "memlat": touch,
    "runqlat": pingpong,
    "io": preads,
    "syscalls": calls,
}
TOOL_ARGS = {"syscalls": ["-q", "-w", os.devnull]}  # the tool's own arguments


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


def measure(
    tool: str, seconds: float, cmd: list[str] | None = None
) -> tuple[float, dict[str, tuple[float, int]]]:
    """(workload rate, {program: (ns per run, runs)}) for one run of the workload under
    `cmd` (default: the tool itself)."""
    cmd = cmd or [MERIDIAN, tool, "-v", *TOOL_ARGS.get(tool, [])]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        wait_ready(p.stderr, "strategy:", " ".join(cmd))  # loaded and attached
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
    argv, extra = sys.argv[1:], []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = [a for a in argv if a != "--floors"]
    tool = args[0] if args else "memlat"
    rounds = int(args[1]) if len(args) > 1 else 3
    own = [MERIDIAN, tool, "-v", *TOOL_ARGS.get(tool, []), *extra]
    configs: dict[str, list[str] | None] = {" ".join([tool, *extra]): own}
    if "--floors" in argv:
        configs = {"empty": floor(tool), "latency floor": floor(tool, clock=True), **configs}
    old = SYSCTL.read_text().strip()
    SYSCTL.write_text("1")
    try:
        for r in range(rounds):
            for what, cmd in configs.items():
                rate, per_run = measure(tool, 3.0, cmd)
                progs = ", ".join(
                    f"{name} {ns:.0f} ns x {runs:,}" for name, (ns, runs) in sorted(per_run.items())
                )
                print(f"round {r + 1}, {what}: {rate:,.0f}/s; {progs}", flush=True)
    finally:
        SYSCTL.write_text(old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
