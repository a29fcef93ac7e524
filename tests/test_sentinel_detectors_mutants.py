"""Tests written against the survivors of mutation testing of sentinel's detectors
(`tools/sentinel/detectors`) (issue 36; docs/testing.md): each pins an exact value that
a changed comparison, bound, default or order would change."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sentinel_values import LINE, SEC, T0, A, Array, B, C, remote, u64

from meridian.tools.sentinel.detectors import DetectorContext, create_all, detector_types
from meridian.tools.sentinel.detectors.base import REGISTRY, Detector, register
from meridian.tools.sentinel.detectors.false_sharing import FalseSharing, FalseSharingFinding
from meridian.tools.sentinel.detectors.remote_dram import RemoteDram, RemoteDramFinding
from meridian.tools.sentinel.detectors.window import MERGE_PARTS, WindowCounts
from meridian.tools.sentinel.model.dataobjects import DataObject
from meridian.tools.sentinel.model.records import (
    Event,
)
from meridian.tools.sentinel.sources.mock import make_samples


def hitm(rows: list[tuple[int, int, int]], line: int = LINE, t0: int = T0) -> Array:
    """HITM samples on `line`: (cpu, pid, n) n samples each, 1 us apart, the words
    of the line in turn (addresses line, line+8, ...)."""
    cpu = [c for c, _, n in rows for _ in range(n)]
    pid = [p for _, p, n in rows for _ in range(n)]
    n = len(cpu)
    addr = np.uint64(line) + (np.arange(n, dtype=np.uint64) % np.uint64(8)) * np.uint64(8)
    times = np.uint64(t0) + np.arange(n, dtype=np.uint64) * np.uint64(1000)
    return make_samples(
        n, event=Event.XSNP_HITM, cpu=cpu, pid=pid, tid=pid, data_addr=addr, time_ns=times
    )


def flushed(det: Detector, now: int = T0 + SEC) -> list[Any]:
    out: list[Any] = []
    det.flush(now, out.append)
    return out


# ---- detectors/window.py ---------------------------------------------------------------


def counts_of(closed: Any) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in r) for r in closed.rows.tolist()]


def test_window_counts_need_one_key_at_least() -> None:
    """max_keys 0 is refused with its message; 1 is the smallest table that works."""
    with pytest.raises(ValueError, match=r"^max_keys must be at least 1$"):
        WindowCounts([("k", "<u8")], max_keys=0)
    one = WindowCounts([("k", "<u8")], max_keys=1)
    one.add({"k": u64([5, 6, 6])}, u64([1, 2, 3]))
    closed = one.close(10)
    assert closed is not None
    assert closed.rows["k"].tolist() == [6] and one.dropped == 1


def test_window_counts_reduce_each_key_to_hits_first_last_and_first_addr() -> None:
    """Per key: the samples counted, the least and greatest time whatever their
    order, and the address of the key's first sample in the batch."""
    w = WindowCounts([("a", "<u4"), ("b", "<u4")], max_keys=16)
    w.add(
        {"a": u64([2, 1, 2, 1, 2]), "b": u64([0, 9, 0, 9, 1])},
        u64([50, 40, 30, 60, 70]),
        u64([0x100, 0x200, 0x300, 0x400, 0x500]),
    )
    closed = w.close(100)
    assert closed is not None
    assert (closed.start_ns, closed.end_ns) == (30, 100)
    assert closed.rows.dtype.names == ("a", "b", "hits", "first_ns", "last_ns", "addr")
    assert counts_of(closed) == [
        (1, 9, 2, 40, 60, 0x200),
        (2, 0, 2, 30, 50, 0x100),
        (2, 1, 1, 70, 70, 0x500),
    ]


def test_window_counts_without_addresses_keep_zero() -> None:
    """add() without `addr`: the rows' address is 0, not left uninitialised."""
    w = WindowCounts([("k", "<u8")], max_keys=4)
    w.add({"k": u64([3, 3])}, u64([7, 8]))
    closed = w.close(9)
    assert closed is not None and counts_of(closed) == [(3, 2, 7, 8, 0)]


