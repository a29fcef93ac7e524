"""meridian io's block-layer view: device requests per submitting process.

The kernel's `disk_io` map counts block requests per (submitting PID, op) from
`block_io_start` to `block_rq_complete`: requests, bytes and a histogram of
device latency (issue to completion). It includes what no file operation of the
process waited for (writeback threads, page faults on mapped files), so it is
reported beside the per-file-operation summary, not folded into it. Write requests
for pages another process dirtied are charged to that process instead (writeback.py):
a flusher thread keeps only its own share here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...hist import Hist
from .model import empty_hist, first_comm, latency_hist, op_name

__all__ = ["BlockStats", "capped_block", "summarize_block"]


@dataclass
class BlockStats:
    pid: int
    comm: str
    op: str
    requests: int
    bytes: int
    latency_sum_ns: int
    latency_max_ns: int
    hist: Hist

    def add(self, other: BlockStats) -> None:
        self.requests += other.requests
        self.bytes += other.bytes
        self.latency_sum_ns += other.latency_sum_ns
        self.latency_max_ns = max(self.latency_max_ns, other.latency_max_ns)
        self.hist = self.hist + other.hist

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": "block",
            "pid": self.pid,
            "comm": self.comm,
            "op": self.op,
            "requests": self.requests,
            "bytes": self.bytes,
            "latency_avg_ns": self.latency_sum_ns // self.requests if self.requests else 0,
            "latency_p50_ns": round(self.hist.percentile(0.5)),
            "latency_p99_ns": round(self.hist.percentile(0.99)),
            "latency_max_ns": self.latency_max_ns,
            "latency": self.hist.to_json(),
        }


def summarize_block(keys: np.ndarray[Any, Any], vals: np.ndarray[Any, Any]) -> list[BlockStats]:
    """One entry per (PID, op) from the `disk_io` map (per-CPU values), by PID then op."""
    out = []
    for k, v in zip(keys, vals, strict=True):
        v = np.atleast_1d(v)
        out.append(
            BlockStats(
                pid=int(k["pid"]),
                comm=first_comm(v),
                op=op_name(int(k["op"])),
                requests=int(v["requests"].sum()),
                bytes=int(v["bytes"].sum()),
                latency_sum_ns=int(v["latency_sum_ns"].sum()),
                latency_max_ns=int(v["latency_max_ns"].max()),
                hist=latency_hist(v),
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
        if b.pid not in keep:
            empty = empty_hist()
            other.setdefault(b.op, BlockStats(0, "other", b.op, 0, 0, 0, 0, empty)).add(b)
    return [b for b in stats if b.pid in keep] + list(other.values())
