"""The PID table on fake snapshots of the aggregate map: windows, intervals, retiring,
caps. No kernel needed (the layouts come from the compiled object's BTF)."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest

from meridian.bpf import BpfObject, object_path
from meridian.hist import Hist, Layout
from meridian.tools.io.model import NBUCKETS, PidSummary
from meridian.tools.io.pid_table import (
    NS,
    RETIRED_MAX,
    OpView,
    PidTable,
    _Series,
    delete_keys,
)

if not object_path("io").exists():
    pytest.skip("BPF objects not built (make bpf)", allow_module_level=True)

with BpfObject(object_path("io")) as _obj:
    KEY = _obj.maps["stats"].key_dtype
    VAL = _obj.maps["stats"].value_dtype


class FakeMap:
    """Cumulative per-(pid, op, cached) counters, as the kernel keeps them."""

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int, int, int], dict[str, Any]] = {}
        self.comms: dict[int, bytes] = {}

    def io(
        self,
        pid: int,
        op: int,
        cached: int,
        ops: int,
        nbytes: int,
        slot: int = 10,
        start: int = 0,
        disk: tuple[int, int] = (0, 0),
    ) -> None:
        """`disk`: the bytes the disk moved for these operations, and ns waited on it."""
        c = self.cells.setdefault(
            (pid, op, cached, start), {"ops": 0, "bytes": 0, "slots": {}, "disk": 0, "wait": 0}
        )
        c["ops"] += ops
        c["bytes"] += nbytes
        c["disk"] += disk[0]
        c["wait"] += disk[1]
        c["slots"][slot] = c["slots"].get(slot, 0) + ops

    def snapshot(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        keys = np.zeros(len(self.cells), KEY)
        vals = np.zeros((len(self.cells), 2), VAL)  # two CPUs, all on CPU 1
        for i, ((pid, op, cached, start), c) in enumerate(sorted(self.cells.items())):
            keys[i]["pid"], keys[i]["op"], keys[i]["cached"] = pid, op, cached
            keys[i]["start"] = start
            vals[i, 1]["ops"], vals[i, 1]["bytes"] = c["ops"], c["bytes"]
            vals[i, 1]["disk_bytes"], vals[i, 1]["io_wait_ns"] = c["disk"], c["wait"]
            vals[i, 1]["comm"] = self.comms.get(pid, b"proc%d" % pid)
            vals[i, 1]["first_ns"], vals[i, 1]["last_ns"] = 1, 2
            for slot, n in c["slots"].items():  # n latencies of 2**slot ns
                vals[i, 1]["buckets"][Layout(NBUCKETS).bucket_of(1 << slot)] = n
            vals[i, 1]["latency_min_ns"] = 1 << min(c["slots"])
            vals[i, 1]["latency_max_ns"] = 1 << max(c["slots"])
        return keys, vals

    def delete(self, keys: np.ndarray[Any, Any]) -> None:
        for k in keys:
            del self.cells[(int(k["pid"]), int(k["op"]), int(k["cached"]), int(k["start"]))]


def test_rolling_windows_are_exact_differences_of_snapshots() -> None:
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    for t in range(1, 71):  # 1000 bytes/s of reads, one op per second, for 70 s
        m.io(100, 0, 1, 1, 1000)
        table.update(*m.snapshot(), t * NS)
    (row,) = table.rows()
    rd = row.ops["read"]
    assert rd.bytes_per_s == {1: 1000.0, 10: 1000.0, 60: 1000.0}
    assert rd.ops_per_s[1] == 1.0 and rd.span_s[1] == 1.0 and rd.span_s[10] == 10.0
    for t in range(71, 76):  # then idle for 5 s
        table.update(*m.snapshot(), t * NS)
    rd = table.rows()[0].ops["read"]
    assert rd.bytes_per_s[1] == 0.0
    assert rd.bytes_per_s[10] == 500.0  # 5 busy seconds of the last 10
    span = rd.span_s[60]
    assert 48 <= span <= 72
    assert rd.bytes_per_s[60] == pytest.approx((span - 5) * 1000 / span)
    assert rd.ops == 70 and rd.bytes == 70_000 and rd.interval_ops == 0
    assert max(len(s.history) for s in table.series.values()) <= 20
    assert table.rolling()[100]["read"]["10s"] == {
        "bytes_per_s": 500.0, "ops_per_s": 0.5, "disk_bytes_per_s": 0.0, "span_s": 10.0
    }  # fmt: skip


def test_interval_ops_histogram_and_hit_ratio() -> None:
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    m.io(7, 0, 1, 10, 100, slot=5)
    table.update(*m.snapshot(), NS)
    m.io(7, 0, 1, 3, 30, slot=12)  # 3 cached, 1 disk in the second interval
    m.io(7, 0, 0, 1, 4096, slot=20)
    m.io(7, 1, 1, 2, 8192, slot=8)
    table.update(*m.snapshot(), 2 * NS)
    (row,) = table.rows()
    rd, wr = row.ops["read"], row.ops["write"]
    assert rd.interval_ops == 4 and rd.ops == 14
    assert rd.interval_hist.total == 4 and int(rd.interval_hist.slots[5]) == 0
    assert rd.hit_ratio() == 0.75 and rd.hit_ratio(interval=False) == 13 / 14
    assert 1 << 12 <= (rd.percentile_ns(0.5) or 0) < 1 << 13
    assert wr.interval_ops == 2 and wr.bytes_per_s[1] == 8192.0  # new: zero one interval ago
    assert row.comm == "proc7"


def test_exited_processes_are_retired_after_the_grace_period() -> None:
    m, alive = FakeMap(), {1, 2}
    table = PidTable(start_ns=0, grace_s=30, alive=lambda pid, start: pid in alive)
    m.io(1, 0, 1, 1, 10)
    m.io(2, 1, 0, 1, 20)
    m.io(2, 0, 1, 1, 20)
    assert not len(table.update(*m.snapshot(), NS))
    alive.discard(2)  # process 2 exits; seen gone at t=2 s
    for t in range(2, 32):
        assert not len(table.update(*m.snapshot(), t * NS)), t
    gone = table.update(*m.snapshot(), 32 * NS)
    assert sorted(map(int, gone["pid"])) == [2, 2]
    m.delete(gone)
    table.update(*m.snapshot(), 33 * NS)
    assert [r.pid for r in table.rows()] == [1]
    final = {ps.pid: ps for ps in table.summaries()}
    assert final[2].total().bytes == 40  # kept for the exit summary
    assert set(final) == {1, 2}


def test_a_reused_pid_is_another_process() -> None:
    """PID 5 exits and a new process gets PID 5 within the grace period: the old one
    is retired at once with its own totals, and PID 5's series start from zero."""
    m = FakeMap()
    table = PidTable(start_ns=0, grace_s=30, alive=lambda pid, start: start == 200)
    m.io(5, 0, 1, 3, 300, start=100)
    table.update(*m.snapshot(), 1 * NS)
    m.io(5, 0, 1, 1, 7, start=200)  # the new process's first read
    gone = table.update(*m.snapshot(), 2 * NS)
    assert [(int(k["pid"]), int(k["start"])) for k in gone] == [(5, 100)]
    m.delete(gone)
    (row,) = table.rows()
    assert (row.pid, row.ops["read"].ops, row.ops["read"].interval_ops) == (5, 1, 1)
    m.io(5, 0, 1, 1, 7, start=200)
    table.update(*m.snapshot(), 3 * NS)
    (row,) = table.rows()
    assert (row.ops["read"].ops, row.ops["read"].bytes_per_s[1]) == (2, 7.0)
    assert [(ps.pid, ps.start, ps.total().bytes) for ps in table.summaries()] == [
        (5, 100, 300),
        (5, 200, 14),
    ]


