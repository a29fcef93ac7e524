"""The stack maps' reader on a fake map: a stack that does not start at the sample's
ip is another's (the kernel's lookup race, sources/stackmaps.py), counted as raced
and never given to the sample; the resolver labels such a sample's stack as gone."""

from __future__ import annotations

from typing import Any

import numpy as np

from meridian.tools.sentinel.pipeline.resolver import GONE_STACK, SymbolResolver
from meridian.tools.sentinel.sources.stackmaps import STACK_DEPTH, STACK_SIDE_B, StackSides

KERNEL_IP = 0xFFFF_FFFF_8100_0000


class FakeMap:
    def __init__(self, stacks: dict[int, tuple[int, ...]]) -> None:
        self.stacks = stacks
        self.lookups = 0

    def lookup(self, idx: int) -> np.ndarray[Any, Any] | None:
        self.lookups += 1
        found = self.stacks.get(idx)
        if found is None:
            return None
        val = np.zeros(STACK_DEPTH, dtype="<u8")
        val[: len(found)] = found
        return val


class FakeObj:
    def __init__(self, a: dict[int, tuple[int, ...]], b: dict[int, tuple[int, ...]]) -> None:
        self.maps = {"ms_stacks": FakeMap(a), "ms_stacks_b": FakeMap(b)}


def test_a_stack_that_does_not_start_at_the_ip_is_counted_as_raced() -> None:
    obj = FakeObj({3: (0x401000, 0x402000)}, {3: (0x501000,)})
    sides = StackSides(64)
    assert sides.ips(obj, 3, 0x401000) == (0x401000, 0x402000)  # type: ignore[arg-type]
    assert sides.ips(obj, 3, 0x401008) == ()  # type: ignore[arg-type]
    assert sides.ips(obj, 3) == (0x401000, 0x402000)  # type: ignore[arg-type]
    assert sides.ips(obj, 3 | STACK_SIDE_B, 0x501000) == (0x501000,)  # type: ignore[arg-type]
    assert sides.ips(obj, 9, 0x401000) == ()  # type: ignore[arg-type]
    assert obj.maps["ms_stacks"].lookups == 2  # id 3 read once, then from the cache
    assert sides.counts()["raced"] == 1 and sides.counts()["gone"] == 1


class Symbols:
    def stack_id(self, pid: int, ips: Any, cheap: bool = False, unresolved: int = 0) -> int:
        return len(ips)  # the number of frames: which parts were joined


def test_the_resolver_checks_the_stack_taken_in_the_sample_s_own_mode() -> None:
    """A kernel sample: its kernel stack must start at the ip, its user stack is not
    checkable. A user sample: its user stack must start at the ip. A part that fails
    labels the whole stack gone, not a stack with a part missing."""
    stacks = {1: (KERNEL_IP, KERNEL_IP + 64), 2: (0x401000, 0x402000, 0x403000)}
    asked: list[tuple[int, int | None]] = []

    def stack_ips(sid: int, first: int | None) -> tuple[int, ...]:
        asked.append((sid, first))
        found = stacks.get(sid, ())
        return () if first is not None and found[:1] != (first,) else found

    r = SymbolResolver(Symbols(), stack_ips)  # type: ignore[arg-type]
    assert r.callstack_id(7, 2, 1, KERNEL_IP) == 5
    assert asked == [(1, KERNEL_IP), (2, None)]
    assert r.callstack_id(7, 2, 1, KERNEL_IP + 8) == GONE_STACK
    assert r.callstack_id(7, 2, -2, 0x401000) == 3
    assert asked[-1] == (2, 0x401000)
    assert r.callstack_id(7, 2, -2, 0x401004) == GONE_STACK
    assert r.callstack_id(7, 3, 1, KERNEL_IP) == GONE_STACK  # the user part is gone
