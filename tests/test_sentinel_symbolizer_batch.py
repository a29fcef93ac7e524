"""The symbolizer's batch path (numpy over sorted symbol starts) against its per-address
path: kallsyms.find against lookup on the real /proc/kallsyms, ElfSymbols.vaddrs and
find against vaddr and lookup on real binaries (python3, libc), and function_ids of a
batch against function_id address by address, on this very process and on a fake
/proc whose mappings hold what the per-address path answers as "[unknown]"."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from symbolizer_fakes import PID, Binary, Clock, FakeProc, maps_lines, odd_mappings, symbolizer

from meridian.tools.sentinel.symbols.elf import ElfSymbols
from meridian.tools.sentinel.symbols.kallsyms import KERNEL_START, KernelSymbols
from meridian.tools.sentinel.symbols.procview import parse_maps
from meridian.tools.sentinel.symbols.symbolizer import Symbolizer

Array = np.ndarray[Any, Any]
RNG = np.random.default_rng(26)


def around(starts: Array, lo: int, hi: int, n: int = 20_000) -> Array:
    """Addresses a lookup must tell apart: each start, one byte either side of it,
    and random ones in [lo, hi)."""
    starts = starts.astype(np.uint64)
    edges = np.concatenate([starts, starts + np.uint64(1), starts - np.uint64(1)])
    rand = RNG.integers(lo, hi, size=n, dtype=np.uint64, endpoint=False)
    return np.concatenate([edges, rand, np.array([lo, hi - 1], dtype=np.uint64)])


@pytest.mark.skipif(os.geteuid() != 0, reason="kallsyms addresses need root")
def test_kallsyms_find_is_lookup() -> None:
    ks = KernelSymbols("/proc/kallsyms")
    ks.reload()
    if ks.hidden or not len(ks):
        pytest.skip("kptr_restrict hides kernel addresses")
    starts = np.frombuffer(ks._addrs, dtype=np.uint64)
    some = np.concatenate([starts[:100], RNG.choice(starts, 10_000), starts[-100:]])
    addrs = around(some, KERNEL_START, (1 << 64) - 1)
    index = ks.find(addrs)
    for addr, i in zip(addrs.tolist(), index.tolist(), strict=True):
        hit = ks.lookup(addr)
        if i < 0:
            assert hit is None, hex(addr)
        else:
            name, module = ks.symbol(i)
            assert hit == (name, addr - ks._addrs[i], module), hex(addr)
    assert (index >= 0).sum() > len(some)  # the test found symbols, not only gaps
    idle = ks.idle_text(addrs)
    assert [ks.idle(a) for a in addrs[idle].tolist()] == [True] * int(idle.sum())


def mapped_libc() -> str:
    for m in parse_maps(Path("/proc/self/maps").read_text()):
        if "/libc.so" in m.path or "/libc-" in m.path:
            return m.path
    pytest.skip("no libc mapped in this process")


@pytest.mark.parametrize("which", ["/usr/bin/python3", "libc", "this python"])
def test_elf_vaddrs_and_find_are_vaddr_and_lookup(which: str) -> None:
    if which == "libc":
        path = os.path.realpath(mapped_libc())
    else:
        path = os.path.realpath(sys.executable if which == "this python" else which)
    if not os.path.exists(path):
        pytest.skip(f"no {path}")
    table = ElfSymbols.load(path)
    if len(table) < 100:
        table = ElfSymbols.load(mapped_python())  # a python linked to libpython
    assert table.ok and len(table) > 100
    size = os.path.getsize(path)
    offsets = RNG.integers(0, size + (1 << 16), size=20_000, dtype=np.uint64)
    edges = [s.offset + d for s in table.segments for d in (-1, 0, 1, s.filesz - 1, s.filesz)]
    offsets = np.concatenate([offsets, np.array([e for e in edges if e >= 0], dtype=np.uint64)])
    vaddrs = table.vaddrs(offsets)
    for off, got in zip(offsets.tolist(), vaddrs.tolist(), strict=True):
        want = table.vaddr(off)
        assert got == (-1 if want is None or want < 0 else want), off
    for seg in table.segments:  # the offsets of one mapping: one segment at once
        inside = RNG.integers(seg.offset, seg.offset + max(seg.filesz, 1), size=500)
        one = [table.vaddr(o) for o in inside.tolist()]
        assert table.vaddrs(inside.astype(np.uint64)).tolist() == [
            -1 if v is None or v < 0 else v for v in one
        ]
    starts = np.frombuffer(table._starts, dtype=np.uint64).astype(np.int64)
    at = np.concatenate([vaddrs, around(starts, 0, int(starts.max()) + 4096).astype(np.int64)])
    index = table.find(at)
    for vaddr, i in zip(at.tolist(), index.tolist(), strict=True):
        hit = table.lookup(vaddr) if vaddr >= 0 else None
        assert hit == (None if i < 0 else (table.name(i), vaddr - table._starts[i])), vaddr
    assert (index >= 0).sum() > 1000


def mapped_python() -> str:
    for m in parse_maps(Path("/proc/self/maps").read_text()):
        if "/libpython" in m.path:
            return m.path
    return os.path.realpath(sys.executable)


def process_addresses(pid: int) -> Array:
    """Random addresses in the mappings of a process (more in its code), and some in
    none."""
    out = [np.array([0, 0x10, (1 << 56) + 5], dtype=np.uint64)]
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        span, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in span.split("-"))
        n = 200 if "x" in perms else 5
        out.append(RNG.integers(lo, hi, size=n, dtype=np.uint64))
    return np.concatenate(out)


def check_batch(s: Symbolizer, pids: Array, ips: Array) -> float:
    """function_ids of the batch == function_id of each address; returns the share of
    addresses the batch path answered itself."""
    s.function_ids(pids, ips)  # every table read
    batch = s.function_ids(pids, ips)
    one_by_one = [s.function_id(p, ip) for p, ip in zip(pids.tolist(), ips.tolist(), strict=True)]
    assert batch == one_by_one
    with s._lock:
        answered = s._batch(pids.astype(np.int64), ips.astype(np.uint64))
    assert [int(a) for a in answered[answered != 0]] == [
        b for a, b in zip(answered.tolist(), batch, strict=True) if a
    ]
    return float(np.count_nonzero(answered)) / len(ips)


def test_function_ids_of_this_process_and_the_kernel(tmp_path: Path) -> None:
    s = Symbolizer(perf_map_dir=tmp_path)
    s.load_kernel()
    ips = process_addresses(os.getpid())
    kernel = np.array([], dtype=np.uint64)
    if os.geteuid() == 0 and not s._kernel.hidden and len(s._kernel):
        starts = np.frombuffer(s._kernel._addrs, dtype=np.uint64)
        some = starts[RNG.integers(0, len(starts), 5_000)] + np.uint64(3)
        kernel = np.append(some, np.array([KERNEL_START, (1 << 64) - 1], dtype=np.uint64))
    ips = np.concatenate([ips, kernel])
    pids = np.full(len(ips), os.getpid(), dtype=np.int64)
    pids[: len(ips) // 10] = 0  # pid 0: kernel addresses only resolve
    assert check_batch(s, pids, ips) > 0.5
    assert s.idle_function_ids() == frozenset(
        s.function_id(0, ip) for ip in ips.tolist() if ip >= KERNEL_START and s._kernel.idle(ip)
    )


def test_function_ids_of_mappings_named_unknown(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """Code in a binary, outside every function, in a file that is no ELF, in a deleted
    file, in [vdso] and anonymous memory (no perf map), in no mapping: one batch."""
    pie, lib = binaries["pie"], binaries["lib.so"]
    junk = tmp_path / "junk.so"
    junk.write_text("garbage")
    bias = 0x5555_0000_0000
    fake.add(
        PID,
        [
            *maps_lines(pie, bias),
            *maps_lines(lib, 0x7F00_0000_0000),
            *odd_mappings(junk),
        ],
    )
    fake.add(PID + 1, maps_lines(lib, 0x7E00_0000_0000))
    s = symbolizer(fake, clock, tmp_path)
    ips = [bias + v + d for v in pie.symbols.values() for d in (0, 1)]
    ips += [0x7F00_0000_0000 + v + 2 for v in lib.symbols.values()]
    ips += [bias + 0x10, 0x7000_0000_0010, 0x7000_0002_0010, 0x7000_0004_0010]
    ips += [0x7000_0005_0010, 0x7000_0005_0020, 0x1234_5678, 1 << 62]
    pids = [PID] * len(ips) + [PID + 1] * len(lib.symbols)
    ips += [0x7E00_0000_0000 + v for v in lib.symbols.values()]
    share = check_batch(s, np.array(pids), np.array(ips, dtype=np.uint64))
    assert share > 0.8
    names = {s.function_name(i) for i in s.function_ids(pids, ips)}
    assert {"alpha", "beta", "main", "[unknown] (junk.so)", "[unknown] ([vdso])"} <= names


def test_cheap_batches_leave_reads_to_warm(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """In cheap mode a batch reads nothing: what needs a read gets a provisional id (as
    address by address), and once warm() has read it, the batch path answers it."""
    pie = binaries["pie"]
    bias = 0x5555_0000_0000
    fake.add(PID, maps_lines(pie, bias))
    s = symbolizer(fake, clock, tmp_path)
    ips = [bias + pie.symbols[n] for n in ("alpha", "beta", "main")]
    first = s.function_ids([PID] * 3, ips, cheap=True, unresolved=7)
    assert s.cache_sizes()["binaries"] == 0 and all(i >= 1 << 62 for i in first)
    while s.warm(1.0):
        pass
    ids = s.function_ids([PID] * 3, ips, cheap=True, unresolved=7)
    assert [s.function_name(i) for i in ids] == ["alpha", "beta", "main"]
    assert [s.canonical_function(i) for i in first] == ids
    with s._lock:
        assert s._batch(np.full(3, PID), np.array(ips, dtype=np.uint64)).tolist() == ids


def test_memory_without_a_perf_map_needs_no_read(
    fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """Anonymous code of a process with no perf map is answered by the batch, cheap
    or not ("[unknown]" in its mapping, as address by address); once a perf map
    appears it is read again after recheck_s, by warm() in cheap mode, and names it."""
    anon = 0x7F00_0000_0000
    fake.add(PID, [f"{anon:x}-{anon + 0x100000:x} rwxp 00000000 00:00 0"])
    s = symbolizer(fake, clock, tmp_path)
    ips = [anon + 0x104, anon + 0x2000]
    first = s.function_ids([PID, PID], ips, cheap=True, unresolved=7)
    assert [s.function_name(i) for i in first] == ["[unknown] ([anon])"] * 2
    assert first == [s.function_id(PID, ip) for ip in ips]
    (tmp_path / f"perf-{PID}.map").write_text(f"{anon + 0x100:x} 40 handler\n")
    assert s.function_ids([PID], ips[:1], cheap=True, unresolved=7) == first[:1]  # recheck_s
    clock.now += 2
    waiting = s.function_ids([PID], ips[:1], cheap=True, unresolved=7)[0]
    assert waiting >= 1 << 62  # provisional: the perf map is read by warm()
    while s.warm(1.0):
        pass
    assert s.function_name(s.canonical_function(waiting) or 0) == "handler"