def test_a_pid_seen_alive_again_starts_its_grace_over() -> None:
    m, alive = FakeMap(), {5}
    table = PidTable(start_ns=0, grace_s=10, alive=lambda pid, start: pid in alive)
    m.io(5, 0, 1, 1, 1)
    alive.clear()
    table.update(*m.snapshot(), 1 * NS)
    alive.add(5)
    table.update(*m.snapshot(), 8 * NS)
    alive.clear()
    assert not len(table.update(*m.snapshot(), 12 * NS))
    assert len(table.update(*m.snapshot(), 22 * NS)) == 1


def test_max_pids_caps_series_into_comm_then_other() -> None:
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    sizes = {10: 5000, 11: 4000, 12: 3000, 13: 2000, 14: 1000, 15: 500}
    names = {10: b"a", 11: b"a", 12: b"b", 13: b"c", 14: b"a", 15: b"d"}
    for pid, n in sizes.items():
        m.comms[pid] = names[pid]
        m.io(pid, 0, 1, 1, n)
    table.update(*m.snapshot(), NS)
    rows = table.rows(max_pids=2)
    assert [(r.level, r.pid, r.comm) for r in rows] == [
        ("pid", 10, "a"),
        ("pid", 11, "a"),
        ("comm", None, "b"),  # 3000
        ("comm", None, "c"),  # 2000
        ("other", None, "other"),  # a's third process (1000) and d (500)
    ]
    assert rows[-1].ops["read"].bytes == 1500 and rows[-1].processes == 2
    assert sum(r.ops["read"].bytes for r in rows) == sum(sizes.values())
    assert len(table.rows()) == 6 and len(table.rows(max_pids=6)) == 6


