"""The sentinel symbolizer's ids: functions, stacks and data objects interned and
bounded, the cheap mode that leaves slow reads to warm(), and the runtime's resolver
labels for what it did not resolve."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from symbolizer_fakes import PID, Binary, Clock, FakeProc, maps_lines, symbolizer

from meridian.tools.sentinel.model.rollup import PROVISIONAL_BASE, is_provisional
from meridian.tools.sentinel.symbols.symbolizer import DataObject


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


def test_cheap_mode_leaves_slow_reads_to_warm(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """Cheap answers come only from what is loaded: the first address of a binary
    (its symbols not read yet) gets a provisional id (the same when asked again) and
    is noted; warm() reads it and resolves the provisional id to the function's id
    (its name and storage key from then on), and the same addresses then answer as
    the full mode does, with file and line. A stack likewise, and storage gets a
    stack row for its provisional id. `missed` (what the symbols thread sleeps on)
    is set while an address waits, clear after."""
    b = binaries["pie"]
    base = 0x5500_0000_0000
    fake.add(PID, maps_lines(b, base))
    s = symbolizer(fake, clock, tmp_path)
    alpha, beta = base + b.symbols["alpha"] + 1, base + b.symbols["beta"] + 1
    U = 2**64 - 1
    assert not s.missed.is_set()
    first = s.function_ids([PID, PID], [alpha, beta], cheap=True, unresolved=U)
    assert all(is_provisional(i) for i in first) and first[0] != first[1]
    assert s.function_ids([PID], [alpha], cheap=True, unresolved=U) == first[:1]
    assert s.missed.is_set()
    assert s.function_key(first[0]) is None and s.canonical_function(first[0]) is None
    pst = s.stack_id(PID, [alpha, beta], cheap=True, unresolved=U)
    assert is_provisional(pst) and s.stack(pst) == () and s.canonical_stack(pst) is None
    assert s.cache_sizes()["binaries"] == 0 and s.cheap_misses == 5
    assert s.warm(10.0) == 0 and not s.missed.is_set()
    fa, fb = s.function_id(PID, alpha), s.function_id(PID, beta)
    assert [s.canonical_function(i) for i in first] == [fa, fb]
    assert s.function_key(first[0]) == (str(b.path), "alpha")
    assert s.function_name(first[1]) == "beta"
    assert s.function_ids([PID, PID], [alpha, beta], cheap=True, unresolved=U) == [fa, fb]
    st = s.stack_id(PID, [alpha, beta], cheap=True, unresolved=U)
    assert not is_provisional(st) and s.canonical_stack(pst) == st
    assert [f.function for f in s.stack(st)] == ["alpha", "beta"] and s.stack(pst) == s.stack(st)
    assert s.stack(st)[0].line > 0
    written = dict(s.consume_stacks())
    assert written[pst] == written[st] == s.stack(st)


def test_provisional_ids_are_bounded(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """Past `max_provisional` ids waiting at once, a cheap answer is `unresolved` (as
    before provisional ids); once they are resolved, new ones are given again."""
    b = binaries["pie"]
    base = 0x5500_0000_0000
    fake.add(PID, maps_lines(b, base))
    s = symbolizer(fake, clock, tmp_path, max_provisional=2)
    ips = [base + b.symbols[n] + 1 for n in ("alpha", "beta", "main")]
    U = 2**64 - 1
    got = s.function_ids([PID] * 3, ips, cheap=True, unresolved=U)
    assert is_provisional(got[0]) and is_provisional(got[1]) and got[2] == U
    assert s.warm(10.0) == 0
    assert s.function_name(got[1]) == "beta"
    fake.add(PID + 1, maps_lines(binaries["nopie"], 0))
    other = binaries["nopie"].symbols["alpha"] + 1
    assert is_provisional(s.function_ids([PID + 1], [other], cheap=True, unresolved=U)[0])


def test_non_addresses_need_no_reads(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """A user stack walked by frame pointers through code built without them ends in
    garbage above any user address: such a frame is "[unknown]" at once, even in cheap
    mode, and does not hold its stack back for a read of /proc or a perf map."""
    b = binaries["pie"]
    base = 0x5500_0000_0000
    fake.add(PID, maps_lines(b, base))
    s = symbolizer(fake, clock, tmp_path)
    alpha = base + b.symbols["alpha"] + 1
    garbage = 0x51C9_3A77_0000_1234
    U = 2**64 - 1
    s.frame(PID, alpha)  # the binary's symbols and line table read
    st = s.stack_id(PID, [alpha, garbage], cheap=True, unresolved=U)
    assert st != U and s.cheap_misses == 0 and not s.missed.is_set()
    assert [f.function for f in s.stack(st)] == ["alpha", "[unknown]"]
    assert s.function_ids([PID], [garbage], cheap=True, unresolved=U) != [U]
    # an unmapped address that could be a user one still waits for the reads
    assert is_provisional(s.stack_id(PID, [alpha, 0x7F00_0000_0000], cheap=True, unresolved=U))


def test_resolver_labels_what_it_did_not_resolve() -> None:
    """The runtime's resolver: a stack whose frames are gone from the source is
    GONE_STACK, an address over the cheap mode UNRESOLVED; both named by a label, as
    is a provisional id still waiting for its read (ranked as UNRESOLVED)."""
    WAITING = PROVISIONAL_BASE + 7
    from meridian.tools.sentinel.model.flows import FlowNames
    from meridian.tools.sentinel.model.rollup import UNRESOLVED
    from meridian.tools.sentinel.pipeline.resolver import GONE_STACK, RuntimeNames, SymbolResolver

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

        def canonical_function(self, function_id: int) -> int | None:
            return None if function_id == WAITING else function_id

        def canonical_stack(self, stack_id: int) -> int | None:
            return None if stack_id == WAITING else stack_id

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
    assert names.function(WAITING).startswith("[unresolved")
    assert names.stack(WAITING)[0].startswith("[unresolved")
    assert names.canonical_function(WAITING) == names.canonical_stack(WAITING) == UNRESOLVED
    assert names.canonical_function(3) == 3 and names.canonical_stack(GONE_STACK) == GONE_STACK
