"""meridian io's writeback view: device writes charged to the process that dirtied the
pages, not to the flusher thread (kworker) or other process that issued them.

The kernel remembers the last user process that dirtied each inode's pages
(`dirtiers`, an LRU hash) and, when another task issues a write request for one of
those pages, counts the request in the `writeback` map under that process and the
device, with its device latency (io_writeback.bpf.h). Such requests leave the
submitter's own row of the block table; the rest stays there (the kernel's own share:
journal, metadata, pages dirtied before tracing started, counted as `wb_unattributed`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ... import proc
from .block import BlockStats, summarize_block

__all__ = ["WritebackStats", "by_process", "summarize_writeback"]


@dataclass
class WritebackStats:
    """Requests written back on behalf of one process, on one device."""

    block: BlockStats  # pid, comm (the dirtier's), requests, bytes, latency
    dev: int  # kernel dev_t of the disk
    device: str  # its name (sda, loop0), or MAJOR:MINOR

    @property
    def pid(self) -> int:
        return self.block.pid

    @property
    def comm(self) -> str:
        return self.block.comm

    def as_dict(self) -> dict[str, Any]:
        d = self.block.as_dict()
        for k in ("type", "op", "pid", "comm"):
            d.pop(k, None)
        head = {"type": "writeback", "pid": self.pid, "comm": self.comm, "device": self.device}
        return {**head, **d}


def summarize_writeback(
    keys: np.ndarray[Any, Any], vals: np.ndarray[Any, Any], sys_root: str = "/sys"
) -> list[WritebackStats]:
    """One entry per (dirtier, device) from the `writeback` map (per-CPU values), by
    PID then device; devices are named while they exist (at the summary)."""
    out = []
    for i in range(len(keys)):
        dev = int(keys[i]["dev"])
        (b,) = summarize_block(keys[i : i + 1], vals[i : i + 1])
        out.append(WritebackStats(b, dev, proc.device_name(dev, sys_root)))
    return sorted(out, key=lambda w: (w.pid, w.device))


def by_process(stats: list[WritebackStats]) -> list[BlockStats]:
    """Summed over devices: one write entry per process (the metrics' series)."""
    out: dict[tuple[int, str], BlockStats] = {}
    for w in stats:
        b = out.get((w.pid, w.comm))
        if b is None:
            out[(w.pid, w.comm)] = replace(w.block)  # add() replaces, never mutates, hist
        else:
            b.add(w.block)
    return list(out.values())
