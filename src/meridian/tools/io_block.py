"""meridian io's block-layer view: device requests per submitting process.

The kernel's `disk_io` map counts block requests per (submitting PID, op) from
`block_io_start` to `block_rq_complete`: requests, bytes and a log2 histogram of
device latency (issue to completion). It includes what no file operation of the
process waited for (writeback threads, page faults on mapped files), so it is
reported beside the per-file-operation summary, not folded into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..export.series import Family, HistPoint, Point
from ..hist import Log2Hist

__all__ = ["BlockStats", "block_series", "capped_block", "summarize_block"]

OPS = ("read", "write")


@dataclass
class BlockStats:
    pid: int
    comm: str
    op: str
    requests: int
    bytes: int
    latency_sum_ns: int
    latency_max_ns: int
    hist: Log2Hist

    def as_dict(self) -> dict[str, Any]:
        p = self.hist.percentile
        return {
            "type": "block",
            "pid": self.pid,
            "comm": self.comm,
            "op": self.op,
            "requests": self.requests,
            "bytes": self.bytes,
            "latency_avg_ns": self.latency_sum_ns // self.requests if self.requests else 0,
            "latency_p50_ns": min(round(p(0.5)), self.latency_max_ns),
            "latency_p99_ns": min(round(p(0.99)), self.latency_max_ns),
            "latency_max_ns": self.latency_max_ns,
            "latency": self.hist.to_json(),
        }


def summarize_block(keys: np.ndarray[Any, Any], vals: np.ndarray[Any, Any]) -> list[BlockStats]:
    """One entry per (PID, op) from the `disk_io` map (per-CPU values), by PID then op."""
    out = []
    for k, v in zip(keys, vals, strict=True):
        v = np.atleast_1d(v)
        comms = [c for c in v["comm"] if c]
        out.append(
            BlockStats(
                pid=int(k["pid"]),
                comm=comms[0].decode(errors="replace") if comms else "",
                op=OPS[min(int(k["op"]), 1)],
                requests=int(v["requests"].sum()),
                bytes=int(v["bytes"].sum()),
                latency_sum_ns=int(v["latency_sum_ns"].sum()),
                latency_max_ns=int(v["latency_max_ns"].max()),
                hist=Log2Hist(v["slots"].sum(axis=0).astype(np.uint64), "nsecs"),
            )
        )
    return sorted(out, key=lambda b: (b.pid, b.op))


def capped_block(stats: list[BlockStats], max_series: int | None) -> list[BlockStats]:
    """With --max-pids N: the N processes with the most bytes keep their own entries,
    the rest are summed per op into `other` (pid 0)."""
    by_pid: dict[int, int] = {}
    for b in stats:
        by_pid[b.pid] = by_pid.get(b.pid, 0) + b.bytes
    if max_series is None or len(by_pid) <= max_series:
        return stats
    keep = set(sorted(by_pid, key=lambda pid: (-by_pid[pid], pid))[:max_series])
    other: dict[str, BlockStats] = {}
    for b in stats:
        if b.pid in keep:
            continue
        o = other.setdefault(
            b.op,
            BlockStats(0, "other", b.op, 0, 0, 0, 0, Log2Hist.empty(len(b.hist.slots), "nsecs")),
        )
        o.requests += b.requests
        o.bytes += b.bytes
        o.latency_sum_ns += b.latency_sum_ns
        o.latency_max_ns = max(o.latency_max_ns, b.latency_max_ns)
        o.hist = o.hist + b.hist
    return [b for b in stats if b.pid in keep] + list(other.values())


def block_series(stats: list[BlockStats], max_series: int | None = None) -> list[Family]:
    """Device requests per submitting process. No semantic convention covers them, so
    the names are Meridian's; the attributes are the conventional ones."""
    reqs = Family(
        "meridian.block.requests", "counter", "{request}", "Block requests by submitting process"
    )
    nbytes = Family("meridian.block.io", "counter", "By", "Bytes of block requests by process")
    lat = Family(
        "meridian.block.request.duration",
        "histogram",
        "s",
        "Device latency of block requests, issue to completion",
    )
    for b in capped_block(stats, max_series):
        attrs: dict[str, str | int | bool] = {
            "process.executable.name": b.comm,
            "disk.io.direction": b.op,
        }
        if b.pid:
            attrs["process.pid"] = b.pid
        reqs.points.append(Point(attrs, b.requests))
        nbytes.points.append(Point(attrs, b.bytes))
        lat.points.append(
            HistPoint(attrs, b.hist.slots, 1e-9, b.latency_sum_ns / 1e9, b.latency_max_ns / 1e9)
        )
    return [reqs, nbytes, lat]
