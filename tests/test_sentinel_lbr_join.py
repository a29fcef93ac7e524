"""Branch records (LBR) of `meridian sentinel --lbr` (issue 25) past the source: the
mock's synthetic branch stacks, each batch carrying the records of its own samples
through the skew adjuster, and the whole path to ms_raw_samples.lbr_from / lbr_to
without a PMU. The key, the flag and the probe: test_sentinel_lbr.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from children import wait_until
from sentinel_values import Array

from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.pipeline.branches import BranchJoin, member
from meridian.tools.sentinel.sources.mock import FUNC_SIZE, FUNCTIONS, MockSource
from meridian.tools.sentinel.sources.mock_branches import (
    CALL_BYTES,
    LOOP_FROM,
    LOOP_TO,
    branch_stacks,
)

AGENT = [sys.executable, "-m", "meridian", "sentinel", "--perf-mock", "--json"]
AGENT += ["--prometheus", "127.0.0.1:0"]


# ---- the mock's branch stacks ------------------------------------------------------------


class FakeTime:
    def __init__(self) -> None:
        self.ns = 1_000 * 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def sleep(self, s: float) -> None:
        self.ns += int(s * 1e9)


def polls(src: MockSource, t: FakeTime, n: int = 20) -> list[tuple[Array, Array]]:
    out = []
    for _ in range(n):
        t.ns += 25_000_000
        out.append(src.poll(0))
    return out


def test_mock_records_join_their_samples() -> None:
    t = FakeTime()
    src = MockSource(25, 1, t, sleep=t.sleep, rate=20_000, lbr=True)
    total = 0
    for samples, lbr in polls(src, t):
        total += len(samples)
        # one record per sample, in its order, its count in lbr_nr
        assert len(lbr) == len(samples)
        assert (lbr["cpu"] == samples["cpu"]).all() and (lbr["time_ns"] == samples["time_ns"]).all()
        assert (samples["lbr_nr"] == lbr["nr"]).all() and (lbr["nr"] >= 1).all()
        col = np.arange(lbr["entries"].shape[1])
        unused = col[None, :] >= lbr["nr"][:, None]
        assert (lbr["entries"]["from"][unused] == 0).all()
        assert (lbr["entries"]["from"][~unused] != 0).all()
        keys = set(zip(samples["cpu"].tolist(), samples["time_ns"].tolist(), strict=True))
        assert len(keys) == len(samples)  # (cpu, time_ns) is a key, as in the kernel
    assert total > 5000
    off = MockSource(25, 1, t, sleep=t.sleep, rate=20_000)
    for samples, lbr in polls(off, t, 3):
        assert len(lbr) == 0 and len(samples) and (samples["lbr_nr"] == 0).all()


def test_mock_records_only_for_samples_kept() -> None:
    """The kernel takes a sample's branches after its token: dropped samples have none."""
    t = FakeTime()
    src = MockSource(25, 2, t, sleep=t.sleep, rate=20_000, cpus=2, lbr=True)
    src.set_budget(100, 0)
    seen = 0
    for samples, lbr in polls(src, t):
        assert member(lbr, samples).all() and len(lbr) == len(samples)
        seen += len(samples)
    assert src.dropped()["token_bucket"] > 0 and seen > 0


def region_of(src: MockSource) -> Any:
    regions = src.symbols()

    def region(pid: int, ip: int) -> tuple[int, str]:
        return next((lo, n) for p, lo, hi, n in regions if p == pid and lo <= ip < hi)

    return region


def test_mock_branches_walk_the_sample_stack() -> None:
    """Loop back-edges in the sample's function, then the calls that led to it: from
    each caller's frame in the sample's stack (less a call's bytes) to its callee."""
    t = FakeTime()
    src = MockSource(25, 3, t, sleep=t.sleep, rate=5000, lbr=True)
    region = region_of(src)
    callers = {name: c for name, c, _ in FUNCTIONS}
    checked = 0
    for samples, lbr in polls(src, t, 4):
        for s, r in zip(samples[:100], lbr[:100], strict=False):
            pid, ip = int(s["pid"]), int(s["ip"])
            frames = src.stack_ips(int(s["user_stack_id"]))
            start, name = region(pid, ip)
            nr = int(r["nr"])
            frm = r["entries"]["from"][:nr].tolist()
            to = r["entries"]["to"][:nr].tolist()
            loops = nr - (len(frames) - 1)
            assert 1 <= loops <= 6
            assert frm[:loops] == [start + LOOP_FROM] * loops
            assert to[:loops] == [start + LOOP_TO] * loops
            assert frm[loops:] == [f - CALL_BYTES for f in frames[1:]]
            assert to[loops:] == [region(pid, f)[0] for f in frames[:-1]]
            assert region(pid, frames[-1])[1] == "mock_main"
            assert (callers[name] < 0) == (nr == loops)
            checked += 1
    assert checked > 100
    assert FUNC_SIZE > LOOP_FROM  # every address in the function's region


