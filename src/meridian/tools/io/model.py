"""meridian io's model: what processes did, from the kernel's exact aggregates.

The kernel keeps one aggregate per (process, op, cached): operations, bytes, disk
bytes, I/O wait, latency sum, minimum and maximum, first and last time, and a
log-linear latency histogram (hist.py), per CPU. The kernel's op is the direction and
the interface: a read or write syscall, or a read or write submitted through io_uring.
`summarize_processes` sums them over CPUs into a `PidSummary` per process, its cells
`OpStats` by direction, cached (True: the page cache served it) and interface.
Everything else (the PID table, the views, the metrics) reads these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...hist import Hist
from ...output import iso_now
from ...proc import start_wall_ns

__all__ = [
    "INTERFACES",
    "OPS",
    "OpStats",
    "PidSummary",
    "first_comm",
    "interface_name",
    "latency_hist",
    "op_name",
    "summarize",
    "summarize_processes",
]

OPS = ("read", "write")
INTERFACES = ("syscall", "io_uring")  # how the operation was asked for


def op_name(op: int) -> str:
    """The direction of a kernel `enum io_op` value (its bit 0)."""
    return OPS[op & 1]


def interface_name(op: int) -> str:
    """The interface of a kernel `enum io_op` value (its bit 1: io_uring)."""
    return INTERFACES[(op >> 1) & 1]


def first_comm(per_cpu: np.ndarray[Any, Any]) -> str:
    """The command name of per-CPU values: the first CPU's that has one."""
    comms = [c for c in per_cpu["comm"] if c]
    return comms[0].decode(errors="replace") if comms else ""


NBUCKETS = (1 + 34 - 4) * 16  # IO_HIST_BUCKETS


def latency_hist(per_cpu: np.ndarray[Any, Any]) -> Hist:
    """The latency histogram (ns) of per-CPU values of `fileio_stats` or
    `fileio_disk_stats`, with the exact min and max."""
    mins = per_cpu["latency_min_ns"][per_cpu["latency_min_ns"] > 0]
    counts = per_cpu["buckets"].sum(axis=0, dtype=np.uint64)
    return Hist.of_buckets(
        counts,
        "nsecs",
        float(mins.min()) if len(mins) else None,
        float(per_cpu["latency_max_ns"].max()) if counts.any() else None,
    )


def empty_hist() -> Hist:
    return Hist.of_buckets(np.zeros(NBUCKETS, np.uint64), "nsecs")


@dataclass
class OpStats:
    ops: int = 0
    bytes: int = 0
    bytes_requested: int = 0
    disk_bytes: int = 0
    io_wait_ns: int = 0
    latency_sum_ns: int = 0
    latency_max_ns: int = 0
    first_ns: int = 0
    last_ns: int = 0
    hist: Hist = field(default_factory=empty_hist)  # with the exact min and max

    def add(self, other: OpStats) -> None:
        self.ops += other.ops
        self.bytes += other.bytes
        self.bytes_requested += other.bytes_requested
        self.disk_bytes += other.disk_bytes
        self.io_wait_ns += other.io_wait_ns
        self.latency_sum_ns += other.latency_sum_ns
        self.latency_max_ns = max(self.latency_max_ns, other.latency_max_ns)
        firsts = [t for t in (self.first_ns, other.first_ns) if t]
        self.first_ns = min(firsts) if firsts else 0
        self.last_ns = max(self.last_ns, other.last_ns)
        self.hist = self.hist + other.hist


