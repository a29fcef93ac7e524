"""Ids for what samples point at, and names for what people read: the aggregator's
resolver over the symbolizer and the source's stack map, and view.Names over the
flow names and the symbolizer. Kept apart from the threads because the cost rules
live here (what the consumer may ask, what is left unresolved and labelled)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model.flows import FlowKey, FlowNames
from ..model.records import RACED_STACK_ID
from ..model.rollup import (
    GONE_STACK,
    SKIPPED_STACK,
    STACK_LABELS,
    UNRESOLVED,
    UNRESOLVED_LABEL,
)
from ..model.services import ServiceKey
from .listening import ServiceMap

if TYPE_CHECKING:
    from ..symbols.symbolizer import Symbolizer

__all__ = [
    "GONE_STACK",
    "SKIPPED_STACK",
    "STACK_LABELS",
    "UNRESOLVED_LABEL",
    "RuntimeNames",
    "SymbolResolver",
]


# Ids that name nothing but say why, and their labels: model/rollup.py's.
UNRESOLVED_STACK = UNRESOLVED


class SymbolResolver:
    """The aggregator's `Resolver`: the symbolizer for addresses, the source's stack
    map for stack ids (kernel frames first, innermost first, then the user frames).

    The consumer must keep up with the ring, so it asks only what costs little: with
    a symbolizer that has a cheap mode (the Symbolizer), an address (or a stack) whose
    answer needs a slow read (a binary's symbols or line table: up to seconds in
    Python) is keyed by a provisional id and left to the symbols thread (Runtime),
    which does the reads at a bounded share of a core and then resolves the id: its
    name is the function's from then on (RuntimeNames), in the windows already
    flushed too, and the outputs merge it with the function's own id when they rank.
    Past the symbolizer's bound of pending provisional ids the key is UNRESOLVED, its
    samples and cost exact under a label that says so. A stack whose frames the
    source no longer has, or found to be another's (RACED_STACK_ID), is GONE_STACK.

    `idle_function_ids()`: the kernel's idle functions (the aggregator charges a
    sample in them to no flow)."""

    def __init__(self, symbolizer: Symbolizer, stack_ips: Callable[[int], tuple[int, ...]]):
        self.symbolizer = symbolizer
        self.stack_ips = stack_ips

    def function_id(self, pid: int, ip: int) -> int:
        return self.function_ids([pid], [ip])[0]

    def function_ids(
        self, pids: Sequence[int] | np.ndarray[Any, Any], ips: Sequence[int] | np.ndarray[Any, Any]
    ) -> list[int]:
        return self.symbolizer.function_ids(pids, ips, cheap=True, unresolved=UNRESOLVED)

    def _stack_id(self, pid: int, ips: Sequence[int]) -> int:
        return self.symbolizer.stack_id(pid, ips, cheap=True, unresolved=UNRESOLVED_STACK)

    def callstack_id(self, pid: int, user_stack_id: int, kernel_stack_id: int, ip: int) -> int:
        if RACED_STACK_ID in (user_stack_id, kernel_stack_id):
            return GONE_STACK
        if user_stack_id < 0 and kernel_stack_id < 0:
            # no stack: the sampled instruction alone
            return self._stack_id(pid, [ip]) if ip else 0
        ips: list[int] = []
        if kernel_stack_id >= 0:
            ips.extend(self.stack_ips(kernel_stack_id))
        if user_stack_id >= 0:
            ips.extend(self.stack_ips(user_stack_id))
        if not ips:
            return GONE_STACK
        return self._stack_id(pid, ips)

    def data_object_id(self, pid: int, addr: int) -> int:
        return self.symbolizer.data_object_id(pid, addr)

    def idle_function_ids(self) -> frozenset[int]:
        return self.symbolizer.idle_function_ids()


class RuntimeNames:
    """view.Names over the flow names and the symbolizer (both safe across threads:
    the flow names under the runtime's lock, the symbolizer on its own), and each
    flow's service (listening.ServiceMap, over the host's listening sockets)."""

    def __init__(
        self,
        flows: FlowNames,
        lock: threading.Lock,
        symbolizer: Symbolizer,
        proc_root: str = "/proc",
    ):
        self.flows = flows
        self.lock = lock
        self.symbolizer = symbolizer
        self.services = ServiceMap(self.flow, proc_root, max_flows=flows.max_flows)

    def flow(self, flow_id: int) -> FlowKey | None:
        with self.lock:
            return self.flows.get(flow_id)

    def get(self, flow_id: int) -> FlowKey | None:  # metrics.flow_rows' names
        return self.flow(flow_id)

    def service(self, flow_id: int) -> ServiceKey | None:
        """The flow's listening side (None while its 5-tuple is not known)."""
        return self.services(flow_id)

    def function(self, function_id: int) -> str:
        """The function's name; a provisional id's once it is resolved, the label
        UNRESOLVED_LABEL until then."""
        found = self.canonical_function(function_id)
        if found == UNRESOLVED:
            return UNRESOLVED_LABEL
        return self.symbolizer.function_name(found)

    def canonical_function(self, function_id: int) -> int:
        """The id a function id is counted under when ranked: a provisional id's
        function once resolved, UNRESOLVED while it waits; any other id itself."""
        if function_id == UNRESOLVED:
            return UNRESOLVED
        found = self.symbolizer.canonical_function(function_id)
        return UNRESOLVED if found is None else found

    def stack(self, stack_id: int) -> list[str]:
        found = self.canonical_stack(stack_id)
        label = STACK_LABELS.get(found)
        if label is not None:
            return [label]
        return [str(f) for f in self.symbolizer.stack(found)] if found else []

    def canonical_stack(self, stack_id: int) -> int:
        """canonical_function for stack ids (the labels' ids and 0 stay themselves)."""
        if stack_id in STACK_LABELS or stack_id == 0:
            return stack_id
        found = self.symbolizer.canonical_stack(stack_id)
        return UNRESOLVED_STACK if found is None else found
