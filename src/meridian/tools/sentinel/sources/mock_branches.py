"""The mock source's branch records (`--perf-mock --lbr`): for each sample in a mock
function, the last taken branches as an LBR would show them, most recent first, in
`struct ms_lbr` records joined to the sample by (cpu, time_ns), as the kernel's.

A sample in function F of process P (mock_layout.py's fake JIT regions) gets 1 to
MAX_LOOPS back-edges of a loop in F (from F + LOOP_FROM to F + LOOP_TO), then the
calls that led to F, innermost first: from each caller's call site (its frame in
the sample's stack, less the 5 bytes of a call) to its callee's start. Every address
symbolizes to a mock function. A function of the sample's own fields (pid, ip,
time_ns, cpu), so that what was stored can be checked against it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model.records import empty_lbr
from .mock_layout import FUNC_SIZE, FUNCTIONS, JIT_BASE, PIDS

__all__ = ["CALL_BYTES", "LOOP_FROM", "LOOP_TO", "MAX_LOOPS", "branch_stacks"]

Array = np.ndarray[Any, Any]
MAX_LOOPS = 6
LOOP_FROM, LOOP_TO = 0x3C0, 0x40  # a loop's back-edge within a function
CALL_BYTES = 5  # x86's call rel32: the return address is this far past the call


def _chains() -> tuple[Array, Array]:
    """Per function: its chain of functions up to mock_main (itself first), padded
    with -1, and the number of callers in it."""
    chains = []
    for f in range(len(FUNCTIONS)):
        chain, cur = [], f
        while cur >= 0:
            chain.append(cur)
            cur = FUNCTIONS[cur][1]
        chains.append(chain)
    width = max(len(c) for c in chains)
    out = np.full((len(chains), width), -1, dtype=np.int64)
    for f, chain in enumerate(chains):
        out[f, : len(chain)] = chain
    return out, np.array([len(c) - 1 for c in chains], dtype=np.int64)


CHAINS, CALLERS = _chains()


def branch_stacks(samples: Array) -> Array:
    """One lbr_dtype record per sample, in order: `nr` 0 (no entries) for a sample
    outside the mock functions."""
    n = len(samples)
    out = empty_lbr(n)
    out["time_ns"], out["cpu"] = samples["time_ns"], samples["cpu"]
    if n == 0:
        return out
    pids = np.array(PIDS, dtype=np.uint64)
    pid = samples["pid"].astype(np.uint64)
    p = np.minimum(np.searchsorted(pids, pid), len(PIDS) - 1)
    base = np.uint64(JIT_BASE) + (p.astype(np.uint64) << np.uint64(24))
    ip = samples["ip"].astype(np.uint64)
    rel = np.where(ip >= base, ip - base, np.uint64(len(FUNCTIONS) * FUNC_SIZE))
    f = (rel // np.uint64(FUNC_SIZE)).astype(np.int64)
    ok = (pids[p] == pid) & (f < len(FUNCTIONS))
    rows = np.flatnonzero(ok)
    f, base = f[rows], base[rows]
    loops = 1 + (samples["time_ns"][rows].astype(np.uint64) >> np.uint64(4)) % np.uint64(MAX_LOOPS)
    loops = loops.astype(np.int64)
    size = np.uint64(FUNC_SIZE)
    frm, to = out["entries"]["from"], out["entries"]["to"]
    start = base + f.astype(np.uint64) * size
    for k in range(MAX_LOOPS):
        has = np.flatnonzero(loops > k)
        frm[rows[has], k] = start[has] + np.uint64(LOOP_FROM)
        to[rows[has], k] = start[has] + np.uint64(LOOP_TO)
    for k in range(CHAINS.shape[1] - 1):  # the call from chain[k + 1] into chain[k]
        has = np.flatnonzero(CALLERS[f] > k)
        callee = CHAINS[f[has], k].astype(np.uint64)
        caller = CHAINS[f[has], k + 1].astype(np.uint64)
        site = np.uint64(0x10 + 8 * (k + 1) - CALL_BYTES)  # frame: MockSource._build_stacks
        col = loops[has] + k
        frm[rows[has], col] = base[has] + caller * size + site
        to[rows[has], col] = base[has] + callee * size
    out["nr"][rows] = loops + CALLERS[f]
    return out
