"""The PID table on fake snapshots of the aggregate map: windows, intervals, retiring,
caps. No kernel needed (the layouts come from the compiled object's BTF)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from meridian.bpf import BpfObject, object_path
from meridian.hist import Hist, Layout
from meridian.tools.io.model import NBUCKETS
from meridian.tools.io.pid_table import NS, OpView, PidTable, delete_keys

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


def test_process_alive_checks_the_start_and_rechecks_it_only_now_and_then(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from meridian.tools.io import pid_table as io_table

    proc = tmp_path / "42"
    proc.mkdir()
    stat = "42 (a b) S" + " 0" * 18 + " {start} 0\n"  # field 22 is the start
    (proc / "stat").write_text(stat.format(start=500))
    alive = io_table.ProcessAlive(recheck_s=10, proc_root=str(tmp_path))
    clock = [0]
    monkeypatch.setattr("meridian.tools.io.pid_table.time.monotonic_ns", lambda: clock[0])
    assert alive(42, 500) and not alive(42, 499) and not alive(7, 500)
    (proc / "stat").write_text(stat.format(start=900))  # PID 42 given to another process
    clock[0] = 5 * NS
    assert alive(42, 500)  # not re-read yet: the directory is there
    clock[0] = 11 * NS
    assert not alive(42, 500) and alive(42, 900)


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
