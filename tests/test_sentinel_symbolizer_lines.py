"""DWARF line tables past the old 16 KiB bound (issue 25 item 8.3): a program of many
functions built here with gcc -g (DWARF 4 and 5), whose .debug_line is some 60 KiB,
resolves an address to its own file:line, exactly as pyelftools' decoding of the
same table says for every row; through the Symbolizer, warm() decodes the table
without holding the lock the agent's consumer needs."""

from __future__ import annotations

import shutil
import subprocess
import threading
from bisect import bisect_right
from pathlib import Path
from typing import Any

import pytest
from symbolizer_fakes import PID, Binary, Clock, FakeProc, loads, maps_lines, nm, symbolizer

from meridian.tools.sentinel.symbols import elf as elf_module
from meridian.tools.sentinel.symbols.dwarflines import decode_lines
from meridian.tools.sentinel.symbols.elf import ElfSymbols

FUNCTIONS = 1200


def source() -> tuple[str, dict[str, int]]:
    """C with FUNCTIONS functions of a few lines each, and main calling them; the line
    of each function's first statement: where its first instruction is (a leaf at -O1
    has no prologue, so the rows of its opening line and of its first statement share
    that address, and the last row at an address is the one that answers, as
    addr2line answers)."""
    text = ["#include <stdio.h>"]
    first = {}
    for i in range(FUNCTIONS):
        text.append(f"__attribute__((noinline)) int f{i}(int x) {{")
        first[f"f{i}"] = len(text) + 1
        text += [f"    int y = x * {i + 3};", "    y ^= x >> 3;", f"    return y + {i};", "}"]
    text.append("int main(int argc, char **argv) {")
    text += [f"    argc += f{i}(argc);" for i in range(FUNCTIONS)]
    text += ["    return argc & 1;", "}"]
    return "\n".join(text) + "\n", first


