"""The per-CPU cache of aggregates (stats_cache.py) read with the hash: live entries
only, each added once as a column of its key's row, and the summaries equal to those
of the same numbers kept in the hash alone. Without a kernel."""

from __future__ import annotations

from typing import Any

import numpy as np

from meridian.tools.io.model import PidSummary, summarize
from meridian.tools.io.stats_cache import CLAIMING, entry_keys, exited, live, merge

KEY = np.dtype([("pid", "<u4"), ("op", "<u4"), ("cached", "<u4"), ("start", "<u4")])
BUCKETS = 496
STATS = np.dtype(
    [
        ("ops", "<u8"), ("bytes", "<u8"), ("bytes_requested", "<u8"), ("disk_bytes", "<u8"),
        ("io_wait_ns", "<u8"), ("latency_sum_ns", "<u8"), ("latency_min_ns", "<u8"),
        ("latency_max_ns", "<u8"), ("first_ns", "<u8"), ("last_ns", "<u8"),
        ("buckets", "<u8", (BUCKETS,)), ("comm", "S16"), ("cgroup_id", "<u8"),
    ]
)  # fmt: skip
CACHED = np.dtype([("tag", "<u8"), ("s", STATS)])
WAYS, NCPUS = 2, 2


def stats(ops: int, lat: int, first: int, comm: bytes = b"dd") -> np.ndarray[Any, Any]:
    v = np.zeros((), dtype=STATS)
    v["ops"], v["bytes"], v["latency_sum_ns"] = ops, 4096 * ops, lat * ops
    v["latency_min_ns"] = v["latency_max_ns"] = lat
    v["first_ns"], v["last_ns"] = first, first + ops
    v["buckets"][7] = ops
    v["comm"] = comm
    return v


def index(cpu: int, way: int, op: int, cached: int) -> int:
    return (cpu * WAYS + way) << 2 | op << 1 | cached


def test_live_entries_are_owned_not_claimed_not_retired() -> None:
    e = np.zeros(4, dtype=CACHED)
    e["tag"] = [0, 7 << 32 | 5, CLAIMING, 8 << 32 | 1]
    idx = np.arange(4, dtype=np.uint32)
    retired = np.zeros(4, dtype=np.uint64)
    retired[3] = 8 << 32 | 1
    assert live(idx, e, retired).tolist() == [False, True, False, False]
    k = entry_keys(np.array([index(1, 1, 1, 0)], dtype=np.uint32), e["tag"][1:2], KEY)
    assert (int(k["pid"][0]), int(k["op"][0]), int(k["cached"][0]), int(k["start"][0])) == (
        7, 1, 0, 5
    )  # fmt: skip


def test_entries_add_to_their_keys_once_and_new_keys_get_rows() -> None:
    """pid 7 (start 5) reads: 10 ops in the hash on CPU 0, 30 in CPU 1's cache entry;
    pid 9 writes only through CPU 0's cache. Summaries: as if all were in the hash."""
    keys = np.zeros(1, dtype=KEY)
    keys[0] = (7, 0, 1, 5)
    vals = np.zeros((1, NCPUS), dtype=STATS)
    vals[0, 0] = stats(10, 900, 100)
    e = np.zeros(2, dtype=CACHED)
    e["tag"] = [7 << 32 | 5, 9 << 32 | 3]
    e["s"][0], e["s"][1] = stats(30, 500, 50), stats(4, 2000, 70, b"cp")
    idx = np.array([index(1, 0, 0, 1), index(0, 1, 1, 0)], dtype=np.uint32)
    mk, mv = merge(keys, vals, idx, e, WAYS)
    assert mv.shape == (2, 2 * NCPUS)
    got = summarize(mk, mv)
    r = got[7].cells[("read", True, "syscall")]
    assert (r.ops, r.bytes, r.latency_max_ns, r.first_ns, r.last_ns) == (
        40,
        40 * 4096,
        900,
        50,
        110,
    )
    assert r.hist.total == 40 and r.hist.lo == 500
    w = got[9].cells[("write", False, "syscall")]
    assert (w.ops, got[9].comm) == (4, "cp")

    alone = np.zeros((2, NCPUS), dtype=STATS)  # the same numbers in the hash alone
    alone[0, 0], alone[0, 1], alone[1, 0] = vals[0, 0], e["s"][0], e["s"][1]
    want = summarize(mk, alone)
    assert [view(ps) for ps in got.values()] == [view(ps) for ps in want.values()]


def view(ps: PidSummary) -> dict[str, Any]:
    """What a summary reports, but its start time (made from the clock when asked)."""
    out = ps.as_dict(1.0)
    out.pop("start_time", None)
    return out


def test_no_entries_leave_the_hash_as_it_is() -> None:
    keys = np.zeros(1, dtype=KEY)
    vals = np.zeros((1, NCPUS), dtype=STATS)
    mk, mv = merge(keys, vals, np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=CACHED), WAYS)
    assert mk is keys and mv is vals


def test_exited_asks_once_a_process_and_marks_each_of_its_entries() -> None:
    asked: list[tuple[int, int]] = []

    def alive(pid: int, start: int) -> bool:
        asked.append((pid, start))
        return pid != 7

    tags = np.array([7 << 32 | 5, 8 << 32 | 5, 7 << 32 | 5, 9 << 32 | 1], dtype=np.uint64)
    assert exited(tags, alive).tolist() == [True, False, True, False]
    assert sorted(asked) == [(7, 5), (8, 5), (9, 1)]
