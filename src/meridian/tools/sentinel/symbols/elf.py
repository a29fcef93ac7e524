"""One ELF file's load segments and function symbols: what turns an offset inside a
mapped file into `function+offset`, and into `file:line` from its DWARF line table
(dwarflines.py).

pyelftools (the `sentinel` extra) reads the headers and sections; the symbol table
itself is decoded with numpy in one pass, because a Python object per symbol made
loading libpython or libLLVM cost seconds. Names are decoded only when a lookup
returns them. `vaddrs` and `find` answer `vaddr` and `lookup` for a whole array at
once (the symbolizer resolves a batch's addresses in a binary with them).
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ....errors import ExtraMissing
from .dwarflines import LineTable, decode_lines

__all__ = ["NOT_SIGNED", "ElfSymbols", "Segment", "debug_file", "require"]

STT_FUNC = 2
STT_GNU_IFUNC = 10
# Among aliases at one address the name shown: global before weak before local.
BIND_RANK = {1: 0, 2: 1, 0: 2}
PAGE = 4096
# vaddrs(): an offset whose address int64 would not hold exactly
NOT_SIGNED = -2
# A symbol of size 0 (assembly labels) covers up to the next symbol, at most this.
UNSIZED_SPAN = 4096
# DWARF line tables larger than this (uncompressed) are not decoded. What bounds it is
# what a table costs, no longer the symbolizer's lock (the background thread decodes
# outside it; the bound was 16 KiB for that): dwarflines.py decodes some 4 MB/s and
# keeps about 2.6 bytes of rows per byte of table, with some 9 bytes per byte at the
# peak of decoding (libc6-dbg's libc table, 1.3 MB: 0.34 s, 3.3 MB kept, 11 MB peak).
# At 16 MiB that is some 5 s of one background core, 45 MB kept and 150 MB at the
# peak for the largest table read: libc's, libstdc++'s, an interpreter's or most
# programs' tables are read, libLLVM's or a browser's (hundreds of MiB) are not.
MAX_LINE_BYTES = 16 << 20


def require() -> None:
    """Raise ExtraMissing when pyelftools is not installed."""
    try:
        import elftools.elf.elffile  # noqa: F401
    except ImportError:
        raise ExtraMissing("symbolizing user addresses (meridian sentinel)", "sentinel") from None


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD program header: file bytes [offset, offset+filesz) load at vaddr."""

    offset: int
    vaddr: int
    filesz: int
    memsz: int


def _sym_dtype(elfclass: int, little: bool) -> np.dtype[Any]:
    e = "<" if little else ">"
    if elfclass == 64:
        fields = [
            ("name", e + "u4"),
            ("info", "u1"),
            ("other", "u1"),
            ("shndx", e + "u2"),
            ("value", e + "u8"),
            ("size", e + "u8"),
        ]
    else:
        fields = [
            ("name", e + "u4"),
            ("value", e + "u4"),
            ("size", e + "u4"),
            ("info", "u1"),
            ("other", "u1"),
            ("shndx", e + "u2"),
        ]
    return np.dtype(fields)


def u64_column(values: np.ndarray[Any, Any]) -> array[int]:
    """A numpy column as array('Q'): bisect over it yields Python ints, not numpy scalars."""
    out = array("Q")
    out.frombytes(np.ascontiguousarray(values, dtype=np.uint64).tobytes())
    return out