def test_processes_evicted_from_the_map_leave_the_table() -> None:
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    m.io(1, 0, 1, 1, 1)
    m.io(2, 0, 1, 1, 1)
    table.update(*m.snapshot(), NS)
    del m.cells[(2, 0, 1, 0)]
    table.update(*m.snapshot(), 2 * NS)
    assert [r.pid for r in table.rows()] == [1]


def test_rolling_rates_are_rounded_for_json() -> None:
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    m.io(100, 0, 1, 1, 1000, disk=(1000, 0))
    table.update(*m.snapshot(), 3_000_400_000)  # 3.0004 s after the start
    assert table.rolling()[100]["read"]["10s"] == {
        "bytes_per_s": 333.3, "ops_per_s": 0.333, "disk_bytes_per_s": 333.3, "span_s": 3.0
    }  # fmt: skip


def hist_of(*values: int) -> Hist:
    counts = np.zeros(NBUCKETS, np.uint64)
    for v in values:
        counts[Layout(NBUCKETS).bucket_of(v)] += np.uint64(1)
    return Hist.of_buckets(counts, "nsecs", float(min(values)), float(max(values)))


def test_op_views_add_up_into_a_comm_row() -> None:
    def view(n: int, first: int) -> OpView:
        return OpView(
            ops=n, bytes=10 * n, cached_ops=n - 1, disk_bytes=4096 * n, latency_max_ns=n,
            first_ns=first, last_ns=100 - n,
            bytes_per_s={1: 1.0 * n, 10: 2.0 * n, 60: 3.0 * n},
            ops_per_s={1: 0.5 * n, 10: 0.25 * n, 60: 0.125 * n},
            disk_bytes_per_s={1: 8.0 * n, 10: 0.0, 60: 4.0 * n},
            io_wait_ns_per_s={1: 100.0 * n, 10: 50.0 * n, 60: 0.0},
            span_s={1: 1.0, 10: 10.0 - n, 60: 55.0 + n},
            interval_ops=2 * n, interval_cached_ops=n,
            interval_hist=hist_of(*[1000] * n), hist=hist_of(*[1000] * (3 * n)),
        )  # fmt: skip

    a = view(2, 0)
    a.add(view(3, 0))
    assert (a.ops, a.bytes, a.cached_ops, a.disk_bytes) == (5, 50, 3, 20480)
    assert (a.latency_max_ns, a.first_ns, a.last_ns) == (3, 0, 98)
    assert a.bytes_per_s == {1: 5.0, 10: 10.0, 60: 15.0}
    assert a.ops_per_s == {1: 2.5, 10: 1.25, 60: 0.625}
    assert a.disk_bytes_per_s == {1: 40.0, 10: 0.0, 60: 20.0}
    assert a.io_wait_ns_per_s == {1: 500.0, 10: 250.0, 60: 0.0}
    assert a.span_s == {1: 1.0, 10: 8.0, 60: 58.0}
    assert (a.interval_ops, a.interval_cached_ops) == (10, 5)
    assert (a.interval_hist.total, a.hist.total) == (5, 15)
    assert a.hit_ratio() == 0.5 and a.hit_ratio(interval=False) == 0.6
    assert a.percentile_ns(0.5) == a.percentile_ns(0.5, interval=False) == 1000.0
    a.add(view(1, 7))
    assert a.first_ns == 7
    a.add(view(1, 3))
    assert a.first_ns == 3
    assert OpView().hit_ratio() is None and OpView().hit_ratio(interval=False) is None
    assert OpView().percentile_ns(0.5) is None
    assert OpView(hist=hist_of(5)).percentile_ns(0.5, interval=False) == 5.0


