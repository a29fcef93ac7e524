"""meridian runqlat: run-queue latency histograms (seed 001's next step), like bcc's
runqlat: the time from a wake-up or a preemption until the task runs on a CPU.

The kernel counts into a per-CPU hash map keyed by (pid, comm) (pid 0 unless -P);
intervals are differences of two snapshots. `meridian runqlat validate` runs an on/off
experiment: one busy process, then more busy processes than cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from ..bpf import BpfObject, Strategy, choose
from ..errors import UsageError
from ..export import ExportOptions, Family, HistPoint, Point, add_arguments, from_args
from ..hist import Log2Hist
from ..output import JsonWriter, iso_now, print_table
from ..proc import thread_slots
from ..reporting import pid_arg, positive_number, run_histograms
from ..session import Session
from ..system import online_cpu_count

__all__ = ["STRATEGIES", "Options", "Runqlat", "Snapshot", "add_parser", "run", "validate"]

STRATEGIES = (
    Strategy("tp_btf", ("btf_wakeup", "btf_wakeup_new", "btf_switch"), ("tp_btf",)),
    Strategy("tracepoint", ("tp_wakeup", "tp_wakeup_new", "tp_switch"), ("tracepoint",)),
)
NSLOTS = 32  # RUNQLAT_MAX_SLOTS


@dataclass
class Options:
    interval: float | None = None
    count: int | None = None
    duration: float | None = None
    per_process: bool = False
    pid: int | None = None
    millis: bool = False
    timestamps: bool = False
    json: bool = False
    strategy: str | None = None
    verbose: bool = False
    export: ExportOptions | None = None

    @property
    def unit(self) -> str:
        return "msecs" if self.millis else "usecs"

    @property
    def unit_ns(self) -> int:
        return 1_000_000 if self.millis else 1000


@dataclass
class Cell:
    slots: np.ndarray[Any, np.dtype[np.uint64]]
    sum_ns: int
    max_ns: int

    @property
    def count(self) -> int:
        return int(self.slots.sum())


Key = tuple[int, str]  # tgid (0 unless -P), comm


@dataclass
class Snapshot:
    t: float
    cells: dict[Key, Cell]
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def since(self, prev: Snapshot) -> Snapshot:
        """What happened between `prev` and this snapshot (max stays cumulative)."""
        cells = {}
        for k, c in self.cells.items():
            p = prev.cells.get(k)
            d = c if p is None else Cell(c.slots - p.slots, c.sum_ns - p.sum_ns, c.max_ns)
            if d.count:
                cells[k] = d
        counters = {k: v - prev.counters.get(k, 0) for k, v in self.counters.items()}
        return Snapshot(self.t, cells, counters, self.t - prev.t)

    def __add__(self, other: Snapshot) -> Snapshot:
        """Two intervals together (for cases measured in several rounds)."""
        cells = dict(self.cells)
        for k, c in other.cells.items():
            p = cells.get(k)
            cells[k] = (
                c
                if p is None
                else Cell(p.slots + c.slots, p.sum_ns + c.sum_ns, max(p.max_ns, c.max_ns))
            )
        counters = {k: self.counters.get(k, 0) + v for k, v in other.counters.items()}
        return Snapshot(max(self.t, other.t), cells, counters, self.seconds + other.seconds)

    def hist(self, unit: str) -> Log2Hist:
        return Log2Hist.merge((Log2Hist(c.slots, unit) for c in self.cells.values()), NSLOTS, unit)


class Runqlat(Session):
    """The loaded programs; `snapshot()` reads the maps, `metrics()` too, for export."""

    name = "runqlat"
    OBJECT = "runqlat"  # bpfobj/runqlat.bpf.o

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.strategy = choose(STRATEGIES, opts.strategy)

    def setup(self, obj: BpfObject) -> None:
        o = self.opts
        slots = thread_slots()
        obj.resize("start", slots)
        obj.set_rodata(
            {
                "starts_mask": slots - 1,
                "latency_unit_ns": o.unit_ns,
                "per_process": o.per_process,
                "filter_pid": o.pid or 0,
            }
        )
        obj.select(self.strategy.programs)
        obj.load()
        obj.attach()

    def snapshot(self) -> Snapshot:
        assert self.obj is not None
        if self.opts.per_process:
            keys, vals = self.obj.maps["hists"].items()
            labels = [(int(k["pid"]), bytes(k["comm"]).decode(errors="replace")) for k in keys]
        else:
            _, vals = self.obj.maps["totals"].items()
            labels = [(0, "")] * len(vals)
        cells = {
            key: Cell(
                v["slots"].sum(axis=0).astype(np.uint64),
                int(v["sum_ns"].sum()),
                int(v["max_ns"].max()),
            )
            for key, v in zip(labels, vals, strict=True)
        }
        cells = {k: c for k, c in cells.items() if c.count}
        counters = self.obj.maps["counters"].summed()
        return Snapshot(time.monotonic(), cells, counters)

    def metrics(self) -> list[Family]:
        return series(self.snapshot(), self.opts)


def series(snap: Snapshot, opts: Options) -> list[Family]:
    """The exported families (cumulative since attach): the run-queue latency
    histogram, per process with -P."""
    dur = Family(
        "system.runqueue.duration",
        "histogram",
        "s",
        "Run-queue latency: wake-up or preemption until the task runs",
    )
    lost = Family(
        "meridian.runqlat.lost", "counter", "{event}", "Waits not in the histograms, by reason"
    )
    for (pid, comm), c in sorted(snap.cells.items()):
        a: dict[str, str | int | bool] = {}
        if opts.per_process:
            a = {"process.pid": pid, "process.executable.name": comm}
        dur.points.append(
            HistPoint(a, c.slots, opts.unit_ns * 1e-9, c.sum_ns / 1e9, c.max_ns / 1e9)
        )
    lost.points.append(Point({"reason": "hists_full"}, snap.counters.get("hists_full", 0)))
    return [dur, lost]


# ---- views ---------------------------------------------------------------------------


def _groups(snap: Snapshot, opts: Options) -> list[tuple[Key, Cell]]:
    if not opts.per_process:
        if not snap.cells:
            return []
        cells = list(snap.cells.values())
        merged = Cell(
            np.sum([c.slots for c in cells], axis=0).astype(np.uint64),
            sum(c.sum_ns for c in cells),
            max(c.max_ns for c in cells),
        )
        return [((0, ""), merged)]
    return sorted(snap.cells.items(), key=lambda kv: -kv[1].count)


def _stats(cell: Cell, opts: Options) -> dict[str, Any]:
    h = Log2Hist(cell.slots, opts.unit)
    n = cell.count
    return {
        "count": n,
        "avg_ns": cell.sum_ns // n if n else 0,
        "p50_ns": round(h.percentile(0.5) * opts.unit_ns),
        "p99_ns": round(min(h.percentile(0.99) * opts.unit_ns, cell.max_ns)),
        "max_ns": cell.max_ns,
        "hist": h.to_json(),
    }


def report_json(snap: Snapshot, opts: Options, strategy: str = "") -> dict[str, Any]:
    hists = []
    for (pid, comm), cell in _groups(snap, opts):
        labels: dict[str, Any] = {"pid": pid, "comm": comm} if opts.per_process else {}
        hists.append({**labels, **_stats(cell, opts)})
    return {
        "time": iso_now(),
        "interval_s": round(snap.seconds, 6),
        "unit": opts.unit,
        "strategy": strategy,
        "histograms": hists,
        "counters": snap.counters,
    }


def report_text(snap: Snapshot, opts: Options, out: TextIO) -> None:
    if opts.timestamps:
        print(time.strftime("%H:%M:%S"), file=out)
    groups = _groups(snap, opts)
    if not groups:
        print("no tasks waited on a run queue in this interval", file=out)
    for (pid, comm), cell in groups:
        if opts.per_process:
            print(f"\npid = {pid} {comm}", file=out)
        else:
            print(file=out)
        print(Log2Hist(cell.slots, opts.unit).render(), file=out)
        s = _stats(cell, opts)
        print(
            f"count {s['count']}, avg {s['avg_ns'] / 1000:.1f} us, p50 {s['p50_ns'] / 1000:.1f} us,"
            f" p99 {s['p99_ns'] / 1000:.1f} us, max {s['max_ns'] / 1000:.0f} us",
            file=out,
        )
    if snap.counters.get("hists_full"):
        print(f"not in the histograms: hists_full={snap.counters['hists_full']}", file=out)


# ---- validation ----------------------------------------------------------------------


@contextlib.contextmanager
def spinners(workers: int, seconds: float) -> Iterator[list[int]]:
    """`workers` busy processes for `seconds` (the built-in `spin` workload): their PIDs."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "meridian.workloads",
            "spin",
            "--workers",
            str(workers),
            "--seconds",
            str(seconds),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        yield [int(p) for p in json.loads(child.stdout.readline())["pids"]]
    finally:
        if child.poll() is None:
            child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout:
            child.stdout.close()


