"""The stack maps' reader on a fake map: a sample whose ip is not the first frame of
the stack taken in its own mode names another's frames (the kernel's lookup race,
sources/stackmaps.py); it gets RACED_STACK_ID for both ids, is counted, and the
resolver labels its stack as gone."""

from __future__ import annotations

from typing import Any

import numpy as np

from meridian.tools.sentinel.model.records import RACED_STACK_ID
from meridian.tools.sentinel.pipeline.resolver import GONE_STACK, SymbolResolver
from meridian.tools.sentinel.sources.stackmaps import STACK_DEPTH, STACK_SIDE_B, StackSides

KERNEL_IP = 0xFFFF_FFFF_8100_0000
SAMPLE = np.dtype([("ip", "<u8"), ("user_stack_id", "<i8"), ("kernel_stack_id", "<i8")])


class FakeMap:
    def __init__(self, stacks: dict[int, tuple[int, ...]]) -> None:
        self.stacks = stacks

    def lookup(self, idx: int) -> np.ndarray[Any, Any] | None:
        found = self.stacks.get(idx)
        if found is None:
            return None
        val = np.zeros(STACK_DEPTH, dtype="<u8")
        val[: len(found)] = found
        return val


class FakeObj:
    def __init__(self, a: dict[int, tuple[int, ...]], b: dict[int, tuple[int, ...]]) -> None:
        self.maps = {"ms_stacks": FakeMap(a), "ms_stacks_b": FakeMap(b)}


def samples(*rows: tuple[int, int, int]) -> np.ndarray[Any, Any]:
    return np.array(list(rows), dtype=SAMPLE)


def test_a_sample_whose_ip_is_not_its_stack_s_first_frame_is_marked_raced() -> None:
    user, kernel, b_side = 3, 5, 7 | STACK_SIDE_B
    obj: Any = FakeObj({3: (0x401000, 0x402000), 5: (KERNEL_IP, KERNEL_IP + 64)}, {7: (0x501000,)})
    sides = StackSides(64)
    first = samples((0x401000, user, -14), (KERNEL_IP, user, kernel), (0x501000, b_side, -14))
    sides.after_poll(obj, first, 0.0)
    assert sides.counts()["raced"] == 0  # nothing read yet: nothing to check against
    assert sides.ips(obj, user) == (0x401000, 0x402000)
    assert sides.ips(obj, kernel) == (KERNEL_IP, KERNEL_IP + 64)
    assert sides.ips(obj, b_side) == (0x501000,)
    later = samples(
        (0x401000, user, -14),  # its own: kept
        (0x401008, user, -14),  # a user sample on another's user stack
        (KERNEL_IP, 9, kernel),  # its own kernel stack; its user stack is not checked
        (KERNEL_IP + 8, user, kernel),  # a kernel sample on another's kernel stack
        (0x501004, b_side, -14),  # on side b
        (0x601000, 11, -14),  # an id not read yet: nothing to check
    )
    sides.after_poll(obj, later, 0.0)
    raced = [RACED_STACK_ID, RACED_STACK_ID]
    assert later[["user_stack_id", "kernel_stack_id"]].tolist() == [
        (user, -14), tuple(raced), (9, kernel), tuple(raced), tuple(raced), (11, -14)
    ]  # fmt: skip
    assert sides.counts()["raced"] == 3


def test_the_resolver_labels_a_raced_stack_gone() -> None:
    asked: list[int] = []

    def stack_ips(sid: int) -> tuple[int, ...]:
        asked.append(sid)
        return (0x401000,)

    class Symbols:
        def stack_id(self, pid: int, ips: Any, cheap: bool = False, unresolved: int = 0) -> int:
            return 42

    r = SymbolResolver(Symbols(), stack_ips)  # type: ignore[arg-type]
    assert r.callstack_id(7, RACED_STACK_ID, RACED_STACK_ID, 0x401008) == GONE_STACK
    assert asked == []
    assert r.callstack_id(7, 3, -14, 0x401000) == 42
