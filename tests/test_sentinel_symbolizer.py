"""The sentinel symbolizer against binaries built here with gcc (PIE, non-PIE, a shared
library), fake /proc trees whose maps point at them, perf-PID.map files, the real
/proc/kallsyms, and a live process. Expected addresses come from `nm` and `readelf`,
not from the code under test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meridian.errors import ExtraMissing
from meridian.tools.sentinel.elf import ElfSymbols
from meridian.tools.sentinel.kallsyms import KernelSymbols
from meridian.tools.sentinel.perfmap import JitRegions, PerfMapFile, parse_perf_map
from meridian.tools.sentinel.symbolizer import DataObject, Frame, Symbolizer

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


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Binary]:
    if shutil.which("gcc") is None or shutil.which("nm") is None:
        pytest.skip("gcc and binutils are needed to build the test binaries")
    d = tmp_path_factory.mktemp("elf")
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


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def symbolizer(fake: FakeProc, clock: Clock, tmp_path: Path, **bounds: int) -> Symbolizer:
    """A symbolizer on the fake tree, with `max_*` bounds and `grace_s` as given."""
    kallsyms = tmp_path / "kallsyms"
    if not kallsyms.exists():
        kallsyms.write_text("")
    return Symbolizer(
        proc_root=fake.root,
        kallsyms=kallsyms,
        perf_map_dir=tmp_path,
        clock=clock,
        debug_root=None,
        max_processes=bounds.get("max_processes", 1024),
        max_binaries=bounds.get("max_binaries", 64),
        max_frames=bounds.get("max_frames", 1 << 15),
        max_functions=bounds.get("max_functions", 1 << 20),
        max_stacks=bounds.get("max_stacks", 1 << 20),
        max_data_objects=bounds.get("max_data_objects", 1 << 16),
        grace_s=bounds.get("grace_s", 10),
    )


# -- ELF files -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pie", "nopie", "lib.so"])
def test_elf_symbols_match_nm(binaries: dict[str, Binary], name: str) -> None:
    b = binaries[name]
    table = ElfSymbols.load(str(b.path), debug_root=None)
    assert table.ok and table.pie == b.pie and table.build_id
    for fn in ("alpha", "beta", "main", "gamma_fn"):
        assert table.lookup(b.symbols[fn]) == (fn, 0)
        assert table.lookup(b.symbols[fn] + 2) == (fn, 2)
    source, line = table.line(b.symbols["beta"])
    beta_line = next(i for i, x in enumerate(PROG.splitlines(), 1) if "int beta" in x)
    assert source.endswith("prog.c") and line == beta_line
    assert table.lookup(1) is None


def test_elf_load_tolerates_bad_files(tmp_path: Path, binaries: dict[str, Binary]) -> None:
    (tmp_path / "text").write_text("not an ELF file\n")
    truncated = tmp_path / "truncated"
    truncated.write_bytes(binaries["pie"].path.read_bytes()[:200])
    for path in (tmp_path / "text", truncated, tmp_path / "missing"):
        table = ElfSymbols.load(str(path), debug_root=None)
        assert len(table) == 0 and table.lookup(0x1000) is None and table.line(0x1000) == ("", 0)


def test_stripped_binary_uses_dynsym(tmp_path: Path, binaries: dict[str, Binary]) -> None:
    lib = tmp_path / "stripped.so"
    shutil.copy(binaries["lib.so"].path, lib)
    subprocess.run(["strip", str(lib)], check=True)
    dynamic = {
        p[2]: int(p[0], 16)
        for p in (
            line.split()
            for line in subprocess.run(
                ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True
            ).stdout.splitlines()
        )
        if len(p) == 3
    }
    table = ElfSymbols.load(str(lib), debug_root=None)
    assert table.lookup(dynamic["alpha"] + 1) == ("alpha", 1)
    assert table.line(dynamic["alpha"]) == ("", 0)  # no DWARF left


def test_debug_file_by_build_id(tmp_path: Path, binaries: dict[str, Binary]) -> None:
    """A stripped PIE exports nothing; its -dbgsym file (found by build id) names it."""
    b = binaries["pie"]
    stripped = tmp_path / "pie"
    shutil.copy(b.path, stripped)
    subprocess.run(["strip", str(stripped)], check=True)
    assert len(ElfSymbols.load(str(stripped), debug_root=None)) == 0
    build_id = ElfSymbols.load(str(b.path), debug_root=None).build_id
    assert build_id
    debug = tmp_path / "debug" / ".build-id" / build_id[:2] / (build_id[2:] + ".debug")
    debug.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(b.path), str(debug)], check=True)
    table = ElfSymbols.load(str(stripped), debug_root=str(tmp_path / "debug"))
    assert table.lookup(b.symbols["beta"] + 1) == ("beta", 1)
    assert table.line(b.symbols["beta"])[0].endswith("prog.c")


# -- user addresses through a fake /proc ----------------------------------------------


@pytest.mark.parametrize("name", ["pie", "nopie", "lib.so"])
def test_user_addresses_through_maps(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path, name: str
) -> None:
    b = binaries[name]
    bias = 0x7F3A_1200_0000 if b.pie else 0
    fake.add(PID, maps_lines(b, bias))
    s = symbolizer(fake, clock, tmp_path)
    for fn in ("alpha", "beta", "main", "gamma_fn"):
        ip = bias + b.symbols[fn] + 1
        f = s.frame(PID, ip)
        assert (f.binary, f.function, f.offset, f.addr) == (str(b.path), fn, 1, ip)
        assert f.file.endswith("prog.c") and f.line > 0
    assert str(s.frame(PID, bias + b.symbols["alpha"])).startswith(f"alpha+0x0 ({name})")
    # numpy scalars and arrays, as the aggregator's batches hold them
    ip = np.uint64(bias + b.symbols["beta"] + 5)
    f = s.frame(np.int32(PID), ip)
    assert (f.function, f.offset, type(f.offset), type(f.addr)) == ("beta", 5, int, int)
    ips = np.array([ip, bias + b.symbols["main"]], dtype=np.uint64)
    assert s.stack_id(PID, ips) == s.stack_id(PID, [int(x) for x in ips])  # type: ignore[arg-type]


def test_unknown_addresses_never_raise(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    b = binaries["pie"]
    junk = tmp_path / "junk.so"
    junk.write_text("garbage")
    bias = 0x5555_0000_0000
    fake.add(
        PID,
        [
            *maps_lines(b, bias),
            f"{0x7000_0000_0000:x}-{0x7000_0001_0000:x} r-xp 00000000 fe:00 9 {junk}",
            f"{0x7000_0002_0000:x}-{0x7000_0003_0000:x} r-xp 00000000 fe:00 9 /gone (deleted)",
            f"{0x7000_0004_0000:x}-{0x7000_0004_2000:x} r-xp 00000000 00:00 0 [vdso]",
            f"{0x7000_0005_0000:x}-{0x7000_0006_0000:x} rw-p 00000000 00:00 0",
            "this line is not a mapping",
        ],
    )
    s = symbolizer(fake, clock, tmp_path)
    cases = {
        0: ("", "[unknown]", 0),
        bias + 0x10: (str(b.path), "[unknown]", 0x10),  # ELF header bytes, no function
        0x7000_0000_0010: (str(junk), "[unknown]", 0x10),
        0x7000_0002_0010: ("/gone (deleted)", "[unknown]", 0x10),
        0x7000_0004_0010: ("[vdso]", "[unknown]", 0x10),
        0x7000_0005_0010: ("[anon]", "[unknown]", 0x10),
        0x1234_5678: ("", "[unknown]", 0),
    }
    for ip, want in cases.items():
        f = s.frame(PID, ip)
        assert (f.binary, f.function, f.offset) == want, hex(ip)
    assert str(s.frame(PID, 0x7000_0000_0010)) == "[unknown] (junk.so+0x10)"
    assert s.frame(99999, 0x4000).function == "[unknown]"  # no such process
    assert s.frame(-1, 1 << 62).function == "[unknown]"


def test_live_process(binaries: dict[str, Binary], tmp_path: Path) -> None:
    """The built PIE runs; its main symbolizes through the real /proc/PID/maps, and so
    does a libc function through the real libc."""
    b = binaries["pie"]
    child = subprocess.Popen([str(b.path), "wait"], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        maps = Path(f"/proc/{child.pid}/maps").read_text().splitlines()
        base = min(int(line.split("-")[0], 16) for line in maps if line.endswith(str(b.path)))
        s = Symbolizer(perf_map_dir=tmp_path, debug_root=None)
        f = s.frame(child.pid, base + b.symbols["main"] + 4)
        assert (f.binary, f.function, f.offset) == (str(b.path), "main", 4)
        assert f.file.endswith("prog.c")

        libc_line = next(line for line in maps if re.search(r"/libc[.-]", line))
        libc = libc_line.split()[-1]
        libc_base = min(int(m.split("-")[0], 16) for m in maps if m.endswith(libc))
        out = subprocess.run(["nm", "-D", "--defined-only", libc], capture_output=True, text=True)
        names: dict[int, set[str]] = {}
        for line in out.stdout.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TtWwi":
                names.setdefault(int(p[0], 16), set()).add(p[2].split("@")[0])
        pause = next(a for a, n in names.items() if "pause" in n)
        f = s.frame(child.pid, libc_base + pause + 3)
        assert f.binary == libc and f.function in names[pause] and f.offset == 3
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


# -- JIT regions ---------------------------------------------------------------------


def test_perf_map_parse_and_overlap() -> None:
    text = "1000 20 jit_a\n0x1020 10 Lua::f(x, y)\nbad line\n2000 zz nope\n3000 0 empty\n"
    assert parse_perf_map(text) == [(0x1000, 0x20, "jit_a"), (0x1020, 0x10, "Lua::f(x, y)")]
    regions = JitRegions()
    regions.extend(parse_perf_map(text))
    regions.add(0x1000, 0x1010, "recompiled")
    lookup = regions.lookup
    assert [getattr(lookup(a), "name", None) for a in (0x1005, 0x1015, 0x1025, 0x1030)] == [
        "recompiled",
        "jit_a",
        "Lua::f(x, y)",
        None,
    ]


def test_perf_map_file_is_read_as_it_grows(
    fake: FakeProc, clock: Clock, tmp_path: Path, binaries: dict[str, Binary]
) -> None:
    anon = 0x7F00_0000_0000
    fake.add(PID, [f"{anon:x}-{anon + 0x100000:x} rwxp 00000000 00:00 0"])
    perf_map = tmp_path / f"perf-{PID}.map"
    perf_map.write_text(f"{anon + 0x100:x} 40 LazyCompile:~handler app.js:10\n{anon + 0x200:x} 8")
    s = symbolizer(fake, clock, tmp_path)
    f = s.frame(PID, anon + 0x104)
    assert (f.binary, f.function, f.offset) == ("[jit]", "LazyCompile:~handler app.js:10", 4)
    assert s.frame(PID, anon + 0x204).function == "[unknown]"  # line still being written
    with perf_map.open("a") as out:
        out.write(f" stub\n{anon + 0x100:x} 10 recompiled\n")
    assert s.frame(PID, anon + 0x204).function == "[unknown]"  # not re-read before recheck_s
    clock.now += 2
    assert s.frame(PID, anon + 0x204).function == "stub"
    assert s.frame(PID, anon + 0x104).function == "recompiled"
    pmf = PerfMapFile(perf_map)
    assert pmf.refresh() and len(pmf.regions) == 3
    assert not PerfMapFile(tmp_path / "perf-1.map").refresh()


def test_register_jit(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """Registrations work for pids /proc does not know (the mock source's)."""
    s = symbolizer(fake, clock, tmp_path)
    s.register_jit(777, 0x10000, 0x10100, "mock::parse_http")
    s.register_jit(777, 0x10100, 0x10200, "mock::checksum", build_id="ab12")
    lib = binaries["lib.so"]
    s.register_jit(777, 0x40000, 0x40000 + 0x10000, str(lib.path))
    assert s.frame(777, 0x10010) == Frame("[jit]", "mock::parse_http", "", 0, 0, 0x10)
    assert s.frame(777, 0x10100).function == "mock::checksum"
    f = s.frame(777, 0x40000 + lib.symbols["beta"] + 2)
    assert (f.binary, f.function, f.offset) == (str(lib.path), "beta", 2)
    assert s.frame(777, 0x90000).function == "[unknown]"
    assert s.frame(778, 0x10010).function == "[unknown]"
    s.forget(777)
    assert s.frame(777, 0x10010).function == "[unknown]"


# -- kernel addresses ----------------------------------------------------------------

KALLSYMS = """\
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81000100 t helper
ffffffff81000200 D some_data
ffffffff81000300 W weak_fn
ffffffffc0001000 t mod_fn\t[nf_tables]
ffffffffc0000000 t bpf_prog_abc_handler\t[bpf]
ffffffff81000180 T second
"""


def test_kallsyms_fixture(fake: FakeProc, clock: Clock, tmp_path: Path) -> None:
    ks = KernelSymbols(tmp_path / "k")
    ks.parse(KALLSYMS.encode())
    assert ks.lookup(0xFFFFFFFF81000004) == ("startup_64", 4, "")  # alias without "_"
    assert ks.lookup(0xFFFFFFFF81000101) == ("helper", 1, "")
    assert ks.lookup(0xFFFFFFFF81000250) == ("second", 0xD0, "")  # D is not text
    assert ks.lookup(0xFFFFFFFFC0001008) == ("mod_fn", 8, "nf_tables")
    assert ks.lookup(0xFFFFFFFF80000000) is None and not ks.hidden
    (tmp_path / "kallsyms").write_text(KALLSYMS)
    s = symbolizer(fake, clock, tmp_path)
    assert s.frame(1, 0xFFFFFFFFC0000010) == Frame("[bpf]", "bpf_prog_abc_handler", "", 0, 0, 0x10)
    assert str(s.frame(1, 0xFFFFFFFF81000101)) == "helper+0x1 ([kernel])"
    assert s.frame(1, 0xFFFFFFFF00000000).function == "[unknown]"


def test_kallsyms_hidden(fake: FakeProc, clock: Clock, tmp_path: Path) -> None:
    (tmp_path / "kallsyms").write_text(re.sub(r"^f+[0-9a-f]+", "0" * 16, KALLSYMS, flags=re.M))
    s = symbolizer(fake, clock, tmp_path)
    f = s.frame(1, 0xFFFFFFFF81000101)
    assert (f.binary, f.function) == ("[kernel]", "[kernel]") and str(f) == "[kernel]"


@pytest.mark.skipif(os.geteuid() != 0, reason="kallsyms addresses need root")
def test_real_kallsyms(tmp_path: Path) -> None:
    addr = None
    with open("/proc/kallsyms") as text:
        for line in text:
            p = line.split()
            if p[2] == "schedule" and len(p) == 3:
                addr = int(p[0], 16)
                break
    if not addr:
        pytest.skip("kptr_restrict hides kernel addresses")
    s = Symbolizer(perf_map_dir=tmp_path)
    for off in (0, 1, 0x10):
        f = s.frame(0, addr + off)
        assert (f.binary, f.function, f.offset) == ("[kernel]", "schedule", off)


# -- interning -----------------------------------------------------------------------


def test_function_and_stack_ids(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    b = binaries["pie"]
    fake.add(PID, maps_lines(b, 0x5500_0000_0000))
    fake.add(PID + 1, maps_lines(b, 0x5600_0000_0000))  # the same binary, elsewhere
    s = symbolizer(fake, clock, tmp_path)
    sym = b.symbols

    def ips(base: int, *names: str) -> list[int]:
        return [base + sym[n] + 1 for n in names]

    fa = s.function_id(PID, ips(0x5500_0000_0000, "alpha")[0])
    assert fa == s.function_id(PID, 0x5500_0000_0000 + sym["alpha"] + 3)
    assert fa == s.function_id(PID + 1, ips(0x5600_0000_0000, "alpha")[0])
    fb = s.function_id(PID, ips(0x5500_0000_0000, "beta")[0])
    assert fa != fb and fa > 0 and fb > 0
    assert s.function_name(fa) == "alpha" and s.function_name(fb) == "beta"
    unknown = s.function_id(PID, 0x5500_0000_0000 + 0x10)
    assert s.function_name(unknown) == "[unknown] (pie)"
    assert s.function_name(12345) == "[unknown]"

    st = s.stack_id(PID, ips(0x5500_0000_0000, "alpha", "beta", "main"))
    assert st == s.stack_id(PID, ips(0x5500_0000_0000, "alpha", "beta", "main"))
    assert st == s.stack_id(PID + 1, ips(0x5600_0000_0000, "alpha", "beta", "main"))
    other = s.stack_id(PID, ips(0x5500_0000_0000, "beta", "main"))
    assert other != st and s.stack_id(PID, []) == 0
    assert [f.function for f in s.stack(st)] == ["alpha", "beta", "main"]
    assert s.stack(0) == () and s.stack(999) == ()
    assert [i for i, _ in s.consume_stacks()] == [st, other]
    assert s.consume_stacks() == []


def test_data_objects(fake: FakeProc, clock: Clock, tmp_path: Path) -> None:
    s = symbolizer(fake, clock, tmp_path, max_data_objects=3)
    arena = s.register_data_object(5, 0x1000, "arena", "heap", 0x1000)
    inner = s.register_data_object(5, 0x1800, "conn_table", "struct conn[16]", 0x100)
    exact = s.register_data_object(5, 0x3000, "flag")
    assert s.register_data_object(5, 0x1000, "arena", "heap", 0x1000) == arena
    assert len({arena, inner, exact}) == 3 and min(arena, inner, exact) > 0
    assert s.data_object_id(5, 0x1010) == arena
    assert s.data_object_id(5, 0x1810) == inner  # the innermost object
    assert s.data_object_id(5, 0x1900) == arena
    assert s.data_object_id(5, 0x3000) == exact and s.data_object_id(5, 0x3001) == 0
    assert s.data_object_id(6, 0x1010) == 0
    assert s.data_object(inner) == DataObject(
        inner, 5, 0x1800, "conn_table", "struct conn[16]", 0x100
    )
    assert [o.object_id for o in s.consume_data_objects()] == [arena, inner, exact]
    assert s.consume_data_objects() == []
    newest = s.register_data_object(6, 0x10, "x", size=8)  # bound 3: the oldest goes
    assert s.data_object(arena) is None and s.data_object_id(5, 0x1010) == 0
    assert s.data_object_id(6, 0x17) == newest
    s.forget(5)
    assert s.data_object_id(5, 0x1810) == 0
    assert s.data_object(inner) is not None  # ids already handed out stay readable


# -- caches, exec, exit --------------------------------------------------------------


def test_cache_bounds(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    pie, lib = binaries["pie"], binaries["lib.so"]
    for pid in range(100, 104):
        fake.add(pid, [*maps_lines(pie, 0x5500_0000_0000), *maps_lines(lib, 0x7F00_0000_0000)])
    s = symbolizer(
        fake,
        clock,
        tmp_path,
        max_processes=2,
        max_binaries=1,
        max_frames=4,
        max_functions=2,
        max_stacks=2,
    )
    for _ in range(2):
        for pid in range(100, 104):
            for fn in ("alpha", "beta", "main"):
                assert s.frame(pid, 0x5500_0000_0000 + pie.symbols[fn]).function == fn
                assert s.frame(pid, 0x7F00_0000_0000 + lib.symbols[fn]).function == fn
    sizes = s.cache_sizes()
    assert sizes["processes"] == 2 and sizes["binaries"] == 1 and sizes["frames"] == 4

    ids = [s.function_id(100, 0x5500_0000_0000 + pie.symbols[n]) for n in ("alpha", "beta", "main")]
    assert s.cache_sizes()["functions"] == 2 and s.function_name(ids[0]) == "[unknown]"
    again = s.function_id(100, 0x5500_0000_0000 + pie.symbols["alpha"])
    assert again not in ids  # evicted keys come back with a fresh id, never a reused one
    stacks = [
        s.stack_id(100, [0x5500_0000_0000 + pie.symbols[n]]) for n in ("alpha", "beta", "main")
    ]
    assert s.cache_sizes()["stacks"] == 2 and s.stack(stacks[0]) == ()


def test_exec_exit_and_forget(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    pie, nopie = binaries["pie"], binaries["nopie"]
    bias = 0x5500_0000_0000
    fake.add(PID, maps_lines(pie, bias))
    s = symbolizer(fake, clock, tmp_path, grace_s=10)
    ip = bias + pie.symbols["beta"]
    assert s.frame(PID, ip).function == "beta"

    # exec of another binary: the same start time, new code and stack addresses
    fake.add(PID, maps_lines(nopie, 0), code=0x401000)
    assert s.frame(PID, nopie.symbols["alpha"]).function == "[unknown]"  # cached view
    clock.now += 1.5
    assert s.frame(PID, nopie.symbols["alpha"]).function == "alpha"
    assert s.frame(PID, ip).function == "[unknown]"

    # exit: the view serves late samples for grace_s, then goes
    fake.remove(PID)
    clock.now += 1.5
    assert s.frame(PID, nopie.symbols["alpha"] + 1).function == "alpha"  # seen dead
    clock.now += 5
    assert s.frame(PID, nopie.symbols["alpha"] + 2).function == "alpha"
    clock.now += 6
    assert s.frame(PID, nopie.symbols["alpha"] + 2).function == "[unknown]"

    # pid reuse: a new start time
    fake.add(PID, maps_lines(pie, bias), start=100)
    s.forget(PID)
    assert s.frame(PID, ip).function == "beta"
    fake.add(PID, maps_lines(nopie, 0), start=999)
    clock.now += 1.5
    assert s.frame(PID, nopie.symbols["main"]).function == "main"

    # forget drops at once; sweep drops the dead after grace
    fake.add(PID, maps_lines(pie, bias), start=999)
    assert s.frame(PID, ip).function == "[unknown]"
    s.forget(PID)
    assert s.frame(PID, ip).function == "beta"
    fake.remove(PID)
    assert s.sweep() == 0 and s.cache_sizes()["processes"] == 1
    clock.now += 11
    assert s.sweep() == 1 and s.cache_sizes()["processes"] == 0


def test_new_mapping_is_found(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """A library loaded after the maps were read (dlopen) is found on a later miss."""
    pie, lib = binaries["pie"], binaries["lib.so"]
    fake.add(PID, maps_lines(pie, 0x5500_0000_0000))
    s = symbolizer(fake, clock, tmp_path)
    ip = 0x7F00_0000_0000 + lib.symbols["alpha"]
    assert s.frame(PID, ip).function == "[unknown]"
    fake.add(PID, [*maps_lines(pie, 0x5500_0000_0000), *maps_lines(lib, 0x7F00_0000_0000)])
    clock.now += 1.5
    assert s.frame(PID, ip + 1).function == "alpha"


def test_frame_text() -> None:
    assert str(Frame("/usr/lib/libc.so.6", "memcpy", "", 0, 1, 0x1A)) == "memcpy+0x1a (libc.so.6)"
    assert str(Frame("/bin/x", "f", "x.c", 7, 1, 2)) == "f+0x2 (x) x.c:7"
    assert str(Frame("", "[unknown]", "", 0, 5, 0)) == "[unknown]"
    assert Frame("/a", "f", "", 0, 1, 2) == Frame("/a", "f", "", 0, 99, 2)


@pytest.fixture
def no_pyelftools(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [m for m in sys.modules if m == "elftools" or m.startswith("elftools.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "elftools", None)
    yield


@pytest.mark.usefixtures("no_pyelftools")
def test_missing_extra_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(ExtraMissing, match=r"pip install 'meridian-ebpf\[sentinel\]'"):
        Symbolizer(proc_root=tmp_path)


def test_kept_ids_follow_exec_jit_and_rereads(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """function_id / stack_id answers are kept across calls, but never across an exec,
    a JIT registration, or a view read again with other mappings; a view read again
    with the same mappings keeps them (and its frames)."""
    pie, nopie = binaries["pie"], binaries["nopie"]
    bias = 0x5500_0000_0000
    fake.add(PID, maps_lines(pie, bias))
    s = symbolizer(fake, clock, tmp_path)
    beta = bias + pie.symbols["beta"]
    fb = s.function_id(PID, beta)
    stack = s.stack_id(PID, [beta, bias + pie.symbols["main"]])
    assert s.function_ids([PID, PID], [beta, beta + 1]) == [fb, fb]
    assert s.stack_id(PID, [beta, bias + pie.symbols["main"]]) == stack

    # an address in no mapping reads the maps again after recheck_s: the same maps
    clock.now += 1.5
    gen = s._views.peek(PID).gen  # type: ignore[union-attr]
    assert s.frame(PID, 0x10).function == "[unknown]"
    assert s._views.peek(PID).gen == gen  # type: ignore[union-attr]
    assert s.function_id(PID, beta) == fb

    # exec: the kept answer is not served once the process is checked again
    fake.add(PID, maps_lines(nopie, 0), code=0x401000)
    clock.now += 1.5
    assert s.function_name(s.function_id(PID, beta)) != "beta"
    assert s.function_ids([PID], [nopie.symbols["alpha"]]) == [
        s.function_id(PID, nopie.symbols["alpha"])
    ]
    assert s.function_name(s.function_ids([PID], [nopie.symbols["alpha"]])[0]) == "alpha"

    # a JIT region registered over an address changes its answer at once
    addr = nopie.symbols["alpha"]
    s.register_jit(PID, addr, addr + 16, "jitted")
    assert s.function_name(s.function_id(PID, addr)) == "jitted"


def test_cheap_mode_leaves_slow_reads_to_warm(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """Cheap answers come only from what is loaded: the first address of a binary
    (its symbols not read yet) is `unresolved` and noted; warm() reads it, and the
    same addresses then answer as the full mode does, with file and line."""
    b = binaries["pie"]
    base = 0x5500_0000_0000
    fake.add(PID, maps_lines(b, base))
    s = symbolizer(fake, clock, tmp_path)
    alpha, beta = base + b.symbols["alpha"] + 1, base + b.symbols["beta"] + 1
    U = 2**64 - 1
    assert s.function_ids([PID, PID], [alpha, beta], cheap=True, unresolved=U) == [U, U]
    assert s.stack_id(PID, [alpha, beta], cheap=True, unresolved=U) == U
    assert s.cache_sizes()["binaries"] == 0 and s.cheap_misses == 4
    assert s.warm(10.0) == 0
    got = s.function_ids([PID, PID], [alpha, beta], cheap=True, unresolved=U)
    assert got == [s.function_id(PID, alpha), s.function_id(PID, beta)] and U not in got
    st = s.stack_id(PID, [alpha, beta], cheap=True, unresolved=U)
    assert st != U and [f.function for f in s.stack(st)] == ["alpha", "beta"]
    assert s.stack(st)[0].line > 0


def test_resolver_labels_what_it_did_not_resolve() -> None:
    """The runtime's resolver: a stack whose frames are gone from the source is
    GONE_STACK, an address over the cheap mode UNRESOLVED; both named by a label."""
    from meridian.tools.sentinel.aggregator import UNRESOLVED
    from meridian.tools.sentinel.flows import FlowNames
    from meridian.tools.sentinel.resolver import GONE_STACK, RuntimeNames, SymbolResolver

    class Cheap:
        def function_id(self, pid: int, ip: int) -> int:
            return 1

        def function_ids(
            self, pids: Any, ips: Any, cheap: bool = False, unresolved: int = 0
        ) -> list[int]:
            return [unresolved if cheap else 1 for _ in ips]

        def stack_id(self, pid: int, ips: Any, cheap: bool = False, unresolved: int = 0) -> int:
            return unresolved if cheap else 5

        def warm(self, budget_s: float) -> int:
            return 0

        def function_name(self, function_id: int) -> str:
            return "f"

        def stack(self, stack_id: int) -> tuple[Any, ...]:
            return ("frame",)

    sym = Cheap()
    r = SymbolResolver(sym, lambda sid: (0x1000,) if sid == 1 else ())  # type: ignore[arg-type]
    assert r.function_ids([1], [0x1000]) == [UNRESOLVED]
    assert r.callstack_id(1, 1, -14, 0x1000) == UNRESOLVED
    assert r.callstack_id(1, 2, -14, 0x1000) == GONE_STACK  # id 2: frames gone
    names = RuntimeNames(FlowNames(), threading.Lock(), sym)  # type: ignore[arg-type]
    assert names.function(UNRESOLVED).startswith("[unresolved")
    assert names.stack(UNRESOLVED)[0].startswith("[unresolved")
    assert names.stack(GONE_STACK)[0].startswith("[stack gone")
    assert names.stack(3) == ["frame"]
