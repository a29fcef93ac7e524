"""meridian io's live PID table: rolling per-process metrics from the kernel aggregates.

Every interval the agent reads the exact per-(PID, op, cached) aggregate map and hands
the snapshot to `PidTable.update`. Because the kernel's counters are cumulative and
exact, a window's throughput is the difference of two snapshots divided by the time
between them, whatever the event stream dropped:

- rolling throughput (bytes/s and ops/s) over 1 s, 10 s and 60 s per PID and op
  (`WINDOWS`), the first and last I/O time, and the operations of the last interval,
  with that interval's latency histogram (p50/p99) and cache hit ratio;
- processes that exited are retired `grace` seconds (default 30) after the table
  first saw them gone: their keys are returned by `update` for the caller to delete
  from the kernel map (so it never fills with the dead), and their final totals move
  to `retired` (at most `RETIRED_MAX`, the oldest forgotten and counted). A process
  is its PID and its start time (the kernel keys carry both): one whose PID another
  process took is retired at once, and the PID's series start over;
- `rows(max_pids=N)` caps the series: the N processes with the most bytes in the last
  60 s keep a row of their own; the others are summed per command name (at most N
  such `comm` rows, pid None), and what is left after those goes into one row
  labelled `other`. At most 2N + 1 rows, so exporters stay bounded.

History is thinned as it ages (every snapshot of the last 12 s, then the last one of
each 12 s), so a series holds about 17 samples at a 1 s interval. A window's rate is
exact over the span between the two snapshots it uses (`OpView.span_s`): the window
itself for 1 s and 10 s, and 60 s give or take the 12 s thinning.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...hist import Hist
from ...proc import proc_start
from .model import OPS, PidSummary, empty_hist, summarize_processes

__all__ = ["RETIRED_MAX", "WINDOWS", "OpView", "PidTable", "ProcessAlive", "Row"]

WINDOWS = (1, 10, 60)  # seconds
RETIRED_MAX = 4096
NS = 1_000_000_000
FINE_NS = 12 * NS  # every sample this recent is kept; older ones one per FINE_NS


Process = tuple[int, int]  # PID, start (clock ticks since boot)


class ProcessAlive:
    """Is this process (not merely this PID) still there? Reading /proc/PID/stat for
    the start time costs ~10 us (the kernel gathers the whole line), so a process
    found alive is checked again by its start every `recheck_s` only, and in between
    by its /proc directory (~2 us): a PID taken over by a process that does no file
    I/O is noticed within `recheck_s` (the table also sees reuse in the kernel keys)."""

    def __init__(self, recheck_s: float = 10.0, proc_root: str = "/proc") -> None:
        self.recheck_ns = int(recheck_s * NS)
        self.proc_root = proc_root
        self.checked: dict[tuple[int, int], int] = {}  # process -> when its start matched

    def __call__(self, pid: int, start: int) -> bool:
        now = time.monotonic_ns()
        last = self.checked.get((pid, start))
        recent = last is not None and now - last < self.recheck_ns
        if recent and os.path.exists(f"{self.proc_root}/{pid}"):
            return True
        self.checked.pop((pid, start), None)
        if proc_start(pid, self.proc_root) != start:
            return False
        if len(self.checked) > 1 << 16:
            self.checked.clear()
        self.checked[(pid, start)] = now
        return True


def process_ids(keys: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Kernel keys (with pid and start fields) as one number per process."""
    ids: np.ndarray[Any, Any] = keys["pid"].astype(np.uint64) << np.uint64(32)
    ids |= keys["start"].astype(np.uint64)
    return ids


def of_processes(keys: np.ndarray[Any, Any], procs: Iterable[Process]) -> np.ndarray[Any, Any]:
    """Which kernel keys belong to these processes (a boolean mask)."""
    ids = np.array([(pid << 32) | start for pid, start in procs], np.uint64)
    out: np.ndarray[Any, Any] = np.isin(process_ids(keys), ids)
    return out