def test_an_empty_batch_is_ignored_and_an_empty_window_closes_at_now() -> None:
    """No samples: nothing held, the window opens at the first flush and closes with
    no rows; the next one opens where it closed."""
    w = WindowCounts([("k", "<u8")], max_keys=4, min_window_ns=-5)
    assert w.min_window_ns == 0
    w.add({"k": u64([])}, u64([]))
    closed = w.close(500)
    assert closed is not None
    assert (closed.start_ns, closed.end_ns, len(closed.rows)) == (500, 500, 0)
    assert closed.rows.dtype == w.dtype
    w.add({"k": u64([1])}, u64([10]))
    again = w.close(900)
    assert again is not None and (again.start_ns, again.end_ns) == (500, 900)


def test_a_window_closes_exactly_at_its_minimum_length() -> None:
    """min_window_ns: still open 1 ns before, closed at exactly the length, and the
    next window starts at that flush."""
    w = WindowCounts([("k", "<u8")], max_keys=4, min_window_ns=100)
    w.add({"k": u64([1])}, u64([1000]))
    assert w.close(1099) is None
    closed = w.close(1100)
    assert closed is not None and (closed.start_ns, closed.end_ns) == (1000, 1100)
    w.add({"k": u64([1])}, u64([1150]))
    assert w.close(1199) is None
    later = w.close(1200)
    assert later is not None and (later.start_ns, counts_of(later)) == (
        1100,
        [(1, 1, 1150, 1150, 0)],
    )


def test_batches_merge_past_twice_the_key_bound_not_at_it() -> None:
    """Held rows are merged (and bounded) only when more than 2 x max_keys: at
    exactly 2 x max_keys nothing is dropped yet."""
    w = WindowCounts([("k", "<u8")], max_keys=2)
    w.add({"k": u64([1, 2])}, u64([1, 2]))
    w.add({"k": u64([3, 4, 4])}, u64([3, 4, 5]))  # 4 rows held, 2 x max_keys
    assert w.dropped == 0
    w.add({"k": u64([5])}, u64([6]))  # 5 held: merged, the hottest 2 kept
    assert w.dropped == 3
    closed = w.close(10)
    assert closed is not None
    assert [(r[0], r[1]) for r in counts_of(closed)] == [(1, 1), (4, 2)]
    assert w.dropped == 3


def test_batches_merge_after_more_than_merge_parts_batches() -> None:
    """MERGE_PARTS (64) batches are held as they are; the 65th merges them, which
    applies the key bound (one new key a batch, 40 kept)."""
    assert MERGE_PARTS == 64
    w = WindowCounts([("k", "<u8")], max_keys=40)
    for k in range(64):
        w.add({"k": u64([k])}, u64([k]))
    assert w.dropped == 0
    w.add({"k": u64([64])}, u64([64]))
    assert w.dropped == 25
    closed = w.close(100)
    assert closed is not None
    assert closed.rows["k"].tolist() == list(range(40))  # ties: the earliest keys kept


def test_the_bound_keeps_the_hottest_in_key_order_and_counts_the_rest() -> None:
    """Over max_keys at close: the hottest keys kept, listed by key, the samples of
    the others dropped; exactly max_keys keys are all kept."""
    w = WindowCounts([("k", "<u8")], max_keys=2)
    w.add({"k": u64([9, 9, 9, 1, 5, 5])}, u64([1, 2, 3, 4, 5, 6]))
    closed = w.close(10)
    assert closed is not None
    assert [(r[0], r[1]) for r in counts_of(closed)] == [(5, 2), (9, 3)]
    assert w.dropped == 1
    exact = WindowCounts([("k", "<u8")], max_keys=2)
    exact.add({"k": u64([2, 1])}, u64([1, 2]))
    closed = exact.close(10)
    assert closed is not None and closed.rows["k"].tolist() == [1, 2] and exact.dropped == 0


# ---- detectors/false_sharing.py --------------------------------------------------------


