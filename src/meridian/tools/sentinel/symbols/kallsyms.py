"""Kernel addresses to `function+offset` through /proc/kallsyms: its text symbols,
sorted once, searched with bisect.

With kptr_restrict (or without root) the file lists every address as zero; the table
is then `hidden` and callers say "[kernel]" rather than guessing. The names stay in
the file's text, found by offsets, rather than as 100,000+ Python strings: the table
costs the file's size (5 MiB) plus 24 bytes a symbol. Reading it takes about 50 ms
(120,000 symbols, Linux 6.18).

`find(addrs)` answers lookup() for a whole array of addresses at once (one
searchsorted over the sorted starts): the symbolizer resolves a batch's kernel
addresses with it, and asks `symbol(i)` only once per symbol.

`idle(addr)`: the address is the CPU idling, not working. The kernel's own set is its
`.cpuidle.text` section (`__cpuidle` functions, between `__cpuidle_text_start` and
`__cpuidle_text_end`: default_idle, arch_cpu_idle, mwait_idle, intel_idle*,
acpi_idle_*, acpi_safe_halt, cpu_idle_poll, poll_idle, haltpoll's default_enter_idle,
...); to it come IDLE_FUNCTIONS by name, which some kernels build elsewhere
(pv_native_safe_halt, a paravirt op, is in .noinstr.text; other architectures have
no such section), and the idle loop around them (do_idle, cpuidle_idle_call): the
instruction sampled there is the idle task's own code. A sample in them costs no
packet anything, whichever packet the CPU handled before it halted.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np

from ....proc import kallsyms_address
from ..model.frames import KERNEL_START
from .elf import u64_column

__all__ = ["IDLE_FUNCTIONS", "KERNEL_START", "KernelSymbols", "is_idle_function", "is_kernel"]

TEXT_TYPES = b"tTwW"


def _hex_table() -> np.ndarray[Any, Any]:
    """ASCII byte -> hex digit value, 0xFF for anything else."""
    table = np.full(256, 0xFF, dtype=np.uint8)
    for i, c in enumerate(b"0123456789abcdef"):
        table[c] = table[c - 32 if c >= ord("a") else c] = i
    return table


HEX = _hex_table()
# kallsyms has no sizes: an address belongs to the symbol before it when the next
# symbol starts later; past the last symbol, at most this far.
LAST_SPAN = 1 << 16


# Names (without a compiler suffix such as .isra.0) of the kernel's idle code, besides
# the .cpuidle.text section: the halting instructions' wrappers (x86 paravirt, Xen,
# TDX, Hyper-V), the cpuidle drivers' entries, and the idle loop itself.
IDLE_FUNCTIONS = (
    "*_safe_halt",
    "native_halt",
    "default_idle",
    "default_idle_call",
    "arch_cpu_idle",
    "cpu_idle_poll",
    "poll_idle",
    "intel_idle*",
    "acpi_idle_enter*",
    "acpi_idle_do_entry",
    "acpi_processor_ffh_cstate_enter",
    "mwait_idle*",
    "default_enter_idle",  # cpuidle-haltpoll
    "cpu_do_idle",  # arm64
    "do_idle",
    "cpuidle_idle_call",
)


def is_kernel(addr: int) -> bool:
    return addr >= KERNEL_START


def is_idle_function(name: str) -> bool:
    """A kernel function of IDLE_FUNCTIONS (by name, a suffix .isra.0 and the like
    ignored)."""
    base = name.split(".", 1)[0]
    return any(fnmatchcase(base, pattern) for pattern in IDLE_FUNCTIONS)


class KernelSymbols:
    """The kernel's text symbols; read lazily on the first lookup, again by `reload()`."""

    def __init__(self, path: str | Path = "/proc/kallsyms") -> None:
        self.path = Path(path)
        self.loaded = False
        self.hidden = False  # the file exists but shows no addresses
        self.generation = 0  # tables parsed so far: what is derived from one is stale after
        self._addrs: array[int] = array("Q")
        self._name_at: array[int] = array("Q")
        self._name_end: array[int] = array("Q")
        self._spans: np.ndarray[Any, Any] | None = None  # for find(): made on first use
        self._blob = b""
        self._idle_text = (0, 0)  # [__cpuidle_text_start, __cpuidle_text_end)

    def __len__(self) -> int:
        self._ensure()
        return len(self._addrs)

    def _ensure(self) -> None:
        if not self.loaded:
            self.reload()

    def reload(self) -> None:
        """Read the file again (modules and BPF programs come and go)."""
        self.loaded = True
        try:
            data = self.path.read_bytes()
        except OSError:
            data = b""
        self.parse(data)

    def parse(self, data: bytes) -> None:
        """Take the symbols of a kallsyms text, `ADDR TYPE NAME[\t[MODULE]]` per line.

        Parsed with numpy over the whole file (every address has the same width):
        a Python loop over 120,000 lines cost 40 MiB of peak memory. The text itself
        is kept as the name store, which is smaller than the strings would be."""
        self.loaded = True
        self.generation += 1
        self._addrs, self._name_at, self._name_end = array("Q"), array("Q"), array("Q")
        self._spans = None
        self._blob = data
        width = data.find(b" ")
        self.hidden = False
        self._idle_text = (0, 0)
        if width <= 0 or width > 16:
            return
        lo, hi = (
            kallsyms_address(data, b"__cpuidle_text_start"),
            kallsyms_address(data, b"__cpuidle_text_end"),
        )
        if lo and hi:
            self._idle_text = (lo, hi)
        buf = np.frombuffer(data, dtype=np.uint8)
        ends = np.flatnonzero(buf == ord("\n"))
        if len(data) and data[-1:] != b"\n":
            ends = np.append(ends, len(data))
        starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
        ok = ends - starts > width + 3
        starts, ends = starts[ok], ends[ok]
        ok = (buf[starts + width] == ord(" ")) & (buf[starts + width + 2] == ord(" "))
        ok &= np.isin(buf[starts + width + 1], np.frombuffer(TEXT_TYPES, dtype=np.uint8))
        values = np.zeros(len(starts), dtype=np.uint64)
        for k in range(width):  # a column at a time: no (lines x width) temporaries
            digit = HEX[buf[starts + k]]
            ok &= digit != 0xFF
            values = (values << np.uint64(4)) | digit.astype(np.uint64)
        starts, ends, values = starts[ok], ends[ok], values[ok]
        nonzero = values != 0
        self.hidden = bool(len(values)) and not nonzero.any()
        values, starts, ends = values[nonzero], starts[nonzero], ends[nonzero]
        name_at = starts + width + 3
        # Aliases share an address: keep the first without a leading underscore.
        under = (buf[name_at] == ord("_")).astype(np.int8)
        order = np.lexsort((np.arange(len(values)), under, values))
        first = np.ones(len(order), dtype=bool)
        first[1:] = values[order][1:] != values[order][:-1]
        order = order[first]
        self._addrs = u64_column(values[order])
        self._name_at = u64_column(name_at[order])
        self._name_end = u64_column(ends[order])

    def lookup(self, addr: int) -> tuple[str, int, str] | None:
        """(function, addr - its start, module or "" for vmlinux), None when unknown."""
        self._ensure()
        i = bisect_right(self._addrs, addr) - 1
        if i < 0:
            return None
        start = self._addrs[i]
        # Addresses are distinct (aliases merged): the next symbol bounds this one.
        end = self._addrs[i + 1] if i + 1 < len(self._addrs) else start + LAST_SPAN
        if addr >= end:
            return None
        name, module = self.symbol(i)
        return name, addr - start, module

    def find(self, addrs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """lookup() of many addresses (uint64) at once: the index of each one's symbol
        (for `symbol`), -1 where lookup() says None."""
        self._ensure()
        addrs = np.asarray(addrs, dtype=np.uint64)
        if not len(self._addrs):
            return np.full(len(addrs), -1, dtype=np.int64)
        starts = np.frombuffer(self._addrs, dtype=np.uint64)
        if self._spans is None:  # each symbol up to the next, as lookup() bounds it
            self._spans = np.append(np.diff(starts), np.uint64(LAST_SPAN))
        i = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
        at = np.maximum(i, 0)
        # addr - start cannot wrap (addr >= start where i >= 0), addr + span could
        inside = (i >= 0) & (addrs - starts[at] < self._spans[at])
        return np.where(inside, i, -1)

    def symbol(self, i: int) -> tuple[str, str]:
        """(function, module or "") of symbol index i (of find)."""
        raw = self._blob[self._name_at[i] : self._name_end[i]]
        name, _, module = raw.decode("utf-8", "replace").partition("\t")
        return name.strip(), module.strip().strip("[]")

    def idle(self, addr: int) -> bool:
        """The address is in the kernel's idle code (see the module's doc)."""
        lo, hi = self._idle_text
        if lo <= addr < hi:
            return True
        hit = self.lookup(addr)
        return hit is not None and is_idle_function(hit[0])

    def idle_text(self, addrs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Which of `addrs` (uint64) lie in the .cpuidle.text section: idle() of many
        addresses is this or is_idle_function of their symbol's name."""
        lo, hi = self._idle_text
        addrs = np.asarray(addrs, dtype=np.uint64)
        inside: np.ndarray[Any, Any] = (addrs >= np.uint64(lo)) & (addrs < np.uint64(hi))
        return inside
