"""runqlat's reports: one histogram, or one per process with -P (busiest first), each
with a line of count, average, p50, p99 and max."""

from __future__ import annotations

from typing import Any, TextIO

from ...latency import Group, Summary, print_groups, print_lost, report_head
from .model import Options, Snapshot

__all__ = ["LOST", "groups", "report_json", "report_text"]

# Why a wait is not in the histograms: the histogram map was full; with -p under the
# tracepoint strategy, a new thread of a traced process found the PID set full.
LOST = ("hists_full", "pids_full")


def groups(snap: Snapshot, opts: Options) -> list[Group[Summary]]:
    if not opts.per_process:
        if not snap.cells:
            return []
        return [Group(None, Summary.of(snap.cells.values(), opts.unit), {})]
    return [
        Group(f"pid = {pid} {comm}", Summary.of([c], opts.unit), {"pid": pid, "comm": comm})
        for (pid, comm), c in sorted(snap.cells.items(), key=lambda kv: -kv[1].count)
    ]


def report_json(snap: Snapshot, opts: Options, strategy: str = "") -> dict[str, Any]:
    return {
        **report_head(snap, opts, strategy, groups(snap, opts), lambda s: s.stats(opts.unit_ns)),
        "counters": snap.counters,
    }


def _line(s: Summary, opts: Options) -> str:
    d = s.stats(opts.unit_ns)
    return (
        f"count {d['count']}, avg {d['avg_ns'] / 1000:.1f} us, p50 {d['p50_ns'] / 1000:.1f} us,"
        f" p99 {d['p99_ns'] / 1000:.1f} us, max {d['max_ns'] / 1000:.0f} us"
    )


def report_text(snap: Snapshot, opts: Options, out: TextIO) -> None:
    print_groups(
        groups(snap, opts),
        opts,
        out,
        "no tasks waited on a run queue in this interval",
        lambda s: _line(s, opts),
    )
    print_lost({k: snap.counters.get(k, 0) for k in LOST}, out)
