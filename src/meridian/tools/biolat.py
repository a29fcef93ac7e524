"""meridian biolat: block I/O latency histograms per device and operation, request
sizes, queue depth and slow requests (seed 004 and its four exercises).

The kernel counts everything in one hash map keyed by (device, op, kind, size slot);
every view here is a sum over it. Intervals are differences of two snapshots, so no
sample is lost to a read-then-clear race.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from .. import proc
from ..bpf import BpfObject, RingBuffer, Strategy, choose, hook_exists
from ..errors import UsageError
from ..export import ExportOptions, Family, HistPoint, Point, add_arguments, exporting, from_args
from ..hist import Log2Hist, slot_bounds
from ..output import JsonWriter, fmt_bytes, iso_now, print_table
from ..reporting import positive_number, report_loop
from ..session import Session

__all__ = ["Biolat", "Options", "Snapshot", "add_parser", "run"]

OPS = ("read", "write", "discard", "flush", "other")
KIND_LATENCY, KIND_QUEUE, KIND_DEPTH = 0, 1, 2
INFO_COUNTERS = frozenset({"requeued"})  # counted and shown, but nothing was lost

STRATEGIES = (
    Strategy("tp_btf", ("btf_rq_issue", "btf_rq_complete", "btf_rq_requeue"), ("tp_btf",)),
    Strategy("tracepoint", ("tp_rq_issue", "tp_rq_complete", "tp_rq_requeue"), ("tracepoint",)),
)
# Extra programs per strategy: request insert (-Q) and request start (who queued it).
_INSERT = {"tp_btf": "btf_rq_insert", "tracepoint": "tp_rq_insert"}
_START = {"tp_btf": "btf_io_start", "tracepoint": "tp_io_start"}


@dataclass
class Options:
    interval: float | None = None
    count: int | None = None
    duration: float | None = None
    per_disk: bool = False
    queued: bool = False
    millis: bool = False
    disk: int | None = None
    timestamps: bool = False
    json: bool = False
    sizes: bool = False
    depth: bool = False
    slow_ms: float | None = None
    strategy: str | None = None
    workload: bool = False
    verbose: bool = False
    ring_bytes: int = 4 << 20  # slow-I/O ring buffer (a power of two, >= one page)
    export: ExportOptions | None = None

    @property
    def unit(self) -> str:
        return "msecs" if self.millis else "usecs"

    @property
    def unit_ns(self) -> int:
        return 1_000_000 if self.millis else 1000


# ---- snapshots ---------------------------------------------------------------------


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


# ---- the kernel side -----------------------------------------------------------------


class Biolat(Session):
    """The loaded programs; `snapshot()` reads the maps, `events()` the slow requests,
    `metrics()` the maps again, for export."""

    name = "biolat"
    OBJECT = "biolat"  # bpfobj/biolat.bpf.o

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.strategy = choose(STRATEGIES, opts.strategy)
        self.selected: list[str] = []

    def programs(self, obj: BpfObject) -> list[str]:
        """The strategy's programs, plus insert (-Q) and start (who queued a request,
        for --slow) where this kernel has those hooks."""
        s = self.strategy.name
        extra = []
        if self.opts.queued or self.opts.slow_ms is not None:
            extra.append(_INSERT[s])
        if self.opts.slow_ms is not None:
            extra.append(_START[s])
        return list(self.strategy.programs) + [
            p for p in extra if hook_exists(obj.programs[p].section)
        ]

    def setup(self, obj: BpfObject) -> None:
        o = self.opts
        obj.set_rodata(
            {
                "targ_queued": o.queued,
                "latency_unit_ns": o.unit_ns,
                "filter_dev_on": o.disk is not None,
                "filter_dev": o.disk or 0,
                "track_depth": o.depth,
                "slow_on": o.slow_ms is not None,
                "slow_ns": int((o.slow_ms or 0) * 1_000_000),
                "wakeup_bytes": o.ring_bytes // 4,
            }
        )
        obj.resize("events", o.ring_bytes)
        self.selected = self.programs(obj)
        obj.select(self.selected)
        obj.load()
        obj.attach()
        if o.slow_ms is not None:
            assert obj.btf is not None
            self.ring = RingBuffer.of_map(obj.maps["events"], obj.btf.struct_dtype("biolat_event"))

    def snapshot(self) -> Snapshot:
        assert self.obj is not None
        keys, vals = self.obj.maps["hists"].items()
        cells = {
            (int(k["dev"]), int(k["op"]), int(k["kind"]), int(k["size_slot"])): Cell(
                v["slots"].astype(np.uint64), int(v["sum"]), int(v["max"]), int(v["bytes"])
            )
            for k, v in zip(keys, vals, strict=True)
        }
        dkeys, dvals = self.obj.maps["depth"].items()
        inflight = {int(k): int(v["inflight"]) for k, v in zip(dkeys, dvals, strict=True)}
        counters = self.obj.maps["counters"].summed()
        if self.ring is not None:
            counters["events_bad"] = self.ring.bad_records
        return Snapshot(time.monotonic(), cells, inflight, counters)

    def events(self, timeout: float) -> np.ndarray[Any, Any]:
        if self.ring is None:
            time.sleep(max(timeout, 0))
            return np.empty(0)
        return self.ring.poll(timeout)

    def metrics(self) -> list[Family]:
        return series(self.snapshot(), self.opts)


def series(snap: Snapshot, opts: Options) -> list[Family]:
    """The exported families (cumulative since attach), per device and op, after the
    semantic conventions' `system.disk.*` metrics, plus the latency histograms."""
    nbytes = Family("system.disk.io", "counter", "By", "Bytes transferred by block requests")
    ops = Family("system.disk.operations", "counter", "{operation}", "Block requests completed")
    optime = Family(
        "system.disk.operation_time", "counter", "s", "Sum of the time each request took"
    )
    lat = Family(
        "system.disk.operation.duration",
        "histogram",
        "s",
        "Block request latency (issue, or insert with -Q, to completion)",
    )
    queue = Family(
        "system.disk.queue.duration", "histogram", "s", "Time requests waited in the OS queue"
    )
    lost = Family("meridian.biolat.lost", "counter", "{request}", "Requests not counted, by reason")
    for kind, fam in ((KIND_LATENCY, lat), (KIND_QUEUE, queue)):
        for (dev, op), cells in _group(snap, kind, True).items():
            a: dict[str, str | int | bool] = {
                "system.device": _disk(dev),
                "disk.io.direction": OPS[min(op, len(OPS) - 1)],
            }
            h = _merged(cells, opts.unit)
            total = sum(c.sum for _, c in cells)
            top = max(c.max for _, c in cells)
            fam.points.append(HistPoint(a, h.slots, opts.unit_ns * 1e-9, total / 1e9, top / 1e9))
            if kind == KIND_LATENCY:
                nbytes.points.append(Point(a, sum(c.bytes for _, c in cells)))
                ops.points.append(Point(a, h.total))
                optime.points.append(Point(a, total / 1e9))
    for reason, n in snap.counters.items():
        if reason not in INFO_COUNTERS:
            lost.points.append(Point({"reason": reason}, n))
    return [nbytes, ops, optime, lat, queue, lost]


