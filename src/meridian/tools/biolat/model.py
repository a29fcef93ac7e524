"""biolat's model: histograms keyed by (device, op, kind, slot), kind latency (slot:
the request's size), queue time, queue depth, or latency again by the depth at issue
(slot: the depth's), the exact request sizes per (device, op), and each device's busy
time; every view is a sum over them. Intervals are differences of two snapshots, so
no sample is lost to a read-then-clear race."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ... import proc
from ...hist import Cell, ExactCounts, Hist
from ...report_loop import ReportOptions

__all__ = [
    "INFO_COUNTERS",
    "KIND_DEPTH",
    "KIND_LATENCY",
    "KIND_LATENCY_AT_DEPTH",
    "KIND_QUEUE",
    "OPS",
    "DepthLatency",
    "Groups",
    "Key",
    "Options",
    "Row",
    "Snapshot",
    "depth_rows",
    "dev_numbers",
    "device_rows",
    "disk_name",
    "group",
    "merged",
    "op_name",
    "sizes_of",
]

OPS = ("read", "write", "discard", "flush", "other")  # enum biolat_op
KIND_LATENCY, KIND_QUEUE, KIND_DEPTH, KIND_LATENCY_AT_DEPTH = 0, 1, 2, 3  # enum biolat_kind
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


Key = tuple[int, int, int, int]  # dev, op, kind, slot (of the size, or of the depth)
SizeKey = tuple[int, int]  # dev, op


@dataclass
class Snapshot:
    t: float
    cells: dict[Key, Cell]
    inflight: dict[int, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    sizes: dict[SizeKey, dict[int, int]] = field(default_factory=dict)  # bytes: requests
    unit_ns: int = 1000  # of the latency and queue histograms
    busy_ns: dict[int, int] = field(default_factory=dict)  # dev: time with a request in flight

    def since(self, prev: Snapshot) -> Snapshot:
        """What happened between `prev` and this snapshot."""
        cells = {}
        for k, c in self.cells.items():
            p = prev.cells.get(k)
            d = c if p is None else c.since(p, 1 if k[2] == KIND_DEPTH else self.unit_ns)
            if d.count:
                cells[k] = d
        counters = {k: v - prev.counters.get(k, 0) for k, v in self.counters.items()}
        sizes = {}
        for sk, counts in self.sizes.items():
            old = prev.sizes.get(sk, {})
            diff = {b: n - old.get(b, 0) for b, n in counts.items() if n - old.get(b, 0)}
            if diff:
                sizes[sk] = diff
        busy = {d: ns - prev.busy_ns.get(d, 0) for d, ns in self.busy_ns.items()}
        return Snapshot(
            self.t, cells, dict(self.inflight), counters, self.t - prev.t, sizes, self.unit_ns,
            busy,
        )  # fmt: skip


# ---- sums over the cells -------------------------------------------------------------

Groups = dict[tuple[int | None, int], list[tuple[int, Cell]]]  # (dev, op): (slot, cell)


def group(snap: Snapshot, kind: int, per_disk: bool) -> Groups:
    """The cells of `kind` per (device, op), or per op (device None) without -D."""
    groups: Groups = defaultdict(list)
    for (dev, op, k, size_slot), cell in sorted(snap.cells.items()):
        if k == kind:
            groups[(dev if per_disk else None, op)].append((size_slot, cell))
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])))


def merged(cells: list[tuple[int, Cell]], unit: str, unit_ns: int) -> Hist:
    """The cells' histograms summed, in `unit`."""
    return Hist.merge((c.hist(unit, unit_ns) for _, c in cells), 32, unit)


def sizes_of(snap: Snapshot, dev: int | None, op: int) -> ExactCounts:
    """The exact request sizes of (dev, op), of every device when dev is None; the
    sizes the kernel's map had no room for (all devices and ops) as `not_counted`."""
    out = ExactCounts({}, "bytes", snap.counters.get("sizes_full", 0))
    for (d, o), counts in snap.sizes.items():
        if o == op and (dev is None or d == dev):
            for b, n in counts.items():
                out.add(b, n)
    return out


def disk_name(dev: int | None) -> str:
    return "all" if dev is None else proc.device_name(dev)


def dev_numbers(dev: int) -> str:
    """major:minor of a kernel dev_t, as /proc/diskstats and lsblk show it."""
    return f"{proc.dev_major(dev)}:{proc.dev_minor(dev)}"


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
    hist: Hist
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
                "" if dev is None else dev_numbers(dev),
                op_name(op),
                sum(c.count for _, c in cells),
                sum(c.bytes for _, c in cells),
                snap.seconds,
                sum(c.sum_ns for _, c in cells),
                merged(cells, opts.unit, opts.unit_ns),
                opts.unit_ns,
            )
        )
    return rows


def depth_rows(snap: Snapshot, opts: Options) -> dict[int, dict[str, Any]]:
    """Exercise 4: per device, the requests in flight at each issue and now, against
    what its queue can hold; its utilization (the share of the interval with a request
    in flight, as iostat's %util); and the latency by the depth at issue (log2 slots of
    the depth, every op)."""
    by_dev: dict[int, list[Cell]] = defaultdict(list)
    at_depth: dict[int, dict[int, list[Cell]]] = defaultdict(lambda: defaultdict(list))
    for (dev, _op, kind, slot), cell in snap.cells.items():
        if kind == KIND_DEPTH:
            by_dev[dev].append(cell)
        elif kind == KIND_LATENCY_AT_DEPTH:
            at_depth[dev][slot].append(cell)
    out = {}
    for dev, cells in sorted(by_dev.items()):
        h = Hist.merge((c.hist("depth", 1) for c in cells), 32, "depth")
        n, total = h.total, sum(c.sum_ns for c in cells)  # depths, not ns: unit_ns 1
        busy = snap.busy_ns.get(dev, 0)
        out[dev] = {
            "inflight": snap.inflight.get(dev, 0),
            "max": max(c.max_ns for c in cells),
            "sum": total,
            "avg": round(total / n, 3) if n else 0.0,
            "hist": h,
            "busy_ns": busy,
            "utilization": round(busy / 1e9 / snap.seconds, 4) if snap.seconds else None,
            **proc.queue_limits(dev),
            "latency_by_depth": [
                depth_latency(slot, at, opts) for slot, at in sorted(at_depth[dev].items())
            ],
        }
    return out


def depth_latency(slot: int, cells: list[Cell], opts: Options) -> DepthLatency:
    hist = merged([(slot, c) for c in cells], opts.unit, opts.unit_ns)
    return DepthLatency(slot, hist, sum(c.sum_ns for c in cells), max(c.max_ns for c in cells))


@dataclass
class DepthLatency:
    """The requests issued at depths of one log2 slot: their latency."""

    slot: int
    hist: Hist
    sum_ns: int
    max_ns: int

    @property
    def depths(self) -> tuple[int, int]:
        """The depths of the slot, both included: (1, 1), (2, 3), (4, 7) ..."""
        return 1 << self.slot, (2 << self.slot) - 1

    def as_dict(self) -> dict[str, Any]:
        n = self.hist.total
        return {
            "depth_low": self.depths[0],
            "depth_high": self.depths[1],
            "count": n,
            "latency_avg_ns": self.sum_ns // n if n else 0,
            "latency_max_ns": self.max_ns,
            "latency": self.hist.to_json(),
        }
