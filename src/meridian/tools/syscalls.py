"""meridian syscalls: the Mortadelo file-system syscall viewer (seed 002).

The kernel program sends each traced call as two events, a start (arguments, paths,
the path of an fd argument) and an end (the result); the model in
`meridian.syscalls` pairs them (Aggregator), merges them (CompactLog) and filters
them (FilteredLog). Views: strace-like plain lines, the full log, JSON lines, a
recording (-w) that replays (-r) through the same model.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..bpf import BpfObject, RingBuffer, Strategy, choose
from ..errors import ExtraMissing, UsageError
from ..output import dumps
from ..session import Session
from ..syscalls import Aggregator, CompactLog, FilteredLog, Syscall
from ..syscalls.filters import (
    AllOf,
    Filter,
    PathFilter,
    PidFilter,
    ResultFilter,
    SyscallFilter,
    TextFilter,
)
from ..syscalls.fmt import compact_line, full_line, to_json
from ..syscalls.log import Source
from ..syscalls.numbers import FILE_SYSCALLS, NUMBERS, resolve_names
from ..syscalls.raw import decode_frames, frames
from ..syscalls.recording import Recorder, SpooledJsonRecorder, is_jsonl_name, read_events
from ..syscalls.signatures import fd_position, string_positions

__all__ = ["STRATEGIES", "Capture", "Options", "add_parser", "run"]

STRATEGIES = (
    Strategy("tp_btf", ("btf_sys_enter", "btf_sys_exit", "btf_fork", "btf_exit"), ("tp_btf",)),
    Strategy("tracepoint", ("tp_sys_enter", "tp_sys_exit", "tp_fork", "tp_exit"), ("tracepoint",)),
)
MAX_NR = 512  # SYSCALLS_MAX_NR in bpf/syscalls.h
COMM_LEN = 16  # SYSCALLS_COMM_LEN


@dataclass
class Options:
    names: list[str] = field(default_factory=list)  # -e: the traced set ([] = file syscalls)
    all: bool = False
    pids: list[int] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    follow: bool = True
    full: bool = False
    json: bool = False
    write: str | None = None
    record_format: str | None = None  # "raw" | "jsonl"; None: by the file name
    quiet: bool = False  # -q with -w: record only, no view (as perf record)
    read: str | None = None
    text: str | None = None
    regex: bool = False
    comm: str | None = None
    path: str | None = None
    failed: bool = False
    errnos: list[str] = field(default_factory=list)
    duration: float | None = None
    strategy: str | None = None
    ring_mb: int = 16
    cgroup_id: int | None = None  # --cgroup: the cgroup v2 directory's inode number
    max_rows: int = 200_000  # live views: events kept in memory (open calls always are)
    tui: bool = False
    verbose: bool = False

    def traced_names(self) -> frozenset[str]:
        return frozenset(self.names) if self.names else FILE_SYSCALLS

    def raw_recording(self) -> bool:
        if self.record_format is not None:
            return self.record_format == "raw"
        return self.write is not None and not is_jsonl_name(self.write)

    def kernel_comm(self) -> tuple[bytes, bool] | None:
        """--comm as the kernel matches it (a substring, ASCII case folded when the
        pattern is all lower case), or None when user space alone can (a regex, a
        pattern longer than a process name)."""
        c = self.comm
        if not c or self.regex or len(c.encode()) >= COMM_LEN or not c.isascii():
            return None
        return c.encode(), c == c.lower()


# ---- the kernel side -----------------------------------------------------------------


def meta_table(names: Iterable[str]) -> list[dict[str, Any]]:
    """One `struct syscalls_meta` per syscall number: traced, string and fd positions."""
    traced = set(names)
    rows = []
    for nr in range(MAX_NR):
        name = NUMBERS.get(nr, "")
        pos = list(string_positions(name)) if name else []
        pos += [-1] * (2 - len(pos))
        rows.append(
            {
                "traced": int(name in traced),
                "str_pos": pos,
                "fd_pos": fd_position(name) if name else -1,
                "need_fd": int(name == "mmap"),  # file mappings only
            }
        )
    return rows


class Capture(Session):
    """The loaded program and its ring buffer. `poll_raw()` returns the records as the
    ring holds them (variable size: strings packed behind each header), `decode()`
    turns them into events, `poll()` does both."""

    OBJECT = "syscalls"

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.strategy = choose(STRATEGIES, opts.strategy)
        self.offset_ns = time.time_ns() - time.monotonic_ns()
        self.dtype: Any = None

    def setup(self, obj: BpfObject) -> None:
        o = self.opts
        size = max(1, o.ring_mb) << 20
        size = 1 << (size - 1).bit_length()  # a power of 2
        obj.resize("events", size)
        obj.set_rodata(
            {
                "filter_pids": bool(o.pids or o.command),
                "follow_children": o.follow,
                "trace_all": o.all,
                "self_tgid": os.getpid(),
                "filter_cgroup": o.cgroup_id is not None,
                "cgroup_id": o.cgroup_id or 0,
                "wakeup_bytes": size // 4,
                "ring_bytes": size,
            }
        )
        comm = o.kernel_comm()
        if comm is not None:
            pat, fold = comm
            obj.set_rodata(
                {
                    "filter_comm": True,
                    "comm_fold": fold,
                    "comm_pat_len": len(pat),
                    "comm_pat": pat,
                }
            )
        obj.select(self.strategy.programs)
        obj.load()
        meta = obj.maps["sc_meta"]
        for nr, row in enumerate(meta_table(o.traced_names())):
            meta.update(nr, row)
        for pid in o.pids:
            self.add_pid(pid, obj)
        obj.attach()
        assert obj.btf is not None
        self.dtype = obj.btf.struct_dtype("syscalls_event")
        self.ring = RingBuffer.of_map(obj.maps["events"], self.dtype)

    def add_pid(self, pid: int, obj: BpfObject | None = None) -> None:
        o = obj or self.obj
        assert o is not None
        o.maps["pids"].update(pid, 1)

    def poll_raw(self, timeout: float) -> tuple[bytes, int]:
        """Wait up to `timeout` for the ring to fill past its mark, then every record
        committed so far, framed as in the ring, and how many."""
        assert self.ring is not None
        if timeout > 0:
            self.ring.wait(timeout)
        return self.ring.drain_bytes()

    def decode(self, chunk: bytes) -> list[Syscall]:
        return decode_frames(frames(chunk), self.dtype, self.offset_ns)

    def poll(self, timeout: float) -> list[Syscall]:
        return self.decode(self.poll_raw(timeout)[0])

    def recorder(self, path: str, tool_args: list[str], raw: bool) -> Recorder:
        """Raw records either way: kept as they are, or spooled and written as JSON
        lines at the end, so a recording keeps up with the kernel."""
        if raw:
            return Recorder(path, tool_args, raw_dtype=self.dtype, wall_offset_ns=self.offset_ns)
        return SpooledJsonRecorder(path, tool_args, self.dtype, self.offset_ns)

    def counters(self) -> dict[str, int]:
        assert self.obj is not None
        out = self.obj.maps["counters"].summed()
        if self.ring is not None:
            out["bad_records"] = self.ring.bad_records
        return out


class Launcher:
    """`-- COMMAND`: a child that waits, stopped before exec, until its PID is in the
    kernel's set, so its first syscalls are traced. It waits in sigwait (not a file
    syscall, so nothing of the launcher shows), then execs the command."""

    GO = signal.SIGUSR1

    def __init__(self, command: list[str]) -> None:
        exe = shutil.which(command[0]) if "/" not in command[0] else command[0]
        if exe is None or not os.access(exe, os.X_OK):
            raise UsageError(f"command {command[0]!r} not found or not executable")
        self.command = command
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {self.GO})
        pid = os.fork()
        if pid == 0:  # the child: wait for the go, then become the command
            try:
                signal.sigwait({self.GO})
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
                os.execv(exe, command)
            finally:
                os._exit(127)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.pid = pid
        self.status: int | None = None

    def go(self) -> None:
        os.kill(self.pid, self.GO)

    def poll(self) -> int | None:
        """The exit code once the command has exited, else None."""
        if self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
        return self.status

    def kill(self) -> None:
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            _, st = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(st)


# ---- views ---------------------------------------------------------------------------


def build_filter(opts: Options, replay: bool) -> Filter | None:
    """The filters asked for; in replay, -e and -p filter the recording too."""
    parts: list[Filter] = []
    if opts.text:
        parts.append(TextFilter(opts.text, opts.regex))
    if opts.comm:
        parts.append(TextFilter(opts.comm, opts.regex, fields=("comm",)))
    if opts.path:
        parts.append(PathFilter(opts.path, opts.regex))
    if opts.failed or opts.errnos:
        parts.append(ResultFilter(opts.errnos))
    if replay and opts.names:
        parts.append(SyscallFilter(opts.names))
    if replay and opts.pids:
        parts.append(PidFilter(opts.pids))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else AllOf(parts)


class Pipeline:
    """Events -> Aggregator -> (compact) -> filtered; prints each row once, when it is
    complete (a compact row when its end arrives, a full-log event when it arrives).
    Rows completed by one batch of events are printed at `flush()` in index order, so
    a start row that matches only once its end is in comes before that end."""

    def __init__(self, opts: Options, out: TextIO, replay: bool = False) -> None:
        self.opts = opts
        self.out = out
        self.filter = build_filter(opts, replay)
        self._printed: set[int] = set()
        self._ready: list[Syscall] = []
        self.events = 0
        self.unmatched_ends = 0
        self._build()

    def _build(self) -> None:
        self.agg = Aggregator()
        self.compact: CompactLog | None = None if self.opts.full else CompactLog(self.agg.log)
        source: Source = self.compact if self.compact is not None else self.agg.log
        self.view = FilteredLog(source, self.filter)
        self.view.on_change(self._changed)

    def add(self, sc: Syscall) -> None:
        self.events += 1
        before = self.agg.unmatched_ends
        self.agg.add(sc)
        self.unmatched_ends += self.agg.unmatched_ends - before

    def trim(self) -> None:
        """Bound memory: once the log holds more than --max-rows rows (all printed but
        the open ones), start a fresh log holding only the calls still waiting for
        their end, so later ends still pair with them."""
        if self.opts.max_rows <= 0 or len(self.agg.log) <= self.opts.max_rows:
            return
        self.flush()
        pending = sorted(self.agg.open_calls(), key=lambda sc: sc.index)
        self._printed &= {sc.index for sc in pending}
        self._build()
        for sc in pending:
            self.agg.add(sc)

    def _done(self, sc: Syscall) -> bool:
        return self.opts.full or sc.is_end or sc.no_return

    def _changed(self, what: str, row: int) -> None:
        if what == "removed":
            return
        sc = self.view[row]
        if sc.index in self._printed or not self._done(sc):
            return
        self._printed.add(sc.index)
        self._ready.append(sc)

    def flush(self) -> None:
        self._ready.sort(key=lambda sc: sc.index)
        for sc in self._ready:
            self._print(sc)
        self._ready.clear()
        self.out.flush()

    def _print(self, sc: Syscall) -> None:
        if self.opts.json:
            self.out.write(dumps(to_json(sc)) + "\n")
        elif self.opts.full:
            self.out.write(full_line(sc) + "\n")
        else:
            self.out.write(compact_line(sc) + "\n")

    def finish(self) -> None:
        """Then the rows still open (no end seen), in order."""
        self.flush()
        for sc in self.view:
            if sc.index not in self._printed:
                self._printed.add(sc.index)
                self._ready.append(sc)
        self.flush()


class Backlog:
    """Raw records the view has not shown yet, when recording: the view takes them a
    slice at a time between drains, so a slow view never holds up the drain (and the
    kernel never drops for it). A chunk is kept as drained and its frames are walked
    only as the view takes records, so pushing costs nothing. Past `limit` bytes the
    oldest chunks are skipped by the view and counted; they are in the recording."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # [bytes, next record's byte offset, records not taken yet, offset in the stream]
        self._chunks: collections.deque[list[Any]] = collections.deque()
        self.bytes = 0
        self.skipped = 0
        self.pushed = 0  # bytes pushed so far: the stream offset of the next chunk
        self.taken = (0, 0)  # stream bytes of the records the last take() returned

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def push(self, chunk: bytes, records: int) -> None:
        if not chunk:
            return
        self._chunks.append([chunk, 0, records, self.pushed])
        self.bytes += len(chunk)
        self.pushed += len(chunk)
        while self.bytes > self.limit and len(self._chunks) > 1:
            buf, _, left, _ = self._chunks.popleft()
            self.bytes -= len(buf)
            self.skipped += left

    def take(self, cap: Capture, n: int) -> list[Syscall]:
        """Up to `n` of the oldest records, decoded."""
        c = self._chunks[0]
        fr = frames(c[0], c[1], n)
        self.taken = (c[3] + c[1], c[3] + fr.used)
        c[1], c[2] = fr.used, max(0, c[2] - len(fr))
        if len(fr) < n or fr.used >= len(c[0]):
            self._chunks.popleft()
            self.bytes -= len(c[0])
        return decode_frames(fr, cap.dtype, cap.offset_ns)