def measure(tool: Runqlat, workers: int, seconds: float) -> tuple[Snapshot, set[int]]:
    """Run-queue latency while `workers` busy processes run for `seconds`, and their PIDs."""
    with spinners(workers, seconds + 2) as pids:
        time.sleep(0.2)  # let them spin
        s0 = tool.snapshot()
        time.sleep(seconds)
        s1 = tool.snapshot()
    return s1.since(s0), set(pids)


def _only(snap: Snapshot, pids: set[int]) -> Snapshot:
    return Snapshot(snap.t, {k: c for k, c in snap.cells.items() if k[0] in pids})


def _case(name: str, workers: int, snap: Snapshot, opts: Options) -> dict[str, Any]:
    merged = _groups(snap, Options(millis=opts.millis))
    cell = merged[0][1] if merged else Cell(np.zeros(NSLOTS, np.uint64), 0, 0)
    return {"case": name, "busy_processes": workers, **_stats(cell, opts)}


def validate(
    opts: Options, seconds: float, workers: int | None = None, rounds: int = 3
) -> dict[str, Any]:
    """OFF: one busy process; ON: `workers` (default twice the CPUs) busy processes.
    `seconds` per case, taken in `rounds` alternating OFF/ON slices, so a burst of
    unrelated load on the host does not land on one case only. The check is on the
    busy processes' own waits (other load on the host moves both cases alike); the
    whole system is reported too."""
    ncpu = online_cpu_count()
    on_workers = workers or 2 * ncpu
    slice_s = seconds / rounds
    vopts = Options(**{**opts.__dict__, "per_process": True, "pid": None})
    with Runqlat(vopts) as tool:
        parts: dict[str, list[Snapshot]] = {k: [] for k in ("OFF", "ON", "OFF w", "ON w")}
        for _ in range(rounds):
            for name, w in (("OFF", 1), ("ON", on_workers)):
                snap, pids = measure(tool, w, slice_s)
                parts[name].append(snap)
                parts[name + " w"].append(_only(snap, pids))
        strategy = tool.strategy.name
    total = {k: sum(v[1:], v[0]) for k, v in parts.items()}
    cases = [
        _case("OFF", 1, total["OFF w"], opts),
        _case("ON", on_workers, total["ON w"], opts),
    ]
    system = [
        _case("OFF", 1, total["OFF"], opts),
        _case("ON", on_workers, total["ON"], opts),
    ]
    checks = {
        "p99_higher": cases[1]["p99_ns"] > cases[0]["p99_ns"],
        "events_seen": cases[0]["count"] > 0 and cases[1]["count"] > 0,
    }
    return {
        "time": iso_now(),
        "strategy": strategy,
        "cpus": ncpu,
        "seconds": seconds,
        "unit": opts.unit,
        "cases": cases,
        "system": system,
        "checks": checks,
        "passed": all(checks.values()),
    }