def test_false_sharing_thresholds_have_floors() -> None:
    """min_hits below 1 is 1, min_sharers below 2 is 2: one CPU alone is never
    sharing, whatever the settings."""
    det = FalseSharing(min_hits=0, min_sharers=1)
    assert (det.min_hits, det.min_sharers) == (1, 2)
    det.observe(hitm([(0, A, 3)]))
    assert flushed(det) == []
    det.observe(hitm([(0, A, 1), (1, A, 1)]))
    [f] = flushed(det, T0 + 2 * SEC)
    assert f.cpus == ((0, 1), (1, 1)) and f.score == 2.0


def test_false_sharing_at_exactly_min_hits_and_min_sharers() -> None:
    """A CPU with exactly min_hits samples counts as a sharer, and exactly
    min_sharers of them report the line; one fewer sharer does not."""
    det = FalseSharing(min_hits=3, min_sharers=3)
    det.observe(hitm([(0, A, 3), (1, A, 3), (2, A, 3)]))
    [f] = flushed(det)
    assert f.score == 9.0
    det.observe(hitm([(0, A, 3), (1, A, 3), (2, A, 2)], t0=T0 + SEC))
    assert flushed(det, T0 + 2 * SEC) == []


def test_false_sharing_by_processes_alone() -> None:
    """Two processes each over min_hits on one CPU: reported by processes; a line
    two CPUs share from one process is reported by CPUs."""
    det = FalseSharing(min_hits=2)
    det.observe(hitm([(0, A, 2), (0, B, 2), (0, C, 1)]))
    [f] = flushed(det)
    assert (f.cpus, f.pids) == (((0, 5),), ((A, 2), (B, 2), (C, 1)))
    assert f.labels()["pid"] == str(A)  # ties: the lower pid first


def test_false_sharing_ignores_hitm_without_an_address_in_a_mixed_batch() -> None:
    """In one batch: HITM samples with no data address and samples of other events
    are left out, the rest counted."""
    good = hitm([(0, A, 2), (1, A, 2)])
    no_addr = hitm([(2, A, 5), (3, A, 5)])
    no_addr["data_addr"] = 0
    other = hitm([(2, A, 5), (3, A, 5)])
    other["event"] = Event.REMOTE_DRAM
    det = FalseSharing(min_hits=2)
    det.observe(np.concatenate([no_addr, good, other]))
    [f] = flushed(det)
    assert (f.score, f.cpus) == (4.0, ((0, 2), (1, 2)))


def test_false_sharing_window_still_open_reports_nothing() -> None:
    """A flush before min_window_ns has passed reports nothing and keeps the
    samples for the window's close."""
    det = FalseSharing(min_hits=1, min_window_ns=SEC)
    det.observe(hitm([(0, A, 1), (1, A, 1)]))
    assert flushed(det, T0 + SEC - 1) == []
    [f] = flushed(det, T0 + SEC)
    assert (f.score, f.window_start_ns, f.window_end_ns) == (2.0, T0, T0 + SEC)


def test_false_sharing_reports_at_most_max_findings_hottest_first() -> None:
    """Three shared lines: max_findings 2 keeps the two hottest; equal scores keep
    the lower line first."""
    det = FalseSharing(min_hits=1, max_findings=2)
    l1, l2, l3 = LINE, LINE + 0x40, LINE + 0x80
    det.observe(hitm([(0, A, 1), (1, A, 1)], line=l1))
    det.observe(hitm([(0, A, 3), (1, A, 3)], line=l2))
    det.observe(hitm([(0, A, 1), (1, A, 1)], line=l3))
    assert [(f.line, f.score) for f in flushed(det)] == [(l2, 6.0), (l1, 2.0)]