def _summary(
    p: Pipeline,
    counters: dict[str, int] | None,
    err: TextIO,
    backlog: Backlog | None = None,
    recorder: Recorder | None = None,
) -> None:
    parts = [f"{p.events} events", f"{p.unmatched_ends} ends without start"]
    if recorder is not None:
        size = recorder.bytes
        if isinstance(recorder, SpooledJsonRecorder) and recorder.final.exists():
            size = recorder.final.stat().st_size
        parts.insert(0, f"{recorder.count} events recorded ({size} bytes)")
        if p.opts.quiet:
            parts[1:3] = []  # nothing went through the view
    if counters is not None:
        parts.append(f"{counters.get('lost', 0)} lost (ring buffer full)")
        if counters.get("str_failed"):
            parts.append(
                f"{counters['str_failed']} paths unreadable at entry "
                f"({counters.get('str_retried', 0)} read at exit)"
            )
        if counters.get("retry_full"):
            parts.append(f"{counters['retry_full']} path retries not tracked (map full)")
        if counters.get("pids_full"):
            parts.append(f"{counters['pids_full']} child processes not followed (PID set full)")
        if counters.get("bad_records"):
            parts.append(f"{counters['bad_records']} bad records")
    if backlog is not None and backlog.skipped:
        parts.append(f"{backlog.skipped} not shown live (view too slow; in the recording)")
    print("meridian syscalls: " + ", ".join(parts), file=err)


