"""Shared by the sentinel storage tests: the raw sample layout, rollup rows told apart
by their flow, a fake store as strict as ClickHouse about what is stored, and waits and
counts on a sink and its store."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE
from meridian.tools.sentinel.storage import (
    BatchInfo,
    BatchingSink,
    ChdbBackend,
    HttpBackend,
    Reporter,
    StoreUnavailable,
)
from meridian.tools.sentinel.storage.schema import TIMED

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


DAY_S = 86_400


class FakeStore:
    """A store in memory, as strict as ClickHouse's MergeTree tables about what is
    stored: an insert appends its rows, whole or not at all, and a second insert of a
    batch stores its rows a second time (counted in `duplicates`), never overwrites
    them; `stored_rows` counts the rows that carry the batch's id in its day (timed
    tables) or its run, as stored_rows_sql does, so a batch whose rows lack its id,
    or lie in another day, is not found. A line that is not JSON fails the insert
    (code 27, as ClickHouse cannot parse it).

    `fail` makes the next inserts fail: "down" (nothing stored), "lost-answer" (all
    stored, then no answer), "partial-lost" (the first half stored, then no answer: a
    break between the insert's blocks). `down` fails every call; inserts wait for
    `gate` (clear it for a slow store)."""

    name = "fake://store"

    def __init__(self) -> None:
        self.batches: list[tuple[BatchInfo, bytes]] = []  # every insert that stored rows
        self.rows: dict[str, list[dict[str, Any]]] = {}  # table -> rows, as stored
        self.inserts = 0
        self.copies: Counter[tuple[str, int]] = Counter()  # (table, batch id) -> inserts
        self.fail: list[str] = []
        self.down = False
        self.gate = threading.Event()
        self.gate.set()
        self.mu = threading.Lock()

    @property
    def duplicates(self) -> int:
        """Inserts of a batch the store already held: each one is rows stored twice."""
        return sum(n - 1 for n in self.copies.values())

    def open(self) -> None:
        if self.down:
            raise StoreUnavailable("fake store is down", kind="unreachable")

    def insert(self, info: BatchInfo, payload: bytes) -> None:
        self.gate.wait(30)
        with self.mu:
            self.inserts += 1
            how = self.fail.pop(0) if self.fail else ""
            if self.down or how == "down":
                raise StoreUnavailable("fake store is down", kind="unreachable")
            try:
                rows = [json.loads(line) for line in payload.decode().splitlines()]
            except ValueError as exc:
                raise StoreUnavailable(f"Code: 27. fake: {exc}", code=27) from None
            if how == "partial-lost":
                rows = rows[: len(rows) // 2]
            self.rows.setdefault(info.table, []).extend(rows)
            self.batches.append((info, payload))
            self.copies[(info.table, info.batch_id)] += 1
            if how in ("lost-answer", "partial-lost"):
                raise StoreUnavailable("fake: no answer", kind="unreachable", ambiguous=True)

    def stored_rows(self, info: BatchInfo) -> int:
        if self.down:
            raise StoreUnavailable("fake store is down", kind="unreachable")
        with self.mu:
            return sum(_of_batch(row, info) for row in self.rows.get(info.table, []))

    def query(self, sql: str) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass

    def flows(self, table: str = "ms_flow_rollup") -> list[int]:
        """The flow id of every row stored in `table`, a row stored twice twice."""
        with self.mu:
            return sorted(int(row["flow_id"]) for row in self.rows.get(table, []))


def _of_batch(row: dict[str, Any], info: BatchInfo) -> bool:
    """The row is one stored_rows_sql counts for `info`."""
    if row.get("batch_id") != info.batch_id:
        return False
    if info.table in TIMED:
        ns = row.get("time_bucket", row.get("time_ns"))
        return isinstance(ns, int) and ns // 1_000_000_000 // DAY_S == info.day
    return row.get("run_id") == info.run_id


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
