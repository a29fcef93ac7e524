"""Process views: what the symbolizer knows of a pid's address space, from
/proc/PID/maps, and when to believe it no longer. A view is checked at most every
`recheck_s`: a changed /proc/PID/stat start time (pid reused), or a changed exe
link, start of code or stack (exec) replace it; a process that is gone keeps its
view for `grace_s` so samples still in flight resolve. Each view has a `gen`, so
that frames cached under a replaced view are never served. Not locked: the
Symbolizer calls it under its own lock."""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ....proc import proc_stat
from .perfmap import JitRegion, PerfMapFile
from .symcache import Lru

__all__ = ["Identity", "Mapping", "Process", "ProcessViews"]


@dataclass
class Mapping:
    start: int
    end: int
    pgoff: int
    path: str  # "" for anonymous memory, "[heap]", "[vdso]", ... as the kernel says
    binary: tuple[int, int, int, int] | None = None  # the opened file's stat key
    resolved: bool = False

    @property
    def file_backed(self) -> bool:
        return self.path.startswith("/")


def parse_maps(text: str) -> list[Mapping]:
    """/proc/PID/maps lines `start-end perms offset dev inode [path]`, sorted."""
    out: list[Mapping] = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        lo, _, hi = parts[0].partition("-")
        try:
            start, end, pgoff = int(lo, 16), int(hi, 16), int(parts[2], 16)
        except ValueError:
            continue
        out.append(Mapping(start, end, pgoff, parts[5].strip() if len(parts) > 5 else ""))
    out.sort(key=lambda m: m.start)
    return out


def same_maps(a: list[Mapping], b: list[Mapping]) -> bool:
    return len(a) == len(b) and all(
        (x.start, x.end, x.pgoff, x.path) == (y.start, y.end, y.pgoff, y.path)
        for x, y in zip(a, b, strict=True)
    )


Identity = tuple[int, int, int, str]