def replay(opts: Options, out: TextIO, err: TextIO) -> int:
    assert opts.read is not None
    p = Pipeline(opts, out, replay=True)
    try:
        for n, sc in enumerate(read_events(opts.read), 1):
            p.add(sc)
            if n % 4096 == 0:
                p.flush()
                p.trim()
    finally:
        p.finish()  # a damaged recording: everything before the damage, then the error
    if opts.verbose:
        _summary(p, None, err)
    return 0


VIEW_SLICE = 0.02  # seconds the view may take between two drains (raw recording)
BACKLOG_BYTES = 16 << 20  # raw records waiting for the view, at most
CALM = 1 << 20  # a drain smaller than this: time to spare for writing JSON lines


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends (then interrupt as usual)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def capture(opts: Options, out: TextIO, err: TextIO) -> int:
    launcher: Launcher | None = None
    recorder: Recorder | None = None
    p = Pipeline(opts, out)
    status = 0
    backlog: Backlog | None = None
    with Capture(opts) as cap:
        if opts.verbose:
            print(f"strategy: {cap.strategy.name}", file=err)

        def take(timeout: float) -> int:
            """Drain the ring: to the recording and the view's backlog, or decoded
            and shown at once when nothing is recorded. Returns the bytes drained."""
            chunk, n = cap.poll_raw(timeout)
            if recorder is not None:
                recorder.write_raw(chunk, n)
                if backlog is not None:
                    backlog.push(chunk, n)
                return len(chunk)
            for sc in cap.decode(chunk):
                p.add(sc)
            return len(chunk)

        def show(seconds: float | None) -> None:
            """Let the view work through the backlog for a while (None: all of it)."""
            if backlog is None:
                return
            until = None if seconds is None else time.monotonic() + seconds
            while backlog and (until is None or time.monotonic() < until):
                rows = backlog.take(cap, 256)
                if isinstance(recorder, SpooledJsonRecorder):
                    with _signals_held():  # JSON lines from rows decoded anyway, if due
                        recorder.write_decoded(*backlog.taken, rows)
                for sc in rows:
                    p.add(sc)
                p.flush()
                p.trim()

        try:
            if opts.write:
                recorder = cap.recorder(opts.write, sys.argv[1:], opts.raw_recording())
                if not opts.quiet:
                    backlog = Backlog(BACKLOG_BYTES)
            if opts.command:
                launcher = Launcher(opts.command)
                cap.add_pid(launcher.pid)
                launcher.go()
            elif not opts.json and not opts.quiet:
                print("Tracing file-system syscalls... Hit Ctrl-C to end.", file=err)
            end = time.monotonic() + opts.duration if opts.duration else None
            try:
                while True:
                    done = launcher is not None and launcher.poll() is not None
                    if opts.pids and not any(os.path.exists(f"/proc/{pid}") for pid in opts.pids):
                        done = True  # every process asked for has exited (as strace -p)
                    drained = take(0 if done or backlog else 0.05)
                    show(VIEW_SLICE)
                    p.flush()
                    p.trim()
                    if isinstance(recorder, SpooledJsonRecorder) and drained < CALM and not backlog:
                        with _signals_held():  # time to spare: JSON lines from the spool
                            recorder.convert(VIEW_SLICE)
                    if done or (end is not None and time.monotonic() >= end):
                        break
            except KeyboardInterrupt:
                take(0)
            show(None)
            p.finish()
            if isinstance(recorder, SpooledJsonRecorder):
                recorder.close(err)
            _summary(p, cap.counters(), err, backlog, recorder)
            if launcher is not None:
                code = launcher.poll() or 0
                status = 128 - code if code < 0 else code  # killed by a signal: 128 + signo
        finally:
            if launcher is not None:
                launcher.kill()
            if recorder is not None:
                recorder.close()
    return status