def test_other_maps_processes_go_after_the_grace_period() -> None:
    alive = {1}
    table = PidTable(start_ns=0, grace_s=30, alive=lambda pid, start: pid in alive)
    procs = [(1, 10), (2, 20)]
    assert table.gone(procs, 0) == [] and table.other_dead == {(2, 20): 0}
    assert table.gone(procs, 29 * NS) == []
    assert table.gone(procs, 30 * NS) == [(2, 20)] and table.other_dead == {}
    assert table.gone([(3, 30)], 40 * NS) == []
    alive.add(3)  # seen alive again: its grace starts over when it is gone again
    assert table.gone([(3, 30)], 50 * NS) == [] and table.other_dead == {}
    alive.discard(3)
    assert table.gone([(3, 30)], 60 * NS) == []
    assert table.gone([(3, 30)], 89 * NS) == []
    assert table.gone([(3, 30)], 90 * NS) == [(3, 30)]
    assert table.gone([(4, 40)], 91 * NS) == [] and table.other_dead == {(4, 40): 91 * NS}
    assert table.gone([], 92 * NS) == [] and table.other_dead == {}  # not in the map now


def test_delete_keys_counts_the_keys_that_were_there() -> None:
    class Map:
        def __init__(self) -> None:
            self.keys = {1, 3}

        def delete(self, k: int) -> bool:
            if k not in self.keys:
                return False
            self.keys.discard(k)
            return True

    m = Map()
    assert delete_keys(m, [1, 2, 3]) == 2 and m.keys == set()