@dataclass
class PidSummary:
    """Everything one process did, split by op, cached (True) / disk (False) and
    interface (INTERFACES)."""

    pid: int
    comm: str
    cells: dict[tuple[str, bool, str], OpStats] = field(default_factory=dict)
    start: int = 0  # clock ticks since boot (/proc/PID/stat field 22): tells reused PIDs apart
    cgroup_id: int = 0  # its cgroup v2 id, as the kernel saw it (0: not known)

    def total(
        self, op: str | None = None, cached: bool | None = None, interface: str | None = None
    ) -> OpStats:
        out = OpStats()
        for (o, c, i), s in self.cells.items():
            if op in (None, o) and cached in (None, c) and interface in (None, i):
                out.add(s)
        return out

    def hit_ratio(self, op: str | None = None) -> float | None:
        all_ = self.total(op).ops
        return self.total(op, True).ops / all_ if all_ else None

    def merge(self, other: PidSummary) -> None:
        """Add another summary's cells to this one's (a group of processes)."""
        for cell, s in other.cells.items():
            self.cells.setdefault(cell, OpStats()).add(s)

    def as_dict(self, seconds: float, container: dict[str, str] | None = None) -> dict[str, Any]:
        """`container`: its container's attributes (containers.Containers), if any."""
        out: dict[str, Any] = {"type": "summary", "pid": self.pid, "comm": self.comm}
        if self.start:  # tells two processes apart that had the same PID
            out["start_time"] = iso_now(start_wall_ns(self.start))
        if container:
            out["container"] = container
        for op in OPS:
            t = self.total(op)
            if not t.ops:
                continue
            out[op] = {
                "ops": t.ops,
                "bytes": t.bytes,
                "bytes_requested": t.bytes_requested,
                "disk_bytes": t.disk_bytes,
                "cached_ops": self.total(op, True).ops,
                "disk_ops": self.total(op, False).ops,
                "io_wait_ns": t.io_wait_ns,
                "bytes_per_s": round(t.bytes / seconds, 1) if seconds > 0 else None,
                "latency_avg_ns": t.latency_sum_ns // t.ops,
                "latency_p50_ns": round(t.hist.percentile(0.5)),
                "latency_p99_ns": round(t.hist.percentile(0.99)),
                "latency_max_ns": t.latency_max_ns,
                "cache_hit_ratio": round(self.hit_ratio(op) or 0.0, 6),
                "first_ns": t.first_ns,
                "last_ns": t.last_ns,
                "latency": t.hist.to_json(),
            }
            uring = self.total(op, interface="io_uring")
            if uring.ops:  # the part of the above submitted through io_uring
                out[op]["io_uring"] = {
                    "ops": uring.ops,
                    "bytes": uring.bytes,
                    "disk_bytes": uring.disk_bytes,
                    "cached_ops": self.total(op, True, "io_uring").ops,
                    "latency_avg_ns": uring.latency_sum_ns // uring.ops,
                    "latency_max_ns": uring.latency_max_ns,
                }
        return out


def summarize(keys: np.ndarray[Any, Any], vals: np.ndarray[Any, Any]) -> dict[int, PidSummary]:
    """Per-PID summaries from the aggregate map (per-CPU values, shape (n, ncpus)): the
    newest process of each PID (an older one is a process whose PID was reused)."""
    return {pid: ps for (pid, _), ps in summarize_processes(keys, vals).items()}


def summarize_processes(
    keys: np.ndarray[Any, Any], vals: np.ndarray[Any, Any]
) -> dict[tuple[int, int], PidSummary]:
    """Per-process summaries, by (PID, start) in that order."""
    out: dict[tuple[int, int], PidSummary] = {}
    for k, v in zip(keys, vals, strict=True):
        pid, start = int(k["pid"]), int(k["start"])
        v = np.atleast_1d(v)
        firsts = v["first_ns"][v["first_ns"] > 0]
        s = OpStats(
            ops=int(v["ops"].sum()),
            bytes=int(v["bytes"].sum()),
            bytes_requested=int(v["bytes_requested"].sum()),
            disk_bytes=int(v["disk_bytes"].sum()),
            io_wait_ns=int(v["io_wait_ns"].sum()),
            latency_sum_ns=int(v["latency_sum_ns"].sum()),
            latency_max_ns=int(v["latency_max_ns"].max()),
            first_ns=int(firsts.min()) if len(firsts) else 0,
            last_ns=int(v["last_ns"].max()),
            hist=latency_hist(v),
        )
        ps = out.setdefault((pid, start), PidSummary(pid, first_comm(v), start=start))
        ps.cgroup_id = max(ps.cgroup_id, int(v["cgroup_id"].max()))
        op = int(k["op"])
        ps.cells[(op_name(op), bool(k["cached"]), interface_name(op))] = s
    return dict(sorted(out.items()))
