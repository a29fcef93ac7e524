"""The sentinel symbolizer on JIT code: perf-PID.map files (parsed, overlapping, read
again as they grow), regions registered for pids /proc does not know, and the build
id of a registered image: the image that has it names the code (not another written to
the same path; its debug file by build id when the file is gone), read once."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from symbolizer_fakes import PID, Binary, Clock, FakeProc, symbolizer

from meridian.tools.sentinel.symbols.elf import ElfSymbols
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


# ---- the build id of a registered image (issue 25 item 8.4) -----------------------------


def debug_copy(image: Path, root: Path, build_id: str) -> Path:
    """The image's debug file where -dbgsym packages put it: root/.build-id/xx/rest.debug."""
    debug = root / ".build-id" / build_id[:2] / (build_id[2:] + ".debug")
    debug.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(image), str(debug)], check=True)
    return debug


@pytest.fixture
def image(binaries: dict[str, Binary], tmp_path: Path) -> tuple[Path, str, Binary]:
    """A JIT's image written out (the test library), its build id and its symbols."""
    lib = binaries["lib.so"]
    path = tmp_path / "jit-image.so"
    shutil.copy(lib.path, path)
    build_id = ElfSymbols.load(str(path), debug_root=None).build_id
    assert build_id
    return path, build_id, lib


def test_an_image_replaced_at_its_path_is_not_used_for_the_old_build_id(
    image: tuple[Path, str, Binary],
    binaries: dict[str, Binary],
    fake: FakeProc,
    clock: Clock,
    tmp_path: Path,
) -> None:
    """The JIT wrote another image (another build id) to the same path: the region
    registered with the first image's build id is not named from the new file's
    symbols; with the first image's debug file kept (by build id) it is named right."""
    path, build_id, lib = image
    start = 0x40000
    beta = start + lib.symbols["beta"] + 2
    shutil.copy(binaries["pie"].path, path)  # the next image, same path
    s = symbolizer(fake, clock, tmp_path, debug_root=str(tmp_path / "debug"))
    s.register_jit(777, start, start + 0x10000, str(path), build_id=build_id.upper())
    f = s.frame(777, beta)
    assert (f.binary, f.function) == ("[jit]", str(path))  # the region, not a wrong name
    debug_copy(lib.path, tmp_path / "debug", build_id)
    s = symbolizer(fake, clock, tmp_path, debug_root=str(tmp_path / "debug"))
    s.register_jit(777, start, start + 0x10000, str(path), build_id=build_id)
    f = s.frame(777, beta)
    assert (f.binary, f.function, f.offset) == (str(path), "beta", 2)
    assert f.file.endswith("prog.c") and f.line > 0
    other = s.frame(777, start + lib.symbols["alpha"])
    assert (other.function, other.offset) == ("alpha", 0)


def test_a_deleted_image_is_found_by_its_build_id(
    image: tuple[Path, str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    path, build_id, lib = image
    debug_copy(path, tmp_path / "debug", build_id)
    path.unlink()  # written out for the agent, then cleaned up
    s = symbolizer(fake, clock, tmp_path, debug_root=str(tmp_path / "debug"))
    s.register_jit(777, 0x40000, 0x50000, str(path), build_id=build_id)
    s.register_jit(778, 0x80000, 0x90000, str(path))  # no build id: the path only
    assert s.frame(777, 0x40000 + lib.symbols["beta"]).function == "beta"
    assert s.frame(778, 0x80000 + lib.symbols["beta"]).function == str(path)


def test_an_image_is_read_once_for_every_registration_of_its_build_id(
    image: tuple[Path, str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """Two processes (and a registration again) of one image: one table, read once;
    without a build id, one per registration as before."""
    path, build_id, lib = image
    s = symbolizer(fake, clock, tmp_path)
    for pid, start in ((777, 0x40000), (778, 0x60000), (777, 0x80000)):
        s.register_jit(pid, start, start + 0x10000, str(path), build_id=build_id)
        assert s.frame(pid, start + lib.symbols["alpha"] + 1).function == "alpha"
    assert s.cache_sizes()["binaries"] == 1
    s.register_jit(779, 0x40000, 0x50000, str(path))
    s.register_jit(780, 0x40000, 0x50000, str(path))
    assert s.frame(779, 0x40000 + lib.symbols["beta"]).function == "beta"
    assert s.frame(780, 0x40000 + lib.symbols["beta"]).function == "beta"
    assert s.cache_sizes()["binaries"] == 3


def test_an_image_not_there_yet_is_read_again_by_a_new_registration(
    image: tuple[Path, str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    path, build_id, lib = image
    later = tmp_path / "later.so"
    s = symbolizer(fake, clock, tmp_path)
    s.register_jit(777, 0x40000, 0x50000, str(later), build_id=build_id)
    assert s.frame(777, 0x40000 + lib.symbols["beta"]).function == str(later)
    shutil.copy(path, later)
    s.register_jit(777, 0x40000, 0x50000, str(later), build_id=build_id)
    assert s.frame(777, 0x40000 + lib.symbols["beta"]).function == "beta"