# ---- command line --------------------------------------------------------------------

EXAMPLES = """examples:
  meridian syscalls                      # the terminal UI (plain lines when piped)
  meridian syscalls --no-tui             # every file-system syscall, system-wide
  meridian syscalls -- ls /etc           # a command from its first syscall (and children)
  meridian syscalls -p 812               # a running process (and the children it forks)
  meridian syscalls -e openat,unlinkat   # only these syscalls
  meridian syscalls --all -p 812         # every syscall of PID 812
  meridian syscalls --cgroup /sys/fs/cgroup/system.slice/nginx.service  # one cgroup
  meridian syscalls --failed             # only failing calls (the start row too)
  meridian syscalls --errno ENOENT       # only calls that failed with ENOENT
  meridian syscalls --filter passwd      # a substring anywhere (any case if lower case)
  meridian syscalls --path '^/etc' --regex  # calls on paths under /etc
  meridian syscalls --full               # the full log: starts and ends with indices
  meridian syscalls --json -- make       # one JSON object per call, pairing indices
  meridian syscalls -w trace.jsonl.zst -- make   # record JSON lines (zstd) while printing
  meridian syscalls -w trace.rec.zst -q  # record raw kernel records only (no view)
  meridian syscalls -r trace.jsonl.zst --failed  # replay a recording, filtered
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "syscalls",
        help="file-system syscall viewer: paired start/end, compact and filtered logs",
        description=(
            "Show file-system syscalls as start and end events paired into calls, "
            "with decoded arguments, paths of fds, results and durations."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", nargs="*", help="-- COMMAND ARGS: trace this command")
    p.add_argument("-e", dest="names", metavar="SYSCALLS", help="comma-separated syscalls")
    p.add_argument("--all", action="store_true", help="every syscall, not only file ones")
    p.add_argument("-p", "--pid", action="append", default=[], metavar="PID", help="trace PID")
    p.add_argument("--no-follow", action="store_true", help="do not trace forked children")
    p.add_argument("--cgroup", metavar="DIR", help="only tasks in this cgroup v2 directory")
    p.add_argument("--full", action="store_true", help="the full log: starts and ends")
    p.add_argument("--json", action="store_true", help="JSON lines")
    p.add_argument(
        "-w",
        dest="write",
        metavar="FILE",
        help="record every event: raw kernel records, or JSON lines when FILE ends in "
        ".jsonl/.json, written from a raw spool (FILE.part.rec) (.zst: zstd-compressed)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="with -w: record only, show nothing")
    p.add_argument(
        "--record-format",
        choices=("raw", "jsonl"),
        help="-w format regardless of the name: raw or jsonl (both lossless; jsonl is "
        "written while capture has time to spare, the rest at the end, about 15 s per "
        "million events)",
    )
    p.add_argument("-r", dest="read", metavar="FILE", help="replay a recording")
    p.add_argument("--filter", dest="text", metavar="TEXT", help="text in any field")
    p.add_argument("--regex", action="store_true", help="--filter/--comm/--path are regexes")
    p.add_argument(
        "--comm", metavar="NAME", help="process name contains NAME (in the kernel unless --regex)"
    )
    p.add_argument("--path", metavar="TEXT", help="a path argument contains TEXT")
    p.add_argument("--failed", action="store_true", help="only calls that failed")
    p.add_argument("--errno", metavar="NAMES", help="only calls failing with these errnos")
    p.add_argument("--duration", metavar="SECONDS", type=float, help="stop after this long")
    p.add_argument("--ring-mb", type=int, default=16, metavar="MB", help="ring buffer size")
    p.add_argument(
        "--max-rows",
        type=int,
        default=200_000,
        metavar="N",
        help="events kept in memory, live (default 200000; 0: no limit): past it the "
        "oldest leave memory (they are in the -w recording); the TUI says how many",
    )
    p.add_argument(
        "--strategy", choices=[s.name for s in STRATEGIES], help="force a probe strategy"
    )
    p.add_argument("--tui", action="store_true", help="the terminal UI (default on a terminal)")
    p.add_argument("--no-tui", action="store_true", help="plain lines (default when piped)")
    p.add_argument("-v", "--verbose", action="store_true", help="libbpf and strategy detail")
    return p


def cgroup_id(path: str, mounts: str = "/proc/self/mounts") -> int:
    """The id the kernel gives a cgroup v2 directory (its inode number)."""
    real = os.path.realpath(path)
    roots = []
    with open(mounts) as f:
        for line in f:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                roots.append(fields[1])
    if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
        where = ", ".join(roots) or "nowhere (mount -t cgroup2 none /sys/fs/cgroup)"
        raise UsageError(
            f"--cgroup {path}: not a cgroup v2 directory; cgroup2 is mounted at {where}"
        )
    if not os.path.isfile(os.path.join(real, "cgroup.procs")):
        raise UsageError(f"--cgroup {path}: no such cgroup (no cgroup.procs in it)")
    return os.stat(real).st_ino


def options_from_args(args: argparse.Namespace) -> Options:
    names = resolve_names(args.names.split(",")) if args.names else []
    pids = []
    for raw in args.pid:
        for part in str(raw).split(","):
            try:
                pid = int(part)
            except ValueError:
                raise UsageError(f"-p takes process ids, got {part!r}") from None
            if pid <= 0:
                raise UsageError(f"-p takes process ids > 0, got {part!r}")
            if not args.read and not os.path.exists(f"/proc/{pid}"):
                raise UsageError(f"no process {pid}: see ps")
            pids.append(pid)
    if args.duration is not None and not args.duration > 0:
        raise UsageError(f"--duration must be greater than 0, got {args.duration}")
    if args.read and (args.command or args.write):
        raise UsageError("-r replays a recording: it takes no command and no -w")
    if args.command and pids:
        raise UsageError("give either -p PID or -- COMMAND, not both")
    if args.max_rows < 0:
        raise UsageError(f"--max-rows must be 0 or more, got {args.max_rows}")
    if args.quiet and not args.write:
        raise UsageError("-q records only: it needs -w FILE")
    if args.ring_mb <= 0:
        raise UsageError(f"--ring-mb must be greater than 0, got {args.ring_mb}")
    if names and args.all:
        raise UsageError("give either -e SYSCALLS or --all, not both")
    errnos = [e.strip() for e in args.errno.split(",") if e.strip()] if args.errno else []
    return Options(
        names=names,
        all=args.all,
        pids=pids,
        command=list(args.command),
        follow=not args.no_follow,
        full=args.full,
        json=args.json,
        write=args.write,
        record_format=args.record_format,
        quiet=args.quiet,
        read=args.read,
        text=args.text,
        regex=args.regex,
        comm=args.comm,
        path=args.path,
        failed=args.failed,
        errnos=errnos,
        duration=args.duration,
        strategy=args.strategy,
        ring_mb=args.ring_mb,
        max_rows=args.max_rows,
        cgroup_id=cgroup_id(args.cgroup) if args.cgroup else None,
        tui=args.tui
        or (
            not args.no_tui
            and not args.quiet
            and not args.json
            and not args.full
            and sys.stdout.isatty()
        ),
        verbose=args.verbose,
    )


def _tui_module() -> Any:
    try:
        from . import syscalls_tui
    except ImportError:
        raise ExtraMissing("the syscalls terminal UI", "tui") from None
    return syscalls_tui


class _CaptureFeed:
    """The live capture as the TUI's feed. With -w a thread drains the ring into the
    recording and a backlog, and the screen takes from the backlog a slice of time per
    poll: the screen's pace never makes the kernel drop what the recording needs."""

    def __init__(self, cap: Capture, recorder: Recorder | None) -> None:
        self.cap = cap
        self.recorder = recorder
        self.backlog = Backlog(BACKLOG_BYTES)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None  # the drain's, raised in poll()
        if recorder is not None:
            self._thread = threading.Thread(target=self._drain, name="drain", daemon=True)
            self._thread.start()

    def _drain(self) -> None:
        assert self.recorder is not None and self.cap.ring is not None
        ring = self.cap.ring
        try:
            while not self._stop.is_set() and not ring.closed:
                chunk, n = self.cap.poll_raw(0.02)
                self.recorder.write_raw(chunk, n)
                with self._lock:
                    self.backlog.push(chunk, n)
                if isinstance(self.recorder, SpooledJsonRecorder) and len(chunk) < CALM:
                    self.recorder.convert(VIEW_SLICE)  # not the main thread: no signals
        except BaseException as exc:  # e.g. the disk is full: not silent
            self._error = exc

    def stop(self) -> None:
        """End the drain thread (before the recording is closed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def poll(self) -> list[Syscall]:
        if self._thread is None:
            return self.cap.decode(self.cap.poll_raw(0)[0])
        if self._error is not None:
            raise self._error
        out: list[Syscall] = []
        until = time.monotonic() + VIEW_SLICE
        with self._lock:
            while self.backlog and time.monotonic() < until:
                out += self.backlog.take(self.cap, 256)
        return out

    def counters(self) -> dict[str, int]:
        out = self.cap.counters()
        if self._thread is not None:
            out["not_shown"] = self.backlog.skipped
        return out


def read_until_damage(path: str) -> tuple[list[Syscall], UsageError | None]:
    """A recording's events up to any damage, and the damage (a truncated file is
    still worth viewing). A file that is not a recording at all is an error at once."""
    events: list[Syscall] = []
    try:
        events.extend(read_events(path))
    except UsageError as exc:
        if not events:
            raise
        return events, exc
    return events, None


def run_tui(opts: Options) -> int:
    tui = _tui_module()
    flt = build_filter(opts, replay=bool(opts.read))
    if opts.read:
        events, damage = read_until_damage(opts.read)
        app = tui.SyscallsApp(tui.ListFeed(events), live=False, flt=flt)
        app.warning = str(damage) if damage else None
        app.run()
        if damage:
            raise damage
        return 0
    launcher: Launcher | None = None
    recorder: Recorder | None = None
    feed: _CaptureFeed | None = None
    with Capture(opts) as cap:
        try:
            if opts.write:
                recorder = cap.recorder(opts.write, sys.argv[1:], opts.raw_recording())
            if opts.command:
                launcher = Launcher(opts.command)
                cap.add_pid(launcher.pid)
                launcher.go()
            feed = _CaptureFeed(cap, recorder)
            tui.SyscallsApp(
                feed, live=True, flt=flt, max_rows=opts.max_rows, spill=opts.write
            ).run()
        finally:
            if feed is not None:
                feed.stop()
            if launcher is not None:
                launcher.kill()
            if isinstance(recorder, SpooledJsonRecorder):
                recorder.close(sys.stderr)
            elif recorder is not None:
                recorder.close()
    return 0


def run(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    # Build the filters now: a bad regex is a usage error before anything loads.
    build_filter(opts, replay=bool(opts.read))
    if opts.tui:
        return run_tui(opts)
    if opts.read:
        return replay(opts, sys.stdout, sys.stderr)
    return capture(opts, sys.stdout, sys.stderr)
