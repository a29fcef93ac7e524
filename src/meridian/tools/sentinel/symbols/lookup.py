"""Sample addresses to frames (binary, function, file, line): the first half of the
Symbolizer (symbolizer.py interns the frames found here to ids).

Where an address comes from, in the order tried:
- kernel (upper half): /proc/kallsyms (kallsyms.py); "[kernel]" when hidden;
- JIT regions registered through the API (`register_jit`);
- the process's file-backed mappings in /proc/PID/maps, then the file's ELF symbols
  (elf.py, cached per file by binaries.py): `ip - start + pgoff` is a file offset,
  its PT_LOAD gives the address;
- for anonymous memory, the JIT's perf map `PERF_MAP_DIR/perf-PID.map` (perfmap.py).

Nothing raises for an address it cannot name: the frame says "[unknown]" (with the
binary and offset when the mapping is known). Caches are bounded LRUs: a view per
process (procview.py), a symbol table per binary (binaries.py), frames keyed by (pid,
view, ip) so that a replaced view's frames age out (symcache.py).
In cheap mode (`_cheap` set, under the lock) whatever would need a slow read (a
binary's symbols or line table, kallsyms, a perf map) raises `Costly` instead; with
`_lines_later` set, a line table to decode does too (the Symbolizer's warm() decodes
it outside the lock, as it can take seconds).

`_user_binaries` is `_frame`'s vector form, for function ids: where many addresses
of a process lie (the binary, and the address in its symbol table), as far as that
needs no read; what it leaves is asked of `_frame` address by address.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from ..model.frames import JIT, KERNEL, UNKNOWN, Frame
from .binaries import Binaries
from .elf import NOT_SIGNED, ElfSymbols
from .kallsyms import KernelSymbols, is_kernel
from .perfmap import JitRegion, JitRegions
from .procview import Process, ProcessViews
from .symcache import Lru

__all__ = ["USER_END", "AddressLookup", "Costly", "Located"]

Array = np.ndarray[Any, Any]
# Addresses of one binary (_user_binaries): their positions in the batch, the binary,
# and its symbol table with the addresses in it (int64); no table: "[unknown]" in it.
Located = tuple[Array, str, tuple[ElfSymbols, Array] | None]

# Above the highest user address any 64-bit Linux hands out (x86-64 with 5-level
# paging: 2^56; arm64: 2^52) and below the kernel's half: not an address at all.
USER_END = 1 << 56


class Costly(Exception):
    """Raised in cheap mode where an answer would need a slow read (a binary's symbols
    or line table, kallsyms, a perf map): the address is noted for warm(). `lines`:
    the table whose line table is what the answer waits for."""

    def __init__(self, lines: ElfSymbols | None = None) -> None:
        super().__init__()
        self.lines = lines


class AddressLookup:
    """(pid, ip) to a Frame, under `_lock` (a reentrant lock the Symbolizer shares).
    `proc_root`, `kallsyms` and `perf_map_dir` are parameters so that tests run on
    fixture trees; `clock` (monotonic seconds) paces the checks for exec and exit."""

    def __init__(
        self,
        proc_root: str | Path,
        kallsyms: str | Path,
        perf_map_dir: str | Path,
        max_processes: int,
        max_binaries: int,
        max_frames: int,
        max_jit_regions: int,
        recheck_s: float,
        grace_s: float,
        kernel_reload_s: float,
        debug_root: str | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = Path(proc_root)
        self.perf_map_dir = Path(perf_map_dir)
        self.max_jit_regions = max_jit_regions
        self.recheck_s = recheck_s
        self.grace_s = grace_s
        self.kernel_reload_s = kernel_reload_s
        self.clock = clock
        self._lock = threading.RLock()
        self._kernel = KernelSymbols(kallsyms)
        self._kernel_loaded = 0.0
        self._kernel_gen = 0
        # (pid, view gen, ip) -> frame; kernel frames under pid -1 and _kernel_gen.
        self._frames: Lru[tuple[int, int, int], Frame] = Lru(max_frames)
        self._views = ProcessViews(self.proc_root, max_processes, recheck_s, grace_s, clock)
        self._binaries = Binaries(self.proc_root, max_binaries, debug_root, self._costly)
        self._jit: Lru[int, JitRegions] = Lru(max_processes)
        self._jit_gen = 0
        self._cheap = False  # cheap mode: _costly() raises
        self._lines_later = False  # _costly(table) raises: the caller decodes the lines

    def frame(self, pid: int, ip: int) -> Frame:
        """The frame of `ip` in process `pid`; "[unknown]" rather than an exception."""
        pid, ip = int(pid), int(ip)  # numpy scalars would turn offsets into floats
        with self._lock:
            return self._frame(pid, ip)[0]

    def _frame(self, pid: int, ip: int, lines: bool = True) -> tuple[Frame, bool]:
        """The frame, and whether it is kept (the same until the state changes).
        Without `lines` (a function id needs no file and line: decoding a binary's
        line table costs seconds) a new frame has none and is not cached."""
        if is_kernel(ip):
            return self._kernel_frame(ip), True
        if ip >= USER_END:
            # Neither user nor kernel: a frame-pointer walk through code built without
            # them reads garbage. No mapping can ever hold it, so the answer is kept
            # (and the stack with it) rather than re-reading /proc/PID/maps for it.
            return Frame("", UNKNOWN, "", 0, ip, 0), True
        regions = self._jit.get(pid)
        if regions is not None:
            region = regions.lookup(ip)
            if region is not None:
                return self._jit_frame(pid, ip, region, lines), True
        proc = self._views.get(pid)
        found = self._frames.get((pid, proc.gen, ip))
        if found is not None:
            return found, True
        proc, made = self._user_frame(pid, proc, ip, lines)
        # Only file-backed answers are kept: a JIT's perf map and the mappings
        # themselves change under an address, and are checked again on a miss.
        if made.binary.startswith("/"):
            if lines:
                self._frames.put((pid, proc.gen, ip), made)
            return made, True
        return made, False

    def _costly(self, lines: ElfSymbols | None = None) -> None:
        """Before a slow read (`lines`: decoding that table's lines): raises Costly in
        cheap mode, and before decoding lines when they are to be decoded later."""
        if self._cheap or (lines is not None and self._lines_later):
            raise Costly(lines)

    def load_kernel(self) -> None:
        """Read kallsyms now, if not read yet (about 50 ms for 120,000 symbols): the
        kernel's frames then need no slow read in cheap mode."""
        with self._lock:
            if not self._kernel.loaded:
                self._kernel.reload()
                self._kernel_loaded = self.clock()

    def register_jit(
        self, pid: int, start: int, end: int, path: str, build_id: str | None = None
    ) -> None:
        """Code in [start, end) of `pid` belongs to `path`. When `path` is an ELF file
        (a JIT'ed image written out) its symbols name the code, `start` being where the
        image's first PT_LOAD page sits; otherwise the region is one function, `path`.
        `build_id` (hex) names the image: only an image with that build id (the file at
        `path`, else its debug file by build id) names the code (binaries.of_jit)."""
        pid, start, end = int(pid), int(start), int(end)
        with self._lock:
            self._jit_gen += 1
            regions = self._jit.get(pid)
            if regions is None:
                regions = JitRegions(self.max_jit_regions)
                self._jit.put(pid, regions)
            regions.add(start, end, path, build_id)

    def jit_regions(self, pid: int | None, limit: int) -> list[tuple[int, JitRegion]]:
        """(pid, region) of the first `limit` JIT regions (of one process, or all)."""
        with self._lock:
            pids = sorted(self._jit.snapshot()) if pid is None else [pid]
            held = [(p, self._jit.peek(p)) for p in pids]
            found = ((p, r) for p, rs in held if rs is not None for r in rs.regions())
            return list(islice(found, limit))

    def sweep(self) -> int:
        """Check every cached process now; drop those gone past the grace period or
        replaced (exec, pid reuse). Returns how many were dropped (the symbols thread)."""
        with self._lock:
            return self._views.sweep()

    # -- internals ----------------------------------------------------------------

    def _user_frame(
        self, pid: int, proc: Process, ip: int, lines: bool = True
    ) -> tuple[Process, Frame]:
        """The frame of ip, with the process view used (a fresh one when the maps were
        read again because ip was in none of the cached mappings)."""
        m = proc.find(ip)
        now = self.clock()
        if m is None and proc.dead_since is None and now - proc.loaded >= self.recheck_s:
            fresh = self._views.load(pid, now)  # a new mapping (dlopen, mmap) since the last read
            fresh.perf_map, fresh.perf_checked = proc.perf_map, proc.perf_checked
            proc = fresh
            m = proc.find(ip)
        if m is None or not m.file_backed:
            stale = proc.perf_map is None or now - proc.perf_checked >= self.recheck_s
            if stale:
                self._costly()  # a perf map can be megabytes
            path = self.perf_map_dir / f"perf-{pid}.map"
            region = proc.perf_lookup(path, self.max_jit_regions, ip, now, stale)
            if region is not None:
                return proc, Frame(JIT, region.name, "", 0, ip, ip - region.start)
            if m is None:
                return proc, Frame("", UNKNOWN, "", 0, ip, 0)
            return proc, Frame(m.path or "[anon]", UNKNOWN, "", 0, ip, ip - m.start)
        file_offset = ip - m.start + m.pgoff
        table = self._binaries.of_mapping(pid, m)
        vaddr = table.vaddr(file_offset) if table is not None else None
        if table is None or vaddr is None:
            return proc, Frame(m.path, UNKNOWN, "", 0, ip, file_offset)
        return proc, self._binaries.frame(m.path, table, ip, vaddr, lines)

    def _user_binaries(self, pid: int, ips: Array) -> list[Located]:
        """_user_frame's answers (for a function id: no lines) of many user addresses
        of pid (uint64) that need no read: per mapping, the addresses in its file's
        symbol table, or "[unknown]" in the mapping (its file has no table or holds no
        code there; memory with no perf map, or none with a region). Left to _frame: a
        pid with JIT regions, an address in no mapping, a file or a perf map to read."""
        if self._jit.get(pid) is not None:
            return []
        proc = self._views.get(pid)
        where = proc.find_all(ips)
        order = np.argsort(where, kind="stable")
        sorted_where = where[order]
        cuts = np.flatnonzero(sorted_where[1:] != sorted_where[:-1]) + 1
        now = self.clock()
        out: list[Located] = []
        for at in np.split(order, cuts):
            i = int(where[at[0]])
            if i < 0:
                continue
            m = proc.mappings[i]
            if not m.file_backed:
                perf_map = self.perf_map_dir / f"perf-{pid}.map"
                if not proc.no_perf_map(perf_map, self.max_jit_regions, now, self.recheck_s):
                    continue  # a perf map to read, or to look in
                out.append((at, m.path or "[anon]", None))
            elif m.resolved and m.binary is None:
                out.append((at, m.path, None))  # no file opens: no table
            elif (table := self._binaries.loaded(m)) is not None:
                vaddrs = table.vaddrs(ips[at] - np.uint64(m.start) + np.uint64(m.pgoff))
                exact = vaddrs != NOT_SIGNED
                out.append((at[exact], m.path, (table, vaddrs[exact])))
        return out

    def _jit_frame(self, pid: int, ip: int, region: JitRegion, lines: bool = True) -> Frame:
        """A registered region's frame: from the ELF image at its path, else the
        region itself is the function."""
        path = region.name
        if path.startswith("/"):
            table = self._binaries.of_jit(pid, region)
            if table.ok:
                vaddr = ip - region.start + table.base
                return self._binaries.frame(path, table, ip, vaddr, lines)
        return Frame(JIT, path, "", 0, ip, ip - region.start)

    def _kernel_frame(self, ip: int) -> Frame:
        key = (-1, self._kernel_gen, ip)
        found = self._frames.get(key)
        if found is not None:
            return found
        now = self.clock()
        if not self._kernel.loaded:
            self._costly()
            self._kernel.reload()
            self._kernel_loaded = now
        hit = self._kernel.lookup(ip)
        if hit is None and now - self._kernel_loaded >= self.kernel_reload_s:
            self._costly()
            self._kernel_loaded = now  # a module or BPF program loaded since
            self._kernel.reload()
            self._kernel_gen += 1
            hit = self._kernel.lookup(ip)
        if hit is None:
            made = Frame(KERNEL, KERNEL if self._kernel.hidden else UNKNOWN, "", 0, ip, 0)
        else:
            name, offset, module = hit
            made = Frame(f"[{module}]" if module else KERNEL, name, "", 0, ip, offset)
        self._frames.put((-1, self._kernel_gen, ip), made)
        return made