def test_false_sharing_finding_fields_and_dict() -> None:
    """Every field of a finding: the line address, the last sample's time, the
    window, no object without a lookup; as_dict has them all."""
    det = FalseSharing(min_hits=1)
    det.observe(hitm([(1, B, 2), (0, A, 2)], line=LINE + 0x10))  # an address in the line
    [f] = flushed(det)
    assert isinstance(f, FalseSharingFinding)
    assert f.as_dict() == {
        "line": LINE,
        "score": 4.0,
        "cpus": ((0, 2), (1, 2)),
        "pids": ((A, 2), (B, 2)),
        "window_start_ns": T0,
        "window_end_ns": T0 + SEC,
        "last_ns": T0 + 3000,
        "data_object": "",
        "data_object_id": 0,
        "data_object_pid": 0,
    }
    assert f.value == 4.0 and f.metric == "ms_false_sharing_score"
    assert f.labels() == {"line": "0x7f1000000040", "object": "", "pid": str(A)}


class Objects:
    """A DataObjectLookup over a dict (pid, addr) -> id; records what was asked."""

    def __init__(self, ids: dict[tuple[int, int], int], objs: dict[int, DataObject]) -> None:
        self.ids, self.objs = ids, objs
        self.asked: list[tuple[int, int]] = []

    def data_object_id(self, pid: int, addr: int) -> int:
        self.asked.append((pid, addr))
        return self.ids.get((pid, addr), 0)

    def data_object(self, object_id: int) -> DataObject | None:
        if object_id == 0:
            raise AssertionError("asked for object 0")
        return self.objs.get(object_id)


def test_false_sharing_joins_the_object_of_the_busiest_process_first() -> None:
    """The processes with most samples are asked first, the first address of each
    of their (cpu, pid) rows in address order; an id whose object is gone is passed
    over; the first object found is the finding's."""
    objs = {7: DataObject(7, B, LINE, "ring", "struct ring", 64)}
    lookup = Objects({(A, LINE): 3, (B, LINE + 24): 7}, objs)
    det = FalseSharing.create(
        DetectorContext(objects=lookup, settings={"false_sharing": {"min_hits": 1}})
    )
    assert det.min_hits == 1
    det.observe(hitm([(0, A, 2), (1, A, 1), (2, B, 2)]))  # a row per (cpu, pid)
    [f] = flushed(det)
    assert lookup.asked == [(A, LINE), (A, LINE + 16), (B, LINE + 24)]
    assert (f.data_object, f.data_object_id, f.data_object_pid) == ("ring", 7, B)


def test_false_sharing_without_any_object_found_has_none() -> None:
    """A lookup that knows no address: the finding names no object."""
    lookup = Objects({}, {})
    det = FalseSharing(lookup, min_hits=1)
    det.observe(hitm([(0, A, 1), (1, B, 1)]))
    [f] = flushed(det)
    assert (f.data_object, f.data_object_id, f.data_object_pid) == ("", 0, 0)
    assert lookup.asked == [(A, LINE), (B, LINE + 8)]


# ---- detectors/remote_dram.py ----------------------------------------------------------


def test_remote_dram_finding_fields_labels_and_dict() -> None:
    """Every field of a finding, its labels (16 hex digits of the flow) and dict."""
    det = RemoteDram.create(DetectorContext())
    det.observe(remote([(0xAB, 1, 3, 2)]))
    [f] = flushed(det)
    assert isinstance(f, RemoteDramFinding)
    assert f.as_dict() == {
        "flow_id": 0xAB,
        "numa_node": 1,
        "ifindex": 3,
        "samples": 2,
        "first_ns": T0,
        "last_ns": T0 + 1000,
        "window_start_ns": T0,
        "window_end_ns": T0 + SEC,
    }
    assert f.labels() == {"flow": "00000000000000ab", "numa": "1", "ifindex": "3"}
    assert f.value == 2.0 and isinstance(f.value, float)


def test_remote_dram_ties_by_flow_node_and_interface_and_max_findings() -> None:
    """Equal samples: lower flow, then node, then interface first; max_findings
    cuts the list after the order."""
    rows = [(0xB, 0, 1, 2), (0xA, 1, 1, 2), (0xA, 0, 2, 2), (0xA, 0, 1, 2), (0xC, 0, 0, 3)]
    det = RemoteDram()
    det.observe(remote(rows))
    got = [(f.flow_id, f.numa_node, f.ifindex) for f in flushed(det)]
    assert got == [(0xC, 0, 0), (0xA, 0, 1), (0xA, 0, 2), (0xA, 1, 1), (0xB, 0, 1)]
    cut = RemoteDram(max_findings=2)
    cut.observe(remote(rows))
    assert [(f.flow_id, f.ifindex) for f in flushed(cut)] == [(0xC, 0), (0xA, 1)]


