"""biolat's model: histograms keyed by (device, op, kind, size slot), kind latency,
queue time or queue depth; every view is a sum over them. Intervals are differences
of two snapshots, so no sample is lost to a read-then-clear race."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import proc
from ...hist import Log2Hist
from ...reporting import ReportOptions

__all__ = [
    "INFO_COUNTERS",
    "KIND_DEPTH",
    "KIND_LATENCY",
    "KIND_QUEUE",
    "OPS",
    "Cell",
    "Groups",
    "Key",
    "Options",
    "Row",
    "Snapshot",
    "depth_rows",
    "device_rows",
    "disk_name",
    "group",
    "merged",
    "op_name",
    "size_hist",
]

OPS = ("read", "write", "discard", "flush", "other")  # enum biolat_op
KIND_LATENCY, KIND_QUEUE, KIND_DEPTH = 0, 1, 2  # enum biolat_kind
INFO_COUNTERS = frozenset({"requeued"})  # counted and shown, but nothing was lost


@dataclass
class Options(ReportOptions):
    per_disk: bool = False
    queued: bool = False
    millis: bool = False
    disk: int | None = None
    sizes: bool = False
    depth: bool = False
    slow_ms: float | None = None
    workload: bool = False
    ring_bytes: int = 4 << 20  # slow-I/O ring buffer (a power of two, >= one page)

    @property
    def unit_ns(self) -> int:
        return 1_000_000 if self.millis else 1000


@dataclass
class Cell:
    """One histogram of the kernel map (one device, op, kind and size slot)."""

    slots: np.ndarray[Any, np.dtype[np.uint64]]
    sum: int
    max: int
    bytes: int

    @property
    def count(self) -> int:
        return int(self.slots.sum())


Key = tuple[int, int, int, int]  # dev, op, kind, size slot


@dataclass
class Snapshot:
    t: float
    cells: dict[Key, Cell]
    inflight: dict[int, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def since(self, prev: Snapshot) -> Snapshot:
        """What happened between `prev` and this snapshot (max stays cumulative)."""
        cells = {}
        for k, c in self.cells.items():
            p = prev.cells.get(k)
            d = c if p is None else Cell(c.slots - p.slots, c.sum - p.sum, c.max, c.bytes - p.bytes)
            if d.count:
                cells[k] = d
        counters = {k: v - prev.counters.get(k, 0) for k, v in self.counters.items()}
        return Snapshot(self.t, cells, dict(self.inflight), counters, self.t - prev.t)


# ---- sums over the cells -------------------------------------------------------------

Groups = dict[tuple[int | None, int], list[tuple[int, Cell]]]  # (dev, op): (size slot, cell)


def group(snap: Snapshot, kind: int, per_disk: bool) -> Groups:
    """The cells of `kind` per (device, op), or per op (device None) without -D."""
    groups: Groups = defaultdict(list)
    for (dev, op, k, size_slot), cell in sorted(snap.cells.items()):
        if k == kind:
            groups[(dev if per_disk else None, op)].append((size_slot, cell))
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])))


def merged(cells: list[tuple[int, Cell]], unit: str) -> Log2Hist:
    return Log2Hist.merge((Log2Hist(c.slots, unit) for _, c in cells), len(cells[0][1].slots), unit)


def size_hist(cells: list[tuple[int, Cell]]) -> Log2Hist:
    h = Log2Hist.empty(len(cells[0][1].slots), "bytes")
    for slot, c in cells:
        h.slots[min(slot, len(h.slots) - 1)] += np.uint64(c.count)
    return h


def disk_name(dev: int | None) -> str:
    return "all" if dev is None else proc.device_name(dev)


def op_name(op: int) -> str:
    return OPS[min(op, len(OPS) - 1)]


@dataclass
class Row:
    disk: str
    dev: str
    op: str
    count: int
    bytes: int
    seconds: float
    sum_ns: int
    hist: Log2Hist
    unit_ns: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "disk": self.disk,
            "dev": self.dev,
            "op": self.op,
            "count": self.count,
            "bytes": self.bytes,
            "iops": round(self.count / self.seconds, 3) if self.seconds else None,
            "bytes_per_s": round(self.bytes / self.seconds, 1) if self.seconds else None,
            "avg_bytes": self.bytes // self.count if self.count else 0,
            "latency_avg_ns": self.sum_ns // self.count if self.count else 0,
            "latency": self.hist.to_json(),
        }


def device_rows(snap: Snapshot, opts: Options) -> list[Row]:
    """Exercise 1: count, bytes and throughput per device and op, with latency."""
    rows = []
    for (dev, op), cells in group(snap, KIND_LATENCY, opts.per_disk).items():
        rows.append(
            Row(
                disk_name(dev),
                "" if dev is None else f"{proc.dev_major(dev)}:{proc.dev_minor(dev)}",
                op_name(op),
                sum(c.count for _, c in cells),
                sum(c.bytes for _, c in cells),
                snap.seconds,
                sum(c.sum for _, c in cells),
                merged(cells, opts.unit),
                opts.unit_ns,
            )
        )
    return rows


def depth_rows(snap: Snapshot) -> dict[int, dict[str, Any]]:
    """Exercise 4: requests in flight per device at each issue, and now."""
    by_dev: dict[int, list[Cell]] = defaultdict(list)
    for (dev, _op, kind, _slot), cell in snap.cells.items():
        if kind == KIND_DEPTH:
            by_dev[dev].append(cell)
    out = {}
    for dev, cells in sorted(by_dev.items()):
        h = Log2Hist.merge(
            (Log2Hist(c.slots, "depth") for c in cells), len(cells[0].slots), "depth"
        )
        n = h.total
        out[dev] = {
            "inflight": snap.inflight.get(dev, 0),
            "max": max(c.max for c in cells),
            "avg": round(sum(c.sum for c in cells) / n, 3) if n else 0.0,
            "hist": h,
        }
    return out
