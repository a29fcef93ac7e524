"""meridian io: every read and write on a regular file, per process (seed 000).

The kernel decides everything: regular files only (through the task's fd table), the
PID and comm filters, cached or disk per operation (page-cache insertions, bios and
I/O wait of the thread while the operation is in flight), and exact per-(PID, op,
cached) aggregates with a log2 latency histogram. Events come through a ring buffer
as numpy columns and leave as JSON lines (or aligned text) without a dict per event.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from ..bpf import BpfObject, RingBuffer, Strategy, choose, hook_exists
from ..errors import UsageError
from ..export import Exporters, ExportOptions, add_arguments, exporting, from_args
from ..hist import Log2Hist
from ..output import JsonWriter, fmt_bytes, iso_now, print_table
from ..proc import CLOCK_TICK_NS, start_wall_ns, thread_slots
from ..session import Session
from .io_format import TEXT_HEADER, EventFormatter
from .io_metrics import io_source

if TYPE_CHECKING:
    from .io_block import BlockStats

__all__ = [
    "STRATEGIES",
    "EventFormatter",
    "FileIO",
    "Options",
    "PidSummary",
    "add_parser",
    "run",
    "summarize",
]

OPS = ("read", "write")
SYSCALLS: tuple[str, ...] = ("read", "pread64", "readv", "preadv", "preadv2")
SYSCALLS += ("write", "pwrite64", "writev", "pwritev", "pwritev2")
SYSCALLS += ("sendfile64", "copy_file_range")  # a read of the source, a write of the target
# fentry/kprobe hook the syscall bodies that still have the fd (see io.bpf.c).
FENTRY_FNS: tuple[str, ...] = (
    "ksys_read",
    "ksys_write",
    "ksys_pread64",
    "ksys_pwrite64",
    "do_readv",
)
FENTRY_FNS += ("do_writev", "do_preadv", "do_pwritev", "do_sendfile", "copy_file_range")
STRATEGIES = (
    Strategy(
        "fentry",
        tuple(f"{k}_{f}" for f in FENTRY_FNS for k in ("fentry", "fexit")),
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
        ("tracepoint", "tp_btf"),  # the I/O-wait signal is tp_btf/sched_switch
    ),
)
# Disk signals, shared by every strategy.
SIGNALS = ("tp_page_added", "tp_bio_queue", "tp_sched_switch")
# Block requests by submitting process and their device latency (block_io_start: 6.5+).
BLOCK = ("tp_io_start", "tp_rq_issue", "tp_rq_complete")


@dataclass
class Options:
    pids: list[int] = field(default_factory=list)
    comms: list[str] = field(default_factory=list)
    cgroup: tuple[int, int] | None = None  # cgroup v2 (id, depth), see cgroup_id()
    format: str = "json"
    min_latency_ns: int = 0
    disk_only: bool = False
    no_events: bool = False
    duration: float | None = None
    strategy: str | None = None
    max_pids: int = 8192
    thread_slots: int = 0  # in-flight slots (a power of two); 0: sized to pid_max
    export: ExportOptions | None = None
    verbose: bool = False
    # The agent side: PID table, --top, demo workload (io_table.py, io_top.py).
    interval: float = 1.0  # seconds between reads of the aggregate map
    grace: float = 30.0  # seconds an exited process stays before it is retired
    max_series: int | None = None  # --max-pids: rows of their own, then comm, then other
    top: bool = False
    sort: str = "bytes"
    workload: bool = False


# ---- the kernel side -----------------------------------------------------------------


class FileIO(Session):
    """The loaded programs: `stats()` reads the exact aggregates, `events()` the stream."""

    OBJECT = "io"

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.strategy = choose(STRATEGIES, opts.strategy)
        self.selected: list[str] = []

    def programs(self, obj: BpfObject) -> list[str]:
        """The strategy's programs whose hooks this kernel has, plus the disk signals."""
        progs = [p for p in self.strategy.programs if hook_exists(obj.programs[p].section)]
        block = [p for p in BLOCK if hook_exists(obj.programs[p].section)]
        return progs + list(SIGNALS) + (block if len(block) == len(BLOCK) else [])

    def setup(self, obj: BpfObject) -> None:
        o = self.opts
        slots = o.thread_slots or thread_slots()
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
            }
        )
        obj.resize("inflight", slots)
        obj.resize("stats", o.max_pids)
        obj.resize("disk_io", o.max_pids)
        self.selected = self.programs(obj)
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

    def stats(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Keys and per-CPU values of the aggregate map, values summed over CPUs
        (max of maxima, min of non-zero first times, max of last times)."""
        assert self.obj is not None
        keys, vals = self.obj.maps["stats"].items()
        return keys, vals

    def disk_stats(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Block requests per (submitting PID, op): keys and per-CPU values of
        `fileio_disk_stats` (requests, bytes, device latency sum, max, log2 slots)."""
        assert self.obj is not None
        keys, vals = self.obj.maps["disk_io"].items()
        return keys, vals

    def counters(self) -> dict[str, int]:
        assert self.obj is not None
        out = self.obj.maps["counters"].summed()
        if self.ring is not None:
            out["events_bad"] = self.ring.bad_records
        return out

    def events(self, timeout: float) -> np.ndarray[Any, Any]:
        if self.ring is None:
            time.sleep(max(timeout, 0))
            return np.empty(0)
        return self.ring.poll(timeout)


# ---- aggregates ----------------------------------------------------------------------


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
    hist: Log2Hist = field(default_factory=lambda: Log2Hist.empty(40, "nsecs"))

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
    """Everything one process did, split by op and cached (True) / disk (False)."""

    pid: int
    comm: str
    cells: dict[tuple[str, bool], OpStats] = field(default_factory=dict)
    start: int = 0  # clock ticks since boot (/proc/PID/stat field 22): tells reused PIDs apart

    def total(self, op: str | None = None, cached: bool | None = None) -> OpStats:
        out = OpStats()
        for (o, c), s in self.cells.items():
            if (op is None or o == op) and (cached is None or c == cached):
                out.add(s)
        return out

    def hit_ratio(self, op: str | None = None) -> float | None:
        all_ = self.total(op).ops
        return self.total(op, True).ops / all_ if all_ else None

    def as_dict(self, seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "summary", "pid": self.pid, "comm": self.comm}
        if self.start:  # tells two processes apart that had the same PID
            out["start_time"] = iso_now(start_wall_ns(self.start))
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
                "latency_p50_ns": min(round(t.hist.percentile(0.5)), t.latency_max_ns),
                "latency_p99_ns": min(round(t.hist.percentile(0.99)), t.latency_max_ns),
                "latency_max_ns": t.latency_max_ns,
                "cache_hit_ratio": round(self.hit_ratio(op) or 0.0, 6),
                "first_ns": t.first_ns,
                "last_ns": t.last_ns,
                "latency": t.hist.to_json(),
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
        comms = [c for c in v["comm"] if c]
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
            hist=Log2Hist(v["slots"].sum(axis=0).astype(np.uint64), "nsecs"),
        )
        ps = out.setdefault(
            (pid, start),
            PidSummary(pid, comms[0].decode(errors="replace") if comms else "", start=start),
        )
        ps.cells[(OPS[min(int(k["op"]), 1)], bool(k["cached"]))] = s
    return dict(sorted(out.items()))


