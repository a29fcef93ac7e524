"""meridian io's memory with many processes doing I/O: the agent's peak RSS (VmHWM) and
its /metrics body while 10, 100 or 1,000 processes each pread a cached file every 10
ms, beside the agent with no process doing I/O. The agent runs as a fleet runs it:
`meridian io --no-events --prometheus` (the default cap of 100 process series groups,
and --metrics-max-pids all), scraped every second; and streaming every event as JSON
to /dev/null.

Run as root from the repository:
    .venv/bin/python benchmarks/io_processes_bench.py [seconds]
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _rounds import compile_c, wait_ready

ROOT = Path(__file__).resolve().parent.parent
MERIDIAN = [str(ROOT / ".venv" / "bin" / "meridian"), "io", "-v"]
COUNTS = (0, 10, 100, 1000)
# N children, each a pread of 4 KiB every 10 ms until killed (its parent waits)
CHILDREN_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
    int n = atoi(argv[2]);
    char buf[4096];
    for (int i = 0; i < n; i++) {
        if (fork() == 0) {
            int fd = open(argv[1], O_RDONLY);
            struct timespec ts = {0, 10 * 1000 * 1000};
            for (;;) { if (pread(fd, buf, sizeof(buf), 0) < 0) return 1; nanosleep(&ts, 0); }
        }
    }
    while (wait(0) > 0) {}
    return 0;
}
"""


def peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def measure(extra: list[str], exe: Path, data: Path, n: int, seconds: float, port: int) -> str:
    """One row: n processes under the agent with `extra` flags for `seconds`."""
    cmd = [*MERIDIAN, *extra, "--prometheus", f"127.0.0.1:{port}"]
    agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kids = None
    try:
        assert agent.stderr is not None
        wait_ready(agent.stderr, "strategy:", "meridian io")
        kids = subprocess.Popen([str(exe), str(data), str(n)], start_new_session=True)
        size = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(1.0)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                size = len(r.read())
        return f"| {' '.join(extra)} | {n:,} | {peak_kb(agent.pid) / 1024:.0f} | {size:,} |"
    finally:
        if kids is not None:
            os.killpg(kids.pid, signal.SIGKILL)
            kids.wait()
        agent.send_signal(signal.SIGINT)
        agent.wait(60)


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    print(f"machine: {platform.node()} {platform.release()}, {os.cpu_count()} CPUs; "
          f"{seconds:g} s per row, a scrape a second")  # fmt: skip
    print("\n| flags | processes doing I/O | agent peak RSS MB | /metrics bytes |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        exe = compile_c(CHILDREN_C, Path(tmp), "children")
        data = Path(tmp) / "data.bin"
        data.write_bytes(os.urandom(4096))
        for extra in (["--no-events"], ["--no-events", "--metrics-max-pids", "all"], []):
            for n in COUNTS:
                print(measure(extra, exe, data, n, seconds, 19435), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
