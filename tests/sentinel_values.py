"""Shared by sentinel's detector and model tests: times, a cache line, PIDs, u64 arrays
and remote-DRAM samples."""

from __future__ import annotations

from typing import Any

import numpy as np

from meridian.tools.sentinel.model.records import Event
from meridian.tools.sentinel.sources.mock import make_samples

Array = np.ndarray[Any, Any]
SEC = 1_000_000_000
T0 = 1000 * SEC
LINE = 0x7F10_0000_0040
A, B, C = 4201, 4202, 4203


def u64(values: list[int]) -> Array:
    return np.array(values, dtype=np.uint64)


def remote(rows: list[tuple[int, int, int, int]], t0: int = T0) -> Array:
    """Remote-DRAM samples: n per (flow, node, ifindex, n), 1 us apart."""
    flat = [(f, node, i) for f, node, i, n in rows for _ in range(n)]
    n = len(flat)
    return make_samples(
        n,
        event=Event.REMOTE_DRAM,
        flow_id=[f for f, _, _ in flat],
        numa_node=[node for _, node, _ in flat],
        ifindex=[i for _, _, i in flat],
        data_addr=0x7F20_0000_0000,
        time_ns=np.uint64(t0) + np.arange(n, dtype=np.uint64) * np.uint64(1000),
    )
