"""Shared by the sentinel storage tests: the raw sample layout, rollup rows told apart
by their flow, and waits and counts on a sink and its store."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE
from meridian.tools.sentinel.storage import BatchingSink, ChdbBackend, HttpBackend, Reporter

SAMPLE_DTYPE = np.dtype(
    [
        ("time_ns", "<u8"),
        ("ip", "<u8"),
        ("data_addr", "<u8"),
        ("flow_id", "<u8"),
        ("cgroup_id", "<u8"),
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("cpu", "<u4"),
        ("ifindex", "<u4"),
        ("user_stack_id", "<i4"),
        ("kernel_stack_id", "<i4"),
        ("event", "<u2"),
        ("gso_segs", "<u2"),
        ("direction", "u1"),
        ("flow_source", "u1"),
        ("lbr_nr", "u1"),
        ("pad", "u1"),
        ("numa_node", "<u4"),
        ("raw_code", "<u4"),
    ]
)


def rollups(first: int, n: int, when_ns: int | None = None) -> np.ndarray[Any, Any]:
    """n rollups with flow ids first..first+n-1 (each row told apart by its flow)."""
    t = time.time_ns() if when_ns is None else when_ns
    a = np.zeros(n, dtype=ROLLUP_DTYPE)
    a["flow_id"] = np.arange(first, first + n, dtype=np.uint64)
    a["time_bucket"] = t - t % 1_000_000_000
    a["samples"] = 1
    a["norm_cost"] = 0.5
    a["function_id"] = 3
    a["callstack_id"] = 7
    return a


def say_lines(reporter: Reporter, word: str) -> list[str]:
    return [line for line in reporter.lines if word in line]


def wait_stored(sink: BatchingSink, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not sink.flush(timeout=2.0):
        assert time.monotonic() < deadline, f"not stored in {timeout}s: {sink.stats()}"
        time.sleep(0.1)


def counts(backend: HttpBackend | ChdbBackend, table: str = "ms_flow_rollup") -> tuple[int, int]:
    (row,) = backend.query(f"SELECT count() AS n, uniqExact(flow_id) AS u FROM {table}")
    return int(row["n"]), int(row["u"])