# ---- views ---------------------------------------------------------------------------


def _group(
    snap: Snapshot, kind: int, per_disk: bool
) -> dict[tuple[int | None, int], list[tuple[int, Cell]]]:
    groups: dict[tuple[int | None, int], list[tuple[int, Cell]]] = defaultdict(list)
    for (dev, op, k, size_slot), cell in sorted(snap.cells.items()):
        if k == kind:
            groups[(dev if per_disk else None, op)].append((size_slot, cell))
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])))


def _merged(cells: list[tuple[int, Cell]], unit: str) -> Log2Hist:
    return Log2Hist.merge((Log2Hist(c.slots, unit) for _, c in cells), len(cells[0][1].slots), unit)


def _size_hist(cells: list[tuple[int, Cell]]) -> Log2Hist:
    h = Log2Hist.empty(len(cells[0][1].slots), "bytes")
    for slot, c in cells:
        h.slots[min(slot, len(h.slots) - 1)] += np.uint64(c.count)
    return h


def _disk(dev: int | None) -> str:
    return "all" if dev is None else proc.device_name(dev)


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
    for (dev, op), cells in _group(snap, KIND_LATENCY, opts.per_disk).items():
        rows.append(
            Row(
                _disk(dev),
                "" if dev is None else f"{proc.dev_major(dev)}:{proc.dev_minor(dev)}",
                OPS[min(op, len(OPS) - 1)],
                sum(c.count for _, c in cells),
                sum(c.bytes for _, c in cells),
                snap.seconds,
                sum(c.sum for _, c in cells),
                _merged(cells, opts.unit),
                opts.unit_ns,
            )
        )
    return rows


