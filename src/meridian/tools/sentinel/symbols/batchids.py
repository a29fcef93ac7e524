"""Function ids per symbol: a batch's addresses to function ids with numpy, not with a
Python call per address.

The consumer resolves every distinct address of every batch (thousands a second on
a busy host). Per address, the symbolizer's answer is one of a table's symbols (a
kallsyms entry, an ELF function) or "[unknown]" in a binary: so the ids are kept
per symbol (an array per table, 0 until the symbol is first met), and a batch costs
a searchsorted over the table's sorted starts (kallsyms.find, elf.find) and a
gather. A symbol's (binary, function) is interned once, when first met; nothing
else is a Python call per address. The answers are those the symbolizer's
per-address path (`Symbolizer.function_id`) gives: the tests compare the two.

The ids are the interner's, so all of them are dropped when it evicts (ids may then
have moved), and a table's when it is read again (kallsyms' generation; an ELF
table read again is a new object, and its ids go with the old one). Not locked: the
Symbolizer calls it under its own lock.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

import numpy as np

from ..model.frames import KERNEL, UNKNOWN
from .elf import ElfSymbols
from .kallsyms import KernelSymbols, is_idle_function
from .symcache import Interner

__all__ = ["SymbolIds"]

Array = np.ndarray[Any, Any]


class SymbolIds:
    """Interned function ids per symbol of kallsyms and of each ELF table (per the
    binary path it is mapped under: the id keys on it), made as symbols are met.
    `idle`: the ids of kernel functions that are the CPU idling (kallsyms.idle)."""

    def __init__(self, functions: Interner[tuple[str, str]]) -> None:
        self._functions = functions
        self._evicted = functions.evicted
        self._kernel = np.zeros(0, dtype=np.uint64)  # per kallsyms symbol; 0: not made
        self._kernel_generation = -1
        # per table and binary path: an id per function, the last for "[unknown]"
        self._elf: WeakKeyDictionary[ElfSymbols, dict[str, Array]] = WeakKeyDictionary()
        self.idle: frozenset[int] = frozenset()

    def _check(self) -> None:
        """Drop every id once the interner has evicted (an id may have moved)."""
        if self._evicted != self._functions.evicted:
            self._evicted = self._functions.evicted
            self._kernel_generation = -1
            self._elf = WeakKeyDictionary()

    def kernel(self, table: KernelSymbols, addrs: Array) -> Array:
        """The function id of each kernel address (uint64); 0 where kallsyms has no
        symbol for it (the per-address path answers those)."""
        self._check()
        if self._kernel_generation != table.generation:
            self._kernel = np.zeros(len(table), dtype=np.uint64)
            self._kernel_generation = table.generation
        index = table.find(addrs)
        known = index >= 0
        ids = np.zeros(len(index), dtype=np.uint64)
        sym = index[known]
        idle: set[int] = set()
        for i in np.unique(sym[self._kernel[sym] == 0]).tolist():
            name, module = table.symbol(i)
            ident = self._intern(f"[{module}]" if module else KERNEL, name)
            self._kernel[i] = ident
            if is_idle_function(name):
                idle.add(ident)
        ids[known] = self._kernel[sym]
        idle.update(np.unique(ids[known & table.idle_text(addrs)]).tolist())
        if not idle <= self.idle:
            self.idle = self.idle | idle
        self._check()  # interned past the bound: these stand, as the path's answers do
        return ids

    def elf(self, binary: str, table: ElfSymbols, vaddrs: Array) -> Array:
        """The function id of each address in `table` (int64, as table.vaddrs gives
        them) of a file mapped as `binary`."""
        self._check()
        per_path = self._elf.setdefault(table, {})
        ids = per_path.get(binary)
        if ids is None:
            ids = per_path[binary] = np.zeros(len(table) + 1, dtype=np.uint64)
        index = table.find(vaddrs)
        index[index < 0] = len(table)  # "[unknown]" in the binary
        for i in np.unique(index[ids[index] == 0]).tolist():
            ids[i] = self._intern(binary, table.name(i) if i < len(table) else UNKNOWN)
        found: Array = ids[index]
        self._check()
        return found

    def unknown(self, binary: str) -> int:
        """The id of "[unknown]" in `binary`."""
        return self._intern(binary, UNKNOWN)

    def _intern(self, binary: str, function: str) -> int:
        return self._functions.intern((binary, function))[0]
