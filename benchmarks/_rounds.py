"""The harness the overhead benchmarks share: run a workload untraced and under each
tracer, interleaved round by round, and print ratios to the neighbouring untraced runs
(a round's ratio is traced / mean of the untraced runs before and after it)."""

from __future__ import annotations

import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO


def compile_c(source: str, workdir: Path, name: str) -> Path:
    """A small C program (`source`) built with cc -O2 in `workdir`; returns its path."""
    src = workdir / f"{name}.c"
    src.write_text(source)
    exe = workdir / name
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def wait_ready(pipe: IO[str] | IO[bytes], ready: str, what: str) -> None:
    """Read a tracer's output until a line holds `ready` (meridian -v: "strategy:");
    a RuntimeError if it ends first."""
    while line := pipe.readline():
        if ready in (line.decode(errors="replace") if isinstance(line, bytes) else line):
            return
    raise RuntimeError(f"{what} exited before attaching")


def fio_randread_iops(path: str | os.PathLike[str], seconds: int) -> float:
    """IOPS of fio's 4 KiB random O_DIRECT reads of `path` (a file or a device), psync
    at queue depth 1: one pread64 and one block request per I/O."""
    out = subprocess.run(
        ["fio", "--name=bench", f"--filename={path}", "--rw=randread", "--bs=4k",
         "--direct=1", "--ioengine=psync", "--iodepth=1", f"--runtime={seconds}",
         "--time_based", "--output-format=json"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return float(json.loads(out)["jobs"][0]["read"]["iops"])


READY = ("strategy:", "Attaching")  # meridian -v and floor.py; bpftrace


def floor(tool: str, reserve: bool = False, clock: bool = False) -> list[str]:
    """The command of the tool's floor (floor.py): its hooks, empty programs (exits
    reserving a record, or with `clock` the latency floor: two clock reads)."""
    here = Path(__file__).resolve().parent
    how = ["--reserve"] * reserve + ["--clock"] * clock
    return [sys.executable, str(here / "floor.py"), tool, *how]


def under(cmd: list[str], workload: Callable[[], float], ready: float = 60.0) -> float:
    """Run `workload` once `cmd` (a tracer) says it is attached (a READY line on
    either stream, so meridian runs with -v); Ctrl-C the tracer after."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    attached = threading.Event()
    tail: list[str] = []

    def read(pipe: IO[str]) -> None:
        for line in pipe:  # read to the end: a full pipe would block the tracer
            tail[:] = [*tail[-4:], line]
            if any(r in line for r in READY):
                attached.set()
        attached.set()

    for pipe in (p.stdout, p.stderr):
        assert pipe is not None
        threading.Thread(target=read, args=(pipe,), daemon=True).start()
    try:
        attached.wait(ready)
        if p.poll() is not None or not attached.is_set():
            raise RuntimeError(f"{cmd[0]} did not attach: {''.join(tail)}")
        return workload()
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def interleaved(
    workload: Callable[[], float], tracers: dict[str, list[str]], rounds: int, ready: float = 60.0
) -> dict[str, list[float]]:
    """untraced, each tracer, ..., untraced: rounds + 1 untraced runs around them."""
    results: dict[str, list[float]] = {"untraced": [], **{name: [] for name in tracers}}
    for _ in range(rounds):
        results["untraced"].append(workload())
        for name, cmd in tracers.items():
            results[name].append(under(cmd, workload, ready))
    results["untraced"].append(workload())
    return results


def noise(base: list[float]) -> tuple[float, float]:
    """How much neighbouring untraced runs differ (median and largest |1 - b/a|): a
    ratio closer to 1 than this, or to another config, is not told apart here."""
    steps = [abs(1 - b / a) for a, b in itertools.pairwise(base)] or [0.0]
    return statistics.median(steps), max(steps)


def print_ratios(results: dict[str, list[float]], what: str, unit: str) -> None:
    """The machine line and the markdown table of RESULTS.md: per config its median
    ratio to the neighbouring untraced runs, their spread, and this run's noise."""
    base = results["untraced"]
    med, top = noise(base)
    print(
        f"machine: {platform.node()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs; {what}, {len(base) - 1} rounds; noise (neighbouring "
        f"untraced runs): median {100 * med:.1f} %, max {100 * top:.1f} %"
    )
    print(f"\n| config | median {unit} | ratio to untraced: median | min - max | rounds |")
    print("| --- | ---: | ---: | ---: | --- |")
    print(f"| untraced | {statistics.median(base):,.0f} | 1.00 | | |")
    for name, values in results.items():
        if name == "untraced":
            continue
        ratios = [v / ((base[i] + base[i + 1]) / 2) for i, v in enumerate(values)]
        rounds = ", ".join(f"{r:.3f}" for r in ratios)
        print(
            f"| {name} | {statistics.median(values):,.0f} | {statistics.median(ratios):.3f} "
            f"| {min(ratios):.3f} - {max(ratios):.3f} | {rounds} |"
        )
