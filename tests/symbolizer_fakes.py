"""The world of the sentinel symbolizer tests: a program built with gcc (PIE, non-PIE,
a shared library) whose expected addresses come from `nm` and `readelf`, not from the
code under test, and a fake /proc tree whose maps point at those binaries. The
fixtures `binaries`, `fake` and `clock` (in conftest.py) hand these out."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from meridian.tools.sentinel.symbols.symbolizer import Symbolizer

PROG = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) int alpha(int x) { return x * 3 + 1; }
__attribute__((noinline)) int beta(int x) { return alpha(x) ^ 0x55; }
/* Code in a writable segment, whose file offset and address differ by a page. */
__attribute__((noinline, section(".data.gamma"))) int gamma_fn(int x) { return x + 7; }
int main(int argc, char **argv) {
    volatile int v = beta(argc);
    if (argc > 1) { printf("ready\n"); fflush(stdout); pause(); }
    return v & 1;
}
"""

PAGE = 4096
PID = 4242


@dataclass
class Binary:
    path: Path
    symbols: dict[str, int]  # from nm
    loads: list[tuple[int, int, int, str]]  # (offset, vaddr, memsz, flags) from readelf
    pie: bool


def nm(path: Path) -> dict[str, int]:
    out = subprocess.run(["nm", str(path)], check=True, capture_output=True, text=True).stdout
    return {p[2]: int(p[0], 16) for p in (line.split() for line in out.splitlines()) if len(p) == 3}


def loads(path: Path) -> list[tuple[int, int, int, str]]:
    out = subprocess.run(["readelf", "-lW", str(path)], check=True, capture_output=True, text=True)
    rows = []
    for line in out.stdout.splitlines():
        p = line.split()
        if p and p[0] == "LOAD":
            rows.append((int(p[1], 16), int(p[2], 16), int(p[5], 16), "".join(p[6:-1])))
    return rows


def build_binaries(d: Path) -> dict[str, Binary]:
    """PROG built in `d` as a PIE, a non-PIE and a shared library (skips without gcc)."""
    if shutil.which("gcc") is None or shutil.which("nm") is None:
        pytest.skip("gcc and binutils are needed to build the test binaries")
    (d / "prog.c").write_text(PROG)
    flags = {
        "pie": ["-fPIE", "-pie"],
        "nopie": ["-fno-pie", "-no-pie"],
        "lib.so": ["-fPIC", "-shared", "-Wl,-z,noseparate-code"],
    }
    out = {}
    for name, extra in flags.items():
        path = d / name
        subprocess.run(
            ["gcc", "-g", "-O1", *extra, "-o", str(path), str(d / "prog.c")],
            check=True,
            capture_output=True,
        )
        out[name] = Binary(path, nm(path), loads(path), name != "nopie")
    return out


def stat_line(pid: int, start: int = 100, code: int = 0x1000, stack: int = 0x7FFF0000) -> str:
    fields = ["0"] * 50
    fields[0] = "S"
    fields[19], fields[23], fields[25] = str(start), str(code), str(stack)
    return f"{pid} (prog) " + " ".join(fields) + "\n"


def maps_lines(b: Binary, bias: int) -> list[str]:
    """The mappings the kernel and ld.so make for b's PT_LOADs at load bias `bias`."""
    lines = []
    for offset, vaddr, memsz, flags in b.loads:
        start = bias + (vaddr & ~(PAGE - 1))
        end = bias + ((vaddr + memsz + PAGE - 1) & ~(PAGE - 1))
        perms = ("r" if "R" in flags else "-") + ("w" if "W" in flags else "-")
        perms += ("x" if "E" in flags else "-") + "p"
        lines.append(f"{start:x}-{end:x} {perms} {offset & ~(PAGE - 1):08x} fe:00 777 {b.path}")
    return lines


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class IpResolver:
    """An aggregator's resolver without symbols: function id = ip >> 8, no stacks or
    data objects; the function ids in `idle` are the kernel's idle code."""

    def __init__(self, idle: frozenset[int]) -> None:
        self.idle = idle

    def function_id(self, pid: int, ip: int) -> int:
        return ip >> 8

    def callstack_id(self, pid: int, user: int, kernel: int, ip: int) -> int:
        return 0

    def data_object_id(self, pid: int, addr: int) -> int:
        return 0

    def idle_function_ids(self) -> frozenset[int]:
        return self.idle


class FakeProc:
    """A /proc tree with processes whose maps and stat the test writes."""

    def __init__(self, root: Path) -> None:
        self.root = root / "proc"
        self.root.mkdir()

    def add(self, pid: int, maps: list[str], start: int = 100, code: int = 0x1000) -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "maps").write_text("".join(line + "\n" for line in maps))
        (d / "stat").write_text(stat_line(pid, start, code))

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))


def symbolizer(
    fake: FakeProc, clock: Clock, tmp_path: Path, debug_root: str | None = None, **bounds: int
) -> Symbolizer:
    """A symbolizer on the fake tree, with `max_*` bounds and `grace_s` as given (and
    separate debug files under `debug_root`, none by default)."""
    # imported here, not on top: conftest.py imports this module for every test
    from meridian.tools.sentinel.symbols.symbolizer import Symbolizer

    kallsyms = tmp_path / "kallsyms"
    if not kallsyms.exists():
        kallsyms.write_text("")
    return Symbolizer(
        proc_root=fake.root,
        kallsyms=kallsyms,
        perf_map_dir=tmp_path,
        clock=clock,
        debug_root=debug_root,
        max_processes=bounds.get("max_processes", 1024),
        max_binaries=bounds.get("max_binaries", 64),
        max_frames=bounds.get("max_frames", 1 << 15),
        max_functions=bounds.get("max_functions", 1 << 20),
        max_stacks=bounds.get("max_stacks", 1 << 20),
        max_data_objects=bounds.get("max_data_objects", 1 << 16),
        max_provisional=bounds.get("max_provisional", 1 << 14),
        grace_s=bounds.get("grace_s", 10),
    )


def odd_mappings(junk: Path) -> list[str]:
    """/proc/PID/maps lines of code no symbol table names: a file that is no ELF, a
    deleted file, [vdso] and anonymous memory."""
    return [
        f"{0x7000_0000_0000:x}-{0x7000_0001_0000:x} r-xp 00000000 fe:00 9 {junk}",
        f"{0x7000_0002_0000:x}-{0x7000_0003_0000:x} r-xp 00000000 fe:00 9 /gone (deleted)",
        f"{0x7000_0004_0000:x}-{0x7000_0004_2000:x} r-xp 00000000 00:00 0 [vdso]",
        f"{0x7000_0005_0000:x}-{0x7000_0006_0000:x} rw-p 00000000 00:00 0",
    ]