def report_json(snap: Snapshot, opts: Options) -> dict[str, Any]:
    out: dict[str, Any] = {
        "time": iso_now(),
        "interval_s": round(snap.seconds, 6),
        "unit": opts.unit,
    }
    devices = []
    size_groups = _group(snap, KIND_LATENCY, opts.per_disk)
    queue_groups = _group(snap, KIND_QUEUE, opts.per_disk)
    for row, ((dev, op), cells) in zip(device_rows(snap, opts), size_groups.items(), strict=True):
        d = row.as_dict()
        d["sizes"] = _size_hist(cells).to_json()
        d["latency_by_size"] = [
            {
                "size_low": slot_bounds(slot)[0],
                "size_high": slot_bounds(slot)[1],
                "count": c.count,
                "latency_avg_ns": c.sum // c.count,
                "latency": Log2Hist(c.slots, opts.unit).to_json(),
            }
            for slot, c in cells
        ]
        if (dev, op) in queue_groups:
            d["queue"] = _merged(queue_groups[(dev, op)], opts.unit).to_json()
        devices.append(d)
    out["devices"] = devices
    out["depth"] = [
        {"disk": _disk(dev), **info, "hist": info["hist"].to_json()}
        for dev, info in depth_rows(snap).items()
    ]
    out["lost"] = {k: v for k, v in snap.counters.items() if k not in INFO_COUNTERS}
    out["requeued"] = snap.counters.get("requeued", 0)
    return out


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


def report_text(snap: Snapshot, opts: Options, out: TextIO) -> None:
    if opts.timestamps:
        print(time.strftime("%H:%M:%S"), file=out)
    groups = _group(snap, KIND_LATENCY, opts.per_disk)
    if not groups:
        print("no block I/O completed in this interval", file=out)
    for (dev, op), cells in groups.items():
        head = f"disk = {_disk(dev)}, " if opts.per_disk else ""
        print(f"\n{head}op = {OPS[min(op, len(OPS) - 1)]}", file=out)
        print(_merged(cells, opts.unit).render(), file=out)
    if opts.queued:
        for (dev, op), cells in _group(snap, KIND_QUEUE, opts.per_disk).items():
            head = f"disk = {_disk(dev)}, " if opts.per_disk else ""
            print(f"\n{head}op = {OPS[min(op, len(OPS) - 1)]}, queued (insert to issue)", file=out)
            print(_merged(cells, opts.unit).render(), file=out)
    if opts.sizes:
        _sizes_text(groups, opts, out)
    if opts.depth:
        for dev, info in depth_rows(snap).items():
            print(
                f"\ndisk = {_disk(dev)}, queue depth at issue "
                f"(now {info['inflight']}, max {info['max']}, avg {info['avg']})",
                file=out,
            )
            print(info["hist"].render("depth"), file=out)
    _stats_text(snap, opts, out)
    lost = {k: v for k, v in snap.counters.items() if v and k not in INFO_COUNTERS}
    if lost:
        print(
            "lost: " + ", ".join(f"{k}={v}" for k, v in lost.items()) + _lost_hint(lost), file=out
        )
    if snap.counters.get("requeued"):
        print(f"requeued after issue: {snap.counters['requeued']}", file=out)


def _lost_hint(lost: dict[str, int]) -> str:
    if set(lost) == {"unmatched"}:
        return " (completions of requests issued before tracing started)"
    return ""


def _sizes_text(
    groups: dict[tuple[int | None, int], list[tuple[int, Cell]]], opts: Options, out: TextIO
) -> None:
    for (dev, op), cells in groups.items():
        head = f"disk = {_disk(dev)}, " if opts.per_disk else ""
        count = sum(c.count for _, c in cells)
        avg = sum(c.bytes for _, c in cells) / count if count else 0
        print(
            f"\n{head}op = {OPS[min(op, len(OPS) - 1)]}, request sizes (avg {fmt_bytes(avg)})",
            file=out,
        )
        print(_size_hist(cells).render("bytes"), file=out)
        rows = [
            [
                fmt_bytes(slot_bounds(slot)[0]),
                str(c.count),
                f"{c.sum / c.count / opts.unit_ns:.1f}",
                f"{Log2Hist(c.slots, opts.unit).percentile(0.5):.0f}",
                f"{Log2Hist(c.slots, opts.unit).percentile(0.99):.0f}",
            ]
            for slot, c in cells
        ]
        u = "ms" if opts.millis else "us"
        print_table(["SIZE>=", "COUNT", f"AVG({u})", f"P50({u})", f"P99({u})"], rows, out)


