"""Detectors on sample streams whose answer is known: false sharing reported for two
CPUs (or processes) over the threshold and not for one CPU or under it, exact scores
and per-CPU/per-process counts, the data-object join; remote DRAM counted exactly per
(flow, node, interface); windows, the key bound, the registry, and the whole mock
source (HITM and remote-DRAM samples drawn) checked against a plain Python count."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sentinel_values import remote

from meridian.tools.sentinel.detectors import DetectorContext, Finding, create_all, detector_types
from meridian.tools.sentinel.detectors.false_sharing import FalseSharing, FalseSharingFinding
from meridian.tools.sentinel.detectors.remote_dram import RemoteDram, RemoteDramFinding
from meridian.tools.sentinel.detectors.window import WindowCounts
from meridian.tools.sentinel.model.records import Event, concat
from meridian.tools.sentinel.sources.mock import MockSource, make_samples
from meridian.tools.sentinel.sources.pmu_events import parse_events

Array = np.ndarray[Any, Any]
SEC = 1_000_000_000
T0 = 1000 * SEC
LINE = 0x7F10_0000_0040  # a cache line's address
A, B = 4201, 4202  # processes


def hitm(cpu_pid_hits: list[tuple[int, int, int]], line: int = LINE, event: int = 0) -> Array:
    """`hits` HITM samples on `line` per (cpu, pid, hits), words of the line in turn."""
    cpu = [c for c, _, n in cpu_pid_hits for _ in range(n)]
    pid = [p for _, p, n in cpu_pid_hits for _ in range(n)]
    n = len(cpu)
    addr = np.uint64(line) + (np.arange(n, dtype=np.uint64) % np.uint64(8)) * np.uint64(8)
    times = T0 + np.arange(n, dtype=np.uint64) * np.uint64(1000)
    ev = event or Event.XSNP_HITM
    return make_samples(n, event=ev, cpu=cpu, pid=pid, tid=pid, data_addr=addr, time_ns=times)


def flushed(det: FalseSharing | RemoteDram, now: int = T0 + SEC) -> list[Finding]:
    out: list[Finding] = []
    det.flush(now, out.append)
    return out


def sharing(det: FalseSharing, now: int = T0 + SEC) -> list[FalseSharingFinding]:
    found = flushed(det, now)
    assert all(isinstance(f, FalseSharingFinding) for f in found)
    return [f for f in found if isinstance(f, FalseSharingFinding)]


# ---- false sharing ---------------------------------------------------------------------


def test_two_cpus_over_the_threshold_are_reported() -> None:
    det = FalseSharing(min_hits=4)
    det.observe(hitm([(0, A, 5), (1, A, 4), (2, A, 3)]))  # cpu 2 under the threshold
    det.observe(hitm([(0, A, 1)], line=LINE + 64))  # another line, one CPU
    [f] = sharing(det)
    assert f.line == LINE
    assert f.score == 12.0  # every HITM sample on the line, cpu 2's too
    assert f.cpus == ((0, 5), (1, 4), (2, 3))
    assert f.pids == ((A, 12),)
    assert (f.window_start_ns, f.window_end_ns) == (T0, T0 + SEC)
    assert f.last_ns == T0 + 11 * 1000
    assert f.labels() == {"line": "0x7f1000000040", "object": "", "pid": str(A)}
    assert f.metric == "ms_false_sharing_score" and f.value == 12.0


def test_one_cpu_is_not_reported() -> None:
    det = FalseSharing(min_hits=4)
    det.observe(hitm([(3, A, 500)]))
    assert sharing(det) == []


def test_under_the_threshold_is_not_reported() -> None:
    stream = hitm([(0, A, 10), (1, A, 3)])
    det = FalseSharing(min_hits=4)
    det.observe(stream)
    assert sharing(det) == []
    det = FalseSharing(min_hits=3)
    det.observe(stream)
    assert [f.score for f in sharing(det)] == [13.0]


def test_two_processes_on_one_cpu_are_reported() -> None:
    det = FalseSharing(min_hits=4)
    det.observe(hitm([(0, A, 4), (0, B, 6)]))
    [f] = sharing(det)
    assert f.cpus == ((0, 10),)
    assert f.pids == ((B, 6), (A, 4))
    assert f.labels()["pid"] == str(B)


def test_other_events_and_no_address_are_ignored() -> None:
    det = FalseSharing(min_hits=1)
    det.observe(hitm([(0, A, 5), (1, A, 5)], event=Event.LLC_MISS))
    no_addr = hitm([(0, A, 5), (1, A, 5)])
    no_addr["data_addr"] = 0
    det.observe(no_addr)
    assert sharing(det) == []


def test_batches_add_up_and_lines_come_hottest_first() -> None:
    det = FalseSharing(min_hits=2)
    other = LINE + 0x1000
    for part in (
        hitm([(0, A, 1), (1, B, 2)]),
        hitm([(0, A, 1), (1, B, 1)]),
        hitm([(4, A, 9), (5, A, 9)], line=other),
    ):
        det.observe(part)
    found = sharing(det)
    assert [(f.line, f.score) for f in found] == [(other, 18.0), (LINE, 5.0)]
    assert found[1].cpus == ((1, 3), (0, 2))


def test_each_flush_is_a_window() -> None:
    det = FalseSharing(min_hits=4)
    det.observe(hitm([(0, A, 4), (1, A, 2)]))
    assert sharing(det, T0 + SEC) == []
    det.observe(hitm([(0, A, 2), (1, A, 2)]))  # 6 and 4 over both: not one window
    assert sharing(det, T0 + 2 * SEC) == []


def test_a_longer_window_spans_flushes() -> None:
    det = FalseSharing(min_hits=4, min_window_ns=2 * SEC)
    det.observe(hitm([(0, A, 4), (1, A, 2)]))
    assert sharing(det, T0 + SEC) == []  # still open
    det.observe(hitm([(0, A, 2), (1, A, 2)]))
    [f] = sharing(det, T0 + 2 * SEC)
    assert f.cpus == ((0, 6), (1, 4))
    assert (f.window_start_ns, f.window_end_ns) == (T0, T0 + 2 * SEC)


def test_the_line_is_joined_to_its_data_object(tmp_path: Path) -> None:
    from meridian.tools.sentinel.symbols.symbolizer import Symbolizer

    (tmp_path / "kallsyms").write_text("")
    sym = Symbolizer(
        proc_root=tmp_path, kallsyms=tmp_path / "kallsyms", perf_map_dir=tmp_path, debug_root=None
    )
    sym.register_data_object(A, LINE - 0x40, "rx_ring", "struct ring", 0x100)
    sym.register_data_object(B, 0x1000, "elsewhere", None, 0x40)
    det = FalseSharing.create(DetectorContext(objects=sym))
    det.observe(hitm([(0, B, 9), (1, A, 4)]))
    [f] = sharing(det)
    # B has most samples but nothing registered there: A's object is the one
    assert (f.data_object, f.data_object_pid) == ("rx_ring", A)
    assert f.data_object_id == sym.data_object_id(A, LINE)
    assert f.labels() == {"line": "0x7f1000000040", "object": "rx_ring", "pid": str(B)}


# ---- remote DRAM -----------------------------------------------------------------------


def test_remote_dram_counts_per_flow_node_and_interface() -> None:
    det = RemoteDram()
    det.observe(remote([(0xAB, 1, 2, 3), (0xAB, 0, 2, 1), (0xCD, 1, 3, 5)]))
    det.observe(hitm([(0, A, 5)]))  # not remote DRAM
    found = flushed(det)
    assert all(isinstance(f, RemoteDramFinding) for f in found)
    got = [(f.flow_id, f.numa_node, f.ifindex, f.samples, f.first_ns, f.last_ns)
           for f in found if isinstance(f, RemoteDramFinding)]  # fmt: skip
    us = 1000
    assert got == [
        (0xCD, 1, 3, 5, T0 + 4 * us, T0 + 8 * us),
        (0xAB, 1, 2, 3, T0, T0 + 2 * us),
        (0xAB, 0, 2, 1, T0 + 3 * us, T0 + 3 * us),
    ]
    assert found[0].labels() == {"flow": f"{0xCD:016x}", "numa": "1", "ifindex": "3"}
    assert found[0].metric == "ms_remote_dram_hotspot" and found[0].value == 5.0
    assert flushed(det, T0 + 2 * SEC) == []  # the next window is empty


def test_remote_dram_under_min_samples_is_not_reported() -> None:
    det = RemoteDram(min_samples=3)
    det.observe(remote([(0xAB, 1, 2, 3), (0xCD, 0, 2, 2)]))
    assert [f.as_dict()["flow_id"] for f in flushed(det)] == [0xAB]


# ---- the window table, the registry ------------------------------------------------------


def test_keys_over_the_bound_are_dropped_and_counted() -> None:
    counts = WindowCounts([("k", "<u8")], max_keys=2)
    counts.add({"k": np.array([1, 1, 1, 2, 2, 3], dtype=np.uint64)}, np.arange(6, dtype=np.uint64))
    closed = counts.close(10)
    assert closed is not None
    assert closed.rows["k"].tolist() == [1, 2] and closed.rows["hits"].tolist() == [3, 2]
    assert counts.dropped == 1


def test_a_detector_past_its_bound_counts_the_samples_it_dropped() -> None:
    det = RemoteDram(max_keys=2)
    det.observe(remote([(0xAB, 1, 2, 3), (0xAB, 0, 2, 1), (0xCD, 1, 3, 5)]))
    assert [f.value for f in flushed(det)] == [5.0, 3.0]  # the two hottest kept
    assert det.dropped() == 1 and FalseSharing().dropped() == 0


def test_every_detector_is_registered_and_created() -> None:
    assert set(detector_types()) == {"false_sharing", "remote_dram"}
    made = create_all(DetectorContext())
    assert [type(d) for d in made] == [FalseSharing, RemoteDram]
    assert {d.metric for d in made} == {"ms_false_sharing_score", "ms_remote_dram_hotspot"}


def test_fed_by_the_mock_source() -> None:
    """The generated mock stream (4 CPUs, HITM on 4 shared lines, remote DRAM on two
    nodes) against a plain count of the same samples."""
    now = [T0]
    src = MockSource(25, 7, lambda: now[0], rate=4000, cpus=4, sleep=lambda s: None)
    src.set_events(parse_events("hitm,remote-dram"))
    fs, rd = FalseSharing(min_hits=4), RemoteDram()
    polled = []
    for _ in range(40):  # 1 s
        now[0] += 25_000_000
        samples, _ = src.poll(0)
        fs.observe(samples)
        rd.observe(samples)
        polled.append(samples)
    s = concat(polled)
    assert len(s) > 3000

    per_line: dict[int, Counter[int]] = {}
    per_pid: dict[int, Counter[int]] = {}
    dram: Counter[tuple[int, int, int]] = Counter()
    for r in s.tolist():
        row = dict(zip(s.dtype.names or (), r, strict=True))
        if row["event"] == Event.XSNP_HITM:
            line = row["data_addr"] & ~63
            per_line.setdefault(line, Counter())[row["cpu"]] += 1
            per_pid.setdefault(line, Counter())[row["pid"]] += 1
        elif row["event"] == Event.REMOTE_DRAM:
            dram[(row["flow_id"], row["numa_node"], row["ifindex"])] += 1

    lines = sharing(fs, now[0])
    assert len(lines) == 4  # every CPU hits each shared line
    for f in lines:
        assert f.score == sum(per_line[f.line].values())
        assert dict(f.cpus) == per_line[f.line]
        assert dict(f.pids) == per_pid[f.line]
    hot = flushed(rd, now[0])
    assert {(f.flow_id, f.numa_node, f.ifindex): f.samples
            for f in hot if isinstance(f, RemoteDramFinding)} == dram  # fmt: skip
    assert len(hot) == len(dram) > 4


@pytest.mark.parametrize("min_hits", [1, 10_000])
def test_mock_thresholds(min_hits: int) -> None:
    """The same scripted mock stream: reported at a low threshold, not at a high one."""
    src = MockSource.from_samples([hitm([(0, A, 20), (1, B, 20)])], sleep=lambda s: None)
    det = FalseSharing(min_hits=min_hits)
    samples, _ = src.poll(0)
    det.observe(samples)
    assert len(sharing(det)) == (1 if min_hits == 1 else 0)


def test_many_batches_merge_exactly() -> None:
    """More batches than are held before a merge: the counts stay exact."""
    det = FalseSharing(min_hits=1)
    for i in range(150):
        det.observe(hitm([(i % 3, A, 1), (7, B, 2)]))
    [f] = sharing(det)
    assert f.cpus == ((7, 300), (0, 50), (1, 50), (2, 50))
    assert f.pids == ((B, 300), (A, 150))
    assert f.score == 450.0 and det.counts.dropped == 0
