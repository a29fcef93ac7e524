"""meridian memlat: page-fault handling latency (seed 001), t_exit - t_entry matched
per thread, as log2 histograms per minor/major fault and, with -P, per process.

The kernel counts into a per-CPU hash map keyed by (pid, kind, comm); every view here
is a sum over it. Intervals are differences of two snapshots, so no sample is lost to
a read-then-clear race. `meridian memlat validate` runs the seed's on/off experiment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

import numpy as np

from ..bpf import BpfObject, PerfEvent, Strategy, choose, open_per_cpu
from ..errors import UsageError
from ..export import ExportOptions, Family, HistPoint, Point, add_arguments, from_args
from ..hist import Log2Hist
from ..output import JsonWriter, iso_now, print_table
from ..proc import thread_slots
from ..reporting import pid_arg, positive_number, run_histograms
from ..session import Session

__all__ = [
    "STRATEGIES",
    "Cell",
    "Memlat",
    "Options",
    "Snapshot",
    "add_parser",
    "report_json",
    "run",
    "validate",
]

KINDS = ("minor", "major")
LOST = ("stale", "unmatched", "failed", "exited", "evicted", "hists_full")
PERF_PROGRAMS = ("perf_fault_min", "perf_fault_maj")

STRATEGIES = (
    Strategy("fentry", ("fentry_fault", "fexit_fault", "btf_thread_exit"), ("fentry", "tp_btf")),
    Strategy(
        "kprobe", ("kprobe_fault", "kretprobe_fault", "tp_thread_exit"), ("kprobe", "tracepoint")
    ),
    Strategy(
        "tp_btf+perf",
        ("btf_fault_user", "btf_fault_kernel", "btf_thread_exit", *PERF_PROGRAMS),
        ("tp_btf", "perf_event"),
    ),
    Strategy(
        "tracepoint+perf",
        ("tp_fault_user", "tp_fault_kernel", "tp_thread_exit", *PERF_PROGRAMS),
        ("tracepoint", "perf_event"),
    ),
)


@dataclass
class Options:
    interval: float | None = None
    count: int | None = None
    duration: float | None = None
    per_process: bool = False
    pid: int | None = None
    ns: bool = False
    threshold_us: float = 8.0
    timestamps: bool = False
    json: bool = False
    output: str | None = None
    strategy: str | None = None
    verbose: bool = False
    export: ExportOptions | None = None

    @property
    def unit(self) -> str:
        return "nsecs" if self.ns else "usecs"

    @property
    def unit_ns(self) -> int:
        return 1 if self.ns else 1000

    @property
    def tail_ns(self) -> int:
        return round(self.threshold_us * 1000)


# ---- snapshots ---------------------------------------------------------------------


@dataclass
class Cell:
    """One histogram of the kernel map (one pid, kind and comm), summed over CPUs."""

    slots: np.ndarray[Any, np.dtype[np.uint64]]
    sum_ns: int
    max_ns: int
    tail: int

    @property
    def count(self) -> int:
        return int(self.slots.sum())


Key = tuple[int, int, str]  # pid (0 unless -P), kind, comm


@dataclass
class Snapshot:
    t: float
    cells: dict[Key, Cell]
    counters: dict[str, int] = field(default_factory=dict)
    inflight: int = 0
    seconds: float = 0.0
    unit_ns: int = 1000

    def since(self, prev: Snapshot) -> Snapshot:
        """What happened between `prev` and this snapshot (max stays cumulative)."""
        cells = {}
        for k, c in self.cells.items():
            p = prev.cells.get(k)
            if p is None:
                d = c
            else:
                slots = c.slots - p.slots
                d = Cell(
                    slots,
                    c.sum_ns - p.sum_ns,
                    _interval_max(c, p, slots, self.unit_ns),
                    c.tail - p.tail,
                )
            if d.count:
                cells[k] = d
        counters = {k: v - prev.counters.get(k, 0) for k, v in self.counters.items()}
        return Snapshot(self.t, cells, counters, self.inflight, self.t - prev.t, self.unit_ns)

    def lost(self) -> dict[str, int]:
        """Faults started or finished that are not in the histograms, by reason."""
        return {k: self.counters.get(k, 0) for k in LOST}

    def total(self, unit: str, kind: int | None = None, pid: int | None = None) -> Summary:
        cells = [
            c
            for (p, k, _), c in self.cells.items()
            if (kind is None or k == kind) and (pid is None or p == pid)
        ]
        return Summary.of(cells, unit)


def _interval_max(cur: Cell, prev: Cell, slots: np.ndarray[Any, Any], unit_ns: int) -> int:
    """The kernel keeps the largest latency since attach. When it grew, the new one
    happened in this interval (exact); otherwise the interval's largest is at most both
    the old one and the top of its highest non-empty slot (an upper bound)."""
    if cur.max_ns > prev.max_ns:
        return cur.max_ns
    nonzero = np.flatnonzero(slots)
    if not len(nonzero):
        return 0
    top = (1 << (int(nonzero[-1]) + 1)) * unit_ns - 1
    return min(prev.max_ns, top)


@dataclass
class Summary:
    hist: Log2Hist
    sum_ns: int
    max_ns: int
    tail: int

    @classmethod
    def of(cls, cells: list[Cell], unit: str) -> Summary:
        hist = Log2Hist.merge((Log2Hist(c.slots, unit) for c in cells), _NSLOTS, unit)
        return cls(
            hist,
            sum(c.sum_ns for c in cells),
            max((c.max_ns for c in cells), default=0),
            sum(c.tail for c in cells),
        )

    @property
    def count(self) -> int:
        return self.hist.total

    def as_dict(self, opts: Options) -> dict[str, Any]:
        n = self.count
        return {
            "count": n,
            "tail_threshold_us": opts.threshold_us,
            "tail_count": self.tail,
            "tail_share": round(self.tail / n, 6) if n else 0.0,
            "avg_ns": self.sum_ns // n if n else 0,
            "p50_ns": round(self.pct_ns(0.5, opts)),
            "p99_ns": round(self.pct_ns(0.99, opts)),
            "max_ns": self.max_ns,
            "hist": self.hist.to_json(),
        }

    def tail_line(self, opts: Options) -> str:
        n = self.count
        share = 100.0 * self.tail / n if n else 0.0
        return (
            f"tail: {self.tail} of {n} faults ({share:.2f}%) >= {opts.threshold_us:g} us; "
            f"p50 {_us(self.pct_ns(0.5, opts))}, "
            f"p99 {_us(self.pct_ns(0.99, opts))}, max {_us(self.max_ns)}"
        )

    def pct_ns(self, q: float, opts: Options) -> float:
        """The q-quantile estimate in ns, never above the largest latency seen."""
        return min(self.hist.percentile(q) * opts.unit_ns, float(self.max_ns))


_NSLOTS = 32  # MEMLAT_MAX_SLOTS, checked against the object's BTF at load


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f} us" if ns < 10_000 else f"{ns / 1000:.0f} us"


# ---- the kernel side -----------------------------------------------------------------


class Memlat(Session):
    """The loaded programs; `snapshot()` reads the maps, `metrics()` too, for export."""

    name = "memlat"
    OBJECT = "memlat"  # bpfobj/memlat.bpf.o

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.strategy = choose(STRATEGIES, opts.strategy)

    def setup(self, obj: BpfObject) -> None:
        o = self.opts
        slots = thread_slots()
        obj.resize("starts", slots)
        obj.set_rodata(
            {
                "starts_mask": slots - 1,
                "latency_unit_ns": o.unit_ns,
                "tail_ns": o.tail_ns,
                "per_process": o.per_process,
                "filter_pid": o.pid or 0,
            }
        )
        obj.select(self.strategy.programs)
        obj.load()
        obj.attach([p for p in self.strategy.programs if p not in PERF_PROGRAMS])
        if PERF_PROGRAMS[0] in self.strategy.programs:
            for prog, event in zip(
                PERF_PROGRAMS,
                (PerfEvent.PAGE_FAULTS_MIN, PerfEvent.PAGE_FAULTS_MAJ),
                strict=True,
            ):
                _attach_per_cpu(obj, prog, event)

    def snapshot(self) -> Snapshot:
        assert self.obj is not None
        cells: dict[Key, Cell] = {}
        if self.opts.per_process:
            keys, vals = self.obj.maps["hists"].items()
            labels = [
                (int(k["pid"]), int(k["kind"]), bytes(k["comm"]).decode(errors="replace"))
                for k in keys
            ]
        else:
            keys, vals = self.obj.maps["totals"].items()
            labels = [(0, int(k), "") for k in keys]
        for key, v in zip(labels, vals, strict=True):  # v: one value per CPU
            cells[key] = Cell(
                v["slots"].sum(axis=0).astype(np.uint64),
                int(v["sum_ns"].sum()),
                int(v["max_ns"].max()),
                int(v["tail"].sum()),
            )
        counters = self.obj.maps["counters"].summed()
        # The kernel counts neither: every matched fault is in a slot or in
        # hists_full, the open ones hold a start time, the rest ended as a loss.
        counters["matched"] = sum(c.count for c in cells.values()) + counters["hists_full"]
        _, starts = self.obj.maps["starts"].items()
        inflight = int((starts["ts_ns"] != 0).sum()) if len(starts) else 0
        ended = ("matched", "stale", "failed", "exited", "evicted")
        counters["started"] = inflight + sum(counters[k] for k in ended)
        return Snapshot(time.monotonic(), cells, counters, inflight, 0.0, self.opts.unit_ns)

    def metrics(self) -> list[Family]:
        return series(self.snapshot(), self.opts)


def series(snap: Snapshot, opts: Options) -> list[Family]:
    """The exported families (cumulative since attach): fault counts and latency
    histograms per type (`system.paging.type`), and per process with -P."""
    faults = Family("system.paging.faults", "counter", "{fault}", "Page faults handled")
    dur = Family(
        "system.paging.fault.duration",
        "histogram",
        "s",
        "Page-fault handling latency (handle_mm_fault entry to exit)",
    )
    tail = Family(
        "meridian.memlat.tail",
        "counter",
        "{fault}",
        f"Faults at or above the tail threshold ({opts.threshold_us:g} us)",
    )
    lost = Family(
        "meridian.memlat.lost", "counter", "{fault}", "Faults not in the histograms, by reason"
    )
    for (pid, kind, comm), c in sorted(snap.cells.items()):
        a: dict[str, str | int | bool] = {"system.paging.type": KINDS[kind]}
        if opts.per_process:
            a = {"process.pid": pid, "process.executable.name": comm, **a}
        faults.points.append(Point(a, c.count))
        tail.points.append(Point(a, c.tail))
        dur.points.append(
            HistPoint(a, c.slots, opts.unit_ns * 1e-9, c.sum_ns / 1e9, c.max_ns / 1e9)
        )
    for reason, n in snap.lost().items():
        lost.points.append(Point({"reason": reason}, n))
    return [faults, dur, tail, lost]


def _attach_per_cpu(obj: BpfObject, prog: str, event: tuple[int, int]) -> None:
    """One perf event per CPU, sample_period 1: every fault runs the program."""
    fds = open_per_cpu(event, sample_period=1)
    try:
        while fds:
            obj.programs[prog].attach_perf_event(fds[0])  # the link owns the fd now
            fds.pop(0)
    finally:
        for fd in fds:
            os.close(fd)


# ---- views ---------------------------------------------------------------------------


def _groups(snap: Snapshot, opts: Options) -> list[tuple[str, Summary, dict[str, Any]]]:
    """(heading, summary, labels) for each histogram shown: per kind, and per
    process with -P, busiest process first."""
    out = []
    if opts.per_process:
        procs = sorted(
            {(p, c) for (p, _, c) in snap.cells},
            key=lambda pc: (
                -sum(cell.count for (p, _, c), cell in snap.cells.items() if (p, c) == pc)
            ),
        )
        for pid, comm in procs:
            for kind, name in enumerate(KINDS):
                cells = [
                    c for (p, k, cm), c in snap.cells.items() if (p, k, cm) == (pid, kind, comm)
                ]
                if cells:
                    out.append(
                        (
                            f"pid = {pid}, comm = {comm}, kind = {name}",
                            Summary.of(cells, opts.unit),
                            {"pid": pid, "comm": comm, "kind": name},
                        )
                    )
    else:
        for kind, name in enumerate(KINDS):
            s = snap.total(opts.unit, kind=kind)
            if s.count:
                out.append((f"kind = {name}", s, {"kind": name}))
    return out


def report_json(snap: Snapshot, opts: Options, strategy: str = "") -> dict[str, Any]:
    total = snap.total(opts.unit)
    return {
        "time": iso_now(),
        "interval_s": round(snap.seconds, 6),
        "unit": opts.unit,
        "strategy": strategy,
        "histograms": [{**labels, **s.as_dict(opts)} for _, s, labels in _groups(snap, opts)],
        "total": total.as_dict(opts),
        "lost": snap.lost(),
    }


def report_text(snap: Snapshot, opts: Options, out: TextIO) -> None:
    if opts.timestamps:
        print(time.strftime("%H:%M:%S"), file=out)
    groups = _groups(snap, opts)
    if not groups:
        print("no page faults in this interval", file=out)
    for head, s, _ in groups:
        print(f"\n{head}", file=out)
        print(s.hist.render(), file=out)
        print(s.tail_line(opts), file=out)
    total = snap.total(opts.unit)
    if len(groups) > 1:
        print(f"\nall faults: {total.tail_line(opts)}", file=out)
    lost = {k: v for k, v in snap.lost().items() if v}
    if lost:
        print("not in the histograms: " + ", ".join(f"{k}={v}" for k, v in lost.items()), file=out)


# ---- validation: the seed's on/off experiment --------------------------------------


@dataclass
class Case:
    name: str
    summary: Summary
    seconds: float
    workload_faults: int = 0
    pages: int = 0


@contextlib.contextmanager
def page_toucher(megabytes: int, seconds: float | None = None) -> Iterator[subprocess.Popen[str]]:
    """The built-in page-touch workload in a child, started and waiting: write a line to
    its stdin to start it; its last stdout line is JSON with the pages it touched."""
    cmd = [sys.executable, "-m", "meridian.workloads", "page-touch", "--mb", str(megabytes)]
    cmd += ["--wait"] + (["--seconds", str(seconds)] if seconds else ["--rounds", "1"])
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("page-touch workload did not start")
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        for f in (child.stdin, child.stdout):
            if f:
                f.close()


def run_toucher(child: subprocess.Popen[str]) -> dict[str, Any]:
    """Start a waiting page-toucher and wait for its result."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    result: dict[str, Any] = json.loads(child.stdout.readline())
    child.wait(600)
    return result