# ---- command line --------------------------------------------------------------------

EXAMPLES = """examples:
  meridian io                       # every read/write on regular files, JSON lines
  meridian io -p 1234 -p 5678       # only these processes (filtered in the kernel)
  meridian io --comm postgres       # only processes with this name
  meridian io --cgroup /system.slice/nginx.service   # one cgroup (v2) and those below it
  meridian io --format text         # aligned columns for people
  meridian io --disk-only           # only operations that reached the disk
  meridian io --min-latency 10      # only operations slower than 10 ms
  meridian io --no-events --duration 10   # metrics only: a per-PID summary after 10 s
  meridian io --no-events --prometheus :9435   # Prometheus metrics read from the maps
  meridian io --top --sort latency  # live per-process view, slowest first (Ctrl-C ends)
  meridian io --top --max-pids 20   # 20 busiest processes, the rest per command name
  meridian io --workload --duration 10 --format text   # demo: a small file workload
  meridian io --otlp-endpoint http://localhost:4317 --otlp-logs   # OTLP metrics and logs
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "io",
        help="per-process file I/O: latency, bytes, page cache hits (seed 000)",
        description="Trace reads and writes on regular files per process: latency, "
        "bytes, and whether the page cache served them. A summary per PID on exit.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-p", "--pid", action="append", default=[], help="trace this PID (repeatable)")
    p.add_argument("--comm", action="append", default=[], help="trace this process name")
    p.add_argument(
        "--cgroup",
        metavar="PATH",
        help="only processes in this cgroup v2 directory or below it (a path under the "
        "cgroup2 mount, or as in /proc/PID/cgroup)",
    )
    p.add_argument("--format", choices=["json", "text"], default="json", help="event format")
    p.add_argument("--min-latency", metavar="MS", help="only events slower than MS milliseconds")
    p.add_argument("--disk-only", action="store_true", help="only events that reached the disk")
    p.add_argument("--no-events", action="store_true", help="metrics only, no event stream")
    p.add_argument("--duration", metavar="SECONDS", help="stop after this long")
    p.add_argument(
        "--max-pids",
        metavar="N",
        help="at most N processes get rows of their own (--top, exports); the others are "
        "summed per command name (at most N of those), the rest into one 'other' row",
    )
    p.add_argument("--top", action="store_true", help="live per-process view (needs a terminal)")
    p.add_argument(
        "--sort", choices=["bytes", "latency", "ops"], default="bytes", help="--top order"
    )
    p.add_argument("--interval", metavar="SECONDS", default="1", help="--top refresh (default 1)")
    p.add_argument(
        "--grace", metavar="SECONDS", default="30", help="retire exited processes after this"
    )
    p.add_argument("--workload", action="store_true", help="run a small built-in file workload")
    p.add_argument(
        "--strategy", choices=[s.name for s in STRATEGIES], help="force a probe strategy"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="libbpf and strategy detail")
    add_arguments(p, logs=True)
    return p


def _number(value: str | None, what: str, minimum: float, integer: bool = False) -> float | None:
    if value is None:
        return None
    try:
        num = int(value) if integer else float(value)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise UsageError(f"{what} must be {kind}, got {value!r}") from None
    if num < minimum or num != num:
        raise UsageError(f"{what} must be at least {minimum:g}, got {value!r}")
    return num


def parse_pids(values: Sequence[str], proc_root: str = "/proc") -> list[int]:
    pids = []
    for v in values:
        if not v.strip().isdigit() or int(v) <= 0:
            raise UsageError(f"-p takes a process ID (a positive whole number), got {v!r}")
        pid = int(v)
        if not os.path.isdir(f"{proc_root}/{pid}"):
            raise UsageError(f"no process with PID {pid} (see ps -e)")
        pids.append(pid)
    return pids


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points of the cgroup v2 hierarchy (the unified one)."""
    out = []
    try:
        with open(mountinfo) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    out.append(left.split()[4].replace("\\040", " "))
    except OSError:
        pass
    return out