def _stats_text(snap: Snapshot, opts: Options, out: TextIO) -> None:
    rows = device_rows(snap, opts)
    if not rows:
        return
    u = "ms" if opts.millis else "us"
    table = []
    for r in rows:
        table.append(
            [
                r.disk,
                r.op,
                str(r.count),
                f"{r.count / r.seconds:.1f}" if r.seconds else "-",
                f"{r.bytes / r.seconds / 1e6:.2f}" if r.seconds else "-",
                fmt_bytes(r.bytes / r.count if r.count else 0),
                f"{r.sum_ns / r.count / opts.unit_ns:.1f}" if r.count else "-",
                f"{r.hist.percentile(0.5):.0f}",
                f"{r.hist.percentile(0.99):.0f}",
            ]
        )
    print(file=out)
    print_table(
        ["DISK", "OP", "COUNT", "IOPS", "MB/s", "AVG_SIZE", f"AVG({u})", f"P50({u})", f"P99({u})"],
        table,
        out,
    )


SLOW_HEADER = (
    f"{'TIME':<15} {'COMM':<16} {'PID':>7} {'DISK':<8} {'T':<4} "
    f"{'SECTOR':>12} {'BYTES':>8} {'LAT(ms)':>9}"
)


def slow_records(events: np.ndarray[Any, Any]) -> Iterator[dict[str, Any]]:
    """Exercise 3: one dict per slow request, in the order the kernel completed them."""
    offset = time.time_ns() - time.monotonic_ns()
    for e in events:
        dev = int(e["dev"])
        yield {
            "event": "slow_io",
            "wall_time": iso_now(int(e["ts_ns"]) + offset),
            "timestamp_ns": int(e["ts_ns"]),
            "disk": proc.device_name(dev),
            "dev": f"{proc.dev_major(dev)}:{proc.dev_minor(dev)}",
            "op": OPS[min(int(e["op"]), len(OPS) - 1)],
            "rwbs": e["rwbs"].decode(errors="replace"),
            "sector": int(e["sector"]),
            "bytes": int(e["bytes"]),
            "latency_ns": int(e["latency_ns"]),
            "queue_ns": int(e["queue_ns"]),
            "pid": int(e["pid"]),
            "comm": e["comm"].decode(errors="replace"),
            "error": int(e["error"]),
        }


def slow_line(r: dict[str, Any]) -> str:
    return (
        f"{r['wall_time'][11:26]:<15} {r['comm']:<16} {r['pid']:>7} {r['disk']:<8} "
        f"{r['rwbs']:<4} {r['sector']:>12} {r['bytes']:>8} {r['latency_ns'] / 1e6:>9.3f}"
    )


# ---- command line --------------------------------------------------------------------