def validate(opts: Options, seconds: float, megabytes: int) -> tuple[bool, dict[str, Any]]:
    """OFF (idle) then ON (page-touch workload) for `seconds` each, in one session."""
    vopts = Options(**{**opts.__dict__, "per_process": True, "pid": None})
    with Memlat(vopts) as tool, page_toucher(megabytes, seconds) as child:
        s0 = tool.snapshot()
        time.sleep(seconds)
        s1 = tool.snapshot()
        result = run_toucher(child)
        s2 = tool.snapshot()
        strategy = tool.strategy.name
    off, on = s1.since(s0), s2.since(s1)
    pid, pages = int(result["pid"]), int(result["pages"])
    cases = [
        Case("OFF", off.total(vopts.unit), off.seconds),
        Case("ON", on.total(vopts.unit), on.seconds, on.total(vopts.unit, pid=pid).count, pages),
    ]
    c_off, c_on = cases
    err = abs(c_on.workload_faults - pages) / pages if pages else 1.0
    checks = {
        "more_faults": c_on.summary.count > c_off.summary.count,
        "more_tail_events": c_on.summary.tail > c_off.summary.tail,
        "workload_faults_within_5pct": err <= 0.05,
    }
    passed = all(checks.values())
    report: dict[str, Any] = {
        "time": iso_now(),
        "strategy": strategy,
        "unit": vopts.unit,
        "seconds": seconds,
        "tail_threshold_us": vopts.threshold_us,
        "workload": {
            "pid": pid,
            "pages_touched": pages,
            "faults": c_on.workload_faults,
            "error": round(err, 6),
        },
        "cases": [
            {"case": c.name, "seconds": round(c.seconds, 3), **c.summary.as_dict(vopts)}
            for c in cases
        ],
        "checks": checks,
        "passed": passed,
        "lost": {c: (off if c == "OFF" else on).lost() for c in ("OFF", "ON")},
    }
    return passed, report


