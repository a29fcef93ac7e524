"""The sentinel symbolizer on kernel addresses: a kallsyms fixture (aliases, data
symbols, modules, BPF programs), addresses hidden by kptr_restrict, and the real
/proc/kallsyms."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from symbolizer_fakes import Clock, FakeProc, symbolizer

from meridian.tools.sentinel.symbols.kallsyms import KernelSymbols
from meridian.tools.sentinel.symbols.symbolizer import Frame, Symbolizer

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