EXAMPLES = """examples:
  meridian biolat                 # latency histograms by op until Ctrl-C
  meridian biolat 1 10            # print 1 second summaries, 10 times
  meridian biolat -D -m 5         # per disk, milliseconds, every 5 seconds
  meridian biolat -Q              # include OS queued time (insert to complete)
  meridian biolat -d nvme0n1      # only this disk (loop0, /dev/vda, 259:0 also work)
  meridian biolat --sizes         # request size histograms and latency by size
  meridian biolat --depth         # queue depth at each issue, per disk
  meridian biolat --slow 10       # stream each request slower than 10 ms
  meridian biolat --json 1        # one JSON object per second
  meridian biolat --workload 10 1 # demo: a small O_DIRECT workload, one 10 s report
  meridian biolat --prometheus :9435   # per-disk histograms on /metrics, read on scrape
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "biolat",
        help="block I/O latency histograms, sizes, queue depth, slow requests",
        description="Summarize block device I/O latency as histograms, per op and disk.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("interval", nargs="?", help="seconds between reports (default: one at the end)")
    p.add_argument("count", nargs="?", help="number of reports (default: until Ctrl-C)")
    p.add_argument("-D", "--disks", action="store_true", help="one histogram per disk")
    p.add_argument("-Q", "--queued", action="store_true", help="include OS queued time")
    p.add_argument("-m", "--milliseconds", action="store_true", help="histograms in msecs")
    p.add_argument("-d", "--disk", metavar="DISK", help="trace this disk only")
    p.add_argument("-T", "--timestamp", action="store_true", help="print a timestamp per report")
    p.add_argument("--json", action="store_true", help="JSON lines instead of text")
    p.add_argument("--sizes", action="store_true", help="request size histograms (exercise 2)")
    p.add_argument("--depth", action="store_true", help="queue depth histograms (exercise 4)")
    p.add_argument("--slow", metavar="MS", help="stream requests slower than MS ms (0: all)")
    p.add_argument("--duration", metavar="SECONDS", help="stop after this long")
    p.add_argument(
        "--strategy", choices=[s.name for s in STRATEGIES], help="force a probe strategy"
    )
    p.add_argument("--workload", action="store_true", help="run a small built-in disk workload")
    p.add_argument("-v", "--verbose", action="store_true", help="libbpf and strategy detail")
    add_arguments(p)
    return p


def options_from_args(args: argparse.Namespace) -> Options:
    slow = None
    if args.slow is not None:
        try:
            slow = float(args.slow)
        except ValueError:
            raise UsageError(f"--slow takes milliseconds as a number, got {args.slow!r}") from None
        if slow < 0 or slow != slow:
            raise UsageError(f"--slow must be 0 or more milliseconds, got {args.slow!r}")
    disk = None
    if args.disk is not None:
        try:
            disk = proc.parse_device(args.disk)
        except ValueError as exc:
            raise UsageError(f"{exc}: see lsblk for disk names") from None
    count = positive_number(args.count, "count", integer=True)
    return Options(
        interval=positive_number(args.interval, "interval"),
        count=int(count) if count is not None else None,
        duration=positive_number(args.duration, "--duration"),
        per_disk=args.disks,
        queued=args.queued,
        millis=args.milliseconds,
        disk=disk,
        timestamps=args.timestamp,
        json=args.json,
        sizes=args.sizes,
        depth=args.depth,
        slow_ms=slow,
        strategy=args.strategy,
        workload=args.workload,
        verbose=args.verbose,
        export=from_args(args),
    )


@contextlib.contextmanager
def _workload(on: bool, seconds: float | None) -> Iterator[None]:
    if not on:
        yield
        return
    child = subprocess.Popen(
        [sys.executable, "-m", "meridian.workloads", "direct-io", "--seconds", str(seconds or 3600)]
    )
    try:
        yield
    finally:
        child.terminate()
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    return run_options(opts, sys.stdout)


def run_options(opts: Options, out: TextIO) -> int:
    json_out = JsonWriter(out) if opts.json else None
    with Biolat(opts) as tool, exporting(opts.export, tool.metrics, tool.name):
        if opts.verbose:
            print(f"strategy: {tool.strategy.name} ({', '.join(tool.selected)})", file=sys.stderr)
        if not opts.json:
            msg = "Tracing block device I/O... Hit Ctrl-C to end."
            print(msg, file=out)
            if opts.slow_ms is not None:
                print(SLOW_HEADER, file=out)
        out.flush()
        total = opts.duration or (
            opts.interval * opts.count if opts.interval and opts.count else None
        )
        with _workload(opts.workload, total):
            _loop(tool, opts, out, json_out)
    return 0


def _loop(tool: Biolat, opts: Options, out: TextIO, json_out: JsonWriter | None) -> None:
    def emit(prev: Snapshot, cur: Snapshot) -> None:
        delta = cur.since(prev)
        if json_out:
            json_out.write(report_json(delta, opts))
        else:
            report_text(delta, opts, out)
        out.flush()

    def wait(seconds: float) -> None:
        _print_slow(tool.events(min(0.05, seconds)), out, json_out)

    def last_events() -> None:
        _print_slow(tool.events(0), out, json_out)
        if not opts.json:
            print(file=out)

    report_loop(
        tool.snapshot,
        emit,
        interval=opts.interval,
        count=opts.count,
        duration=opts.duration,
        has_news=lambda prev, cur: bool(cur.since(prev).cells),
        wait=wait,
        on_interrupt=last_events,
    )


def _print_slow(recs: np.ndarray[Any, Any], out: TextIO, json_out: JsonWriter | None) -> None:
    if not len(recs):
        return
    for r in slow_records(recs):
        if json_out:
            json_out.write(r)
        else:
            print(slow_line(r), file=out)
    out.flush()
