"""JIT code regions: perf's `/tmp/perf-PID.map` files (`START SIZE name` in hex, one
line per JIT'ed function, appended as the runtime compiles) and regions registered
through the API. Code is recompiled into reused memory, so where regions overlap the
one added last wins, as in perf.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JitRegion", "JitRegions", "PerfMapFile", "parse_perf_map"]

# How many overlapping candidates a lookup examines before giving up.
MAX_SCAN = 64


@dataclass(frozen=True)
class JitRegion:
    """Code in [start, end) named `name` (a function, or an ELF image's path)."""

    start: int
    end: int
    name: str
    build_id: str | None = None
    seq: int = 0  # order of addition: the newest covering region wins


def parse_perf_map(text: str) -> list[tuple[int, int, str]]:
    """(start, size, name) per well-formed line; other lines are skipped."""
    out: list[tuple[int, int, str]] = []
    for line in text.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) != 3:
            continue
        try:
            start, size = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            continue
        if size > 0:
            out.append((start, size, parts[2].strip()))
    return out


class JitRegions:
    """A bounded, sorted set of regions; at `max_regions` the oldest tenth is dropped."""

    def __init__(self, max_regions: int = 1 << 16) -> None:
        self.max_regions = max(1, max_regions)
        self._starts: list[int] = []
        self._regions: list[JitRegion] = []
        self._seq = 0
        self._longest = 0

    def __len__(self) -> int:
        return len(self._regions)

    def regions(self) -> list[JitRegion]:
        """Every region, by start address (the control plane lists them)."""
        return list(self._regions)

    def add(self, start: int, end: int, name: str, build_id: str | None = None) -> None:
        if end <= start:
            return
        if len(self._regions) >= self.max_regions:
            self._drop_oldest(max(1, self.max_regions // 10))
        self._seq += 1
        region = JitRegion(start, end, name, build_id, self._seq)
        i = bisect_right(self._starts, start)
        self._starts.insert(i, start)
        self._regions.insert(i, region)
        self._longest = max(self._longest, end - start)

    def extend(self, entries: list[tuple[int, int, str]]) -> None:
        """Add many (start, size, name) at once: one sort instead of one insert each."""
        if len(entries) > self.max_regions // 2 or len(entries) > len(self._regions):
            regions = self._regions
            for start, size, name in entries:
                self._seq += 1
                regions.append(JitRegion(start, start + size, name, None, self._seq))
            regions.sort(key=lambda r: (r.start, r.seq))
            if len(regions) > self.max_regions:
                self._regions = regions
                self._drop_oldest(len(regions) - self.max_regions)
            self._reindex()
        else:
            for start, size, name in entries:
                self.add(start, start + size, name)

    def _drop_oldest(self, n: int) -> None:
        cut = sorted(r.seq for r in self._regions)[n - 1]
        self._regions = [r for r in self._regions if r.seq > cut]
        self._reindex()

    def _reindex(self) -> None:
        self._starts = [r.start for r in self._regions]
        self._longest = max((r.end - r.start for r in self._regions), default=0)

    def lookup(self, addr: int) -> JitRegion | None:
        """The newest region holding addr, or None."""
        i = bisect_right(self._starts, addr) - 1
        best: JitRegion | None = None
        stop = max(-1, i - MAX_SCAN)
        while i > stop:
            r = self._regions[i]
            if r.start + self._longest <= addr:
                break
            if addr < r.end and (best is None or r.seq > best.seq):
                best = r
            i -= 1
        return best


class PerfMapFile:
    """One process's perf map, re-read from where it stopped when the file grows."""

    def __init__(self, path: str | Path, max_regions: int = 1 << 16) -> None:
        self.path = Path(path)
        self.regions = JitRegions(max_regions)
        self._ident: tuple[int, int] | None = None  # (dev, inode) of what was read
        self._read = 0  # bytes consumed (whole lines only)

    def refresh(self) -> bool:
        """Read new lines; start over when the file was replaced or shrank. True when
        the file exists."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        ident = (st.st_dev, st.st_ino)
        if ident != self._ident or st.st_size < self._read:
            self.regions = JitRegions(self.regions.max_regions)
            self._ident, self._read = ident, 0
        if st.st_size == self._read:
            return True
        try:
            with open(self.path, "rb") as f:
                f.seek(self._read)
                data = f.read(st.st_size - self._read)
        except OSError:
            return False
        end = data.rfind(b"\n") + 1  # a line still being written waits for next time
        self._read += end
        self.regions.extend(parse_perf_map(data[:end].decode("utf-8", "replace")))
        return True

    def lookup(self, addr: int) -> JitRegion | None:
        return self.regions.lookup(addr)
