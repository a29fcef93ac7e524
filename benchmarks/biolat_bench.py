"""biolat overhead: IOPS of a 4 KiB O_DIRECT random-read fio job on a loop device,
untraced, with `meridian biolat` attached, and with bpftrace running the equivalent
biolatency script, interleaved round by round in the same run. Ratios are medians of
traced / untraced IOPS of the neighbouring rounds.

Run as root from the repository: .venv/bin/python benchmarks/biolat_bench.py [rounds]
"""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MERIDIAN = [str(ROOT / ".venv" / "bin" / "meridian")]
BPFTRACE = """
tracepoint:block:block_rq_issue { @start[args->dev, args->sector] = nsecs; }
tracepoint:block:block_rq_complete /@start[args->dev, args->sector]/ {
  @usecs[args->dev] = hist((nsecs - @start[args->dev, args->sector]) / 1000);
  delete(@start[args->dev, args->sector]);
}
"""


def fio(dev: str, seconds: int) -> float:
    out = subprocess.run(
        [
            "fio",
            "--name=bench",
            f"--filename={dev}",
            "--rw=randread",
            "--bs=4k",
            "--direct=1",
            "--ioengine=psync",
            "--iodepth=1",
            f"--runtime={seconds}",
            "--time_based",
            "--output-format=json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out)["jobs"][0]["read"]["iops"])


def traced(cmd: list[str], dev: str, seconds: int, ready: float = 2.5) -> float:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(ready)  # loaded and attached
        if p.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited: {p.stderr.read() if p.stderr else ''}")
        return fio(dev, seconds)
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    seconds = 5
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        img = Path(d) / "disk.img"
        with open(img, "wb") as f:
            f.truncate(1 << 30)
        subprocess.run(
            [
                "dd",
                "if=/dev/urandom",
                f"of={img}",
                "bs=1M",
                "count=256",
                "conv=notrunc",
                "status=none",
            ],
            check=True,
        )
        dev = subprocess.run(
            ["losetup", "--find", "--show", str(img)], check=True, capture_output=True, text=True
        ).stdout.strip()
        script = Path(d) / "biolatency.bt"
        script.write_text(BPFTRACE)
        results: dict[str, list[float]] = {"untraced": [], "meridian": [], "bpftrace": []}
        try:
            for _ in range(rounds):
                results["untraced"].append(fio(dev, seconds))
                results["meridian"].append(traced([*MERIDIAN, "biolat", "-D"], dev, seconds))
                results["bpftrace"].append(traced(["bpftrace", str(script)], dev, seconds))
            results["untraced"].append(fio(dev, seconds))
        finally:
            subprocess.run(["losetup", "-d", dev], check=False)
    base = results["untraced"]
    print(
        f"machine: {platform.node()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs; fio 4k randread O_DIRECT psync QD1 on a loop device, "
        f"{seconds} s per run, {rounds} rounds"
    )
    print("\n| config | median IOPS | ratio to untraced (median of rounds) |")
    print("| --- | ---: | ---: |")
    print(f"| untraced | {statistics.median(base):,.0f} | 1.00 |")
    for name in ("meridian", "bpftrace"):
        ratios = [v / ((base[i] + base[i + 1]) / 2) for i, v in enumerate(results[name])]
        print(
            f"| {name} | {statistics.median(results[name]):,.0f} | "
            f"{statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
