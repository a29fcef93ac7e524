"""The sentinel symbolizer on user addresses through a fake /proc whose maps point at
binaries built here: PIE, non-PIE and shared-library load biases, addresses it cannot
name, its bounded caches, and views that follow exec, exit, pid reuse and dlopen."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from symbolizer_fakes import PID, Binary, Clock, FakeProc, maps_lines, odd_mappings, symbolizer


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
            *odd_mappings(junk),
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