def cgroup_id(path: str, mountinfo: str = "/proc/self/mountinfo") -> tuple[int, int]:
    """(id, depth) of a cgroup v2 directory: the id is the directory's inode number, what
    bpf_get_current_cgroup_id() returns; the depth counts components below the root.
    PATH is a directory under a cgroup2 mount or a path as /proc/PID/cgroup shows it."""
    mounts = cgroup_mounts(mountinfo)
    if not mounts:
        raise UsageError("--cgroup needs cgroup v2, and no cgroup2 file system is mounted")
    for m in mounts:
        rel = os.path.relpath(os.path.realpath(path), m) if os.path.isabs(path) else path
        if rel == "." or not rel.startswith(".."):
            break
    else:
        rel = path
    for m in mounts:
        full = os.path.normpath(os.path.join(m, rel.lstrip("/")))
        if os.path.isfile(os.path.join(full, "cgroup.procs")):
            depth = 0 if full == os.path.normpath(m) else len(os.path.relpath(full, m).split("/"))
            return os.stat(full).st_ino, depth
    raise UsageError(
        f"--cgroup: {path!r} is not a cgroup v2 directory (cgroup2 is mounted at {mounts[0]})"
    )


def options_from_args(args: argparse.Namespace) -> Options:
    comms = []
    for c in args.comm:
        if not c or len(c.encode()) > 15:
            raise UsageError(f"--comm takes a process name of 1 to 15 bytes, got {c!r}")
        comms.append(c)
    min_lat = _number(args.min_latency, "--min-latency", 0)
    duration = _number(args.duration, "--duration", 0.001)
    max_series = _number(args.max_pids, "--max-pids", 1, integer=True)
    interval = _number(args.interval, "--interval", 0.05) or 1.0
    grace = _number(args.grace, "--grace", 0)
    export = from_args(args)
    if export.otlp_logs and (args.no_events or args.top):
        raise UsageError("--otlp-logs sends events: it cannot go with --no-events or --top")
    return Options(
        pids=parse_pids(args.pid),
        comms=comms,
        cgroup=cgroup_id(args.cgroup) if args.cgroup is not None else None,
        format=args.format,
        min_latency_ns=int((min_lat or 0) * 1_000_000),
        disk_only=args.disk_only,
        duration=duration,
        strategy=args.strategy,
        # The kernel map holds up to four keys per process (op x cached).
        max_pids=max(8192, 4 * int(max_series)) if max_series else 8192,
        export=export,
        verbose=args.verbose,
        interval=interval,
        grace=30.0 if grace is None else grace,
        max_series=int(max_series) if max_series else None,
        top=args.top,
        sort=args.sort,
        # --top draws from the aggregates: no event stream, so nothing to drop.
        no_events=args.no_events or args.top,
        workload=args.workload,
    )