@dataclass
class Process:
    """What is cached about one pid: its mappings and its perf map. `gen` tells this
    view's cached frames from those of the view it replaced."""

    gen: int
    ident: Identity | None
    mappings: list[Mapping]
    loaded: float
    checked: float
    dead_since: float | None = None
    perf_map: PerfMapFile | None = None
    perf_checked: float = 0.0
    starts: list[int] = field(default_factory=list)
    # find_all's: the starts and ends as arrays, made on its first call
    _bounds: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.starts = [m.start for m in self.mappings]

    def perf_lookup(
        self, path: Path, max_regions: int, ip: int, now: float, refresh: bool
    ) -> JitRegion | None:
        """The region of ip in the JIT's perf map file `path`, read again first when
        `refresh` (the symbolizer paces the reads)."""
        if self.perf_map is None:
            self.perf_map = PerfMapFile(path, max_regions)
        if refresh:
            self.perf_checked = now
            self.perf_map.refresh()
        return self.perf_map.lookup(ip)

    def no_perf_map(self, path: Path, max_regions: int, now: float, recheck_s: float) -> bool:
        """No JIT region to look in: the perf map read within `recheck_s` holds none, or
        there is no file at `path` and none was read (noted as checked now: a stat,
        not a read)."""
        if self.perf_map is not None and now - self.perf_checked < recheck_s:
            return not len(self.perf_map.regions)
        if (self.perf_map is not None and len(self.perf_map.regions)) or path.exists():
            return False
        if self.perf_map is None:
            self.perf_map = PerfMapFile(path, max_regions)
        self.perf_checked = now
        return True

    def find(self, ip: int) -> Mapping | None:
        i = bisect_right(self.starts, ip) - 1
        if i >= 0 and ip < self.mappings[i].end:
            return self.mappings[i]
        return None

    def find_all(self, ips: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """find() of many addresses (uint64) at once: the index of each one's mapping
        in `mappings`, -1 where find() says None."""
        if self._bounds is None:
            self._bounds = (
                np.array(self.starts, dtype=np.uint64),
                np.array([m.end for m in self.mappings], dtype=np.uint64),
            )
        starts, ends = self._bounds
        ips = np.asarray(ips, dtype=np.uint64)
        if not len(starts):
            return np.full(len(ips), -1, dtype=np.int64)
        i = np.searchsorted(starts, ips, side="right").astype(np.int64) - 1
        return np.where((i >= 0) & (ips < ends[np.maximum(i, 0)]), i, -1)


@dataclass(eq=False)
class ProcessViews:
    """The cached views, the most recently used `max_processes` of them."""

    proc_root: Path
    max_processes: InitVar[int]
    recheck_s: float
    grace_s: float
    clock: Callable[[], float]
    _procs: Lru[int, Process] = field(init=False)
    _gen: int = field(init=False, default=0)

    def __post_init__(self, max_processes: int) -> None:
        self._procs = Lru(max_processes)

    def __len__(self) -> int:
        return len(self._procs)

    def peek(self, pid: int) -> Process | None:
        return self._procs.peek(pid)

    def pop(self, pid: int) -> Process | None:
        return self._procs.pop(pid)

    def identity(self, pid: int) -> Identity | None:
        """(start time, start of code, start of stack, exe) or None when pid is gone.
        The start time changes when the pid is reused; exec keeps it but moves the
        code and stack (and usually the exe)."""
        stat = proc_stat(pid, self.proc_root)
        if stat is None:
            return None
        try:
            exe = os.readlink(self.proc_root / str(pid) / "exe")
        except OSError:
            exe = ""
        return stat.start, stat.start_code, stat.start_stack, exe

    def load(self, pid: int, now: float) -> Process:
        ident = self.identity(pid)
        try:
            text = (self.proc_root / str(pid) / "maps").read_text(errors="replace")
        except OSError:
            text = ""
        mappings = parse_maps(text)
        old = self._procs.peek(pid)
        if old is not None and ident == old.ident and same_maps(mappings, old.mappings):
            # Read again (an address in no mapping, the grace period of a dead pid):
            # the same view, whose frames (cached under its gen) and binaries stay.
            old.loaded = old.checked = now
            if ident is None:
                old.dead_since = now
            self._procs.put(pid, old)
            return old
        if old is not None and ident == old.ident:
            # The same process with a mapping more or less (a heap grown, a library
            # loaded): the file of each unchanged mapping is known already.
            known = {(m.start, m.end, m.pgoff, m.path): m for m in old.mappings if m.resolved}
            for m in mappings:
                was = known.get((m.start, m.end, m.pgoff, m.path))
                if was is not None:
                    m.binary, m.resolved = was.binary, True
        self._gen += 1
        proc = Process(self._gen, ident, mappings, now, now)
        if ident is None:
            proc.dead_since = now
        self._procs.put(pid, proc)
        return proc

    def get(self, pid: int) -> Process:
        now = self.clock()
        proc = self._procs.get(pid)
        if proc is None:
            return self.load(pid, now)
        if now - proc.checked < self.recheck_s:
            return proc
        proc.checked = now
        ident = self.identity(pid)
        if ident is None:
            if proc.dead_since is None:
                proc.dead_since = now
            elif now - proc.dead_since >= self.grace_s:
                return self.load(pid, now)
            return proc
        if ident != proc.ident:
            return self.load(pid, now)
        return proc

    def sweep(self) -> int:
        """Check every cached process now; drop those gone past the grace period or
        replaced (exec, pid reuse). Returns how many were dropped. For a flush loop."""
        dropped = 0
        now = self.clock()
        for pid in self._procs.snapshot():
            proc = self._procs.pop(pid)
            assert proc is not None
            ident = self.identity(pid)
            proc.checked = now
            if ident is None:
                proc.dead_since = proc.dead_since if proc.dead_since is not None else now
                if now - proc.dead_since >= self.grace_s:
                    dropped += 1
                    continue
            elif ident != proc.ident:
                dropped += 1
                continue
            self._procs.put(pid, proc)
        return dropped