def validate_text(report: dict[str, Any], out: TextIO) -> None:
    u = "us"
    print(
        f"memlat validate: {report['seconds']:g} s idle (OFF), then {report['seconds']:g} s of "
        f"the page-touch workload (ON); strategy {report['strategy']}\n",
        file=out,
    )
    rows = [
        [
            c["case"],
            str(c["count"]),
            str(c["tail_count"]),
            f"{100 * c['tail_share']:.2f}%",
            f"{c['p50_ns'] / 1000:.1f}",
            f"{c['p99_ns'] / 1000:.1f}",
            f"{c['max_ns'] / 1000:.0f}",
        ]
        for c in report["cases"]
    ]
    thr = f"{report['tail_threshold_us']:g}{u}"
    print_table(
        [
            "Case",
            "Total faults",
            f"Tail events (>= {thr})",
            "Tail share",
            f"p50({u})",
            f"p99({u})",
            f"max({u})",
        ],
        rows,
        out,
    )
    w = report["workload"]
    print(
        f"\nworkload pid {w['pid']}: {w['pages_touched']} pages touched, {w['faults']} faults "
        f"attributed ({100 * w['error']:.2f}% off)",
        file=out,
    )
    for name, ok in report["checks"].items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name.replace('_', ' ')}", file=out)
    print(
        "\nthe metric responds to the workload"
        if report["passed"]
        else "\nFAILED: the metric did not respond as expected",
        file=out,
    )


