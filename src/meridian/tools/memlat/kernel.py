"""memlat's kernel session: each page-fault exception timed per thread, from its
tracepoint (exceptions:page_fault_user/kernel) to its end, seen at the return of
handle_mm_fault (fexit, or a kretprobe) or as the page-faults-min/maj perf event.

One semantics under every strategy (bpf/memlat.bpf.c says it in full): a fault
finishes when the kernel accounts it as minor or major (mm_account_fault, as getrusage
and the perf events count); every other end is `failed` (SIGSEGV, SIGBUS, EFAULT
through the fixup), counted once: at the error return where the strategy sees it, else
at the thread's next fault or exit. get_user_pages() faults (no exception) are not
counted. The faults the kernel does not count as such (matched, started) are derived
from what it does count.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ...bpf import BpfObject, PerfEvent, Strategy, open_per_cpu
from ...export import Family
from ...latency import LatencySession
from .metrics import series
from .model import Key, Options, Snapshot

__all__ = ["PERF_PROGRAMS", "STRATEGIES", "Memlat"]

PERF_PROGRAMS = ("perf_fault_min", "perf_fault_maj")

ENTRIES_BTF = ("btf_fault_user", "btf_fault_kernel", "btf_thread_exit")
ENTRIES_TP = ("tp_fault_user", "tp_fault_kernel", "tp_thread_exit")

# Every strategy starts a fault at the exception tracepoint; they differ in the end.
STRATEGIES = (
    Strategy("fentry", (*ENTRIES_BTF, "fexit_fault"), ("fentry", "tp_btf")),
    Strategy("kprobe", (*ENTRIES_TP, "kprobe_fault", "kretprobe_fault"), ("kprobe", "tracepoint")),
    Strategy("tp_btf+perf", (*ENTRIES_BTF, *PERF_PROGRAMS), ("tp_btf", "perf_event")),
    Strategy("tracepoint+perf", (*ENTRIES_TP, *PERF_PROGRAMS), ("tracepoint", "perf_event")),
)


class Memlat(LatencySession[Options, Key]):
    """The loaded programs; `snapshot()` reads the maps, `metrics()` too, for export."""

    name = "memlat"
    OBJECT = "memlat"  # bpfobj/memlat.bpf.o
    STRATEGIES = STRATEGIES

    def settings(self) -> dict[str, Any]:
        return {"tail_ns": self.opts.tail_ns}

    def attach(self, obj: BpfObject) -> None:
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
