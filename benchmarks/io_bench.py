"""meridian io overhead: preads per second of a cached 4 KiB pread loop (a small C
program) untraced, with `meridian io --no-events` (and with `-p` of another process,
which leaves the loop out: what -p costs the rest of the host), with `meridian io`
streaming every event as JSON to /dev/null, and with bpftrace keeping the equivalent
per-PID latency histogram, interleaved round by round in the same run. Ratios are
medians of traced / untraced rates of the same round. Then the same four conditions on
a fio job: 4 KiB random O_DIRECT reads (psync, queue depth 1) of a file, IOPS
interleaved round by round (ratios to the neighbouring untraced runs). The agent's own
cost (CPU seconds and RSS per million JSON lines, drops at 100k/s):
benchmarks/ioagent_bench.py.

Run as root from the repository:
  .venv/bin/python benchmarks/io_bench.py [rounds] [seconds] [fio-rounds] [fio-seconds]
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _rounds import compile_c, fio_randread_iops, floor, interleaved, print_ratios, wait_ready

ROOT = Path(__file__).resolve().parent.parent
MERIDIAN = [str(ROOT / ".venv" / "bin" / "meridian"), "io", "-v"]
LOOP_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[4096];
    int fd = open(argv[1], O_RDONLY);
    double secs = atof(argv[2]);
    struct timespec t0, t;
    long n = 0;
    if (fd < 0) return 1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        for (int i = 0; i < 1024; i++, n++)
            if (pread(fd, buf, sizeof(buf), (off_t)(n % 256) * 4096) != sizeof(buf)) return 2;
        clock_gettime(CLOCK_MONOTONIC, &t);
        double el = (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
        if (el >= secs) { printf("%.1f\n", n / el); return 0; }
    }
}
"""
BPFTRACE = """
tracepoint:syscalls:sys_enter_pread64 { @start[tid] = nsecs; }
tracepoint:syscalls:sys_exit_pread64 /@start[tid]/ {
  @ns[pid] = hist(nsecs - @start[tid]);
  delete(@start[tid]);
}
"""


def loop(exe: Path, data: Path, seconds: float) -> float:
    out = subprocess.run([str(exe), str(data), str(seconds)], check=True, capture_output=True)
    return float(out.stdout)


def traced(
    cmd: list[str], ready: str, exe: Path, data: Path, seconds: float, on_stdout: bool = False
) -> tuple[float, str]:
    """Start the tracer, wait for its ready line, run the loop, stop the tracer.
    The ready line is on stderr (meridian -v) or stdout (bpftrace); the other stream
    goes to /dev/null."""
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE if on_stdout else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if on_stdout else subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    pipe = p.stdout if on_stdout else p.stderr
    assert pipe is not None
    try:
        wait_ready(pipe, ready, cmd[0])
        rate = loop(exe, data, seconds)
    finally:
        p.terminate()
        tail = pipe.read()
        p.wait(30)
    return rate, tail


def fio_rounds(rounds: int, seconds: int, script: Path) -> None:
    """The fio job untraced and under each tracer, interleaved; events to /dev/null."""
    meridian = [str(ROOT / ".venv" / "bin" / "meridian"), "io", "-v"]
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        data = Path(d) / "fio.bin"
        subprocess.run(
            ["fio", "--name=lay", f"--filename={data}", "--size=256m", "--rw=write",
             "--bs=1m", "--direct=1", "--output-format=json"],
            check=True, capture_output=True,
        )  # fmt: skip
        results = interleaved(
            lambda: fio_randread_iops(data, seconds),
            {
                "floor (io's hooks, empty)": floor("io"),
                "meridian io --no-events": [*meridian, "--no-events"],
                "floor (io's hooks, exits reserve and discard)": floor("io", reserve=True),
                "meridian io (JSON to /dev/null)": meridian,
                "bpftrace per-PID pread64 histogram": ["bpftrace", str(script)],
            },
            rounds,
        )
    print_ratios(results, f"fio 4 KiB randread O_DIRECT psync qd1, {seconds} s runs", "IOPS")


def main(argv: list[str]) -> int:
    rounds = int(argv[1]) if len(argv) > 1 else 3
    seconds = float(argv[2]) if len(argv) > 2 else 3.0
    fio_n = int(argv[3]) if len(argv) > 3 else 3
    fio_s = int(argv[4]) if len(argv) > 4 else 5
    names = {
        "floor": "floor (io's hooks, empty)",
        "floor-clock": "latency floor (io's hooks, two clock reads)",
        "no-events": "meridian io --no-events",
        "left-out": "meridian io --no-events -p another process (the loop left out)",
        "floor-reserve": "floor (io's hooks, exits reserve and discard)",
        "stream": "meridian io (JSON to /dev/null)",
        "bpftrace": "bpftrace per-PID pread64 histogram",
    }
    results: dict[str, list[float]] = {"untraced": [], **{n: [] for n in names.values()}}
    lost: list[str] = []
    # -p of a process that makes no reads: what -p costs the processes it leaves out
    idle = subprocess.Popen(["sleep", "infinity"])
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        stack.callback(idle.wait)
        stack.callback(idle.kill)
        work = Path(tmp)
        exe = compile_c(LOOP_C, work, "preadloop")
        data = work / "data.bin"
        data.write_bytes(os.urandom(1 << 20))
        script = work / "lat.bt"
        script.write_text(BPFTRACE)
        loop(exe, data, 0.5)  # warm the page cache
        tracers = {
            "floor": (floor("io"), False),
            "floor-clock": (floor("io", clock=True), False),
            "no-events": ([*MERIDIAN, "--no-events"], False),
            "left-out": ([*MERIDIAN, "--no-events", "-p", str(idle.pid)], False),
            "floor-reserve": (floor("io", reserve=True), False),
            "stream": (MERIDIAN, False),
            "bpftrace": (["bpftrace", str(script)], True),
        }
        for r in range(rounds):
            results["untraced"].append(loop(exe, data, seconds))
            for key, (cmd, on_stdout) in tracers.items():
                ready = "Attaching" if on_stdout else "strategy:"
                rate, tail = traced(cmd, ready, exe, data, seconds, on_stdout)
                results[names[key]].append(rate)
                if key == "stream":  # every drop counted: meridian's summary says them
                    said = [x for x in tail.splitlines() if x.startswith("lost:")]
                    lost.append(said[0] if said else tail.strip()[-200:])
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in results.items()))
        results["untraced"].append(loop(exe, data, seconds))
    print_ratios(results, f"cached 4 KiB pread loop, {seconds:g} s per run", "preads/s")
    print(f"meridian io (JSON to /dev/null), per round: {'; '.join(lost)}")
    if fio_n <= 0:  # fio-rounds 0: the pread loop only
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "lat.bt"
        script.write_text(BPFTRACE)
        fio_rounds(fio_n, fio_s, script)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
