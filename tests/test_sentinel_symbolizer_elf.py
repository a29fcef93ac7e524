"""The sentinel symbolizer's ELF reading against binaries built here with gcc (PIE,
non-PIE, a shared library, stripped, with a debug file by build id), a live process
through the real /proc, the text of a frame, and the missing extra."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from symbolizer_fakes import PROG, Binary

from meridian.errors import ExtraMissing
from meridian.tools.sentinel.symbols.elf import ElfSymbols
from meridian.tools.sentinel.symbols.symbolizer import Frame, Symbolizer


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
