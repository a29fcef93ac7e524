"""The sentinel symbolizer on kernel addresses: a kallsyms fixture (aliases, data
symbols, modules, BPF programs), addresses hidden by kptr_restrict, and the real
/proc/kallsyms."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
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


# 6.1's layout: the last vmlinux symbol is in .exit.text (freed after boot), far below
# the modules and BPF programs; code nobody listed lies in the gaps.
OWNERS = """\
ffffffff81000000 T startup_64
ffffffff81004000 t big_fn
ffffffff837f8f10 t mpls_gso_exit
ffffffffc0000000 t veth_open\t[veth]
ffffffffc0000800 t veth_close\t[veth]
ffffffffc0100000 t nft_init\t[nf_tables]
ffffffffc0103000 t nft_exit\t[nf_fables]
ffffffffc0200000 t bpf_prog_abc_handler\t[bpf]
"""


@pytest.mark.parametrize(
    ("addr", "found"),
    [
        (0xFFFFFFFF81003FFF, ("startup_64", 0x3FFF, "")),  # one owner: up to the next
        (0xFFFFFFFF81004000 + 0x100000, ("big_fn", 0x100000, "")),
        (0xFFFFFFFF837F9FFF, ("mpls_gso_exit", 0x10EF, "")),  # another owner next:
        (0xFFFFFFFF837FA000, None),  # the page after its start's page ends it
        (0xFFFFFFFFBFFFFFFF, None),
        (0xFFFFFFFFC0000900, ("veth_close", 0x100, "veth")),
        (0xFFFFFFFFC0002000, None),  # one module to another
        (0xFFFFFFFFC0103001, ("nft_exit", 1, "nf_fables")),  # alike, not equal
        (0xFFFFFFFFC01000FF, ("nft_init", 0xFF, "nf_tables")),
        (0xFFFFFFFFC0102000, None),
        (0xFFFFFFFFC0200FFF, ("bpf_prog_abc_handler", 0xFFF, "bpf")),  # the last
        (0xFFFFFFFFC0201000, None),
    ],
)
def test_a_symbol_ends_before_another_owners_gap(
    addr: int, found: tuple[str, int, str] | None
) -> None:
    ks = KernelSymbols("/nonexistent")
    ks.parse(OWNERS.encode())
    assert ks.lookup(addr) == found
    (i,) = ks.find(np.array([addr], dtype=np.uint64))
    assert (ks.symbol(i)[0] if i >= 0 else None) == (found[0] if found else None)


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
