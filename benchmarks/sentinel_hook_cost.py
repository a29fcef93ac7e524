"""meridian sentinel: what its BPF programs cost per run while iperf3 streams TCP and
64-byte UDP over veth (kernel.bpf_stats_enabled: run count and run time per program).

The throughput ratio (sentinel_bench.py) is noisy on a 2-CPU VM; this says where the
agent's kernel time goes, packet hooks against the sample handler.

Run as root from the repository (a quiet machine):
    .venv/bin/python benchmarks/sentinel_hook_cost.py [seconds]
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from netns import netns_pair


def progs() -> dict[int, dict[str, Any]]:
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True)
    return {p["id"]: p for p in json.loads(out.stdout)}


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    subprocess.run(["sysctl", "-q", "kernel.bpf_stats_enabled=1"], check=True)
    try:
        with netns_pair("hooks") as pair:
            agent = subprocess.Popen(
                [sys.executable, "-m", "meridian", "sentinel", "--metrics-port", "0"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                time.sleep(4)  # loaded and attached
                for udp in (False, True):
                    before = progs()
                    pair.iperf3(seconds, udp=udp, length=64 if udp else None, cpus=(0, 1))
                    print(f"\n{'64-byte UDP' if udp else 'TCP'}, {seconds:g} s")
                    print("| program | runs | ns per run | share of one core |")
                    print("| --- | ---: | ---: | ---: |")
                    for pid, p in progs().items():
                        b = before.get(pid)
                        if b is None or "run_cnt" not in p:
                            continue
                        n = p["run_cnt"] - b.get("run_cnt", 0)
                        t = p["run_time_ns"] - b.get("run_time_ns", 0)
                        if n:
                            share = 100 * t / (seconds * 1e9)
                            print(f"| {p.get('name')} | {n:,} | {t / n:.1f} | {share:.2f} % |")
            finally:
                agent.send_signal(signal.SIGINT)
                agent.wait(30)
    finally:
        subprocess.run(["sysctl", "-q", "kernel.bpf_stats_enabled=0"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