def test_history_keeps_every_sample_of_the_last_12_s_then_one_per_12_s() -> None:
    """The thinning decides which snapshots a window's rate can use: every one of the
    last 12 s (a sample exactly 12 s old stays), then the last of each older 12 s
    bucket, and one anchor at or before the 60 s window's horizon (now - 72 s)."""
    s = _Series(deque([(0, 0, 0, 0, 0, 0)]))
    seen = {}
    for t in range(1, 101):  # one snapshot a second for 100 s
        s.push((t * NS, 3 * t, 0, 0, 0, 0))
        seen[t] = [x[0] // NS for x in s.history]
    assert seen[13] == list(range(14))  # the second sample is exactly 12 s old: no thinning
    assert seen[14] == list(range(2, 15))  # 0 and 1 are old, 2 is exactly 12 s old
    assert seen[25] == [11, *range(13, 26)]  # 11: the last of 0-11; 12 is old, 13 not
    assert seen[94] == [11, 23, 35, 47, 59, 71, *range(82, 95)]
    assert seen[95] == [23, 35, 47, 59, 71, *range(83, 96)]  # 23 is the horizon: 11 goes
    assert seen[100] == [23, 35, 47, 59, 71, 83, *range(88, 101)]


def test_thinning_starts_at_three_samples_once_the_second_is_older_than_12_s() -> None:
    """After a 19 s gap between snapshots, a history of three thins already: the first
    sample shares its 12 s bucket with the second, which is kept as the older anchor."""
    s = _Series(deque([(0, 0, 0, 0, 0, 0)]))
    s.push((NS, 1, 0, 0, 0, 0))
    s.push((20 * NS, 2, 0, 0, 0, 0))
    assert [x[0] for x in s.history] == [NS, 20 * NS]


def test_a_window_halfway_between_two_snapshots_uses_the_older() -> None:
    """On a tie the older snapshot is nearest: the 1 s window of a table updated 2 s
    after its start spans those 2 s rather than nothing."""
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    m.io(1, 0, 1, 4, 3000)
    table.update(*m.snapshot(), 2 * NS)
    rd = table.rows()[0].ops["read"]
    assert (rd.span_s[1], rd.bytes_per_s[1], rd.ops_per_s[1]) == (2.0, 1500.0, 2.0)


def disk_table() -> PidTable:
    """Snapshots at 10 s and 20 s of a process that read from disk in both intervals."""
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    m.io(1, 0, 0, 1, 4096, disk=(4096, 1_000_000))
    table.update(*m.snapshot(), 10 * NS)
    m.io(1, 0, 0, 10, 40960, disk=(40960, 5_000_000))
    table.update(*m.snapshot(), 20 * NS)
    return table


def test_a_window_shorter_than_the_interval_has_no_span_and_no_rates() -> None:
    """With snapshots 10 s apart, the 1 s window's nearest snapshot is the newest: its
    span is 0 and every rate 0, not a division by zero nor a made-up value."""
    rd = disk_table().rows()[0].ops["read"]
    assert rd.span_s[1] == 0.0
    assert (rd.bytes_per_s[1], rd.ops_per_s[1]) == (0.0, 0.0)
    assert (rd.disk_bytes_per_s[1], rd.io_wait_ns_per_s[1]) == (0.0, 0.0)


def test_disk_and_io_wait_rates_subtract_the_older_snapshot() -> None:
    """iotop's DISK READ/s and IO% come from the disk bytes and the I/O wait between
    the window's two snapshots, each counter from its own field, divided by the span."""
    rd = disk_table().rows()[0].ops["read"]
    assert (rd.span_s[10], rd.disk_bytes_per_s[10], rd.io_wait_ns_per_s[10]) == (
        10.0,
        4096.0,
        500_000.0,
    )
    assert (rd.span_s[60], rd.disk_bytes_per_s[60], rd.io_wait_ns_per_s[60]) == (
        20.0,
        2252.8,
        300_000.0,
    )


def test_the_liveness_check_is_asked_about_the_process_pid_and_start() -> None:
    """A PID alone does not say whether the process lives: the check gets its start."""
    m, calls = FakeMap(), []

    def alive(pid: int, start: int) -> bool:
        calls.append((pid, start))
        return True

    table = PidTable(start_ns=0, alive=alive)
    m.io(5, 0, 1, 1, 10, start=1234)
    table.update(*m.snapshot(), NS)
    assert calls == [(5, 1234)]


def test_by_default_a_process_is_retired_30_s_after_and_leaves_nothing_behind() -> None:
    """The default grace is 30 s; a retired process's series, name, start and death
    time are forgotten in the update that retires it (the table must not grow)."""
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: False)
    m.io(3, 0, 1, 1, 10)
    assert not len(table.update(*m.snapshot(), NS))  # seen gone at 1 s
    assert not len(table.update(*m.snapshot(), 30 * NS))
    gone = table.update(*m.snapshot(), 31 * NS)
    assert [int(k["pid"]) for k in gone] == [3]
    assert table.rows() == [] and table.series == {}
    assert (table.comms, table.starts, table.dead_since) == ({}, {}, {})
    assert list(table.retired) == [(3, 0)] and table.retired_forgotten == 0