def test_branch_stacks_outside_the_mock_functions() -> None:
    t = FakeTime()
    src = MockSource(25, 4, t, sleep=t.sleep, rate=2000, lbr=True)
    samples = polls(src, t, 2)[-1][0].copy()
    samples["ip"][::2] = 0x1000  # not a mock function
    samples["pid"][1::4] = 1  # not a mock process
    records = branch_stacks(samples)
    outside = np.zeros(len(samples), dtype=bool)
    outside[::2] = outside[1::4] = True
    assert (records["nr"][outside] == 0).all() and (records["nr"][~outside] > 0).all()
    assert (records["time_ns"] == samples["time_ns"]).all()


# ---- each batch with the records of its own samples -----------------------------------

REC = np.dtype([("time_ns", "<u8"), ("cpu", "<u4"), ("nr", "<u4")])
SMP = np.dtype([("time_ns", "<u8"), ("cpu", "<u4"), ("flow_id", "<u8")])


def recs(*keys: tuple[int, int]) -> Array:
    out = np.zeros(len(keys), dtype=REC)
    for i, (cpu, t) in enumerate(keys):
        out[i] = (t, cpu, 1 + i)
    return out


def smps(*keys: tuple[int, int]) -> Array:
    out = np.zeros(len(keys), dtype=SMP)
    for i, (cpu, t) in enumerate(keys):
        out[i] = (t, cpu, 0)
    return out


def keys(a: Array) -> list[tuple[int, int]]:
    return sorted(zip(a["cpu"].tolist(), a["time_ns"].tolist(), strict=True))


def test_member() -> None:
    r = recs((0, 10), (1, 10), (0, 20), (2, 5))
    s = smps((1, 10), (0, 20), (0, 11), (3, 5))
    assert member(r, s).tolist() == [False, True, True, False]
    assert member(r, s[:0]).tolist() == [False] * 4
    assert member(r[:0], s).tolist() == []


def test_join_through_the_stages() -> None:
    j = BranchJoin()
    # poll 1: three samples with records; (0, 20) waits for its packet; (1, 30) filtered;
    # the record of (0, 50) came before its sample (reserved, not yet committed)
    polled = smps((0, 10), (0, 20), (1, 30))
    j.add(recs((0, 10), (0, 20), (1, 30), (0, 50)), polled)
    out = j.take(polled[:1], waiting=polled[1:2])
    assert keys(out) == [(0, 10)]
    assert j.held == 2  # (0, 20) for its sample held; (0, 50) for its sample to come
    # poll 2: (0, 50) arrives; (0, 20) got its packet
    later = smps((0, 50))
    j.add(recs()[:0], later)
    out = j.take(np.concatenate([later, polled[1:2]]), waiting=None)
    assert keys(out) == [(0, 20), (0, 50)] and j.held == 0
    # nothing waits forever: a record older than its CPU's newest sample whose sample
    # was filtered goes
    j.add(recs((3, 7)), smps((3, 7), (3, 9)))
    assert len(j.take(smps((3, 9)))) == 0 and j.held == 0


def test_join_without_records_costs_nothing() -> None:
    j = BranchJoin()
    none = recs()[:0]
    j.add(none, smps((0, 1), (1, 2)))
    out = j.take(smps((0, 1)), smps((1, 2)))
    assert len(out) == 0 and out.dtype == REC and j.held == 0
    assert len(j._newest) == 0  # no times kept without records


E18 = 10**18  # a monotonic time a float64 cannot hold to the ns


def test_member_exact_to_the_ns_and_whatever_sorts_first() -> None:
    """A record and a sample 1 ns apart at 1e18 are not one; a sample that sorts before
    every record does not stop the others' joins."""
    r = recs((1, E18 + 1), (1, E18 + 5))
    s = smps((0, 3), (1, E18 + 2), (1, E18 + 5))
    assert member(r, s).tolist() == [False, True]


def test_a_record_newer_by_1_ns_waits_and_one_on_a_cpu_never_sampled_waits() -> None:
    """Times kept exact: a record 1 ns newer than its CPU's newest sample waits for it.
    A record of a CPU past every sampled one (exactly the next, and further) waits."""
    t = E18 + 100  # as a float64, 1e18 + 128
    j = BranchJoin()
    j.add(recs((0, t + 1), (1, 7), (5, 7)), smps((0, t)))
    assert len(j.take(smps((0, t)))) == 0 and j.held == 3
    j.add(recs()[:0], smps((0, t + 1), (1, 7), (5, 7)))
    assert keys(j.take(smps((0, t + 1), (1, 7), (5, 7)))) == [(0, t + 1), (1, 7), (5, 7)]


def test_take_with_nothing_held_is_no_record_of_the_source_s_type() -> None:
    """Before any poll: no record (of the default type); after one whose records all
    went, none of the source's type (not one left over)."""
    first = BranchJoin().take(smps((0, 1)))
    assert len(first) == 0 and first.dtype.names is not None and "nr" in first.dtype.names
    j = BranchJoin()
    j.add(recs((0, 1)), smps((0, 1)))
    assert keys(j.take(smps((0, 1)))) == [(0, 1)]
    again = j.take(smps((0, 2)))
    assert len(again) == 0 and again.dtype == REC


