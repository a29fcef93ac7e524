"""Sample addresses to frames (binary, function, file, line), interned to the small ids
the aggregator keys on: function ids, call-stack ids and data-object ids.

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
view, ip) so that a replaced view's frames age out (symcache.py). `forget(pid)` drops
a process.
Cheap mode (`function_ids`/`stack_id` with cheap=True) answers only from what is
loaded; what needs a slow read is "unresolved" until `warm()` (a background thread)
has read it: the agent's consumer must keep up.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path

from ..model.dataobjects import DataObject, DataObjects
from ..model.frames import JIT, KERNEL, UNKNOWN, Frame
from . import elf
from .binaries import Binaries
from .kallsyms import KERNEL_START, KernelSymbols, is_kernel
from .perfmap import JitRegion, JitRegions
from .procview import Process, ProcessViews
from .symcache import Interner, Lru

# Above the highest user address any 64-bit Linux hands out (x86-64 with 5-level
# paging: 2^56; arm64: 2^52) and below the kernel's half: not an address at all.
USER_END = 1 << 56

__all__ = ["DataObject", "Frame", "Symbolizer"]


class _Costly(Exception):
    """Raised in cheap mode where an answer would need a slow read (a binary's symbols
    or line table, kallsyms, a perf map): the address is noted for warm()."""


class Symbolizer:
    """Resolves (pid, ip) to frames and interns them; safe to call from several threads.

    `proc_root`, `kallsyms` and `perf_map_dir` are parameters so that tests run on
    fixture trees; `clock` (monotonic seconds) paces the checks for exec and exit.
    Function ids key on (binary, function); stack ids on the frames (see `Frame`).
    Ids start at 1; 0 means none (an empty stack, no data object).
    """

    def __init__(
        self,
        proc_root: str | Path = "/proc",
        kallsyms: str | Path = "/proc/kallsyms",
        perf_map_dir: str | Path = "/tmp",
        max_processes: int = 1024,
        max_binaries: int = 64,
        max_frames: int = 1 << 15,
        max_functions: int = 1 << 20,
        max_stacks: int = 1 << 20,
        max_jit_regions: int = 1 << 16,
        max_data_objects: int = 1 << 16,
        max_pending: int = 1 << 16,
        recheck_s: float = 1.0,
        grace_s: float = 10.0,
        kernel_reload_s: float = 60.0,
        debug_root: str | None = "/usr/lib/debug",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        elf.require()
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
        self._functions: Interner[tuple[str, str]] = Interner(max_functions)
        self._stacks: Interner[tuple[Frame, ...]] = Interner(max_stacks)
        # Ids given for (pid, state, ip) and (pid, state, ips), state naming all an
        # answer came from (view, JIT and kernel registrations, interners): asked again,
        # a dict lookup instead of frames. Only answers stable within a state are kept.
        self._jit_gen = 0
        # (owner, state) -> {ip: function id}: a dict lookup per address; all of them
        # dropped at once past max_frames answers (tables of old states among them)
        self._function_ids: dict[tuple[int, tuple[int, ...]], dict[int, int]] = {}
        self._function_ids_kept = 0
        self._max_function_ids = max_frames
        self._stack_ids: Lru[tuple[int, tuple[int, ...], tuple[int, ...]], int] = Lru(
            max(1, max_frames // 8)
        )
        self._new_stacks: deque[tuple[int, tuple[Frame, ...]]] = deque(maxlen=max_pending)
        self._data = DataObjects(max_data_objects, max_pending)
        # cheap mode (function_ids/stack_id with cheap=True): answers from what is
        # loaded already; the addresses that needed more wait here for warm()
        self._cheap = False
        self._misses: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.max_misses = max_pending
        self.cheap_misses = 0  # addresses answered "unresolved" in cheap mode
        self.missed = threading.Event()  # set when an address starts waiting for warm()

    # -- frames -------------------------------------------------------------------

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

    def _state(self, pid: int) -> tuple[int, ...]:
        """What answers for pid depend on: its view (checked as frame() checks it, so
        an exec is seen as soon), JIT registrations, kernel symbols, the interners."""
        view = self._views.get(pid).gen if pid >= 0 else 0
        return (
            view,
            self._jit_gen,
            self._kernel_gen,
            self._functions.evicted,
            self._stacks.evicted,
        )

    def function_id(self, pid: int, ip: int) -> int:
        """The interned id of the function holding ip (stable within a run)."""
        pid, ip = int(pid), int(ip)
        owner = -1 if is_kernel(ip) else pid  # kernel frames are every process's
        with self._lock:
            found = self._function_table(owner).get(ip)
            if found is not None:
                return found
            f, kept = self._frame(pid, ip, lines=False)
            ident = self._functions.intern((f.binary, f.function))[0]
            if kept:  # under the state after the answer (a view read again, say)
                if self._function_ids_kept >= self._max_function_ids:
                    self._function_ids.clear()
                    self._function_ids_kept = 0
                self._function_table(owner)[ip] = ident
                self._function_ids_kept += 1
            return ident

    def _function_table(self, owner: int) -> dict[int, int]:
        key = (owner, self._state(owner))
        table = self._function_ids.get(key)
        if table is None:
            table = self._function_ids[key] = {}
        return table

    def function_ids(
        self, pids: Sequence[int], ips: Sequence[int], cheap: bool = False, unresolved: int = 0
    ) -> list[int]:
        """function_id of each (pid, ip), under one lock and one check of each process.
        `cheap`: an address whose answer needs a slow read (a binary's symbols, say)
        is answered `unresolved` and left for warm()."""
        out: list[int] = []
        with self._lock:
            tables: dict[int, dict[int, int]] = {}
            for pid, ip in zip(pids, ips, strict=True):
                owner = -1 if ip >= KERNEL_START else pid
                table = tables.get(owner)
                if table is None:
                    table = tables[owner] = self._function_table(owner)
                found = table.get(ip)
                if found is None and cheap and (pid, ip) in self._misses:
                    self.cheap_misses += 1  # still waiting for warm()
                    out.append(unresolved)
                    continue
                if found is None and cheap:
                    self._cheap = True
                    try:
                        found = self.function_id(pid, ip)
                    except _Costly:  # nothing read: the table stands
                        self._miss(int(pid), int(ip))
                        out.append(unresolved)
                        continue
                    finally:
                        self._cheap = False
                    tables.pop(owner, None)
                elif found is None:
                    found = self.function_id(pid, ip)
                    tables.pop(owner, None)  # the view may have been read again
                out.append(found)
        return out

    def _costly(self) -> None:
        if self._cheap:
            raise _Costly

    def _miss(self, pid: int, ip: int) -> None:
        self.cheap_misses += 1
        key = (pid, ip)
        if key in self._misses:
            return
        self._misses[key] = None
        if not self.missed.is_set():  # set() takes a lock and notifies: not per address
            self.missed.set()
        while len(self._misses) > self.max_misses:
            self._misses.popitem(last=False)

    def warm(self, budget_s: float) -> int:
        """The slow reads cheap answers skipped, oldest first, for about `budget_s`
        seconds (a background thread's job). Returns how many are still waiting."""
        end = time.perf_counter() + budget_s
        while time.perf_counter() < end:
            with self._lock:
                if not self._misses:
                    self.missed.clear()
                    return 0
                (pid, ip), _ = self._misses.popitem(last=False)
                self._frame(pid, ip)
        with self._lock:
            return len(self._misses)

    def function_key(self, function_id: int) -> tuple[str, str] | None:
        """(binary, symbol) of a function id (None: not interned), for storage."""
        with self._lock:
            return self._functions.key(function_id)

    def function_name(self, function_id: int) -> str:
        """A function id's display name: the symbol, or "[unknown] (binary)"."""
        key = self.function_key(function_id)
        if key is None:
            return UNKNOWN
        binary, function = key
        if function == UNKNOWN and binary:
            return f"{UNKNOWN} ({os.path.basename(binary) or binary})"
        return function

    def stack_id(
        self, pid: int, ips: Sequence[int], cheap: bool = False, unresolved: int = 0
    ) -> int:
        """The interned id of the frames of `ips` (innermost first); 0 for no frames.
        `cheap`: when a frame needs a slow read, `unresolved` (the addresses that did
        are left for warm())."""
        if len(ips) == 0:  # not `not ips`: a numpy array has no truth value
            return 0
        pid = int(pid)
        addrs = tuple(int(ip) for ip in ips)
        with self._lock:
            found = self._stack_ids.get((pid, self._state(pid), addrs))
            if found is not None:
                return found
            answers = []
            missed = False
            self._cheap = cheap
            try:
                for ip in addrs:
                    try:
                        answers.append(self._frame(pid, ip))
                    except _Costly:
                        missed = True
                        self._miss(pid, ip)
            finally:
                self._cheap = False
            if missed:
                return unresolved
            frames = tuple(f for f, _ in answers)
            ident, new = self._stacks.intern(frames)
            if new:
                self._new_stacks.append((ident, frames))
            if all(kept for _, kept in answers):
                self._stack_ids.put((pid, self._state(pid), addrs), ident)
            return ident

    def stack(self, stack_id: int) -> tuple[Frame, ...]:  # frames innermost first
        with self._lock:
            return self._stacks.key(stack_id) or ()

    def consume_stacks(self) -> list[tuple[int, tuple[Frame, ...]]]:
        """Stacks interned since the last call (at most `max_pending`: older ones are
        dropped when nobody consumes), for storage."""
        with self._lock:
            out = list(self._new_stacks)
            self._new_stacks.clear()
            return out

    def register_jit(
        self, pid: int, start: int, end: int, path: str, build_id: str | None = None
    ) -> None:
        """Code in [start, end) of `pid` belongs to `path`. When `path` is an ELF file
        (a JIT'ed image written out) its symbols name the code, `start` being where the
        image's first PT_LOAD page sits; otherwise the region is one function, `path`."""
        pid, start, end = int(pid), int(start), int(end)
        with self._lock:
            self._jit_gen += 1
            regions = self._jit.get(pid)
            if regions is None:
                regions = JitRegions(self.max_jit_regions)
                self._jit.put(pid, regions)
            regions.add(start, end, path, build_id)

    def register_data_object(
        self, pid: int, address: int, name: str, type: str | None = None, size: int | None = None
    ) -> int:
        """Register [address, address+size) (just `address` without a size) as `name`;
        returns its id, the same id for the same registration."""
        size = None if size is None else int(size)
        with self._lock:
            return self._data.register((int(pid), int(address), name, type, size))

    def data_object_id(self, pid: int, addr: int) -> int:
        """The id of the registered object holding addr, 0 when none does."""
        with self._lock:
            return self._data.find(int(pid), int(addr))

    def data_object(self, object_id: int) -> DataObject | None:
        with self._lock:
            return self._data.get(object_id)

    def jit_regions(self, pid: int | None, limit: int) -> list[tuple[int, JitRegion]]:
        """(pid, region) of the first `limit` JIT regions (of one process, or all)."""
        with self._lock:
            pids = sorted(self._jit.snapshot()) if pid is None else [pid]
            held = [(p, self._jit.peek(p)) for p in pids]
            found = ((p, r) for p, rs in held if rs is not None for r in rs.regions())
            return list(islice(found, limit))

    def data_objects(self, pid: int | None, limit: int) -> list[DataObject]:
        """The first `limit` data objects registered (one process's, or all)."""
        with self._lock:
            return list(islice(self._data.objects(pid), limit))

    def consume_data_objects(self) -> list[DataObject]:
        """Data objects registered since the last call, for storage."""
        with self._lock:
            return self._data.consume()

    def forget(self, pid: int) -> None:
        """Drop everything known about pid (it exited or exec'd): its cached mappings
        and frames, JIT registrations and data objects. Ids already given stay valid."""
        with self._lock:
            self._jit_gen += 1  # its view goes too: answers for a new one are new
            self._views.pop(pid)
            self._jit.pop(pid)
            self._data.forget(pid)

    def sweep(self) -> int:
        """Check every cached process now; drop those gone past the grace period or
        replaced (exec, pid reuse). Returns how many were dropped (the symbols thread)."""
        with self._lock:
            return self._views.sweep()

    def cache_sizes(self) -> dict[str, int]:
        """Entries per cache, for tests and the agent's own metrics."""
        with self._lock:
            return {
                "processes": len(self._views),
                "binaries": len(self._binaries),
                "frames": len(self._frames),
                "functions": len(self._functions),
                "stacks": len(self._stacks),
                "jit_processes": len(self._jit),
                "data_objects": len(self._data),
            }

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
