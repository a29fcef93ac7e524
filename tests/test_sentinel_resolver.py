"""pipeline/resolver.py over a fake symbolizer: what the aggregator's ids are asked
with (a stack's kernel frames first, stack id 0 a stack, the ip alone without one),
and the names RuntimeNames gives a stack id (labels, 0, a provisional id's stack)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meridian.tools.sentinel.model.flows import FlowNames
from meridian.tools.sentinel.model.records import RACED_STACK_ID
from meridian.tools.sentinel.model.rollup import GONE_STACK, STACK_LABELS, UNRESOLVED
from meridian.tools.sentinel.pipeline.resolver import RuntimeNames, SymbolResolver

STACKS = {0: (0xA0, 0xA1), 1: (0xB0,), 2: ()}  # the source's stack map; 2: frames gone


class FakeSymbolizer:
    """Ids from what it is asked, every call kept."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def function_ids(self, pids: Any, ips: Any, cheap: bool, unresolved: int) -> list[int]:
        self.calls.append(("functions", list(pids), list(ips), cheap, unresolved))
        return [1000 + ip for ip in ips]

    def stack_id(self, pid: int, ips: Sequence[int], cheap: bool, unresolved: int) -> int:
        self.calls.append(("stack", pid, list(ips), cheap, unresolved))
        return 500 + sum(ips)

    def data_object_id(self, pid: int, addr: int) -> int:
        return pid * 10 + addr

    def canonical_stack(self, stack_id: int) -> int | None:
        return {77: 7, 1: 9}.get(stack_id)

    def stack(self, stack_id: int) -> list[str]:
        return [f"f{stack_id}", f"g{stack_id}"]


def test_what_the_symbolizer_is_asked() -> None:
    sym = FakeSymbolizer()
    r = SymbolResolver(sym, STACKS.__getitem__)  # type: ignore[arg-type]
    assert r.function_id(3, 0x10) == 1000 + 0x10
    assert sym.calls == [("functions", [3], [0x10], True, UNRESOLVED)]
    assert r.data_object_id(3, 4) == 34
    sym.calls.clear()
    assert r.callstack_id(3, -1, -1, 0x10) == 500 + 0x10  # no stack: the ip alone
    assert r.callstack_id(3, -1, -1, 0) == 0  # nor an ip: nothing asked
    assert r.callstack_id(3, 1, 0, 0x10) == 500 + 0xA0 + 0xA1 + 0xB0
    assert r.callstack_id(3, 0, -1, 0x10) == 500 + 0xA0 + 0xA1  # user stack 0
    assert r.callstack_id(3, -1, 0, 0x10) == 500 + 0xA0 + 0xA1  # kernel stack 0
    assert [c[2] for c in sym.calls] == [[0x10], [0xA0, 0xA1, 0xB0], [0xA0, 0xA1], [0xA0, 0xA1]]
    assert r.callstack_id(3, 2, -1, 0x10) == GONE_STACK  # its frames gone
    assert r.callstack_id(3, RACED_STACK_ID, 1, 0x10) == GONE_STACK  # another's frames
    assert len(sym.calls) == 4


def test_the_names_of_stack_ids(tmp_path: Path) -> None:
    """A label's id and 0 stay themselves (a label, no frames); a provisional id is its
    stack's once resolved (1 too), UNRESOLVED while it waits."""
    flows = FlowNames(max_flows=7)
    names = RuntimeNames(flows, threading.Lock(), FakeSymbolizer(), str(tmp_path))  # type: ignore[arg-type]
    assert (names.services.proc_root, names.services.max_flows) == (str(tmp_path), 7)
    assert (names.canonical_stack(0), names.stack(0)) == (0, [])
    assert names.canonical_stack(GONE_STACK) == GONE_STACK
    assert names.stack(GONE_STACK) == [STACK_LABELS[GONE_STACK]]
    assert (names.canonical_stack(77), names.stack(77)) == (7, ["f7", "g7"])
    assert (names.canonical_stack(1), names.stack(1)) == (9, ["f9", "g9"])
    assert names.canonical_stack(78) == UNRESOLVED
    assert names.stack(78) == [STACK_LABELS[UNRESOLVED]]