def validate_text(report: dict[str, Any], out: TextIO) -> None:
    print(
        f"runqlat validate: {report['seconds']:g} s with 1 busy process (OFF), then "
        f"{report['seconds']:g} s with {report['cases'][1]['busy_processes']} on "
        f"{report['cpus']} CPUs (ON), alternating; strategy {report['strategy']}\n",
        file=out,
    )
    rows = [
        [
            c["case"],
            scope,
            str(c["busy_processes"]),
            str(c["count"]),
            f"{c['p50_ns'] / 1000:.1f}",
            f"{c['p99_ns'] / 1000:.1f}",
            f"{c['max_ns'] / 1000:.0f}",
        ]
        for scope, key in (("busy processes", "cases"), ("whole system", "system"))
        for c in report[key]
    ]
    print_table(["Case", "Tasks", "Busy", "Events", "p50(us)", "p99(us)", "max(us)"], rows, out)
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
  meridian runqlat                 # run-queue latency histogram until Ctrl-C
  meridian runqlat 1 10            # print 1 second summaries, 10 times
  meridian runqlat -m 5            # milliseconds, every 5 seconds
  meridian runqlat -P              # one histogram per process
  meridian runqlat -p 185          # only PID 185
  meridian runqlat --json 1        # one JSON object per second
  meridian runqlat --otlp-endpoint http://localhost:4317   # histograms over OTLP
  meridian runqlat validate        # 1 busy process vs more busy processes than cores
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "runqlat",
        help="run-queue (scheduler) latency histograms; validate",
        description="Summarize run-queue latency: the time from a wake-up or a preemption "
        "until the task runs. 'validate' as first argument runs the on/off experiment.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "interval", nargs="?", help="seconds between reports (default: one at the end), or validate"
    )
    p.add_argument("count", nargs="?", help="number of reports (default: until Ctrl-C)")
    p.add_argument("-P", "--pids", action="store_true", help="one histogram per process")
    p.add_argument("-p", "--pid", metavar="PID", help="trace this process only")
    p.add_argument("-m", "--milliseconds", action="store_true", help="histograms in msecs")
    p.add_argument("-T", "--timestamp", action="store_true", help="print a timestamp per report")
    p.add_argument("--json", action="store_true", help="JSON lines instead of text")
    p.add_argument("--duration", metavar="SECONDS", help="stop after this long")
    p.add_argument(
        "--strategy", choices=[s.name for s in STRATEGIES], help="force a probe strategy"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="libbpf and strategy detail")
    add_arguments(p)
    v = p.add_argument_group("validate")
    v.add_argument("--seconds", metavar="N", help="length of each case (default 5)")
    v.add_argument("--workers", metavar="N", help="busy processes of the ON case (2 x CPUs)")
    return p


