"""memlat's `validate`, the on/off experiment (docs/requirements/memlat-runqlat.md,
"Validation"): idle (OFF), then the built-in page-touch workload (ON), in one session.
It passes (exit status 0) when the ON case has more faults and more tail events than
the OFF case, and the faults it attributes to the workload are the pages it touched,
within 5% (`verdict`); else exit status 1."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from ...latency import print_checks
from ...output import iso_now, print_table
from .kernel import Memlat
from .model import Options, Summary

__all__ = ["high_buckets", "page_toucher", "run_toucher", "validate", "validate_text", "verdict"]


@dataclass
class Case:
    name: str
    summary: Summary
    seconds: float
    workload_faults: int = 0
    pages: int = 0


@contextlib.contextmanager
def page_toucher(megabytes: int, seconds: float | None = None) -> Iterator[subprocess.Popen[str]]:
    """The built-in page-touch workload in a child, started and waiting: write a line to
    its stdin to start it; its last stdout line is JSON with the pages it touched."""
    cmd = [sys.executable, "-m", "meridian.workloads", "page-touch", "--mb", str(megabytes)]
    cmd += ["--wait"] + (["--seconds", str(seconds)] if seconds else ["--rounds", "1"])
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("page-touch workload did not start")
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        for f in (child.stdin, child.stdout):
            if f:
                f.close()


def run_toucher(child: subprocess.Popen[str]) -> dict[str, Any]:
    """Start a waiting page-toucher and wait for its result."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    result: dict[str, Any] = json.loads(child.stdout.readline())
    child.wait(600)
    return result


def verdict(
    off_faults: int, off_tail: int, on_faults: int, on_tail: int, workload_faults: int, pages: int
) -> dict[str, bool]:
    """The experiment's checks, each True when passed; it passes when all do. The tail
    must grow: as many tail events ON as OFF is a failure (the requirement is that
    the tail responds to the workload: docs/requirements/memlat-runqlat.md, "Expected
    results")."""
    err = abs(workload_faults - pages) / pages if pages else 1.0
    return {
        "more_faults": on_faults > off_faults,
        "more_tail_events": on_tail > off_tail,
        "workload_faults_within_5pct": err <= 0.05,
    }


def validate(opts: Options, seconds: float, megabytes: int) -> tuple[bool, dict[str, Any]]:
    """OFF (idle) then ON (page-touch workload) for `seconds` each, in one session."""
    vopts = Options(**{**opts.__dict__, "per_process": True, "pids": []})
    with Memlat(vopts) as tool, page_toucher(megabytes, seconds) as child:
        s0 = tool.snapshot()
        time.sleep(seconds)
        s1 = tool.snapshot()
        result = run_toucher(child)
        s2 = tool.snapshot()
        strategy = tool.strategy.name
    off, on = s1.since(s0), s2.since(s1)
    pid, pages = int(result["pid"]), int(result["pages"])
    cases = [
        Case("OFF", off.total(vopts.unit), off.seconds),
        Case("ON", on.total(vopts.unit), on.seconds, on.total(vopts.unit, pid=pid).count, pages),
    ]
    c_off, c_on = cases
    err = abs(c_on.workload_faults - pages) / pages if pages else 1.0
    checks = verdict(
        c_off.summary.count,
        c_off.summary.tail,
        c_on.summary.count,
        c_on.summary.tail,
        c_on.workload_faults,
        pages,
    )
    passed = all(checks.values())
    report: dict[str, Any] = {
        "time": iso_now(),
        "strategy": strategy,
        "from": vopts.start,
        "unit": vopts.unit,
        "unit_ns": vopts.unit_ns,
        "seconds": seconds,
        "tail_threshold_us": vopts.threshold_us,
        "workload": {
            "pid": pid,
            "pages_touched": pages,
            "faults": c_on.workload_faults,
            "error": round(err, 6),
        },
        "cases": [
            {"case": c.name, "seconds": round(c.seconds, 3), **c.summary.as_dict(vopts)}
            for c in cases
        ],
        "checks": checks,
        "passed": passed,
        "lost": {c: (off if c == "OFF" else on).lost() for c in ("OFF", "ON")},
    }
    return passed, report


def high_buckets(report: dict[str, Any]) -> list[tuple[int, int, list[int]]]:
    """The log2 buckets at or above the tail threshold that either case has: (low,
    high, the count of each case), lowest first."""
    thr = report["tail_threshold_us"] * 1000 / report.get("unit_ns", 1000)
    counts: dict[tuple[int, int], list[int]] = {}
    cases = report["cases"]
    for i, c in enumerate(cases):
        for b in c["hist"]["buckets"]:
            if b["low"] >= thr:
                counts.setdefault((b["low"], b["high"]), [0] * len(cases))[i] = b["count"]
    return [(lo, hi, n) for (lo, hi), n in sorted(counts.items())]


def validate_text(report: dict[str, Any], out: TextIO) -> None:
    u = "us"
    start = report.get("from", "exception")
    print(
        f"memlat validate: {report['seconds']:g} s idle (OFF), then {report['seconds']:g} s of "
        f"the page-touch workload (ON); from {start}, strategy {report['strategy']}\n",
        file=out,
    )
    rows = [
        [
            c["case"],
            str(c["count"]),
            str(c["tail_count"]),
            f"{100 * c['tail_share']:.2f}%",
            f"{c['p50_ns'] / 1000:.1f}",
            f"{c['p99_ns'] / 1000:.1f}",
            f"{c['max_ns'] / 1000:.0f}",
        ]
        for c in report["cases"]
    ]
    thr = f"{report['tail_threshold_us']:g}{u}"
    print_table(
        [
            "Case",
            "Total faults",
            f"Tail events (>= {thr})",
            "Tail share",
            f"p50({u})",
            f"p99({u})",
            f"max({u})",
        ],
        rows,
        out,
    )
    high = high_buckets(report)
    if high:
        print(f"\nbuckets at or above the tail threshold ({report['unit']}):", file=out)
        names = [c["case"] for c in report["cases"]]
        print_table(
            ["Bucket", *names], [[f"{lo} -> {hi}", *map(str, n)] for lo, hi, n in high], out
        )
    w = report["workload"]
    print(
        f"\nworkload pid {w['pid']}: {w['pages_touched']} pages touched, {w['faults']} faults "
        f"attributed ({100 * w['error']:.2f}% off)",
        file=out,
    )
    print_checks(report, out)
