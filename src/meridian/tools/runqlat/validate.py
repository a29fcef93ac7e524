"""runqlat's `validate`: one busy process (OFF), then more busy processes than CPUs
(ON), in alternating rounds; the busy processes' own p99 wait must rise."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from ...latency import Summary, print_checks
from ...output import iso_now, print_table
from ...report_loop import stop_child
from ...system import online_cpu_count
from .kernel import Runqlat
from .model import Options, Snapshot

__all__ = ["measure", "spinners", "validate", "validate_text"]


@contextlib.contextmanager
def spinners(workers: int, seconds: float) -> Iterator[list[int]]:
    """`workers` busy processes for `seconds` (the built-in `spin` workload): their PIDs."""
    cmd = [sys.executable, "-m", "meridian.workloads", "spin", "--workers", str(workers)]
    child = subprocess.Popen([*cmd, "--seconds", str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield [int(p) for p in json.loads(child.stdout.readline())["pids"]]
    finally:
        stop_child(child, 10)
        if child.stdout:
            child.stdout.close()


def measure(tool: Runqlat, workers: int, seconds: float) -> tuple[Snapshot, set[int]]:
    """Run-queue latency while `workers` busy processes run for `seconds`, and their PIDs."""
    with spinners(workers, seconds + 2) as pids:
        time.sleep(0.2)  # let them spin
        s0 = tool.snapshot()
        time.sleep(seconds)
        s1 = tool.snapshot()
    return s1.since(s0), set(pids)


def _case(name: str, workers: int, snap: Snapshot, opts: Options) -> dict[str, Any]:
    summary = Summary.of(snap.cells.values(), opts.unit)
    return {"case": name, "busy_processes": workers, **summary.stats(opts.unit_ns)}


def validate(
    opts: Options, seconds: float, workers: int | None = None, rounds: int = 3
) -> dict[str, Any]:
    """OFF: one busy process; ON: `workers` (default twice the CPUs) busy processes.
    `seconds` per case, taken in `rounds` alternating OFF/ON slices, so a burst of
    unrelated load on the host does not land on one case only. The check is on the
    busy processes' own waits (other load on the host moves both cases alike); the
    whole system is reported too."""
    ncpu = online_cpu_count()
    on_workers = workers or 2 * ncpu
    slice_s = seconds / rounds
    vopts = Options(**{**opts.__dict__, "per_process": True, "pids": []})
    with Runqlat(vopts) as tool:
        parts: dict[str, list[Snapshot]] = {k: [] for k in ("OFF", "ON", "OFF w", "ON w")}
        for _ in range(rounds):
            for name, w in (("OFF", 1), ("ON", on_workers)):
                snap, pids = measure(tool, w, slice_s)
                parts[name].append(snap)
                parts[name + " w"].append(snap.of_pids(pids))
        strategy = tool.strategy.name
    total = {k: sum(v[1:], v[0]) for k, v in parts.items()}
    cases = [
        _case("OFF", 1, total["OFF w"], opts),
        _case("ON", on_workers, total["ON w"], opts),
    ]
    system = [
        _case("OFF", 1, total["OFF"], opts),
        _case("ON", on_workers, total["ON"], opts),
    ]
    checks = {
        "p99_higher": cases[1]["p99_ns"] > cases[0]["p99_ns"],
        # The lone busy process of OFF may never be queued (an idle CPU is always
        # free for it): no wait is its lowest latency. ON's must be seen.
        "events_seen": cases[1]["count"] > 0,
    }
    return {
        "time": iso_now(),
        "strategy": strategy,
        "cpus": ncpu,
        "seconds": seconds,
        "unit": opts.unit,
        "cases": cases,
        "system": system,
        "checks": checks,
        "passed": all(checks.values()),
    }


def validate_text(report: dict[str, Any], out: TextIO) -> None:
    print(
        f"runqlat validate: {report['seconds']:g} s with 1 busy process (OFF), then "
        f"{report['seconds']:g} s with {report['cases'][1]['busy_processes']} on "
        f"{report['cpus']} CPUs (ON), alternating; strategy {report['strategy']}\n",
        file=out,
    )
    rows = [
        [
            c["case"],
            scope,
            str(c["busy_processes"]),
            str(c["count"]),
            f"{c['p50_ns'] / 1000:.1f}",
            f"{c['p99_ns'] / 1000:.1f}",
            f"{c['max_ns'] / 1000:.0f}",
        ]
        for scope, key in (("busy processes", "cases"), ("whole system", "system"))
        for c in report[key]
    ]
    print_table(["Case", "Tasks", "Busy", "Events", "p50(us)", "p99(us)", "max(us)"], rows, out)
    print_checks(report, out)