def run(args: argparse.Namespace) -> int:
    return run_options(options_from_args(args), sys.stdout)


def run_options(opts: Options, out: TextIO) -> int:
    from .io_top import check_terminal

    if opts.top:
        check_terminal(out)  # before loading anything
    with FileIO(opts) as tool, _workload(opts.workload, opts.duration):
        source = io_source(tool, max_series=opts.max_series)
        with exporting(opts.export, source, "io") as exporters:
            return _stream(tool, exporters, opts, out)


def _stream(tool: FileIO, exporters: Exporters, opts: Options, out: TextIO) -> int:
    """The event stream (or --top) and the PID table until the end, then the summary."""
    from .io_block import summarize_block
    from .io_table import RETIRED_MAX, PidTable, delete_keys, of_processes
    from .io_top import run_top

    fmt = EventFormatter()
    chunks: Callable[[np.ndarray[Any, Any]], Iterable[str]] = (
        fmt.json_chunks if opts.format == "json" else lambda ev: (fmt.text_lines(ev),)
    )

    def write(recs: np.ndarray[Any, Any]) -> None:
        for text in chunks(recs):
            out.write(text)
        out.flush()
        if exporters.logs:
            exporters.logs.emit_json_lines(fmt.json_lines(recs))

    assert tool.obj is not None
    stats_map = tool.obj.maps["stats"]
    table = PidTable(time.monotonic_ns(), grace_s=opts.grace)

    disk_map = tool.obj.maps["disk_io"]
    retired_block: list[BlockStats] = []

    def retire(keys: np.ndarray[Any, Any]) -> None:
        delete_keys(stats_map, keys)
        dkeys, dvals = tool.disk_stats()
        procs = {(int(p), int(s)) for p, s in zip(dkeys["pid"], dkeys["start"], strict=True)}
        gone = table.gone(procs, time.monotonic_ns())
        if gone:
            mask = of_processes(dkeys, gone)
            retired_block.extend(summarize_block(dkeys[mask], dvals[mask]))
            del retired_block[: max(0, len(retired_block) - RETIRED_MAX)]
            delete_keys(disk_map, dkeys[mask])

    if opts.verbose:
        print(f"strategy: {tool.strategy.name} ({', '.join(tool.selected)})", file=sys.stderr)
        sys.stderr.flush()
    start = time.monotonic()
    if opts.top:
        run_top(tool, table, opts, out, retire)
    if opts.format == "text" and not opts.top:
        print("Tracing reads and writes on regular files... Hit Ctrl-C to end.", file=out)
        if not opts.no_events:
            print(TEXT_HEADER, file=out)
        out.flush()
    end = start + opts.duration if opts.duration else None
    next_table = start + opts.interval
    try:
        while not opts.top and (end is None or time.monotonic() < end):
            now = time.monotonic()
            wait = 0.05 if end is None else max(0.0, min(0.05, end - now))
            recs = tool.events(wait)
            if len(recs):
                write(recs)
            if now >= next_table:  # the PID table: windows, retiring the exited
                retire(table.update(*tool.stats(), time.monotonic_ns()))
                next_table = now + opts.interval
    except KeyboardInterrupt:
        pass
    recs = tool.events(0)
    if len(recs):
        write(recs)
    table.update(*tool.stats(), time.monotonic_ns())
    counters = tool.counters()
    if opts.verbose:
        print("lost: " + " ".join(f"{k}={v}" for k, v in counters.items()), file=sys.stderr)
    block = retired_block + summarize_block(*tool.disk_stats())
    seconds = time.monotonic() - start
    report(table.summaries(), counters, seconds, opts, out, table.rolling(), block)
    out.flush()
    return 0


