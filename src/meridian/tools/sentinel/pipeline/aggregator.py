"""Samples to rollups: the aggregation key of docs/requirements/sentinel.md §3.4
`(flow_id, function, callstack_id, data_object_id, event, numa_node, direction,
interference_class, time_bucket)` with `samples` and
`norm_cost = samples * sample_scale / gso_segs` (summed per sample, so a sample on a GSO
super-packet of 40 segments costs a fortieth per segment; the scale is the sample's
event's, pipeline/scales.py).

All in numpy: rows are grouped by sorting a 64-bit hash of each row (then checked
column by column, exact: model/groups.py) and summed with `np.bincount`; the resolver
(symbolizer, stack map) is asked once per distinct (pid, ip), (pid, stacks) and (pid,
data address) of a flush window, never per sample (a resolver with `function_ids`
is given those of a batch in one call; the window's answers are looked up with
numpy, not a dict lookup a row): a call stack is asked with ip 0, and with the
sampled ip only when it has no stack ids or its frames are gone (id 0). Its ids are
integers in [0, 2**64). New call stacks are asked at most `stacks_per_window` times
a window, the hottest first (a stack each costs the resolver tens of microseconds,
and code without frame pointers gives almost every sample its own); the rest are
keyed SKIPPED_STACK, their samples and cost exact (its label says why: model/rollup.py).

Idle is no flow's cost: a sample whose instruction is in the kernel's idle code (the
resolver's `idle_function_ids()`, kallsyms.py says which) is keyed to no flow (0)
with the direction IDLE, whatever packet the CPU handled before it halted. It is
decided by the sampled function, not by the pid: the softirq that handles a packet
on an idle CPU runs as pid 0 and is that flow's cost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..model.groups import group, in_order, row_hash
from ..model.interference import classify
from ..model.records import IDLE, take
from ..model.rollup import KEY_DTYPE, ROLLUP_DTYPE, SKIPPED_STACK, Rollup, rollups

__all__ = ["SKIPPED_STACK", "Aggregator", "Resolver"]

Array = np.ndarray[Any, Any]

STACK_CANDIDATES = 4096  # of a batch's distinct stacks, the hottest looked at at all
STACKS_PER_WINDOW = 512  # new call stacks resolved per flush window, the hottest first
# what a sample is keyed by, besides its time bucket (the ids below derive from them)
RAW_KEY = (
    "pid", "ip", "user_stack_id", "kernel_stack_id", "data_addr",
    "flow_id", "direction", "numa_node", "event",
)  # fmt: skip


class Resolver(Protocol):
    """Ids for what samples point at (R's runtime, on the symbolizer and stack map)."""

    def function_id(self, pid: int, ip: int) -> int:
        """(A resolver may also have `function_ids(pids, ips) -> list[int]`, the same
        for arrays of (pid, ip), used instead when it has: one call per batch.)"""
        ...

    def callstack_id(self, pid: int, user_stack_id: int, kernel_stack_id: int, ip: int) -> int: ...

    def data_object_id(self, pid: int, addr: int) -> int:
        """0: no known object at `addr`."""
        ...

    # optional: `idle_function_ids() -> frozenset[int]`, the function ids of the
    # kernel's idle code (its samples are charged to no flow)


class _Answers:
    """The resolver's answers of one window, by key row: a batch's rows are looked up
    with one searchsorted over the rows' hashes (model/groups.row_hash), each found
    row checked column by column; only rows not seen in the window are asked."""

    def __init__(self) -> None:
        self._hashes = np.zeros(0, dtype=np.uint64)  # sorted
        self._keys: list[Array] = []  # the key columns (uint64), in the hashes' order
        self._ids = np.zeros(0, dtype=np.uint64)

    def find(self, keys: list[Array]) -> tuple[Array, Array]:
        """(the id of each row, 0 where not found; which rows were found)."""
        n = len(keys[0])
        if not len(self._hashes):
            return np.zeros(n, dtype=np.uint64), np.zeros(n, dtype=bool)
        hashes = row_hash(*keys)
        at = np.minimum(np.searchsorted(self._hashes, hashes), len(self._hashes) - 1)
        found = self._hashes[at] == hashes
        for mine, col in zip(self._keys, keys, strict=True):
            found &= mine[at] == col
        return np.where(found, self._ids[at], np.uint64(0)), found

    def add(self, keys: list[Array], ids: Array) -> None:
        """New rows merged into the sorted answers: only they are sorted (the window's
        answers grow batch by batch, and sorting them all again made each batch cost
        more than the one before)."""
        if not len(ids):
            return
        hashes = row_hash(*keys)
        order = np.argsort(hashes, kind="stable")
        at = np.searchsorted(self._hashes, hashes[order])
        self._hashes = np.insert(self._hashes, at, hashes[order])
        if not self._keys:
            self._keys = [np.zeros(0, dtype=np.uint64) for _ in keys]
        self._keys = [np.insert(m, at, k[order]) for m, k in zip(self._keys, keys, strict=True)]
        self._ids = np.insert(self._ids, at, ids.astype(np.uint64)[order])


def _resolve(
    cache: _Answers,
    call: Callable[..., int],
    cols: list[Array],
    first: Array,
    budget: int | None = None,
    weight: Array | None = None,
    many: Callable[..., Any] | None = None,
) -> tuple[Array, int]:
    """The resolver's id of each distinct row (`first` indexes them), from the
    window's answers, else one call each (one call of `many` for them all, with the
    columns), and the number of rows asked. With a `budget`, at most that many rows
    are asked (those of highest `weight` first); the others are SKIPPED_STACK for the
    rest of the window."""
    if budget is not None and weight is not None and len(first) > STACK_CANDIDATES:
        # Thousands of distinct rows (a stack per sample): only the hottest are looked
        # at, the rest are skipped.
        top = np.argpartition(-weight, STACK_CANDIDATES)[:STACK_CANDIDATES]
        out = np.full(len(first), SKIPPED_STACK, dtype=np.uint64)
        out[top], asked = _resolve(cache, call, cols, first[top], budget, weight[top], many)
        return out, asked
    keys = [c[first].astype(np.uint64) for c in cols]
    ids, found = cache.find(keys)
    missing = np.flatnonzero(~found)
    if budget is not None and len(missing) > budget:
        if weight is not None:
            missing = missing[np.argsort(-weight[missing], kind="stable")]
        ids[missing[budget:]] = SKIPPED_STACK
        missing = np.sort(missing[:budget])
    if many is not None:
        if len(missing):
            got = many(*(c[first][missing] for c in cols))
            ids[missing] = np.asarray(got, dtype=np.uint64)
    else:
        rows = zip(*(c[first][missing].tolist() for c in cols), strict=True)
        ids[missing] = np.array([call(*row) for row in rows], dtype=np.uint64)
    new = np.flatnonzero(~found)
    cache.add([k[new] for k in keys], ids[new])
    return ids, len(missing)


def _reduce(keys: Array, samples: Array, cost: Array, pid: Array) -> Array:
    """One row per distinct key: samples and cost summed, the first row's pid."""
    first, inv = group(*(keys[name] for name in KEY_DTYPE.names or ()))
    out = np.empty(len(first), dtype=ROLLUP_DTYPE)
    for name in KEY_DTYPE.names or ():
        out[name] = keys[name][first]
    out["samples"] = np.rint(np.bincount(inv, weights=samples, minlength=len(first)))
    out["norm_cost"] = np.bincount(inv, weights=cost, minlength=len(first))
    out["pid"] = pid[first]
    return out


class Aggregator:
    """Accumulates the rollups of one flush window. `add` from the consumer thread,
    `flush` from the flush loop: each part is appended whole, under a lock."""

    def __init__(
        self,
        time_window_ns: int,
        resolver: Resolver,
        stacks_per_window: int | None = STACKS_PER_WINDOW,
    ) -> None:
        """`stacks_per_window` bounds the new call stacks asked of the resolver in a
        window (None: no bound): code without frame pointers gives almost every
        sample a stack of its own, and each costs the resolver tens of microseconds."""
        if time_window_ns <= 0:
            raise ValueError("time_window_ns must be positive")
        self.time_window_ns = int(time_window_ns)
        self.resolver = resolver
        self._parts: list[Array] = []
        # resolver answers of this window: a key resolved once per window, not per batch
        self._functions, self._stacks, self._objects = _Answers(), _Answers(), _Answers()
        self.stacks_per_window = stacks_per_window
        self._stack_budget = stacks_per_window
        self._lock = threading.Lock()
        self.samples_total = 0

    def add(self, samples: Array, scale: float | Array = 1.0, time_ns: Array | None = None) -> None:
        """A batch of samples (sample_dtype) at this sample scale: one for all, or one
        per sample (its event's, pipeline/scales.py). `time_ns` (e.g. the wall clock
        of ClockCalibrator.to_wall) buckets instead of samples["time_ns"]."""
        n = len(samples)
        if n == 0:
            return
        t = np.asarray(samples["time_ns"] if time_ns is None else time_ns).astype(np.uint64)
        bucket = t - t % np.uint64(self.time_window_ns)
        gso = np.maximum(samples["gso_segs"], 1).astype(np.float64)
        cost = np.broadcast_to(np.asarray(scale, dtype=np.float64) / gso, (n,))
        # Samples alike in all they are keyed by are one row from here on: a batch has
        # a tenth as many distinct rows as samples (a hot loop, a stack), and each
        # step below is then paid per row, not per sample.
        raw = [samples[name] for name in RAW_KEY]
        first, inv = in_order(*raw, bucket)  # the rows in the order of their first sample
        rows = take(samples, first)
        weight = np.bincount(inv, minlength=len(first)).astype(np.float64)
        part = self._rows(rows, bucket[first], weight, np.bincount(inv, weights=cost))
        with self._lock:
            self._parts.append(part)
            self.samples_total += n

    def _rows(self, rows: Array, bucket: Array, samples: Array, cost: Array) -> Array:
        """The rollups of distinct sample rows, each standing for `samples` samples of
        `cost`: the resolver's ids per distinct (pid, ip), stack and data address."""
        r = self.resolver
        pid, ip = rows["pid"], rows["ip"]
        ustack = rows["user_stack_id"].astype(np.int64)
        kstack = rows["kernel_stack_id"].astype(np.int64)

        first, inv = group(pid, ip)
        many = getattr(r, "function_ids", None)  # optional: all of them in one call
        fids = _resolve(self._functions, r.function_id, [pid, ip], first, many=many)[0][inv]
        # A sample with a stack is keyed by its stack ids alone (the ip counts only
        # without one: asking per distinct ip would be asking per sample); a stack
        # whose frames are gone (0) is then asked again with the sampled ip.
        stacked = (ustack >= 0) | (kstack >= 0)
        cols = [pid, ustack, kstack, np.where(stacked, np.uint64(0), ip)]
        first, inv = group(*cols)
        weight = np.bincount(inv, weights=samples, minlength=len(first))
        got, asked = _resolve(
            self._stacks, r.callstack_id, cols, first, budget=self._stack_budget, weight=weight
        )
        sids = got[inv]
        if self._stack_budget is not None:
            self._stack_budget = max(0, self._stack_budget - asked)
        gone = np.flatnonzero((sids == 0) & stacked & (ip != 0))
        if len(gone):
            cols = [pid[gone], ustack[gone], kstack[gone], ip[gone]]
            first, inv = group(*cols)
            sids[gone] = _resolve(self._stacks, r.callstack_id, cols, first)[0][inv]
        addr = rows["data_addr"]
        dids = np.zeros(len(rows), dtype=np.uint64)
        has = np.flatnonzero(addr != 0)
        if len(has):
            cols = [pid[has], addr[has]]
            first, inv = group(*cols)
            dids[has] = _resolve(self._objects, r.data_object_id, cols, first)[0][inv]

        keys = np.empty(len(rows), dtype=KEY_DTYPE)
        keys["flow_id"] = rows["flow_id"]
        keys["direction"] = rows["direction"]
        self._idle(keys, fids)
        keys["function_id"] = fids
        keys["callstack_id"] = sids
        keys["data_object_id"] = dids
        keys["time_bucket"] = bucket
        keys["numa_node"] = rows["numa_node"]
        keys["event"] = rows["event"]
        keys["interference_class"] = classify(rows["event"])
        return _reduce(keys, samples, cost, pid)

    def _idle(self, keys: Array, fids: Array) -> None:
        """The samples in the kernel's idle code: no flow, direction IDLE."""
        idle_ids = getattr(self.resolver, "idle_function_ids", None)
        ids = idle_ids() if idle_ids is not None else None
        if not ids:
            return
        idle = np.isin(fids, np.fromiter(ids, dtype=np.uint64, count=len(ids)))
        if idle.any():
            keys["flow_id"][idle] = 0
            keys["direction"][idle] = IDLE

    def flush_array(self) -> Array:
        """The window's rollups as one ROLLUP_DTYPE array (for bulk sinks), and a new
        window begins. Ordered by time bucket, then cost, highest first."""
        with self._lock:
            parts, self._parts = self._parts, []
            self._functions, self._stacks, self._objects = _Answers(), _Answers(), _Answers()
            self._stack_budget = self.stacks_per_window
        if not parts:
            return np.empty(0, dtype=ROLLUP_DTYPE)
        rows = np.concatenate(parts)
        if len(parts) > 1:
            rows = _reduce(rows, rows["samples"].astype(np.float64), rows["norm_cost"], rows["pid"])
        return rows[np.lexsort((-rows["norm_cost"], rows["time_bucket"]))]

    def flush(self) -> list[Rollup]:
        """The window's rollups; a new window begins."""
        return rollups(self.flush_array())
