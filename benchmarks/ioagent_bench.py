"""meridian io's agent cost: CPU seconds and peak RSS of the `meridian io` process for
1 million events logged as JSON lines, and the drops at 100,000 events/s for 60 s.

The producer is a small C program (compiled here) doing a known number of cached 4 KiB
preads of a 1 MiB file, flat out or paced; `meridian io --comm preadn` streams every
one of them as a JSON line into a pipe this script counts. The agent's CPU time is read
from /proc/PID/stat just before the producer starts and after the last line arrived
(start-up and BPF loading excluded; reported apart), its peak RSS from VmHWM. Also the
formatter alone, in this process: JSON lines per CPU second from decoded columns.

Run as root from the repository:
  .venv/bin/python benchmarks/ioagent_bench.py [events] [rate] [seconds]
  (defaults: 1000000 flat out, then 100000/s for 60 s)
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _rounds import compile_c, wait_ready

ROOT = Path(__file__).resolve().parent.parent
# MERIDIAN=/path/to/meridian compares another build (e.g. main's) with the same load.
MERIDIAN = [os.environ.get("MERIDIAN", str(ROOT / ".venv" / "bin" / "meridian"))]
MERIDIAN += ["io", "-v", "--comm", "preadn"]
PRODUCER_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
int main(int argc, char **argv) {      /* preadn FILE COUNT RATE (0: flat out) */
    char buf[4096];
    int fd = open(argv[1], O_RDONLY);
    long count = atol(argv[2]);
    double rate = atof(argv[3]);
    long n = 0;
    if (fd < 0) return 1;
    double t0 = now();
    while (n < count) {
        for (int i = 0; i < 500 && n < count; i++, n++)
            if (pread(fd, buf, sizeof(buf), (off_t)(n % 256) * 4096) != sizeof(buf)) return 2;
        if (rate > 0) {
            double ahead = n / rate - (now() - t0);
            if (ahead > 0) {
                struct timespec s = {(time_t)ahead, (long)((ahead - (long)ahead) * 1e9)};
                nanosleep(&s, NULL);
            }
        }
    }
    printf("{\"ops\": %ld, \"seconds\": %.6f}\n", n, now() - t0);
    return 0;
}
"""
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class LineCounter(threading.Thread):
    """Counts lines on the agent's stdout; keeps the tail (the summary)."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.lines = 0
        self.tail = b""

    def run(self) -> None:
        while chunk := os.read(self.fd, 1 << 20):
            self.lines += chunk.count(b"\n")
            self.tail = (self.tail + chunk)[-(1 << 16) :]


def agent_run(producer: Path, data: Path, count: int, rate: float) -> dict[str, Any]:
    p = subprocess.Popen(MERIDIAN, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=False)
    assert p.stdout is not None and p.stderr is not None
    counter = LineCounter(p.stdout.fileno())
    counter.start()
    try:
        wait_ready(p.stderr, "strategy:", "meridian io")
        cpu_start = cpu_seconds(p.pid)
        started = time.monotonic()
        out = subprocess.run(
            [str(producer), str(data), str(count), str(rate)], check=True, capture_output=True
        )
        made = json.loads(out.stdout)
        last, still = -1, 0
        while still < 3:  # until no line arrived for 3 polls of 0.2 s
            time.sleep(0.2)
            still = still + 1 if counter.lines == last else 0
            last = counter.lines
        cpu = cpu_seconds(p.pid) - cpu_start
        hwm = vm_hwm_mb(p.pid)
        wall = time.monotonic() - started
        p.send_signal(signal.SIGINT)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        counter.join(10)
    finally:
        if p.returncode is None:
            p.kill()
            p.wait()
    summary = [json.loads(x) for x in counter.tail.splitlines() if x.startswith(b'{"type"')]
    lost: dict[str, Any] = next((s for s in summary if s["type"] == "lost"), {})
    events = counter.lines - len(summary)
    # What the kernel aggregated for the producer (its preads and the dynamic loader's
    # few start-up reads): every one of them should be a line unless it was lost.
    kernel_ops = sum(
        s[op]["ops"]
        for s in summary
        if s["type"] == "summary"
        for op in ("read", "write")
        if op in s
    )
    return {
        "rate_asked": rate,
        "producer_ops": made["ops"],
        "producer_rate": round(made["ops"] / made["seconds"]),
        "event_lines": events,
        "kernel_ops": kernel_ops,
        "missing_lines": kernel_ops - events,
        "events_lost_in_kernel": lost.get("events_lost"),
        "agent_cpu_s": round(cpu, 2),
        "events_per_agent_cpu_s": round(events / cpu) if cpu else None,
        "agent_cpu_share": round(cpu / wall, 3),
        "agent_cpu_total_s_with_startup": round(usage.ru_utime + usage.ru_stime, 2),
        "agent_peak_rss_mb": round(max(hwm, usage.ru_maxrss / 1024), 1),
        "exit": p.returncode,
    }


def formatter_rate(n: int = 1_000_000) -> dict[str, Any]:
    """The formatter alone, in this process, on mixed events made chunk by chunk."""
    sys.path.insert(0, str(ROOT / "src"))
    from meridian.bpf import BpfObject, object_path
    from meridian.tools.io.event_format import EventFormatter

    with BpfObject(object_path("io")) as obj:
        assert obj.btf is not None
        dtype = obj.btf.struct_dtype("fileio_event")
    rng = np.random.default_rng(1)
    fmt = EventFormatter()
    batch = 65536
    cpu = 0.0
    size = 0
    for start in range(0, n, batch):
        m = min(batch, n - start)
        ev = np.zeros(m, dtype=dtype)
        k = rng.integers(0, 8, m)
        ev["pid"], ev["tid"], ev["fd"] = 4000 + k, 4000 + k, 3 + k % 2
        ev["comm"] = np.array([b"preadn", b"postgres", b"dd", b"java"])[k % 4]
        ev["dev"], ev["ino"], ev["op"] = 7 << 20, 12 + k, k % 2
        ev["bytes"] = np.where(k < 6, 4096, rng.integers(0, 1 << 20, m))
        ev["bytes_requested"] = np.where(k < 6, 4096, 1 << 20)
        ev["cached"] = k > 1
        ev["disk_bytes"] = np.where(k > 1, 0, ev["bytes"])
        ev["io_wait_ns"] = np.where(k > 1, 0, rng.integers(0, 10**6, m))
        ev["latency_ns"] = rng.integers(300, 5 * 10**6, m)
        ev["ts_ns"] = time.monotonic_ns() + np.arange(m) * 997
        t = time.process_time()
        for text in fmt.json_chunks(ev):
            size += len(text)
        cpu += time.process_time() - t
    return {"events": n, "cpu_s": round(cpu, 2), "events_per_cpu_s": round(n / cpu),
            "bytes_per_line": round(size / n)}  # fmt: skip


def main(argv: list[str]) -> int:
    count = int(argv[1]) if len(argv) > 1 else 1_000_000
    rate = float(argv[2]) if len(argv) > 2 else 100_000
    seconds = float(argv[3]) if len(argv) > 3 else 60
    print(f"machine: {platform.node()} {platform.release()} {os.cpu_count()} CPUs", flush=True)
    if "MERIDIAN" not in os.environ:
        print(f"formatter alone: {formatter_rate()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        producer = compile_c(PRODUCER_C, work, "preadn")
        data = work / "data.bin"
        data.write_bytes(os.urandom(1 << 20))
        subprocess.run([str(producer), str(data), "1000", "0"], check=True, capture_output=True)
        print(f"flat out, {count} events: {agent_run(producer, data, count, 0)}", flush=True)
        sustained = agent_run(producer, data, int(rate * seconds), rate)
        print(f"{rate:.0f}/s for {seconds:.0f} s: {sustained}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
