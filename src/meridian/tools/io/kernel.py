"""meridian io's kernel side: the `io` BPF object, its strategies and its maps.

The kernel decides everything: regular files only (through the task's fd table), the
PID, comm and cgroup filters, cached or disk per operation (page-cache insertions, bios
and I/O wait of the thread while the operation is in flight), and exact per-(process,
op, cached) aggregates with a log2 latency histogram. Events come through a ring buffer
as numpy columns (`events`); the aggregates are read whole (`stats`, `disk_stats`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ...bpf import BpfObject, RingBuffer, Strategy, choose, hook_exists
from ...containers import Containers
from ...proc import CLOCK_TICK_NS, thread_slots
from ...session import Session
from .names import NameCache
from .options import Options
from .pid_table import ProcessAlive
from .stats_cache import CACHE_WAYS, entry_keys, exited, live, merge

__all__ = [
    "BLOCK",
    "STRATEGIES",
    "SYSCALLS",
    "URING",
    "WRITEBACK",
    "FileIO",
    "missing_hooks",
    "signals",
]

SYSCALLS: tuple[str, ...] = ("read", "pread64", "readv", "preadv", "preadv2")
SYSCALLS += ("write", "pwrite64", "writev", "pwritev", "pwritev2")
SYSCALLS += ("sendfile64", "copy_file_range")  # a read of the source, a write of the target
# The disk signals (page-cache insertions, bios, the I/O wait) each strategy loads: as
# raw tracepoints with BTF, or for the tracepoint strategy as tracepoints, which read
# tracefs. The I/O wait is tp_btf/sched_switch in both.
BTF_SIGNALS = ("btf_page_added", "btf_bio_queue", "tp_sched_switch")
TRACEPOINT_SIGNALS = ("tp_page_added", "tp_bio_queue", "tp_sched_switch")
STRATEGIES = (
    Strategy(
        "fentry",
        tuple(f"{k}_{s}" for s in SYSCALLS for k in ("fentry", "fexit")),  # each syscall's own
        ("fentry", "tp_btf"),
    ),
    Strategy(
        "kprobe",
        tuple(f"{k}_{s}" for s in SYSCALLS for k in ("ks", "kr")),
        ("kprobe", "tp_btf"),
    ),
    # Raw syscalls before the syscalls: tracepoints. Both put every syscall of every
    # task on the traced slow path, but the tracepoints then copy the arguments into a
    # perf record before the program runs (io_bench.py: 0.60 against 0.50 here).
    Strategy("tp_btf", ("raw_enter", "raw_exit"), ("tp_btf",)),
    Strategy(
        "tracepoint",
        tuple(f"tp_{d}_{s}" for s in SYSCALLS for d in ("enter", "exit")),
        ("tracepoint", "tp_btf"),
    ),
)


def signals(strategy: Strategy) -> tuple[str, ...]:
    """The disk-signal programs `strategy` loads beside its own."""
    return TRACEPOINT_SIGNALS if strategy.name == "tracepoint" else BTF_SIGNALS


# Block requests by submitting process and their device latency (block_io_start: 6.5+).
BLOCK = ("tp_io_start", "tp_rq_issue", "tp_rq_complete")
# Who dirtied each inode's pages, so its writeback is charged to it (io_writeback.bpf.h).
WRITEBACK = ("tp_dirty_folio",)
# io_uring reads and writes (io_uring.bpf.h), each program with its tracepoint-strategy
# twin: the submission (io_uring_submit_req; io_uring_submit_sqe before 6.4), the
# completion, and the hand-off to an io-wq worker (optional: without it a worker's disk
# I/O is not seen, so what it read is counted as cached).
URING_SUBMIT = ("uring_submit", "uring_submit_sqe")
URING = ("uring_complete", "uring_async")
URING_MISSING = (
    "io_uring reads and writes are not counted: this kernel has no io_uring_submit_req "
    "(6.4+) or io_uring_submit_sqe tracepoint, or no io_uring_complete"
)
# What io counts only where the kernel has the hooks, for doctor: each entry's hooks
# are groups of raw tracepoints, one of each group needed.
OPTIONAL_HOOKS = {
    "io_uring reads and writes": (
        ("io_uring_submit_req", "io_uring_submit_sqe"),
        ("io_uring_complete",),
    ),
    "block requests by submitting process": (("block_io_start",), ("block_rq_complete",)),
}


def missing_hooks() -> dict[str, str]:
    """What io does not count on this kernel (OPTIONAL_HOOKS), with the hooks it lacks."""
    out = {}
    for what, groups in OPTIONAL_HOOKS.items():
        lacking = [g for g in groups if not any(hook_exists(f"tp_btf/{h}") for h in g)]
        if lacking:
            out[what] = " or ".join(h for g in lacking for h in g)
    return out


def uring_programs(obj: BpfObject, strategy: Strategy) -> list[str]:
    """The io_uring programs `strategy` loads where this kernel has their hooks: none
    without a submission and a completion tracepoint."""
    prefix = "tp_" if strategy.name == "tracepoint" else "btf_"
    have = [
        p
        for p in (prefix + n for n in (*URING_SUBMIT, *URING))
        if hook_exists(obj.programs[p].section)
    ]
    submit = [p for p in have if p.removeprefix(prefix) in URING_SUBMIT][:1]
    if not submit or prefix + "uring_complete" not in have:
        return []
    return submit + [p for p in have if p.removeprefix(prefix) in URING]


class FileIO(Session):
    """The loaded programs: `stats()` reads the exact aggregates, `events()` the stream."""

    OBJECT = "io"
    BAD_RECORDS = "events_bad"  # counters(): ring records of an unexpected size

    def __init__(self, opts: Options, cache_ways: int = CACHE_WAYS) -> None:
        self.opts = opts
        self.cache_ways = cache_ways  # stats_cache.py; 0: none
        self.strategy = choose(STRATEGIES, opts.strategy)
        self.selected: list[str] = []
        self.uring = False  # io_uring's reads and writes are counted (URING_MISSING)
        self.containers = Containers.on_host(opts.host_root)  # by cgroup id
        self.names = NameCache(forget=self._forget)  # the kernel's paths, per inode
        self.names_ring: RingBuffer | None = None
        self.alive = ProcessAlive()
        self.folded_idx = np.zeros(0, dtype=np.uint32)  # _fold_exited(): entries kept here
        self.folded: np.ndarray[Any, Any] | None = None

    def programs(self, obj: BpfObject) -> list[str]:
        """The strategy's programs whose hooks this kernel has, plus the disk signals."""
        progs = [p for p in self.strategy.programs if hook_exists(obj.programs[p].section)]
        block = [p for p in BLOCK if hook_exists(obj.programs[p].section)]
        disk = list(signals(self.strategy)) + uring_programs(obj, self.strategy)
        if len(block) != len(BLOCK):
            return progs + disk
        wb = [p for p in WRITEBACK if hook_exists(obj.programs[p].section)]
        return progs + disk + block + (wb if len(wb) == len(WRITEBACK) else [])

    def setup(self, obj: BpfObject) -> None:
        o = self.opts
        slots = o.thread_slots or thread_slots()
        self.selected = self.programs(obj)
        self.uring = any("uring_complete" in p for p in self.selected)
        obj.set_rodata(
            {
                "filter_pid": bool(o.pids),
                "filter_comm": bool(o.comms),
                "filter_cgroup": o.cgroup[0] if o.cgroup else 0,
                "cgroup_level": o.cgroup[1] if o.cgroup else 0,
                "self_pid": os.getpid(),
                "inflight_mask": slots - 1,
                "events_on": not o.no_events,
                "disk_only": o.disk_only,
                "min_latency_ns": o.min_latency_ns,
                "wakeup_bytes": obj.maps["events"].max_entries // 4,
                "tick_ns": CLOCK_TICK_NS,
                "writeback_on": set(WRITEBACK) <= set(self.selected),
                "cache_ways": self.cache_ways,
            }
        )
        entries = max(1, obj.maps["stats"].ncpus * self.cache_ways * 4)  # per possible CPU
        obj.resize("stats_cache", entries)
        obj.resize("stats_retired", entries)
        obj.resize("inflight", slots)
        obj.resize("stats", o.max_pids)
        obj.resize("disk_io", o.max_pids)
        obj.resize("writeback", o.max_pids)
        obj.select(self.selected)
        obj.load()
        for pid in o.pids:
            obj.maps["pids"].update(np.uint32(pid), np.uint8(1))
        for comm in o.comms:
            obj.maps["comms"].update(comm.encode()[:15].ljust(16, b"\0"), np.uint8(1))
        obj.attach()
        if not o.no_events:
            assert obj.btf is not None
            self.ring = RingBuffer.of_map(obj.maps["events"], obj.btf.struct_dtype("fileio_event"))
            names = obj.btf.struct_dtype("fileio_name")
            self.names_ring = RingBuffer.of_map(obj.maps["names"], names)

    def _items(self, name: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        assert self.obj is not None
        keys, vals = self.obj.maps[name].items()
        return keys, vals

    def stats(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Keys and per-CPU values of the aggregates (model.summarize sums them): the
        hash's, and the per-CPU cache's live entries as more columns (stats_cache.py)."""
        keys, vals = self._items("stats")
        idx, entries = self._fold_exited(*self.cache_entries())
        if self.folded is not None and len(self.folded):
            idx = np.concatenate([idx, self.folded_idx])
            entries = np.concatenate([entries, self.folded])
        return merge(keys, vals, idx, entries, self.cache_ways)

    def _fold_exited(
        self, idx: np.ndarray[Any, Any], entries: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The live entries (`idx`, `entries`) less those of exited processes, which
        from now on are kept here and the kernel may claim again: an exited process's
        ways go to the next process now, not after its retirement (`--grace`, 30 s),
        while its numbers stay in stats() until then. Their numbers are final, read
        again once the owner is gone (it may have counted more after the first read);
        at most max_pids entries are kept here, the rest wait in the kernel."""
        gone = exited(entries["tag"], self.alive)
        if not gone.any():
            return idx, entries
        assert self.obj is not None
        cache, retired = self.obj.maps["stats_cache"], self.obj.maps["stats_retired"]
        held = 0 if self.folded is None else len(self.folded)
        moved: list[int] = []
        for j in np.flatnonzero(gone)[: max(0, self.opts.max_pids - held)].tolist():
            i = np.uint32(idx[j])
            entries[j] = cache.lookup(i)  # same tag: only a retired entry is claimed
            retired.update(i, entries[j]["tag"])
            moved.append(j)
        self.folded_idx = np.concatenate([self.folded_idx, idx[moved]])
        self.folded = (
            entries[moved] if self.folded is None else np.concatenate([self.folded, entries[moved]])
        )
        keep = np.ones(len(idx), dtype=bool)
        keep[moved] = False
        return idx[keep], entries[keep]

    def cache_entries(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The live entries of the per-CPU cache: their indices and values."""
        assert self.obj is not None
        if not self.cache_ways:
            empty = np.zeros(0, dtype=self.obj.maps["stats_cache"].value_dtype)
            return np.zeros(0, dtype=np.uint32), empty
        idx, entries = self._items("stats_cache")
        _, retired = self._items("stats_retired")
        keep = live(idx, entries, retired)
        return idx[keep], entries[keep]

    def forget_stats(self, keys: np.ndarray[Any, Any]) -> int:
        """Retired keys (their processes gone and summarized): out of the hash, and
        their cache entries marked retired, so that the kernel may claim them again
        and stats() no longer reads them. Returns how many of the keys were there."""
        assert self.obj is not None
        stats, found = self.obj.maps["stats"], set()
        for k in keys:
            if stats.delete(k):
                found.add(k.tobytes())
        idx, entries = self.cache_entries()
        gone = {k.tobytes() for k in keys}
        retired = self.obj.maps["stats_retired"]
        ekeys = entry_keys(idx, entries["tag"], keys.dtype)
        for i, tag, k in zip(idx.tolist(), entries["tag"].tolist(), ekeys, strict=True):
            if k.tobytes() in gone:
                retired.update(np.uint32(i), np.uint64(tag))
                found.add(k.tobytes())
        if self.folded is not None and len(self.folded):
            fkeys = entry_keys(self.folded_idx, self.folded["tag"], keys.dtype)
            drop = np.array([k.tobytes() in gone for k in fkeys], dtype=bool)
            found.update(k.tobytes() for k in fkeys[drop])
            self.folded_idx, self.folded = self.folded_idx[~drop], self.folded[~drop]
        return len(found)

    def disk_stats(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Block requests per (submitting PID, op): keys and per-CPU values of
        `fileio_disk_stats` (requests, bytes, device latency sum, max, log2 slots)."""
        return self._items("disk_io")

    def writeback_stats(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Block requests written back on behalf of the process that dirtied the pages,
        per (dirtier, device): keys (pid, op, start, dev) and per-CPU values as in
        `disk_stats`."""
        return self._items("writeback")

    def counters(self) -> dict[str, int]:
        """The drop counters, with `wb_evicted`: dirtier entries the LRU forgot (those
        put in, minus those still there), in place of the count put in."""
        out = super().counters()
        put = out.pop("wb_dirtiers", 0)
        if put:
            out["wb_evicted"] = max(0, put - len(self._items("dirtiers")[0]))
        else:
            out["wb_evicted"] = 0
        return out

    def events(self, timeout: float) -> np.ndarray[Any, Any]:
        """Events, after the names of their files: each name is sent before the first
        event naming it, so the names ring drained after the events has them all."""
        if self.ring is None:
            time.sleep(max(timeout, 0))
            return np.empty(0)
        ev = self.ring.poll(timeout)
        if self.names_ring is not None:
            self.names.add(self.names_ring.poll(0))
        return ev

    def _forget(self, dev: int, ino: int) -> None:
        """Have the kernel send this inode's name again (user space lost it)."""
        if self.obj is not None:
            key = np.zeros(1, self.obj.maps["named"].key_dtype)
            key["ino"], key["dev"] = ino, dev
            self.obj.maps["named"].delete(key[0].tobytes())

    def __exit__(self, *exc: object) -> None:
        if self.names_ring is not None:
            self.names_ring.close()
            self.names_ring = None
        super().__exit__(*exc)
