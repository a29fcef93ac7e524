"""The frame of a latency tool's reports: one histogram per group (a tool decides the
groups and the line under each), the JSON report's common fields, and the line of
what is not in the histograms."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TextIO, TypeVar

from ..output import iso_now
from .model import LatencyOptions, Snapshot, Summary

__all__ = ["Group", "print_checks", "print_groups", "print_lost", "report_head"]


T = TypeVar("T", bound=Summary)


@dataclass(frozen=True)
class Group(Generic[T]):
    """One histogram of a report."""

    head: str | None  # the line above it (None: an empty line)
    summary: T
    labels: dict[str, Any]  # what tells it apart in JSON


def report_head(
    snap: Snapshot[Any],
    opts: LatencyOptions,
    strategy: str,
    groups: list[Group[T]],
    stats: Callable[[T], dict[str, Any]],
) -> dict[str, Any]:
    """The JSON report's time, interval, unit and strategy, and each group's labels
    with its `stats`; a tool adds its totals and losses."""
    return {
        "time": iso_now(),
        "interval_s": round(snap.seconds, 6),
        "unit": opts.unit,
        "strategy": strategy,
        "histograms": [{**g.labels, **stats(g.summary)} for g in groups],
    }


def print_groups(
    groups: list[Group[T]],
    opts: LatencyOptions,
    out: TextIO,
    nothing: str,
    line: Callable[[T], str],
) -> None:
    """The text report's histograms (with -T a time first), each with its `line`, or
    `nothing` when there are none."""
    if opts.timestamps:
        print(time.strftime("%H:%M:%S"), file=out)
    if not groups:
        print(nothing, file=out)
    for g in groups:
        if g.head is None:
            print(file=out)
        else:
            print(f"\n{g.head}", file=out)
        print(g.summary.hist.render(), file=out)
        print(line(g.summary), file=out)


def print_lost(lost: Mapping[str, int], out: TextIO) -> None:
    """`not in the histograms: reason=n, ...` for the reasons that count any."""
    shown = {k: v for k, v in lost.items() if v}
    if shown:
        print("not in the histograms: " + ", ".join(f"{k}={v}" for k, v in shown.items()), file=out)


def print_checks(report: Mapping[str, Any], out: TextIO) -> None:
    """A `validate` report's checks, PASS or FAIL each, and the verdict."""
    for name, ok in report["checks"].items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name.replace('_', ' ')}", file=out)
    print(
        "\nthe metric responds to the workload"
        if report["passed"]
        else "\nFAILED: the metric did not respond as expected",
        file=out,
    )