@dataclass
class OpView:
    """One op of one row: totals since the agent started, windows, the last interval."""

    ops: int = 0
    bytes: int = 0
    cached_ops: int = 0
    disk_bytes: int = 0
    latency_max_ns: int = 0
    first_ns: int = 0  # CLOCK_MONOTONIC of the first and last I/O (0: none)
    last_ns: int = 0
    bytes_per_s: dict[int, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS, 0.0))
    ops_per_s: dict[int, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS, 0.0))
    # iotop's DISK READ/s, DISK WRITE/s and IO%: bytes the disk moved for the op, and ns
    # spent waiting on it, per second of the window
    disk_bytes_per_s: dict[int, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS, 0.0))
    io_wait_ns_per_s: dict[int, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS, 0.0))
    span_s: dict[int, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS, 0.0))
    interval_ops: int = 0
    interval_cached_ops: int = 0
    interval_hist: Hist = field(default_factory=empty_hist)
    hist: Hist = field(default_factory=empty_hist)

    def add(self, o: OpView) -> None:
        self.ops += o.ops
        self.bytes += o.bytes
        self.cached_ops += o.cached_ops
        self.disk_bytes += o.disk_bytes
        self.latency_max_ns = max(self.latency_max_ns, o.latency_max_ns)
        firsts = [t for t in (self.first_ns, o.first_ns) if t]
        self.first_ns = min(firsts) if firsts else 0
        self.last_ns = max(self.last_ns, o.last_ns)
        for w in WINDOWS:
            self.bytes_per_s[w] += o.bytes_per_s[w]
            self.ops_per_s[w] += o.ops_per_s[w]
            self.disk_bytes_per_s[w] += o.disk_bytes_per_s[w]
            self.io_wait_ns_per_s[w] += o.io_wait_ns_per_s[w]
            self.span_s[w] = max(self.span_s[w], o.span_s[w])
        self.interval_ops += o.interval_ops
        self.interval_cached_ops += o.interval_cached_ops
        self.interval_hist = self.interval_hist + o.interval_hist
        self.hist = self.hist + o.hist

    def hit_ratio(self, interval: bool = True) -> float | None:
        """Cached share of the last interval's operations (or of all, interval=False)."""
        if interval:
            return self.interval_cached_ops / self.interval_ops if self.interval_ops else None
        return self.cached_ops / self.ops if self.ops else None

    def percentile_ns(self, q: float, interval: bool = True) -> float | None:
        h = self.interval_hist if interval else self.hist
        return h.percentile(q) if h.total else None


@dataclass
class Row:
    """A process (pid set), the sum of one command's other processes (pid None), or
    everything beyond the caps (`other`)."""

    pid: int | None
    comm: str
    level: str  # "pid", "comm" or "other"
    ops: dict[str, OpView] = field(default_factory=lambda: {op: OpView() for op in OPS})
    processes: int = 1

    def total(self, window: int = 1) -> float:
        return sum(v.bytes_per_s[window] for v in self.ops.values())

    def add(self, other: Row) -> None:
        for op in OPS:
            self.ops[op].add(other.ops[op])
        self.processes += other.processes


Sample = tuple[int, int, int, int, int, int]  # t_ns, ops, bytes, cached, disk_bytes, io_wait_ns