# ---- command line --------------------------------------------------------------------

EXAMPLES = """examples:
  meridian memlat                  # minor/major fault latency histograms until Ctrl-C
  meridian memlat 1 10             # print 1 second summaries, 10 times
  meridian memlat --ns 5           # nanosecond buckets, every 5 seconds
  meridian memlat -P -p 1234       # per process, only PID 1234
  meridian memlat --threshold 16   # tail line counts faults >= 16 us
  meridian memlat --duration 10 -o faults.txt   # one 10 s report, also saved to a file
  meridian memlat --json 1         # one JSON object per second
  meridian memlat -P --prometheus :9435   # histograms on /metrics, read on scrape
  meridian memlat validate         # the on/off experiment: 10 s idle, 10 s page-touch
  meridian memlat validate --seconds 3 --json
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "memlat",
        help="page-fault latency histograms, minor/major, per process; validate",
        description="Summarize page-fault handling latency (handle_mm_fault entry to exit) "
        "as histograms per minor/major fault. 'validate' as first argument runs the "
        "on/off experiment with a built-in page-touch workload.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "interval", nargs="?", help="seconds between reports (default: one at the end), or validate"
    )
    p.add_argument("count", nargs="?", help="number of reports (default: until Ctrl-C)")
    p.add_argument("-P", "--pids", action="store_true", help="one histogram per process")
    p.add_argument("-p", "--pid", metavar="PID", help="trace this process only")
    p.add_argument("--ns", action="store_true", help="histograms in nsecs")
    p.add_argument("--threshold", metavar="US", help="tail threshold in microseconds (default 8)")
    p.add_argument("-T", "--timestamp", action="store_true", help="print a timestamp per report")
    p.add_argument("--json", action="store_true", help="JSON lines instead of text")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the reports to FILE")
    p.add_argument("--duration", metavar="SECONDS", help="stop after this long")
    p.add_argument(
        "--strategy", choices=[s.name for s in STRATEGIES], help="force a probe strategy"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="libbpf and strategy detail")
    add_arguments(p)
    v = p.add_argument_group("validate")
    v.add_argument("--seconds", metavar="N", help="length of each case (default 10)")
    v.add_argument("--mb", metavar="MIB", help="page-touch region size (default 256)")
    return p


def _output(path: str | None) -> str | None:
    if path is None:
        return None
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {parent} does not exist")
    if Path(path).is_dir():
        raise UsageError(f"cannot write {path}: it is a directory, give a file name")
    return path


def options_from_args(args: argparse.Namespace, validating: bool = False) -> Options:
    count = None if validating else positive_number(args.count, "count", integer=True)
    threshold = positive_number(args.threshold, "--threshold")
    return Options(
        interval=None if validating else positive_number(args.interval, "interval"),
        count=int(count) if count is not None else None,
        duration=positive_number(args.duration, "--duration"),
        per_process=args.pids,
        pid=pid_arg(args.pid),
        ns=args.ns,
        threshold_us=threshold if threshold is not None else 8.0,
        timestamps=args.timestamp,
        json=args.json,
        output=_output(args.output),
        strategy=args.strategy,
        verbose=args.verbose,
        export=from_args(args),
    )


class _Tee:
    """Write to stdout and, with -o, to a file too."""

    def __init__(self, out: TextIO, file: IO[str] | None) -> None:
        self.out, self.file = out, file

    def write(self, s: str) -> int:
        self.out.write(s)
        if self.file:
            self.file.write(s)
        return len(s)

    def flush(self) -> None:
        self.out.flush()
        if self.file:
            self.file.flush()


def run(args: argparse.Namespace) -> int:
    validating = args.interval == "validate"
    if not validating and (args.seconds is not None or args.mb is not None):
        raise UsageError("--seconds and --mb belong to 'meridian memlat validate'")
    opts = options_from_args(args, validating)
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(open(opts.output, "w")) if opts.output else None
        out: TextIO = _Tee(sys.stdout, f)  # type: ignore[assignment]
        if validating:
            if args.count is not None:
                raise UsageError(f"validate takes no count, got {args.count!r}")
            if opts.export is not None and opts.export.any:
                raise UsageError("validate exports nothing: drop --prometheus and --otlp-endpoint")
            secs = positive_number(args.seconds, "--seconds") or 10.0
            mb = int(positive_number(args.mb, "--mb", integer=True) or 256)
            ok, report = validate(opts, secs, mb)
            if opts.json:
                JsonWriter(out).write(report)
            else:
                validate_text(report, out)
            return 0 if ok else 1
        return run_options(opts, out)


def run_options(opts: Options, out: TextIO) -> int:
    banner = "Tracing page faults... Hit Ctrl-C to end."
    return run_histograms(Memlat(opts), opts, out, banner, report_json, report_text)
