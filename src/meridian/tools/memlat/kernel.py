"""memlat's kernel session: each page-fault exception timed per thread, from its
tracepoint (exceptions:page_fault_user/kernel) to its end, seen at the return of
handle_mm_fault (fexit, or a kretprobe) or as the page-faults-min/maj perf event; or,
with --from handle_mm_fault, each call of handle_mm_fault from its entry (fentry or a
kprobe) to its return, whoever the caller.

One semantics under every strategy (bpf/memlat.bpf.c says it in full): a fault
finishes when the kernel accounts it as minor or major (mm_account_fault, as getrusage
and the perf events count); every other end is `failed` (SIGSEGV, SIGBUS, EFAULT
through the fixup), counted once: at the error return where the strategy sees it, else
at the thread's next fault or exit. get_user_pages() faults (no exception) are not
counted (they are with --from handle_mm_fault; a call nested in another is `nested`).
The faults the kernel does not count as such (matched, started) are derived from what
it does count. -p: a hash set of PIDs, written before attach.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ...bpf import BpfObject, PerfEvent, Strategy, choose, open_per_cpu
from ...errors import MeridianError, NotSupported, UsageError
from ...export import Family
from ...latency import LatencySession
from .metrics import series
from .model import STARTS, Key, Options, Snapshot

__all__ = [
    "FROM_EXCEPTION",
    "FROM_HANDLE_MM_FAULT",
    "PERF_PROGRAMS",
    "STRATEGIES",
    "Memlat",
    "choose_strategy",
    "start_of",
]

PERF_PROGRAMS = ("perf_fault_min", "perf_fault_maj")

ENTRIES_BTF = ("btf_fault_user", "btf_fault_kernel", "btf_thread_exit")
ENTRIES_TP = ("tp_fault_user", "tp_fault_kernel", "tp_thread_exit")

# --from exception (the default): every strategy starts a fault at the exception
# tracepoint; they differ in the end.
FROM_EXCEPTION = (
    Strategy("fentry", (*ENTRIES_BTF, "fexit_fault"), ("fentry", "tp_btf")),
    Strategy("kprobe", (*ENTRIES_TP, "kprobe_fault", "kretprobe_fault"), ("kprobe", "tracepoint")),
    Strategy("tp_btf+perf", (*ENTRIES_BTF, *PERF_PROGRAMS), ("tp_btf", "perf_event")),
    Strategy("tracepoint+perf", (*ENTRIES_TP, *PERF_PROGRAMS), ("tracepoint", "perf_event")),
)
# --from handle_mm_fault: its entry and return (a thread's exit closes a retried fault
# given up); nothing else sees the entry of every call.
FROM_HANDLE_MM_FAULT = (
    Strategy("hmf_fentry", ("fentry_hmf", "fexit_hmf", "btf_thread_exit"), ("fentry", "tp_btf")),
    Strategy(
        "hmf_kprobe", ("kprobe_hmf", "kretprobe_hmf", "tp_thread_exit"), ("kprobe", "tracepoint")
    ),
)
# Every strategy, best first; the default start's first, so that the first the kernel
# allows (doctor's) is the one `meridian memlat` takes.
STRATEGIES = FROM_EXCEPTION + FROM_HANDLE_MM_FAULT
_BY_START = dict(zip(STARTS, (FROM_EXCEPTION, FROM_HANDLE_MM_FAULT), strict=True))


def start_of(strategy: str) -> str | None:
    """The start point (--from) strategy `strategy` times from, None for no strategy."""
    return next((st for st, group in _BY_START.items() for s in group if s.name == strategy), None)


def choose_strategy(start: str, forced: str | None = None) -> Strategy:
    """The strategy for --from `start` (the one forced, or the first this kernel
    allows). A forced one of the other start point is bad input; --from
    handle_mm_fault on a kernel without fentry and kprobes is refused in one line that
    says why and what to do."""
    if start not in _BY_START:
        raise UsageError(f"--from takes one of {', '.join(STARTS)}, got {start!r}")
    other = start_of(forced) if forced else None
    if other is not None and other != start:
        raise UsageError(
            f"--strategy {forced} times from {other}, not {start}: "
            f"use --from {other}, or a strategy of "
            f"{', '.join(s.name for s in _BY_START[start])}"
        )
    group = _BY_START[start]
    try:
        return choose(group, forced)
    except MeridianError:
        if start != "handle_mm_fault" or forced:
            raise
    why = []
    for s in group:
        p = next(iter(s.missing()), None)
        if p is not None:
            why.append(f"{s.name}: {p.feature} {p.detail}")
    raise NotSupported(
        "--from handle_mm_fault",
        "it hooks the entry and return of handle_mm_fault, which needs fentry/fexit or "
        f"kprobes, and this kernel allows neither ({'; '.join(why)})",
        "run without --from (--from exception, the default, times from the page-fault "
        "exception with tracepoints and perf events), or on a kernel that allows fentry or "
        "kprobes ('meridian doctor' says why this one does not)",
    )


class Memlat(LatencySession[Options, Key]):
    """The loaded programs; `snapshot()` reads the maps, `metrics()` too, for export."""

    name = "memlat"
    OBJECT = "memlat"  # bpfobj/memlat.bpf.o
    STRATEGIES = STRATEGIES

    def choose_strategy(self) -> Strategy:
        """Among the strategies of the start point (--from) only."""
        return choose_strategy(self.opts.start, self.opts.strategy)

    def settings(self) -> dict[str, Any]:
        return {"tail_ns": self.opts.tail_ns}

    def setup(self, obj: BpfObject) -> None:
        obj.resize("pids", max(1, len(self.opts.pids)))
        super().setup(obj)

    def attach(self, obj: BpfObject) -> None:
        # -p: the set, complete before any program runs (its change count stays 0)
        for pid in self.opts.pids:
            obj.maps["pids"].update(np.uint32(pid), np.uint8(1))
        obj.attach([p for p in self.strategy.programs if p not in PERF_PROGRAMS])
        if PERF_PROGRAMS[0] in self.strategy.programs:
            for prog, event in zip(
                PERF_PROGRAMS,
                (PerfEvent.PAGE_FAULTS_MIN, PerfEvent.PAGE_FAULTS_MAJ),
                strict=True,
            ):
                _attach_per_cpu(obj, prog, event)

    def hist_key(self, key: Any) -> Key:
        return (int(key["pid"]), int(key["kind"]), bytes(key["comm"]).decode(errors="replace"))

    def total_key(self, index: int) -> Key:
        return (0, index, "")  # totals: one per kind

    def snapshot(self) -> Snapshot:
        assert self.obj is not None
        cells = self.cells()
        counters = self.counters()
        # The kernel counts neither: every matched fault is in a slot or in
        # hists_full, the open ones hold a start time, the rest failed or were evicted.
        counters["matched"] = sum(c.count for c in cells.values()) + counters["hists_full"]
        _, starts = self.obj.maps["starts"].items()
        inflight = int((starts["ts_ns"] != 0).sum()) if len(starts) else 0
        ended = ("matched", "failed", "evicted")
        counters["started"] = inflight + sum(counters[k] for k in ended)
        return Snapshot(time.monotonic(), cells, counters, inflight, 0.0, self.opts.unit_ns)

    def metrics(self) -> list[Family]:
        return series(self.snapshot(), self.opts)


def _attach_per_cpu(obj: BpfObject, prog: str, event: tuple[int, int]) -> None:
    """One perf event per CPU, sample_period 1: every fault runs the program."""
    fds = open_per_cpu(event, sample_period=1)
    try:
        while fds:
            obj.programs[prog].attach_perf_event(fds[0])  # the link owns the fd now
            fds.pop(0)
    finally:
        for fd in fds:
            os.close(fd)