@dataclass
class _Series:
    """One process and op: cumulative samples and the previous histogram."""

    history: deque[Sample]
    prev: Hist = field(default_factory=empty_hist)  # the histogram at the last push
    view: OpView = field(default_factory=OpView)

    def push(self, s: Sample) -> None:
        h = self.history
        h.append(s)
        now = s[0]
        if len(h) < 3 or now - h[1][0] <= FINE_NS:
            return
        # Thin: every sample of the last FINE_NS, the last one of each older FINE_NS
        # bucket, and nothing older than the longest window but one anchor.
        horizon = now - max(WINDOWS) * NS - FINE_NS
        kept: list[Sample] = []
        for i, x in enumerate(h):
            nxt = h[i + 1] if i + 1 < len(h) else None
            old = nxt is not None and now - x[0] > FINE_NS
            if old and nxt and (x[0] // FINE_NS == nxt[0] // FINE_NS or nxt[0] <= horizon):
                continue
            kept.append(x)
        if len(kept) != len(h):
            self.history = deque(kept)

    def at(self, t: int) -> Sample:
        """The sample nearest to time t (the oldest when history is shorter)."""
        best = self.history[0]
        for s in self.history:
            if abs(s[0] - t) < abs(best[0] - t):
                best = s
        return best


class PidTable:
    """Per-process rolling metrics from successive snapshots of the aggregate map."""

    def __init__(
        self,
        start_ns: int,
        grace_s: float = 30.0,
        alive: Callable[[int, int], bool] | None = None,
    ) -> None:
        self.last_ns = start_ns
        self.grace_ns = int(grace_s * NS)
        self.alive = alive or ProcessAlive()
        self.series: dict[tuple[int, str], _Series] = {}
        self.comms: dict[int, str] = {}
        self.starts: dict[int, int] = {}  # the process each PID's series belong to
        self.dead_since: dict[int, int] = {}
        self.retired: dict[Process, PidSummary] = {}
        self.retired_forgotten = 0
        self.latest: dict[int, PidSummary] = {}
        self.other_dead: dict[Process, int] = {}  # gone() over another per-process map

    def update(
        self, keys: np.ndarray[Any, Any], vals: np.ndarray[Any, Any], now_ns: int
    ) -> np.ndarray[Any, Any]:
        """Take a snapshot (keys and per-CPU values of the aggregate map) made at
        `now_ns` (CLOCK_MONOTONIC). Returns the keys of retired processes, to delete
        from the kernel map."""
        pids: dict[int, PidSummary] = {}
        reused: list[PidSummary] = []  # processes whose PID a newer process took
        for (pid, _), ps in summarize_processes(keys, vals).items():
            if pid in pids:
                reused.append(pids[pid])
            pids[pid] = ps
        self.latest = pids
        prev_ns = self.last_ns
        for pid, ps in pids.items():
            if self.starts.setdefault(pid, ps.start) != ps.start:
                self._forget(pid)  # another process now: its own series from zero
                self.starts[pid] = ps.start
            self.comms[pid] = ps.comm or self.comms.get(pid, "")
            for op in OPS:
                self._observe(pid, op, ps, now_ns, prev_ns)
        self.last_ns = now_ns
        for pid in [p for p in self.starts if p not in pids]:
            self._forget(pid)  # gone from the kernel map (evicted or deleted)
        return self._retire(keys, pids, reused, now_ns)

    def _forget(self, pid: int) -> None:
        for op in OPS:
            self.series.pop((pid, op), None)
        self.comms.pop(pid, None)
        self.starts.pop(pid, None)
        self.dead_since.pop(pid, None)

    def _observe(self, pid: int, op: str, ps: PidSummary, now: int, prev: int) -> None:
        t = ps.total(op)
        s = self.series.get((pid, op))
        if s is None:
            if not t.ops:
                return
            # Not in the previous snapshot: its counters were zero then.
            s = self.series[(pid, op)] = _Series(deque([(prev, 0, 0, 0, 0, 0)]))
        cached = ps.total(op, True).ops
        s.push((now, t.ops, t.bytes, cached, t.disk_bytes, t.io_wait_ns))
        v = s.view
        last = s.history[-2] if len(s.history) >= 2 else s.history[-1]
        v.interval_ops = t.ops - last[1]
        v.interval_cached_ops = cached - last[3]
        v.interval_hist = t.hist.since(s.prev) if s.prev.total else t.hist
        s.prev = t.hist
        v.hist = t.hist
        v.ops, v.bytes, v.cached_ops, v.disk_bytes = t.ops, t.bytes, cached, t.disk_bytes
        v.latency_max_ns, v.first_ns, v.last_ns = t.latency_max_ns, t.first_ns, t.last_ns
        for w in WINDOWS:
            old = s.at(now - w * NS)
            span = (now - old[0]) / NS
            v.bytes_per_s[w] = (t.bytes - old[2]) / span if span > 0 else 0.0
            v.ops_per_s[w] = (t.ops - old[1]) / span if span > 0 else 0.0
            v.disk_bytes_per_s[w] = (t.disk_bytes - old[4]) / span if span > 0 else 0.0
            v.io_wait_ns_per_s[w] = (t.io_wait_ns - old[5]) / span if span > 0 else 0.0
            v.span_s[w] = span

    def _retire(
        self,
        keys: np.ndarray[Any, Any],
        pids: dict[int, PidSummary],
        reused: list[PidSummary],
        now: int,
    ) -> np.ndarray[Any, Any]:
        gone = list(reused)
        for pid, ps in pids.items():
            if self.alive(pid, ps.start):
                self.dead_since.pop(pid, None)
                continue
            since = self.dead_since.setdefault(pid, now)
            if now - since >= self.grace_ns:
                gone.append(ps)
                self._forget(pid)
        for ps in gone:
            self.retired[(ps.pid, ps.start)] = ps
            if len(self.retired) > RETIRED_MAX:
                del self.retired[next(iter(self.retired))]
                self.retired_forgotten += 1
        if not gone or not len(keys):
            return keys[:0]
        out: np.ndarray[Any, Any] = keys[of_processes(keys, [(ps.pid, ps.start) for ps in gone])]
        return out

    def gone(self, procs: Iterable[Process], now_ns: int) -> list[Process]:
        """Of the processes of another per-process map (block requests), those to
        retire now: seen exited for the grace period, the same rule as the table's own
        (a process whose PID was reused has exited)."""
        out, present = [], set()
        for proc in procs:
            present.add(proc)
            if self.alive(*proc):
                self.other_dead.pop(proc, None)
            elif now_ns - self.other_dead.setdefault(proc, now_ns) >= self.grace_ns:
                out.append(proc)
        for proc in [p for p in self.other_dead if p not in present or p in out]:
            del self.other_dead[proc]
        return out

    def rows(self, max_pids: int | None = None, window: int = 60) -> list[Row]:
        """One row per live process, most bytes in `window` first; capped as the module
        says when max_pids is given."""
        by_pid: dict[int, Row] = {}
        for (pid, op), s in self.series.items():
            row = by_pid.get(pid)
            if row is None:
                row = by_pid[pid] = Row(pid, self.comms.get(pid, ""), "pid")
            row.ops[op] = s.view
        ranked = sorted(by_pid.values(), key=lambda r: (-r.total(window), r.pid or 0))
        if max_pids is None or len(ranked) <= max_pids:
            return ranked
        kept, rest = ranked[:max_pids], ranked[max_pids:]
        comms: dict[str, Row] = {}
        for r in rest:
            agg = comms.get(r.comm)
            if agg is None:
                agg = comms[r.comm] = Row(None, r.comm, "comm", processes=0)
            agg.add(r)
        groups = sorted(comms.values(), key=lambda r: (-r.total(window), r.comm))
        out = kept + groups[:max_pids]
        if len(groups) > max_pids:
            other = Row(None, "other", "other", processes=0)
            for g in groups[max_pids:]:
                other.add(g)
            out.append(other)
        return out

    def rolling(self) -> dict[int, dict[str, dict[str, dict[str, float]]]]:
        """pid -> op -> "1s"/"10s"/"60s" -> bytes_per_s, ops_per_s, disk_bytes_per_s,
        span_s (JSON-ready)."""
        out: dict[int, dict[str, dict[str, dict[str, float]]]] = {}
        for (pid, op), s in self.series.items():
            v = s.view
            out.setdefault(pid, {})[op] = {
                f"{w}s": {
                    "bytes_per_s": round(v.bytes_per_s[w], 1),
                    "ops_per_s": round(v.ops_per_s[w], 3),
                    "disk_bytes_per_s": round(v.disk_bytes_per_s[w], 1),
                    "span_s": round(v.span_s[w], 3),
                }
                for w in WINDOWS
            }
        return out

    def summaries(self) -> list[PidSummary]:
        """Every process seen, by PID and start: the latest snapshot and the retired."""
        procs = {**self.retired, **{(ps.pid, ps.start): ps for ps in self.latest.values()}}
        return [procs[k] for k in sorted(procs)]


def delete_keys(stats_map: Any, keys: Iterable[Any]) -> int:
    """Delete retired keys from a per-process kernel map (disk_io, writeback); returns
    how many were there."""
    return sum(1 for k in keys if stats_map.delete(k))
