"""Kernel addresses to `function+offset` through /proc/kallsyms: its text symbols,
sorted once, searched with bisect.

With kptr_restrict (or without root) the file lists every address as zero; the table
is then `hidden` and callers say "[kernel]" rather than guessing. The names stay in
the file's text, found by offsets, rather than as 100,000+ Python strings: the table
costs the file's size (5 MiB) plus 32 bytes a symbol. Reading it takes about 60 ms
(120,000 symbols, Linux 6.18).

kallsyms has no sizes: a symbol reaches up to the next one, except where the next
belongs to another owner (vmlinux, a module, BPF) or there is none. There the code
after it may be anything the table does not list (a BPF program or a module loaded
since, or a freed region: on 6.1 the last vmlinux symbol is in .exit.text, freed after
boot), so it ends at the end of the page after its start, as perf bounds it
(symbols__fixup_end). Without that bound a guest named BPF code `mpls_gso_exit`.

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
PAGE = 4096
Array = np.ndarray[Any, Any]


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


def _owners(buf: Array, name_at: Array, line_end: Array) -> Array:
    """Per line, a key of what follows the name's tab (`[module]`, `[bpf]`; vmlinux's
    lines have none): its length and its first and last 8 bytes, which tells kallsyms'
    owners apart (a collision needs two names of one length alike at both ends)."""
    tab = line_end.copy()  # no tab: an empty owner
    tabs = np.flatnonzero(buf == ord("\t"))
    if len(tabs):
        first = tabs[np.minimum(np.searchsorted(tabs, name_at), len(tabs) - 1)]
        tab = np.where((first >= name_at) & (first < line_end), first, line_end)
    length = (line_end - tab).astype(np.uint64)
    key = np.zeros((len(tab), 3), dtype=np.uint64)
    key[:, 0] = length
    named = np.flatnonzero(length)  # vmlinux's lines (most) keep zeros
    at, end = tab[named], line_end[named]
    head, tail = np.zeros(len(named), dtype=np.uint64), np.zeros(len(named), dtype=np.uint64)
    for k in range(8):
        head = (head << np.uint64(8)) | buf[np.minimum(at + k, end - 1)]
        tail = (tail << np.uint64(8)) | buf[np.maximum(end - 1 - k, at)]
    key[named, 1], key[named, 2] = head, tail
    return key


def _symbol_ends(starts: Array, owners: Array) -> Array:
    """Where each symbol (sorted `starts`, one owner key a row) ends at the latest: the
    next symbol's start, or where the next is another owner's or none, the end of the
    page after its own start (the module's doc)."""
    page = np.uint64(PAGE)
    bound = (starts + page + page - np.uint64(1)) // page * page
    ends: Array = bound.copy()
    if len(starts) > 1:
        same = (owners[1:] == owners[:-1]).all(axis=1)
        ends[:-1] = np.where(same, starts[1:], np.minimum(starts[1:], bound[:-1]))
    return ends


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
        self._ends: array[int] = array("Q")  # where each symbol's code ends at the latest
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
        self._ends = array("Q")
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
        values = values[order]
        self._addrs = u64_column(values)
        self._name_at = u64_column(name_at[order])
        self._name_end = u64_column(ends[order])
        self._ends = u64_column(_symbol_ends(values, _owners(buf, name_at, ends)[order]))

    def lookup(self, addr: int) -> tuple[str, int, str] | None:
        """(function, addr - its start, module or "" for vmlinux), None when unknown."""
        self._ensure()
        i = bisect_right(self._addrs, addr) - 1
        if i < 0:
            return None
        start = self._addrs[i]
        if addr >= self._ends[i]:
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
        i = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
        inside = (i >= 0) & (addrs < np.frombuffer(self._ends, dtype=np.uint64)[np.maximum(i, 0)])
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
