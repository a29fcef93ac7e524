"""Sample addresses to frames (binary, function, file, line), interned to the small ids
the aggregator keys on: function ids, call-stack ids and data-object ids.

Frames come from lookup.py (kallsyms, registered JIT regions, the processes' mappings
and ELF symbols, perf maps; "[unknown]" rather than an exception). Ids are interned
per (binary, function) and per frames, in bounded interners (symcache.py), with the
answers for (pid, ip) and (pid, ips) cached per state. `forget(pid)` drops a process.
`function_ids` answers what the loaded tables hold for a whole batch at once (kallsyms
and the mapped files' ELF symbols, with numpy: batchids.py), and only the rest
address by address.

Cheap mode (`function_ids`/`stack_id` with cheap=True) answers only from what is
loaded: the agent's consumer must keep up. What needs a slow read gets a provisional
id (provisional.py) that `warm()` (a background thread) resolves once it has read it
(a line table, which can take seconds, decoded outside the lock);
`function_key`, `stack` and `canonical_function`/`canonical_stack` answer for it from
then on. Past the bound of pending provisional ids, the caller's `unresolved`.

Kernel functions that are the CPU idling (kallsyms.py: the idle loop, the halting
instructions) are noted as their ids are made: `idle_function_ids()`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from ..model.dataobjects import DataObject, DataObjects
from ..model.frames import UNKNOWN, Frame
from ..model.rollup import is_provisional
from . import elf
from .batchids import SymbolIds
from .kallsyms import KERNEL_START, is_kernel
from .lookup import AddressLookup, Costly
from .provisional import Provisional
from .symcache import Interner, Lru

__all__ = ["DataObject", "Frame", "Symbolizer"]

Array = np.ndarray[Any, Any]


class Symbolizer(AddressLookup):
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
        max_provisional: int = 1 << 14,
        recheck_s: float = 1.0,
        grace_s: float = 10.0,
        kernel_reload_s: float = 60.0,
        debug_root: str | None = "/usr/lib/debug",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        elf.require()
        super().__init__(
            proc_root,
            kallsyms,
            perf_map_dir,
            max_processes,
            max_binaries,
            max_frames,
            max_jit_regions,
            recheck_s,
            grace_s,
            kernel_reload_s,
            debug_root,
            clock,
        )
        self._functions: Interner[tuple[str, str]] = Interner(max_functions)
        self._stacks: Interner[tuple[Frame, ...]] = Interner(max_stacks)
        # Ids given for (pid, state, ip) and (pid, state, ips), state naming all an
        # answer came from (view, JIT and kernel registrations, interners): asked again,
        # a dict lookup instead of frames. Only answers stable within a state are kept.
        # (owner, state) -> {ip: function id}: a dict lookup per address; all of them
        # dropped at once past max_frames answers (tables of old states among them)
        self._function_ids: dict[tuple[int, tuple[int, ...]], dict[int, int]] = {}
        self._function_ids_kept = 0
        self._max_function_ids = max_frames
        # ids per symbol of the loaded tables: a batch's addresses at once
        self._symbol_ids = SymbolIds(self._functions)
        self._stack_ids: Lru[tuple[int, tuple[int, ...], tuple[int, ...]], int] = Lru(
            max(1, max_frames // 8)
        )
        self._new_stacks: deque[tuple[int, tuple[Frame, ...]]] = deque(maxlen=max_pending)
        self._data = DataObjects(max_data_objects, max_pending)
        # cheap mode (function_ids/stack_id with cheap=True): answers from what is
        # loaded already; the addresses that needed more wait here for warm()
        self._misses: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.max_misses = max_pending
        self.cheap_misses = 0  # addresses answered "unresolved" in cheap mode
        self.missed = threading.Event()  # set when an address starts waiting for warm()
        # what cheap answers keyed provisionally, until warm() has read them
        self._pfunctions: Provisional[tuple[int, int]] = Provisional(max_provisional, max_frames)
        self._pstacks: Provisional[tuple[int, tuple[int, ...]]] = Provisional(
            max(1, max_provisional // 4), max_frames
        )
        self._idle: frozenset[int] = frozenset()  # ids of the kernel's idle functions

    # -- ids ----------------------------------------------------------------------

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
            if owner == -1 and ident not in self._idle and self._kernel.idle(ip):
                self._idle = self._idle | {ident}
            if kept:  # under the state after the answer (a view read again, say)
                self._keep_function(owner, ip, ident)
            return ident

    def _keep_function(self, owner: int, ip: int, ident: int) -> None:
        if self._function_ids_kept >= self._max_function_ids:
            self._function_ids.clear()
            self._function_ids_kept = 0
        self._function_table(owner)[ip] = ident
        self._function_ids_kept += 1

    def _function_table(self, owner: int) -> dict[int, int]:
        key = (owner, self._state(owner))
        table = self._function_ids.get(key)
        if table is None:
            table = self._function_ids[key] = {}
        return table

    def function_ids(
        self,
        pids: Sequence[int] | Array,
        ips: Sequence[int] | Array,
        cheap: bool = False,
        unresolved: int = 0,
    ) -> list[int]:
        """function_id of each (pid, ip), under one lock and one check of each process:
        what the loaded tables answer at once (`_batch`), the rest address by address.
        `cheap`: an address whose answer needs a slow read (a binary's symbols, say)
        is answered with a provisional id (the same until warm() resolves it; past
        `max_provisional` waiting, `unresolved`) and left for warm()."""
        pid_col = np.asarray(pids, dtype=np.int64)
        ip_col = np.asarray(ips, dtype=np.uint64)
        with self._lock:
            out = self._batch(pid_col, ip_col)
            rest = np.flatnonzero(out == 0)
            if len(rest):
                got = self._each(pid_col[rest].tolist(), ip_col[rest].tolist(), cheap, unresolved)
                out[rest] = np.array(got, dtype=np.uint64)
        ids: list[int] = out.tolist()
        return ids

    def _batch(self, pids: Array, ips: Array) -> Array:
        """The function id of each address the loaded tables answer, 0 for the rest:
        kallsyms', and the symbols of the files mapped by each process. Under the lock."""
        out, ids = np.zeros(len(ips), dtype=np.uint64), self._symbol_ids
        kernel = ips >= np.uint64(KERNEL_START)
        at = np.flatnonzero(kernel)
        if len(at) and self._kernel.loaded:
            out[at] = ids.kernel(self._kernel, ips[at])
            if not ids.idle <= self._idle:
                self._idle = self._idle | ids.idle
        at = np.flatnonzero(~kernel)
        order = at[np.argsort(pids[at], kind="stable")]  # one process after the other
        for one in np.split(order, np.flatnonzero(np.diff(pids[order])) + 1):
            found = self._user_binaries(int(pids[one[0]]), ips[one]) if len(one) else []
            for where, binary, table in found:
                out[one[where]] = ids.unknown(binary) if table is None else ids.elf(binary, *table)
        return out

    def _each(self, pids: list[int], ips: list[int], cheap: bool, unresolved: int) -> list[int]:
        """function_ids address by address (with the kept answers per state). Under
        the lock."""
        out: list[int] = []
        tables: dict[int, dict[int, int]] = {}
        for pid, ip in zip(pids, ips, strict=True):
            owner = -1 if ip >= KERNEL_START else pid
            table = tables.get(owner)
            if table is None:
                table = tables[owner] = self._function_table(owner)
            found = table.get(ip)
            if found is None and cheap and (pid, ip) in self._misses:
                self.cheap_misses += 1  # still waiting for warm()
                out.append(self._provisional(pid, ip, unresolved))
                continue
            if found is None and cheap:
                found = self._cheap_function((pid, ip))
                if found is None:  # nothing read: the table stands
                    out.append(self._provisional(pid, ip, unresolved))
                    continue
                tables.pop(owner, None)
            elif found is None:
                found = self.function_id(pid, ip)
                tables.pop(owner, None)  # the view may have been read again
            out.append(found)
        return out

    def _cheap_function(self, key: tuple[int, int], count: bool = True) -> int | None:
        """function_id in cheap mode; None (the address noted for warm()) when it
        needs a slow read. Under the lock."""
        self._cheap = True
        try:
            return self.function_id(*key)
        except Costly:
            self._miss(*key, count)
            return None
        finally:
            self._cheap = False

    def _provisional(self, pid: int, ip: int, unresolved: int) -> int:
        found = self._pfunctions.id_for((pid, ip))
        return unresolved if found is None else found

    def _miss(self, pid: int, ip: int, count: bool = True) -> None:
        self.cheap_misses += count
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
        seconds (a background thread's job), then the provisional ids they held back
        (resolved when their answers are loaded now). Returns how many reads and
        provisional ids are still waiting."""
        end = time.perf_counter() + budget_s
        while time.perf_counter() < end:
            with self._lock:
                if not self._misses:
                    break
                key, _ = self._misses.popitem(last=False)
                lines = self._read(key)
                self._settle_read(key)  # a function id needs no lines: resolved now
                if lines is None:
                    continue
            lines.decode_lines()  # outside the lock: the consumer goes on meanwhile
            with self._lock:
                self._frame(*key)
        else:  # the budget is spent: the rest waits for the next call
            return self.waiting()
        self._settle(end)
        with self._lock:
            if not self._misses:
                self.missed.clear()
        return self.waiting()

    def _read(self, key: tuple[int, int]) -> elf.ElfSymbols | None:
        """warm()'s slow reads for (pid, ip), under the lock, but a line table: the
        table whose lines are still to decode (None: nothing left to decode)."""
        self._lines_later = True
        try:
            self._frame(*key)
        except Costly as exc:
            return exc.lines
        finally:
            self._lines_later = False
        return None

    def _settle_read(self, key: tuple[int, int]) -> None:
        """The provisional id waiting for (pid, ip), resolved now that it is read (while
        its answer is fresh). Under the lock."""
        ident = self._pfunctions.pending_id(key)
        if ident is not None:
            self._settle_function(ident, key)

    def waiting(self) -> int:
        """Addresses waiting for a read, and provisional ids for their resolution."""
        with self._lock:
            return len(self._misses) + len(self._pfunctions) + len(self._pstacks)

    def _settle(self, end: float) -> None:
        """Try the pending provisional ids, oldest first, until `end` (perf_counter):
        those whose answers need no read now are resolved (those that still do are
        noted for warm() again)."""
        with self._lock:
            functions, stacks = self._pfunctions.pending(), self._pstacks.pending()
        for ident, key in functions:
            if time.perf_counter() >= end:
                return
            with self._lock:
                if self._pfunctions.pending_id(key) == ident:  # not resolved meanwhile
                    self._settle_function(ident, key)
        for sid, skey in stacks:
            if time.perf_counter() >= end:
                return
            with self._lock:
                if self._pstacks.pending_id(skey) != sid:
                    continue
                found = self._stack_id(*skey, cheap=True, count=False)
                if found is None:
                    self._pstacks.later(sid)
                    continue
                self._pstacks.resolve(sid, found)
                self._new_stacks.append((sid, self._stacks.key(found) or ()))  # for storage

    def _settle_function(self, ident: int, key: tuple[int, int]) -> None:
        found = self._cheap_function(key, count=False)
        if found is None:
            self._pfunctions.later(ident)
        else:
            self._pfunctions.resolve(ident, found)

    def canonical_function(self, function_id: int) -> int | None:
        """The interned id a provisional function id was resolved to (None while it
        waits for a read); any other id itself (no lock: a window ranks thousands)."""
        if not is_provisional(function_id):
            return function_id
        with self._lock:
            return self._pfunctions.canonical(function_id)

    def canonical_stack(self, stack_id: int) -> int | None:
        """canonical_function for stack ids."""
        if not is_provisional(stack_id):
            return stack_id
        with self._lock:
            return self._pstacks.canonical(stack_id)

    def idle_function_ids(self) -> frozenset[int]:
        """The ids of the kernel's idle functions among those made so far."""
        return self._idle

    def function_key(self, function_id: int) -> tuple[str, str] | None:
        """(binary, symbol) of a function id (None: not interned, or provisional and
        not resolved yet), for storage."""
        with self._lock:
            found = self._pfunctions.canonical(function_id)
            return None if found is None else self._functions.key(found)

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
        `cheap`: when a frame needs a slow read, a provisional id as function_ids
        gives (or `unresolved`); the addresses that did are left for warm()."""
        if len(ips) == 0:  # not `not ips`: a numpy array has no truth value
            return 0
        pid = int(pid)
        addrs = tuple(int(ip) for ip in ips)
        with self._lock:
            found = self._stack_id(pid, addrs, cheap)
            if found is not None:
                return found
            found = self._pstacks.id_for((pid, addrs))
            return unresolved if found is None else found

    def _stack_id(
        self, pid: int, addrs: tuple[int, ...], cheap: bool, count: bool = True
    ) -> int | None:
        """stack_id, None when a frame needs a slow read (noted for warm()). Under
        the lock."""
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
                except Costly:
                    missed = True
                    self._miss(pid, ip, count)
        finally:
            self._cheap = False
        if missed:
            return None
        frames = tuple(f for f, _ in answers)
        ident, new = self._stacks.intern(frames)
        if new:
            self._new_stacks.append((ident, frames))
        if all(kept for _, kept in answers):
            self._stack_ids.put((pid, self._state(pid), addrs), ident)
        return ident

    def stack(self, stack_id: int) -> tuple[Frame, ...]:
        """The frames of a stack id (a provisional one's once resolved), innermost
        first."""
        with self._lock:
            found = self._pstacks.canonical(stack_id)
            return (self._stacks.key(found) or ()) if found else ()

    def consume_stacks(self) -> list[tuple[int, tuple[Frame, ...]]]:
        """Stacks interned since the last call (at most `max_pending`: older ones are
        dropped when nobody consumes), for storage."""
        with self._lock:
            out = list(self._new_stacks)
            self._new_stacks.clear()
            return out

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