def test_only_the_newest_retired_max_processes_are_kept_and_the_rest_counted() -> None:
    """Retired summaries are bounded: past RETIRED_MAX the oldest are dropped, and
    how many were dropped is counted (the exporters report it)."""
    m = FakeMap()
    table = PidTable(start_ns=0, grace_s=0, alive=lambda pid, start: False)
    earlier = PidSummary(100_000, "old")
    table.retired = {(100_000 + i, 0): earlier for i in range(RETIRED_MAX - 1)}
    for pid in (1, 2, 3):
        m.io(pid, 0, 1, 1, 1)
    assert len(table.update(*m.snapshot(), NS)) == 3
    assert len(table.retired) == RETIRED_MAX and table.retired_forgotten == 2
    assert min(table.retired) == (1, 0) and sorted(table.retired)[3] == (100_002, 0)


def test_a_new_table_has_no_summaries_rows_or_forgotten() -> None:
    """Before the first snapshot a reader (the exit summary, the exporters) gets
    nothing rather than an error."""
    table = PidTable(start_ns=0, alive=lambda pid, start: True)
    assert (table.summaries(), table.rows(), table.rolling()) == ([], [], {})
    assert table.retired_forgotten == 0


def test_a_process_keeps_its_last_known_command_name() -> None:
    """A snapshot without a comm (no CPU has one) leaves the name seen before, and a
    process never named has an empty one."""
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    m.comms[4] = b""
    m.io(4, 0, 1, 1, 10)
    table.update(*m.snapshot(), NS)
    assert table.rows()[0].comm == ""
    m.comms[4] = b"dd"
    table.update(*m.snapshot(), 2 * NS)
    assert table.rows()[0].comm == "dd"
    m.comms[4] = b""
    table.update(*m.snapshot(), 3 * NS)
    assert table.rows()[0].comm == "dd"


def test_rows_with_equal_bytes_go_by_pid() -> None:
    """Ties in the window's bytes are ordered by PID (0 first), not by when the table
    first saw each process, so rows and caps are stable."""
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    m.io(9, 0, 1, 1, 2000)
    m.io(1, 0, 1, 1, 2000)
    table.update(*m.snapshot(), NS)
    m.io(3, 0, 1, 1, 1000)  # 1000 B/s over 1 s, as 9 and 1 over 2 s
    m.io(0, 0, 1, 1, 1000)
    table.update(*m.snapshot(), 2 * NS)
    rows = table.rows()
    assert [r.pid for r in rows] == [0, 1, 3, 9] and {r.total(60) for r in rows} == {1000.0}


def test_a_capped_comm_row_sums_all_its_processes_and_needs_no_other_row() -> None:
    """Past the cap, the processes of one command add up into one row; with exactly
    max_pids such rows there is nothing left for an `other` row."""
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    sizes = {10: 5000, 11: 4000, 12: 3000, 13: 2000, 14: 1000}
    names = {10: b"a", 11: b"b", 12: b"c", 13: b"c", 14: b"d"}
    for pid, n in sizes.items():
        m.comms[pid] = names[pid]
        m.io(pid, 0, 1, 1, n)
    table.update(*m.snapshot(), NS)
    rows = table.rows(max_pids=2)
    assert [(r.level, r.pid, r.comm, r.processes, r.ops["read"].bytes) for r in rows] == [
        ("pid", 10, "a", 1, 5000),
        ("pid", 11, "b", 1, 4000),
        ("comm", None, "c", 2, 5000),
        ("comm", None, "d", 1, 1000),
    ]


def test_a_rows_total_defaults_to_the_1_s_window() -> None:
    """`Row.total()` is the last second's bytes of all ops (what `top` sorts by)."""
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    m.io(1, 0, 1, 1, 1000)
    table.update(*m.snapshot(), NS)
    m.io(1, 0, 1, 1, 3000)
    m.io(1, 1, 1, 1, 500)
    table.update(*m.snapshot(), 2 * NS)
    (row,) = table.rows()
    assert (row.total(), row.total(60)) == (3500.0, 2500.0)


def test_rolling_rounds_the_span_to_milliseconds() -> None:
    """A span of 2.5004 s is 2.5 in the JSON, not a whole number of seconds."""
    m, table = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    m.io(100, 0, 1, 1, 1000)
    table.update(*m.snapshot(), 2_500_400_000)
    assert table.rolling()[100]["read"]["10s"]["span_s"] == 2.5