class ElfSymbols:
    """Function symbols (.symtab, else .dynsym) and PT_LOAD segments of one file.

    `load` never raises for a file that is missing, unreadable or not ELF: it returns
    an empty table, so a bad mapping costs one attempt and then answers "unknown".
    When a separate debug file is installed under `/usr/lib/debug/.build-id/` (the
    distributions' -dbgsym packages) its .symtab and DWARF are used instead.
    `line()` answers from DWARF .debug_line when the file (or its debug file) has one
    of at most MAX_LINE_BYTES, decoded once on first use (`decode_lines()`, which
    another thread may run ahead, outside the caller's locks); otherwise ("", 0).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.ok = False  # a readable ELF file
        self.pie = False  # ET_DYN: executables built -pie and shared libraries
        self.build_id: str | None = None
        self.segments: tuple[Segment, ...] = ()
        self._starts: array[int] = array("Q")
        self._ends: array[int] = array("Q")
        self._name_at: array[int] = array("Q")
        self._name_end: array[int] = array("Q")
        self._strtab = b""
        self._line_path: str | None = None  # the file whose DWARF lines to decode
        self._lines: LineTable | None = None
        self._lines_lock = threading.Lock()  # one decoding at a time

    def __len__(self) -> int:
        return len(self._starts)

    @classmethod
    def load(
        cls,
        path: str,
        debug_root: str | None = "/usr/lib/debug",
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> ElfSymbols:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile

        table = cls(path)
        try:
            with open(path, "rb") as f:
                elf = ELFFile(f)
                table.pie = elf["e_type"] == "ET_DYN"
                table.segments = tuple(
                    Segment(s["p_offset"], s["p_vaddr"], s["p_filesz"], s["p_memsz"])
                    for s in elf.iter_segments()
                    if s["p_type"] == "PT_LOAD"
                )
                table.build_id = _build_id(elf)
                table.ok = True
                if not table._read_symbols(elf, ".symtab"):
                    table._read_symbols(elf, ".dynsym")
                if _line_bytes(elf) <= max_line_bytes:
                    table._line_path = path
            debug = debug_file(table.build_id, debug_root)
            if debug is not None:
                with open(debug, "rb") as f:
                    elf = ELFFile(f)
                    table._read_symbols(elf, ".symtab")
                    if _line_bytes(elf) <= max_line_bytes:
                        table._line_path = debug
        except (OSError, ELFError, ValueError, KeyError, IndexError, TypeError, AssertionError):
            pass  # pyelftools reports corrupt files with any of these
        return table

    def _read_symbols(self, elf: Any, section_name: str) -> bool:
        """Decode one symbol table; False when it has no defined function."""
        section = elf.get_section_by_name(section_name)
        if section is None or section["sh_type"] == "SHT_NOBITS":
            return False
        dtype = _sym_dtype(elf.elfclass, elf.little_endian)
        data = section.data()
        syms = np.frombuffer(data, dtype=dtype, count=len(data) // dtype.itemsize)
        kind = syms["info"] & 0xF
        keep = ((kind == STT_FUNC) | (kind == STT_GNU_IFUNC)) & (syms["shndx"] != 0)
        syms = syms[keep & (syms["value"] != 0)]
        if len(syms) == 0:
            return False
        strtab = elf.get_section(section["sh_link"]).data()
        raw = np.frombuffer(strtab, dtype=np.uint8)
        zeros = np.flatnonzero(raw == 0)
        name_at = syms["name"].astype(np.int64)
        ok = name_at < len(raw)
        syms, name_at = syms[ok], name_at[ok]
        where = np.searchsorted(zeros, name_at)
        name_end = np.where(where < len(zeros), zeros[np.minimum(where, len(zeros) - 1)], len(raw))
        bind = syms["info"] >> 4
        rank = np.select([bind == 1, bind == 2], [0, 1], 2)
        under = (raw[name_at] == ord("_")).astype(np.int64)
        under += under * (raw[np.minimum(name_at + 1, len(raw) - 1)] == ord("_"))
        values = syms["value"].astype(np.uint64)
        order = np.lexsort((name_end - name_at, under, rank, values))
        values, sizes = values[order], syms["size"].astype(np.uint64)[order]
        first = np.ones(len(values), dtype=bool)
        first[1:] = values[1:] != values[:-1]
        values, sizes = values[first], sizes[first]
        name_at, name_end = name_at[order][first], name_end[order][first]
        nxt = np.append(values[1:], values[-1] + np.uint64(UNSIZED_SPAN))
        cap = np.minimum(nxt, values + np.uint64(UNSIZED_SPAN))
        ends = np.where(sizes > 0, values + sizes, cap)
        self._starts, self._ends = u64_column(values), u64_column(ends)
        self._name_at, self._name_end = u64_column(name_at), u64_column(name_end)
        self._strtab = strtab
        return True

    def vaddr(self, file_offset: int) -> int | None:
        """The virtual address the file byte at `file_offset` loads at, or None.

        That is how a runtime address is located in the file: the mapping's
        `ip - start + pgoff` is a file offset, and the PT_LOAD holding that offset
        says its link-time address. It is the same arithmetic for PIE and non-PIE
        executables and shared libraries (for non-PIE ones it gives back the ip).
        """
        for s in self.segments:
            if s.offset <= file_offset < s.offset + max(s.filesz, 1):
                return file_offset - s.offset + s.vaddr
        # A page mapped for a segment that starts mid-page.
        for s in self.segments:
            lo = s.offset & ~(PAGE - 1)
            if lo <= file_offset < s.offset + s.filesz:
                return file_offset - s.offset + s.vaddr
        return None

    @property
    def base(self) -> int:
        """The lowest PT_LOAD address, page aligned: where an image's first byte sits."""
        if not self.segments:
            return 0
        return min(s.vaddr - (s.offset & (PAGE - 1)) for s in self.segments) & ~(PAGE - 1)

    def vaddrs(self, file_offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """vaddr() of many file offsets (uint64) at once, as int64: -1 where no symbol
        can hold the address (vaddr() says None, or a negative address), NOT_SIGNED
        where int64 would not be exact (past 2**62: ask vaddr() itself). Segments are
        tried in vaddr()'s order: the first that holds an offset wins."""
        off = np.asarray(file_offsets, dtype=np.uint64)
        out = np.full(len(off), -1, dtype=np.int64)
        if any(max(s.offset, s.vaddr) + s.filesz >= 1 << 62 for s in self.segments):
            out[:] = NOT_SIGNED
            return out
        small = off < np.uint64(1 << 62)
        signed = np.where(small, off, 0).astype(np.int64)
        if len(off) and small.all():
            one = self._segment_of(int(signed.min()), int(signed.max()))
            if one is not None:  # the usual case (a mapping is one segment): one step
                out = signed - one.offset + one.vaddr
                out[out < 0] = -1
                return out
        todo = small.copy()
        for mid_page in (False, True):
            for s in self.segments:
                lo = s.offset & ~(PAGE - 1) if mid_page else s.offset
                hi = s.offset + (s.filesz if mid_page else max(s.filesz, 1))
                hit = todo & (signed >= lo) & (signed < hi)
                out[hit] = signed[hit] - s.offset + s.vaddr
                todo &= ~hit
        out[out < 0] = -1
        out[~small] = NOT_SIGNED
        return out

    def _segment_of(self, lo: int, hi: int) -> Segment | None:
        """The segment vaddr() takes for every offset in [lo, hi], if it is one: the
        first to hold lo holds hi too, and no segment before it holds any of them."""
        for s in self.segments:
            if s.offset <= hi and lo < s.offset + max(s.filesz, 1):
                return s if s.offset <= lo and hi < s.offset + max(s.filesz, 1) else None
        return None

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        """(function name, vaddr - its start), or None outside every function."""
        i = bisect_right(self._starts, vaddr) - 1
        if i < 0 or vaddr >= self._ends[i]:
            return None
        return self.name(i), vaddr - self._starts[i]

    def find(self, vaddrs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """lookup() of many addresses (int64 >= 0, as vaddrs() gives them; below 0
        none) at once: the index of each one's function (for `name`), -1 where
        lookup() says None."""
        vaddrs = np.asarray(vaddrs, dtype=np.int64)
        out = np.full(len(vaddrs), -1, dtype=np.int64)
        if not len(self._starts):
            return out
        ok = vaddrs >= 0
        at = vaddrs[ok].astype(np.uint64)
        starts = np.frombuffer(self._starts, dtype=np.uint64)
        ends = np.frombuffer(self._ends, dtype=np.uint64)
        i = np.searchsorted(starts, at, side="right").astype(np.int64) - 1
        out[ok] = np.where((i >= 0) & (at < ends[np.maximum(i, 0)]), i, -1)
        return out

    def name(self, i: int) -> str:
        """The name of function index i (of find)."""
        return self._strtab[self._name_at[i] : self._name_end[i]].decode("utf-8", "replace")

    @property
    def lines_pending(self) -> bool:
        """The next line() decodes the line table first (seconds for a big binary)."""
        return self._lines is None and self._line_path is not None

    def decode_lines(self) -> None:
        """Decode the line table now if it is pending (seconds for a big one); a
        thread that comes meanwhile waits for this decoding rather than repeating it."""
        if not self.lines_pending:
            return
        with self._lines_lock:
            if self._lines is None and self._line_path is not None:
                self._lines = decode_lines(self._line_path)

    def line(self, vaddr: int) -> tuple[str, int]:
        """(source file, line) of vaddr from DWARF, ("", 0) when not known."""
        if self._line_path is None:
            return "", 0
        self.decode_lines()
        assert self._lines is not None
        return self._lines.find(vaddr)


def _build_id(elf: Any) -> str | None:
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_NOTE":
            continue
        for note in section.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return str(note["n_desc"])
    return None


def debug_file(build_id: str | None, debug_root: str | None) -> str | None:
    """The separate debug file of `build_id` (lower-case hex) under `debug_root`, as
    the distributions' -dbgsym packages install it: .build-id/xx/rest.debug."""
    if not build_id or not debug_root or len(build_id) < 3:
        return None
    path = Path(debug_root, ".build-id", build_id[:2], build_id[2:] + ".debug")
    return str(path) if path.is_file() else None


def _line_bytes(elf: Any) -> int:
    """Uncompressed size of .debug_line; a huge number when there is none."""
    section = elf.get_section_by_name(".debug_line")
    return 1 << 62 if section is None else int(section.data_size)
