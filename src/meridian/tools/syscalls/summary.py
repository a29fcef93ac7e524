"""`meridian syscalls -c`: calls, errors and time per syscall, counted from the rows the
plain views would print (paired by the Aggregator, merged by the CompactLog, filtered),
as a table in strace -c's form or one JSON object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .event import Syscall
from .numbers import BY_NAME

__all__ = ["CallCounts", "SyscallCount", "counts_json", "counts_table", "losses"]

# What makes counts short: its name in JSON, the capture's counter and what it means.
LOSSES = {
    "ring_buffer_full": ("lost", "events lost (ring buffer full)"),
    "pids_full": ("pids_full", "child processes not followed (PID set full)"),
    "bad_records": ("bad_records", "bad records"),
    "not_shown": ("not_shown", "events not counted (view too slow; in the recording)"),
}
# Calls that return, but whose end is never seen (event.NO_RETURN): counted at the
# start, as strace counts them, with no time and no error.
COUNTED_AT_START = frozenset({"rt_sigreturn"})
RULE = "------ ----------- ----------- --------- --------- ----------------"


@dataclass
class SyscallCount:
    name: str
    calls: int = 0
    errors: int = 0
    time_ns: int = 0  # the sum of the calls' durations, start to end

    @property
    def avg_ns(self) -> int:
        return self.time_ns // self.calls if self.calls else 0


class CallCounts:
    """Calls counted per syscall as strace -c counts them: a call counts when it
    returns, so exit, exit_group and the calls still in flight at the end do not; an
    error is a result from -4095 to -1. Its start must have been seen too (as strace
    sees the entry): a forked child's return from fork or clone is not a call of its
    own, and an end whose start was lost has no duration (the summary line counts
    those ends). Time is wall-clock latency, start to end (what strace -c -w sums)."""

    def __init__(self) -> None:
        self.by_name: dict[str, SyscallCount] = {}

    def add(self, sc: Syscall) -> None:
        """A row of the compact log: a start merged with its end, an open start, or
        an end whose start was not seen."""
        returned = sc.is_start and sc.have_result
        if not (returned or (sc.is_start and sc.name in COUNTED_AT_START)):
            return
        count = self.by_name.get(sc.name)
        if count is None:
            count = self.by_name[sc.name] = SyscallCount(sc.name)
        count.calls += 1
        count.errors += sc.failed
        count.time_ns += max(sc.duration_ns, 0)

    def rows(self) -> list[SyscallCount]:
        """Most time first, as strace -c sorts; ties in syscall number order, as
        strace's table lists them."""
        return sorted(
            self.by_name.values(),
            key=lambda c: (-c.time_ns, BY_NAME.get(c.name, len(BY_NAME)), c.name),
        )

    def total(self) -> SyscallCount:
        total = SyscallCount("total")
        for c in self.by_name.values():
            total.calls += c.calls
            total.errors += c.errors
            total.time_ns += c.time_ns
        return total


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def _line(c: SyscallCount, percent: float) -> str:
    errors = str(c.errors) if c.errors else ""  # strace leaves a zero blank
    return (
        f"{percent:6.2f} {c.time_ns / 1e9:11.6f} {c.avg_ns // 1000:11d} "
        f"{c.calls:9d} {errors:>9} {c.name}"
    )


def losses(counters: dict[str, int] | None, not_shown: int) -> dict[str, int]:
    """What the counts may miss, every kind (0: none); {} for a replay, whose capture's
    losses are not known here."""
    if counters is None:
        return {}
    found = {name: counters.get(counter, 0) for name, (counter, _) in LOSSES.items()}
    found["not_shown"] = not_shown  # the view's backlog, not a kernel counter
    return found


def counts_table(counts: CallCounts, lost: dict[str, int]) -> str:
    """strace -c's table, then a line for each kind of loss that makes it short."""
    total = counts.total()
    lines = ["% time     seconds  usecs/call     calls    errors syscall", RULE]
    lines += [_line(c, _percent(c.time_ns, total.time_ns)) for c in counts.rows()]
    lines += [RULE, _line(total, 100.0)]
    lines += [
        f"incomplete: {n} {LOSSES[name][1]}: these counts are short"
        for name, n in lost.items()
        if n
    ]
    return "\n".join(lines) + "\n"


def _count_json(c: SyscallCount, whole: int) -> dict[str, Any]:
    return {
        "syscall": c.name,
        "calls": c.calls,
        "errors": c.errors,
        "time_ns": c.time_ns,
        "avg_ns": c.avg_ns,
        "time_percent": round(_percent(c.time_ns, whole), 2),
    }


def counts_json(counts: CallCounts, lost: dict[str, int]) -> dict[str, Any]:
    """The table as one object; `lost` says what the counts miss (all 0: nothing)."""
    total = counts.total()
    rows = [_count_json(c, total.time_ns) for c in counts.rows()]
    return {"syscalls": rows, "total": _count_json(total, total.time_ns), "lost": lost}
