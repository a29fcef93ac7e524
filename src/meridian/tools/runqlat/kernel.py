"""runqlat's kernel session: a wait starts at a wake-up (sched_wakeup, _new) or when a
task is preempted still runnable, and ends when sched_switch puts it on a CPU.

-p is a set of processes in the kernel's `pids` hash, each id with its process: tp_btf
sees task_structs, so the set holds the tgids. The plain tracepoints carry thread IDs
only, so there it holds every thread of the listed processes (/proc/PID/task), and
FOLLOW keeps it so while tracing: tp_fork adds a new thread of a thread in the set,
tp_free drops a freed thread (its ID may be reused). The set is written, and the
follow programs attached, before the programs that ask it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ...bpf import BpfObject, Strategy
from ...export import Family
from ...latency import LatencySession
from .metrics import series
from .model import Key, Options, Snapshot

__all__ = ["FOLLOW", "STRATEGIES", "Runqlat", "threads"]

STRATEGIES = (
    Strategy("tp_btf", ("btf_wakeup", "btf_wakeup_new", "btf_switch"), ("tp_btf",)),
    Strategy("tracepoint", ("tp_wakeup", "tp_wakeup_new", "tp_switch"), ("tracepoint",)),
)
FOLLOW = ("tp_fork", "tp_free")  # the tracepoint strategy with -p: the set's threads
RESCANS = 10  # /proc reads after FOLLOW is attached, until no thread is new


def threads(pid: int, proc_root: str = "/proc") -> list[int]:
    """The thread IDs of process `pid` now (none once it has exited)."""
    try:
        return [int(t.name) for t in Path(f"{proc_root}/{pid}/task").iterdir()]
    except OSError:
        return []


class Runqlat(LatencySession[Options, Key]):
    """The loaded programs; `snapshot()` reads the maps, `metrics()` too, for export."""

    name = "runqlat"
    OBJECT = "runqlat"  # bpfobj/runqlat.bpf.o
    STRATEGIES = STRATEGIES

    def __init__(self, opts: Options) -> None:
        super().__init__(opts)
        self.by_tid = bool(opts.pids) and self.strategy.name == "tracepoint"
        if self.by_tid:
            self.selected += FOLLOW
        self.members: dict[int, int] = {}  # what user space put in the set: id -> tgid

    def settings(self) -> dict[str, Any]:
        return {"pids_are_tids": self.by_tid}

    def _scan(self) -> dict[int, int]:
        """The set's ids now: each listed process's threads (tracepoints), or itself."""
        if not self.by_tid:
            return {pid: pid for pid in self.opts.pids}
        return {tid: pid for pid in self.opts.pids for tid in threads(pid)}

    def setup(self, obj: BpfObject) -> None:
        self.members = self._scan()
        floor = 8192 if self.by_tid else 1024  # room for the threads they start
        obj.resize("pids", max(floor, 2 * len(self.members)))
        super().setup(obj)

    def attach(self, obj: BpfObject) -> None:
        pids = obj.maps["pids"]
        for key, tgid in self.members.items():
            pids.update(np.uint32(key), np.uint32(tgid))
        if not self.by_tid:
            obj.attach()
            return
        obj.attach(FOLLOW)  # from now on the kernel adds new threads, drops freed ones
        for _ in range(RESCANS):  # the threads started before that
            new = {t: p for t, p in self._scan().items() if t not in self.members}
            if not new:
                break
            for tid, tgid in new.items():
                pids.update(np.uint32(tid), np.uint32(tgid))
            self.members.update(new)
        for tid, tgid in list(self.members.items()):  # gone before tp_free was there
            if not Path(f"/proc/{tgid}/task/{tid}").exists():
                pids.delete(np.uint32(tid))
                del self.members[tid]
        obj.attach(self.strategy.programs)

    def hist_key(self, key: Any) -> Key:
        return (int(key["pid"]), bytes(key["comm"]).decode(errors="replace"))

    def total_key(self, index: int) -> Key:
        return (0, "")  # totals: the one histogram

    def snapshot(self) -> Snapshot:
        return Snapshot(time.monotonic(), self.cells(), self.counters(), unit_ns=self.opts.unit_ns)

    def metrics(self) -> list[Family]:
        return series(self.snapshot(), self.opts)
