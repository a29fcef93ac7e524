"""meridian io overhead: preads per second of a cached 4 KiB pread loop (a small C
program) untraced, with `meridian io --no-events`, with `meridian io` streaming every
event as JSON to /dev/null, and with bpftrace keeping the equivalent per-PID latency
histogram, interleaved round by round in the same run. Ratios are medians of traced /
untraced rates of the same round. Also the agent's own cost: JSON lines per second
of one core for 1 million decoded events.

Run as root from the repository: .venv/bin/python benchmarks/io_bench.py [rounds] [seconds]
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

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


def build_loop(workdir: Path) -> Path:
    src = workdir / "preadloop.c"
    src.write_text(LOOP_C)
    exe = workdir / "preadloop"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


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
        while True:
            line = pipe.readline()
            if not line:
                raise RuntimeError(f"{cmd[0]} exited before attaching")
            if ready in line:
                break
        rate = loop(exe, data, seconds)
    finally:
        p.terminate()
        tail = pipe.read()
        p.wait(30)
    return rate, tail


def agent_json_rate(n: int = 1_000_000) -> dict[str, float]:
    """JSON lines per second of one core, from decoded columns, and peak RSS."""
    sys.path.insert(0, str(ROOT / "src"))
    from meridian.bpf import BpfObject, object_path
    from meridian.tools.io import EventFormatter

    with BpfObject(object_path("io")) as obj:
        assert obj.btf is not None
        dtype = obj.btf.struct_dtype("fileio_event")
    ev = np.zeros(n, dtype=dtype)
    ev["pid"] = 4242
    ev["tid"] = 4242
    ev["comm"] = b"preadloop"
    ev["fd"] = 3
    ev["ino"] = 12
    ev["dev"] = 7 << 20
    ev["bytes"] = 4096
    ev["bytes_requested"] = 4096
    ev["latency_ns"] = np.arange(n) % 5000
    ev["ts_ns"] = time.monotonic_ns() + np.arange(n) * 1000
    ev["cached"] = 1
    fmt = EventFormatter()
    cpu0 = time.process_time()
    total = 0
    with open(os.devnull, "w") as out:
        for i in range(0, n, 65536):
            s = fmt.json_lines(ev[i : i + 65536])
            total += len(s)
            out.write(s)
    cpu = time.process_time() - cpu0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"events": n, "cpu_s": cpu, "events_per_cpu_s": n / cpu, "peak_rss_mb": rss}


def main(argv: list[str]) -> int:
    rounds = int(argv[1]) if len(argv) > 1 else 3
    seconds = float(argv[2]) if len(argv) > 2 else 3.0
    results: dict[str, list[float]] = {
        "untraced": [],
        "no-events": [],
        "stream": [],
        "bpftrace": [],
    }
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build_loop(work)
        data = work / "data.bin"
        data.write_bytes(os.urandom(1 << 20))
        script = work / "lat.bt"
        script.write_text(BPFTRACE)
        loop(exe, data, 0.5)  # warm the page cache
        for r in range(rounds):
            base = loop(exe, data, seconds)
            results["untraced"].append(base)
            rate, tail = traced([*MERIDIAN, "--no-events"], "strategy:", exe, data, seconds)
            results["no-events"].append(rate / base)
            rate, tail = traced(MERIDIAN, "strategy:", exe, data, seconds)
            results["stream"].append(rate / base)
            lost = [x for x in tail.splitlines() if x.startswith("lost:")]
            notes.append(f"round {r} stream {lost[0] if lost else tail.strip()[-200:]}")
            rate, _ = traced(["bpftrace", str(script)], "Attaching", exe, data, seconds, True)
            results["bpftrace"].append(rate / base)
            print(
                f"round {r}: untraced {base / 1e6:.3f} M/s, no-events "
                f"{results['no-events'][-1]:.3f}, stream {results['stream'][-1]:.3f}, "
                f"bpftrace {results['bpftrace'][-1]:.3f}",
                flush=True,
            )
    agent = agent_json_rate()
    summary: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.release()} {os.cpu_count()} CPUs",
        "rounds": rounds,
        "seconds": seconds,
        "untraced_median_per_s": statistics.median(results["untraced"]),
        **{k: statistics.median(v) for k, v in results.items() if k != "untraced"},
        "agent": agent,
        "notes": notes,
    }
    for k, v in summary.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