class Batches:
    def __init__(self) -> None:
        self.batches: list[Any] = []
        self.lock = threading.Lock()

    def on_samples(self, batch: Any) -> None:
        with self.lock:
            self.batches.append(batch)

    def on_window(self, window: Any) -> None:
        pass

    def close(self) -> None:
        pass


def lbr_config() -> SentinelConfig:
    cfg = SentinelConfig()
    cfg.metrics.enabled = cfg.anomaly.enabled = cfg.mode.auto = False
    cfg.aggregator.flush_interval = 0.2
    cfg.mock.enabled = True
    cfg.perf.lbr = "branch-stack"
    return cfg


def test_runtime_batches_carry_their_own_records() -> None:
    """Through the consumer: a flow-0 sample the skew adjuster holds for its packet
    goes on with the next poll's batch, and its branch record with it."""
    from meridian.tools.sentinel.agent.run import Runtime
    from meridian.tools.sentinel.sources.mock import JIT_BASE, PIDS, make_samples

    at = time.monotonic_ns() + 60 * 10**9  # ahead of the runtime's clock: nothing expires
    ip = JIT_BASE + 2 * FUNC_SIZE + 0x20  # in mock_tcp_recv
    first = make_samples(2, cpu=[0, 1], time_ns=[at, at], flow_id=[0, 5], pid=PIDS[0], ip=ip)
    # CPU 0's time passes the first sample's window: it goes on, as flow 0
    second = make_samples(1, cpu=0, time_ns=at + 10**6, flow_id=5, pid=PIDS[0], ip=ip)
    src = MockSource.from_samples([first, second])
    src.lbr = True
    rec = Batches()
    rt = Runtime(lbr_config(), src, observers=[rec], log=lambda line: None)
    rt.start()
    try:
        wait_until(lambda: sum(len(b.samples) for b in rec.batches) >= 3, 20, "3 samples")
    finally:
        rt.stop()
    got = [(keys(b.samples), keys(b.lbr)) for b in rec.batches]
    assert got == [([(1, at)], [(1, at)]), ([(0, at), (0, at + 10**6)],) * 2], got
    for b in rec.batches:
        want = branch_stacks(b.samples)
        order = np.lexsort((b.lbr["time_ns"], b.lbr["cpu"]))
        assert (
            b.lbr["entries"][order].tobytes()
            == want["entries"][np.lexsort((want["time_ns"], want["cpu"]))].tobytes()
        )


def test_runtime_with_generated_samples() -> None:
    from meridian.tools.sentinel.agent.run import Runtime

    src = MockSource(period_ms=10, rng_seed=5, rate=4000, lbr=True)
    rec = Batches()
    rt = Runtime(lbr_config(), src, observers=[rec], log=lambda line: None)
    rt.start()
    try:
        wait_until(lambda: sum(len(b.samples) for b in rec.batches) > 2000, 20, "samples")
    finally:
        rt.stop()
    for b in rec.batches:
        assert len(b.lbr) == len(b.samples) and member(b.lbr, b.samples).all()


# ---- the whole path to the store -----------------------------------------------------------


def test_mock_lbr_stored_in_raw_samples(tmp_path: Path) -> None:
    """`meridian sentinel --perf-mock --lbr --raw-samples --data-dir DIR`: every raw
    sample stored has the branch stack the mock generated for it."""
    pytest.importorskip("chdb", reason="chDB is not installed (the clickhouse extra)")
    from meridian.tools.sentinel.storage import ChdbBackend

    store = tmp_path / "store"
    p = subprocess.run(
        [*AGENT, "--lbr", "--raw-samples", "--data-dir", str(store), "--duration", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.splitlines()[-1])
    db = ChdbBackend(store)
    db.open()
    try:
        rows = db.query(
            "SELECT cpu, ktime_ns, pid, ip, flow_source, lbr_from, lbr_to FROM ms_raw_samples"
        )
    finally:
        db.close()
    assert len(rows) == summary["samples"] > 500
    samples = np.zeros(len(rows), dtype=[(k, "<u8") for k in ("time_ns", "cpu", "pid", "ip")])
    for name, key in (("time_ns", "ktime_ns"), ("cpu", "cpu"), ("pid", "pid"), ("ip", "ip")):
        samples[name] = [int(r[key]) for r in rows]
    want = branch_stacks(samples)
    for r, w in zip(rows, want, strict=True):
        nr = int(w["nr"])
        assert nr > 0 and r["lbr_from"] and len(r["lbr_from"]) == len(r["lbr_to"]) == nr
        assert [int(x) for x in r["lbr_from"]] == w["entries"]["from"][:nr].tolist()
        assert [int(x) for x in r["lbr_to"]] == w["entries"]["to"][:nr].tolist()
    assert any(int(r["flow_source"]) == 1 for r in rows)  # held by the skew adjuster too