def options_from_args(args: argparse.Namespace, validating: bool = False) -> Options:
    count = None if validating else positive_number(args.count, "count", integer=True)
    return Options(
        interval=None if validating else positive_number(args.interval, "interval"),
        count=int(count) if count is not None else None,
        duration=positive_number(args.duration, "--duration"),
        per_process=args.pids,
        pid=pid_arg(args.pid),
        millis=args.milliseconds,
        timestamps=args.timestamp,
        json=args.json,
        strategy=args.strategy,
        verbose=args.verbose,
        export=from_args(args),
    )


def run(args: argparse.Namespace) -> int:
    validating = args.interval == "validate"
    if not validating and (args.seconds is not None or args.workers is not None):
        raise UsageError("--seconds and --workers belong to 'meridian runqlat validate'")
    opts = options_from_args(args, validating)
    out = sys.stdout
    if validating:
        if args.count is not None:
            raise UsageError(f"validate takes no count, got {args.count!r}")
        if opts.export is not None and opts.export.any:
            raise UsageError("validate exports nothing: drop --prometheus and --otlp-endpoint")
        secs = positive_number(args.seconds, "--seconds") or 5.0
        workers = positive_number(args.workers, "--workers", integer=True)
        report = validate(opts, secs, int(workers) if workers else None)
        if opts.json:
            JsonWriter(out).write(report)
        else:
            validate_text(report, out)
        return 0 if report["passed"] else 1
    banner = "Tracing run queue latency... Hit Ctrl-C to end."
    return run_histograms(Runqlat(opts), opts, out, banner, report_json, report_text)