@contextlib.contextmanager
def _workload(on: bool, seconds: float | None) -> Iterator[None]:
    """`--workload`: a small file workload in a child process while the tool runs."""
    if not on:
        yield
        return
    cmd = [sys.executable, "-m", "meridian.workloads", "file-io"]
    child = subprocess.Popen([*cmd, "--seconds", str(seconds or 3600)])
    try:
        yield
    finally:
        child.terminate()
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def report(
    pids: Iterable[PidSummary],
    counters: dict[str, int],
    seconds: float,
    opts: Options,
    out: TextIO,
    rolling: dict[int, dict[str, Any]] | None = None,
    block: list[BlockStats] | None = None,
) -> None:
    """The per-PID summary; `rolling` (PidTable.rolling()) adds each live process's
    1 s / 10 s / 60 s throughput per op to the JSON objects; `block` the device
    requests per submitting process (io_block.py)."""
    if opts.format == "json":
        w = JsonWriter(out)
        for ps in pids:
            d = ps.as_dict(seconds)
            for op, windows in (rolling or {}).get(ps.pid, {}).items():
                if op in d:
                    d[op]["rolling"] = windows
            w.write(d)
        for b in block or []:
            w.write(b.as_dict())
        w.write({"type": "lost", "seconds": round(seconds, 6), **counters})
        return
    rows = []
    for ps in pids:
        for op in OPS:
            t = ps.total(op)
            if not t.ops:
                continue
            rows.append(
                [
                    ps.comm,
                    str(ps.pid),
                    op,
                    str(t.ops),
                    fmt_bytes(t.bytes),
                    fmt_bytes(t.bytes / seconds) + "/s" if seconds > 0 else "-",
                    f"{min(t.hist.percentile(0.5), t.latency_max_ns) / 1e3:.1f}",
                    f"{min(t.hist.percentile(0.99), t.latency_max_ns) / 1e3:.1f}",
                    f"{t.latency_max_ns / 1e3:.1f}",
                    f"{100 * (ps.hit_ratio(op) or 0):.1f}%",
                ]
            )
    print(file=out)
    print_table(
        ["COMM", "PID", "OP", "OPS", "BYTES", "THROUGHPUT", "P50(us)", "P99(us)", "MAX(us)", "HIT"],
        rows,
        out,
    )
    if block:
        print(
            "\nblock requests by submitting process (device latency, issue to completion):",
            file=out,
        )
        print_table(
            ["COMM", "PID", "OP", "REQUESTS", "BYTES", "P50(us)", "P99(us)", "MAX(us)"],
            [
                [
                    b.comm,
                    str(b.pid),
                    b.op,
                    str(b.requests),
                    fmt_bytes(b.bytes),
                    f"{min(b.hist.percentile(0.5), b.latency_max_ns) / 1e3:.1f}",
                    f"{min(b.hist.percentile(0.99), b.latency_max_ns) / 1e3:.1f}",
                    f"{b.latency_max_ns / 1e3:.1f}",
                ]
                for b in block
            ],
            out,
        )
    lost = {k: v for k, v in counters.items() if v}
    if lost:
        print("lost: " + ", ".join(f"{k}={v}" for k, v in lost.items()), file=out)
