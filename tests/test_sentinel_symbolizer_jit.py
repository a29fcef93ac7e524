"""The sentinel symbolizer on JIT code: perf-PID.map files (parsed, overlapping, read
again as they grow) and regions registered for pids /proc does not know."""

from __future__ import annotations

from pathlib import Path

from symbolizer_fakes import PID, Binary, Clock, FakeProc, symbolizer

from meridian.tools.sentinel.symbols.perfmap import JitRegions, PerfMapFile, parse_perf_map
from meridian.tools.sentinel.symbols.symbolizer import Frame


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