def test_remote_dram_thresholds_and_window() -> None:
    """min_samples below 1 is 1; exactly min_samples is reported; a window still
    open reports nothing, then closes with every sample."""
    assert RemoteDram(min_samples=0).min_samples == 1
    det = RemoteDram(min_samples=2, min_window_ns=SEC)
    det.observe(remote([(0xA, 0, 0, 2), (0xB, 0, 0, 1)]))
    assert flushed(det, T0 + SEC - 1) == []
    [f] = flushed(det, T0 + SEC)
    assert (f.flow_id, f.samples, f.window_start_ns) == (0xA, 2, T0)
    other = RemoteDram()
    other.observe(hitm([(0, A, 4)]))
    assert flushed(other) == []


# ---- detectors/base.py, detectors/__init__.py ------------------------------------------


def test_settings_of_is_a_copy_and_empty_for_an_unknown_detector() -> None:
    """settings_of: the section as a new dict ({} when none), so a detector cannot
    change the config it was created from."""
    settings = {"remote_dram": {"min_samples": 4}}
    ctx = DetectorContext(settings=settings)
    got = ctx.settings_of("remote_dram")
    got["min_samples"] = 9
    assert settings["remote_dram"] == {"min_samples": 4}
    assert ctx.settings_of("nothing") == {} and DetectorContext().objects is None
    made = {type(d): d for d in create_all(ctx)}
    det = made[RemoteDram]
    assert isinstance(det, RemoteDram) and det.min_samples == 4


def test_register_refuses_a_second_detector_of_the_same_name() -> None:
    """A second class named as a registered one is refused; the same class twice is
    not an error."""

    class Twin(RemoteDram):
        name = "remote_dram"

    with pytest.raises(ValueError, match=r"^two detectors named remote_dram$"):
        register(Twin)
    assert REGISTRY["remote_dram"] is RemoteDram
    assert register(RemoteDram) is RemoteDram
    assert list(detector_types()) == ["false_sharing", "remote_dram"]


def test_a_detector_drops_nothing_by_default() -> None:
    """Detector.dropped is 0 unless a detector counts drops."""

    class Quiet(Detector):
        name, metric, doc = "quiet", "q", "q"

        def observe(self, samples: Array) -> None:
            pass

        def flush(self, now_ns: int, emit: Any) -> None:
            pass

    assert Quiet().dropped() == 0
    assert "quiet" not in REGISTRY


def test_by_default_a_flush_at_the_first_samples_time_closes_the_window() -> None:
    """min_window_ns defaults to 0: a flush at the very time of the first sample
    closes the window (zero long) with its samples, for both detectors."""
    fs = FalseSharing(min_hits=1)
    fs.observe(hitm([(0, A, 1), (1, A, 1)]))
    [f] = flushed(fs, T0)
    assert (f.window_start_ns, f.window_end_ns, f.score) == (T0, T0, 2.0)
    rd = RemoteDram()
    rd.observe(remote([(0xA, 0, 0, 1)]))
    [r] = flushed(rd, T0)
    assert (r.window_start_ns, r.window_end_ns, r.samples) == (T0, T0, 1)


def test_false_sharing_counts_per_cpu_and_pid_are_ints() -> None:
    """The (cpu, samples) and (pid, samples) pairs hold ints, as JSON shows them."""
    det = FalseSharing(min_hits=1)
    det.observe(hitm([(0, A, 2), (1, B, 1)]))
    [f] = flushed(det)
    assert [type(v) for pair in f.cpus + f.pids for v in pair] == [int] * 8
    assert (f.cpus, f.pids) == (((0, 2), (1, 1)), ((A, 2), (B, 1)))
