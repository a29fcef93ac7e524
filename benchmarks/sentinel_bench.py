"""meridian sentinel: the agent's CPU and memory at 1,000 / 10,000 / 100,000 samples/s
(mock source and the kernel's cpu-clock), and TCP/UDP throughput between two network
namespaces with the agent attached, as a ratio to untraced runs in the same rounds.

CPU is the agent process's utime + stime between two reads of /proc/PID/stat once it
runs (start-up excluded), as a share of one core; RSS is VmRSS at the end and VmHWM.

Run as root from the repository (a quiet machine):
    .venv/bin/python benchmarks/sentinel_bench.py [seconds] [rounds] [PART]

PART: mock, cpu-clock, store (the mock writing to embedded chDB) or throughput.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _rounds import interleaved, print_ratios

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from netns import NetnsPair, netns_pair  # noqa: E402

MERIDIAN = [sys.executable, "-m", "meridian", "sentinel"]
TICK = os.sysconf("SC_CLK_TCK")
RATES = (1_000, 10_000, 100_000)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def agent_cost(config: str, seconds: float, warmup: float = 4.0) -> dict[str, Any]:
    """Run the agent with `config` (YAML text); its steady CPU share, RSS, delivered
    samples/s and every drop, from its JSON summary."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config)
    total = warmup + seconds
    cmd = [*MERIDIAN, "--config", f.name, "--json", "--duration", f"{total + 1:g}"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(warmup)
        if p.poll() is not None:
            raise RuntimeError(f"agent exited: {p.stderr.read() if p.stderr else ''}")
        c0, t0 = cpu_seconds(p.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(p.pid), time.monotonic()
        rss, hwm = status_kb(p.pid, "VmRSS"), status_kb(p.pid, "VmHWM")
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.unlink(f.name)
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    summary = lines[-1]
    windows = [w for w in lines if w.get("type") == "window"][1:]  # the first: start-up
    rate = sum(w["samples"] for w in windows) / max(sum(w["seconds"] for w in windows), 1e-9)
    return {
        "cpu": (c1 - c0) / (t1 - t0),
        "rss_mb": rss / 1024,
        "hwm_mb": hwm / 1024,
        "rate": rate,
        "dropped": summary["dropped"],
        "stderr": err.strip().splitlines()[-1:] if p.returncode else [],
    }


def mock_config(rate: int) -> str:
    # Budgets out of the way (per mock CPU, 4 of them): what is measured is the agent.
    return (
        f"mock: {{enabled: true, period_ms: 10, rate: {rate}}}\n"
        "perf: {sentinel_samples_per_sec: 1000000, diagnostic_samples_per_sec: 1000000}\n"
        "mode: {auto: false}\nmetrics: {listen_port: 0}\n"
    )


def kernel_config(rate: int) -> str:
    freq = max(1, rate // (os.cpu_count() or 1))
    return (
        f"perf: {{frequency: {freq}, sentinel_samples_per_sec: 1000000,"
        " sentinel_groups: [[cpu-clock]]}\n"
        "mode: {auto: false}\nmetrics: {listen_port: 0}\n"
    )


def store_config(rate: int, data_dir: str) -> str:
    """The mock at `rate` writing every window to an embedded store in `data_dir`."""
    return mock_config(rate) + f"clickhouse: {{enabled: true, data_dir: {json.dumps(data_dir)}}}\n"


def cost_table(seconds: float, only: str = "") -> None:
    """Agent cost per source and rate; `only` picks one source (mock, cpu-clock, store)."""
    print("\n| source | offered samples/s | delivered samples/s | agent CPU (one core) "
          "| RSS MB (peak) | dropped |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    sources: list[tuple[str, str, Any, tuple[int, ...]]] = [
        ("mock", "mock", mock_config, RATES),
        ("cpu-clock", "cpu-clock", kernel_config, RATES),
        ("store", "mock + chDB store", None, (1_000, 100_000)),
    ]
    for part, source, config, rates in sources:
        if only and only != part:
            continue
        for rate in rates:
            if config is None:
                with tempfile.TemporaryDirectory() as store:
                    r = agent_cost(store_config(rate, store), seconds)
            else:
                r = agent_cost(config(rate), seconds)
            drops = ", ".join(f"{k} {v}" for k, v in r["dropped"].items() if v) or "0"
            print(
                f"| {source} | {rate:,} | {r['rate']:,.0f} | {100 * r['cpu']:.2f} % "
                f"| {r['rss_mb']:.0f} ({r['hwm_mb']:.0f}) | {drops} |",
                flush=True,
            )


def iperf_bps(pair: NetnsPair, seconds: float, udp: bool) -> float:
    """iperf3's client on CPU 0 and its server on CPU 1: without pinning, where the
    scheduler puts the two moves a round by 10-15 %, more than the agent costs."""
    res = pair.iperf3(seconds, udp=udp, length=64 if udp else None, cpus=(0, 1))
    end = res["end"]
    return float((end["sum"] if udp else end["sum_received"])["bits_per_second"])


def throughput(seconds: float, rounds: int) -> None:
    tracers = {
        "sentinel mode (cpu-clock 99 Hz)": [*MERIDIAN, "--metrics-port", "0"],
        "diagnostic mode": [*MERIDIAN, "--metrics-port", "0", "--mode", "diagnostic"],
    }
    with netns_pair("bench") as pair:
        for udp in (False, True):
            what = "UDP 64-byte datagrams" if udp else "TCP stream"
            run = functools.partial(iperf_bps, pair, seconds, udp)
            res = interleaved(run, tracers, rounds, 3.0)
            print()
            print_ratios(res, f"iperf3 {what}, {seconds:g} s runs over veth", "bits/s")


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    only = sys.argv[3] if len(sys.argv) > 3 else ""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if only != "throughput":
        cost_table(seconds, only)
    if only in ("", "throughput"):
        throughput(seconds, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
