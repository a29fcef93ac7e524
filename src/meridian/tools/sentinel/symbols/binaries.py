"""The symbol tables of the binaries samples fall in, and the frames they name.

A table is cached by its file's identity (dev, inode, size, mtime), not by path: a
library mapped by a thousand processes is read once, a file replaced under the same
path is read again, and a container's file opens through the process's root (else by
its path; a deleted one through map_files). A JIT image written out as an ELF file
is keyed by its build id when registered with one (every registration of the image
shares its table), else by its registration; with a build id, the image is the one
that has it (`of_jit`). Reading a table or decoding its line table is
what costs (seconds for a big binary): `costly` is called before each (with the table
before decoding its lines), and the Symbolizer's raises in cheap mode. Not locked: the
Symbolizer calls it under its own lock."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..model.frames import UNKNOWN, Frame
from .elf import ElfSymbols, debug_file
from .perfmap import JitRegion
from .procview import Mapping
from .symcache import Lru

__all__ = ["Binaries"]


class Binaries:
    """The most recently used `max_binaries` symbol tables."""

    def __init__(
        self,
        proc_root: Path,
        max_binaries: int,
        debug_root: str | None,
        costly: Callable[[ElfSymbols | None], None],
    ) -> None:
        self.proc_root = proc_root
        self.debug_root = debug_root
        self.costly = costly
        # Keyed by the file's (dev, inode, size, mtime), or ("jit", pid, start, seq).
        self._tables: Lru[tuple[object, ...], ElfSymbols] = Lru(max_binaries)

    def __len__(self) -> int:
        return len(self._tables)

    def candidates(self, pid: int, m: Mapping) -> list[str]:
        """Where a mapping's file opens: through the process's root (containers),
        else by its path; a deleted file through map_files."""
        base = self.proc_root / str(pid)
        if m.path.endswith(" (deleted)"):
            return [str(base / "map_files" / f"{m.start:x}-{m.end:x}")]
        return [str(base / "root") + m.path, m.path]

    def of_mapping(self, pid: int, m: Mapping) -> ElfSymbols | None:
        """The symbol table of a mapping's file; None when none of its places opens.
        The file's identity is looked up once per mapping (`m.resolved`)."""
        if not m.resolved:
            self.costly(None)
            m.resolved = True
            for path in self.candidates(pid, m):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                m.binary = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                if self._tables.get(m.binary) is None:
                    self._tables.put(m.binary, ElfSymbols.load(path, self.debug_root))
                break
        if m.binary is None:
            return None
        table = self._tables.get(m.binary)
        if table is None:  # evicted since: read it again
            self.costly(None)
            for path in self.candidates(pid, m):
                if os.path.exists(path):
                    table = ElfSymbols.load(path, self.debug_root)
                    self._tables.put(m.binary, table)
                    break
        return table

    def loaded(self, m: Mapping) -> ElfSymbols | None:
        """of_mapping() where it needs no read: the table of a mapping whose file is
        known and read (None: not known, none, or to read again)."""
        return self._tables.get(m.binary) if m.resolved and m.binary is not None else None

    def of_jit(self, pid: int, region: JitRegion) -> ElfSymbols:
        """The symbol table of a JIT region registered with an ELF image's path (one
        that is not ok names no function: the region is then named by its path).

        A registration's build id names the image (`build_id` of /api/v1/symbols/jit,
        docs/requirements/sentinel.md §3.7, which registers regions for the symbolization
        index):
        the file at the path serves only while it has that build id (a JIT that
        writes its next image to the same path must not name this region's code),
        else the debug file by build id under debug_root (a stripped, deleted or
        replaced image's symbols, as for mapped files); and the image's table is read
        once for every process and registration of it."""
        build_id = region.build_id.lower() if region.build_id else None
        mine = ("jit", pid, region.start, region.seq)
        image = ("jit-image", build_id) if build_id else None
        table = self._tables.get(mine)
        if table is None and image is not None:
            table = self._tables.get(image)
        if table is None:
            self.costly(None)
            table = self._jit_image(region.name, build_id)
            # one not found is tried again by the next registration (its image written)
            self._tables.put(image if image is not None and table.ok else mine, table)
        return table

    def _jit_image(self, path: str, build_id: str | None) -> ElfSymbols:
        """The table of the image at `path`, or with a build id of the image that has
        it: the file at `path`, else its debug file; else a table that is not ok."""
        table = ElfSymbols.load(path, self.debug_root)
        if build_id is None or table.build_id == build_id:
            return table
        found = debug_file(build_id, self.debug_root)
        if found is not None:
            debug = ElfSymbols.load(found, None)
            if debug.ok and debug.build_id in (None, build_id):
                return debug
        return ElfSymbols(path)

    def frame(self, binary: str, table: ElfSymbols, ip: int, vaddr: int, lines: bool) -> Frame:
        """The frame of `ip` in `binary`, at `vaddr` of its `table`: the function, and
        with `lines` its source file and line."""
        hit = table.lookup(vaddr)
        if hit is None:
            return Frame(binary, UNKNOWN, "", 0, ip, vaddr)
        if lines and table.lines_pending:
            self.costly(table)
        source, line = table.line(vaddr) if lines else ("", 0)
        return Frame(binary, hit[0], source, line, ip, hit[1])
