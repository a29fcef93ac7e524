"""runqlat's kernel session: a wait starts at a wake-up (sched_wakeup, _new) or when a
task is preempted still runnable, and ends when sched_switch puts it on a CPU."""

from __future__ import annotations

import time
from typing import Any

from ...bpf import Strategy
from ...export import Family
from ...latency import LatencySession
from .metrics import series
from .model import Key, Options, Snapshot

__all__ = ["STRATEGIES", "Runqlat"]

STRATEGIES = (
    Strategy("tp_btf", ("btf_wakeup", "btf_wakeup_new", "btf_switch"), ("tp_btf",)),
    Strategy("tracepoint", ("tp_wakeup", "tp_wakeup_new", "tp_switch"), ("tracepoint",)),
)


class Runqlat(LatencySession[Options, Key]):
    """The loaded programs; `snapshot()` reads the maps, `metrics()` too, for export."""

    name = "runqlat"
    OBJECT = "runqlat"  # bpfobj/runqlat.bpf.o
    STRATEGIES = STRATEGIES

    def hist_key(self, key: Any) -> Key:
        return (int(key["pid"]), bytes(key["comm"]).decode(errors="replace"))

    def total_key(self, index: int) -> Key:
        return (0, "")  # totals: the one histogram

    def snapshot(self) -> Snapshot:
        return Snapshot(time.monotonic(), self.cells(), self.counters(), unit_ns=self.opts.unit_ns)

    def metrics(self) -> list[Family]:
        return series(self.snapshot(), self.opts)