def addr2line(path: Path, addrs: list[int]) -> list[tuple[str, int]]:
    """binutils' answers, the other oracle."""
    cmd = ["addr2line", "-e", str(path), *(f"{a:x}" for a in addrs)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [(f, int(n)) for f, n in (line.rsplit(":", 1) for line in out.splitlines())]


@pytest.fixture(scope="module", params=[4, 5])
def big(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(binary, source file, first line of each function), built with DWARF 4 or 5."""
    if not all(shutil.which(tool) for tool in ("gcc", "nm", "addr2line", "strip")):
        pytest.skip("gcc and binutils are needed to build the test binaries")
    d = tmp_path_factory.mktemp(f"dwarf{request.param}")
    text, starts = source()
    src = d / "big.c"
    src.write_text(text)
    path = d / "big"
    cmd = ["gcc", "-g", f"-gdwarf-{request.param}", "-O1", "-fPIE", "-pie", "-o", str(path)]
    subprocess.run([*cmd, str(src)], check=True, capture_output=True)
    return Binary(path, nm(path), loads(path), True), src, starts


def line_bytes(path: Path) -> int:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        section = ELFFile(f).get_section_by_name(".debug_line")
        assert section is not None
        return int(section.data_size)


def test_a_line_table_over_16_kib_resolves_each_function(big: Any) -> None:
    b, src, starts = big
    assert line_bytes(b.path) > 16 << 10
    table = ElfSymbols.load(str(b.path), debug_root=None)
    names = ["f0", "f1", "f457", f"f{FUNCTIONS - 1}"]
    for name in names:
        assert table.lookup(b.symbols[name]) == (name, 0)
        assert table.line(b.symbols[name]) == (str(src), starts[name]), name
    addrs = [b.symbols[n] + k for n in [*names, "main"] for k in (0, 3, 6)]
    assert [table.line(a) for a in addrs] == addr2line(b.path, addrs)


def reference(path: Path) -> tuple[list[int], list[tuple[str, int]]]:
    """The rows by pyelftools' own line programs (slow, independent of dwarflines.py):
    addresses sorted, an end of sequence before a sequence starting there."""
    from elftools.elf.elffile import ELFFile

    rows = []
    with open(path, "rb") as f:
        dwarf = ELFFile(f).get_dwarf_info()
        for cu in dwarf.iter_CUs():
            prog = dwarf.line_program_for_CU(cu)
            assert prog is not None
            header = prog.header
            v5 = header["version"] >= 5
            dirs = [d.decode() for d in header["include_directory"]]
            names = {}
            for i, e in enumerate(header["file_entry"]):
                d = e.dir_index if v5 else e.dir_index - 1
                folder = dirs[d] if 0 <= d < len(dirs) else ""
                names[i if v5 else i + 1] = str(Path(folder, e.name.decode()))
            for n, entry in enumerate(prog.get_entries()):
                st = entry.state
                if st is not None:
                    where = ("", 0) if st.end_sequence else (names[st.file], st.line)
                    rows.append((st.address, 0 if st.end_sequence else 1, n, where))
    rows.sort()
    return [r[0] for r in rows], [r[3] for r in rows]


def test_every_row_as_pyelftools_decodes_it(big: Any) -> None:
    b, _, _ = big
    addrs, where = reference(b.path)
    table = decode_lines(str(b.path))
    assert 0 < len(table) <= len(addrs)
    for probe in sorted({*addrs, *(a + 1 for a in addrs)}):
        assert table.find(probe) == where[bisect_right(addrs, probe) - 1], hex(probe)


def test_warm_decodes_lines_outside_the_lock(
    big: Any, fake: FakeProc, clock: Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cheap stack of the big binary waits for warm(); warm() reads the symbols,
    then decodes the line table while another thread takes the symbolizer's lock (the
    consumer's cheap lookups go on); the stack then has its file:line."""
    b, src, starts = big
    base = 0x5500_0000_0000
    fake.add(PID, maps_lines(b, base))
    s = symbolizer(fake, clock, tmp_path)
    last = f"f{FUNCTIONS - 1}"
    ips = [base + b.symbols["f457"], base + b.symbols[last]]
    pst = s.stack_id(PID, ips, cheap=True, unresolved=0)
    assert pst != 0 and s.stack(pst) == ()
    taken: list[bool] = []
    decode = decode_lines

    def take() -> None:  # as the consumer does, on its own thread
        got = s._lock.acquire(timeout=2)
        taken.append(got)
        if got:
            s._lock.release()

    def watched(path: str) -> Any:
        other = threading.Thread(target=take)
        other.start()
        other.join()
        return decode(path)

    monkeypatch.setattr(elf_module, "decode_lines", watched)
    assert s.warm(30.0) == 0
    assert taken == [True]  # decoded once, the lock free meanwhile
    frames = s.stack(pst)
    assert [(f.function, f.file, f.line) for f in frames] == [
        ("f457", str(src), starts["f457"]),
        (last, str(src), starts[last]),
    ]


def test_a_table_over_the_bound_is_not_decoded(big: Any) -> None:
    b, _, _ = big
    table = ElfSymbols.load(str(b.path), debug_root=None, max_line_bytes=16 << 10)
    assert table.lookup(b.symbols["f1"]) == ("f1", 0)
    assert table.line(b.symbols["f1"]) == ("", 0) and not table.lines_pending
    assert elf_module.MAX_LINE_BYTES == 16 << 20


def test_no_table_and_a_stripped_table(big: Any, tmp_path: Path) -> None:
    b, _, _ = big
    stripped = tmp_path / "big"
    shutil.copy(b.path, stripped)
    subprocess.run(["strip", "-g", str(stripped)], check=True)
    assert len(decode_lines(str(stripped))) == 0
    assert len(decode_lines(str(tmp_path / "missing"))) == 0
    (tmp_path / "text").write_text("not ELF")
    assert len(decode_lines(str(tmp_path / "text"))) == 0
    assert ElfSymbols.load(str(stripped), debug_root=None).line(b.symbols["f1"]) == ("", 0)


def test_a_table_whose_length_runs_past_its_section(big: Any, tmp_path: Path) -> None:
    """A corrupt unit length (past the end of the section): no exception, and the rows
    decoded before the bytes ran out still answer."""
    from elftools.elf.elffile import ELFFile

    b, src, starts = big
    with open(b.path, "rb") as f:
        section = ELFFile(f).get_section_by_name(".debug_line")
        assert section is not None
        offset = section["sh_offset"]
    data = bytearray(b.path.read_bytes())
    data[offset : offset + 4] = (0x7FFF_FFF0).to_bytes(4, "little")
    broken = tmp_path / "broken"
    broken.write_bytes(bytes(data))
    table = decode_lines(str(broken))
    assert table.find(b.symbols["f0"]) == (str(src), starts["f0"])
