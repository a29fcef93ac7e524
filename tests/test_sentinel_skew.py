"""The skew adjuster: a flow-0 sample takes the flow of its CPU's packet seen within
the window after it; past the window it stays flow 0; CPUs never mix."""

from __future__ import annotations

from typing import Any

import numpy as np

from meridian.tools.sentinel.model.records import CONTEXT_DTYPE, FlowSource
from meridian.tools.sentinel.pipeline.skew import SkewAdjuster
from meridian.tools.sentinel.sources.mock import make_samples

W = 200_000  # window, ns
T0 = 10_000_000_000
FLOW = 0xABCDEF


def ctx(*rows: tuple[int, int, int]) -> np.ndarray[Any, Any]:
    """(cpu, time_ns, flow_id) contexts on ifindex 7, gso 4, tx."""
    out = np.zeros(len(rows), dtype=CONTEXT_DTYPE)
    for i, (cpu, t, flow) in enumerate(rows):
        out[i] = (t, flow, cpu, 7, 4, 1)
    return out


def sample(cpu: int, t: int, flow: int = 0, pid: int = 1) -> np.ndarray[Any, Any]:
    return make_samples(1, cpu=cpu, time_ns=t, flow_id=flow, pid=pid, flow_source=2)


def test_sample_before_its_packet_gets_the_flow() -> None:
    sk = SkewAdjuster(W)
    assert len(sk.push(sample(0, T0))) == 0  # waits: nothing after it yet
    out = sk.push(sample(0, T0 + 10)[:0], ctx((0, T0 + 150_000, FLOW)))
    assert out["flow_id"].tolist() == [FLOW]
    assert (int(out["ifindex"][0]), int(out["gso_segs"][0]), int(out["direction"][0])) == (7, 4, 1)
    assert int(out["flow_source"][0]) == FlowSource.HISTORY
    assert sk.completed == 1
    assert sk.pending == 0


def test_context_already_known_completes_a_late_sample() -> None:
    sk = SkewAdjuster(W)
    sk.push(sample(0, T0 - 1_000_000, FLOW), ctx((0, T0 + 50_000, FLOW)))
    out = sk.push(sample(0, T0))
    assert out["flow_id"].tolist() == [FLOW]


def test_past_the_window_it_stays_flow_zero() -> None:
    sk = SkewAdjuster(W)
    assert len(sk.push(sample(0, T0))) == 0
    out = sk.push(sample(0, T0)[:0], ctx((0, T0 + W + 1, FLOW)))
    assert out["flow_id"].tolist() == [0]
    assert int(out["time_ns"][0]) == T0
    assert sk.expired == 1
    assert sk.pending == 0


def test_exactly_at_the_window_edge_matches() -> None:
    sk = SkewAdjuster(W)
    out = sk.push(sample(0, T0), ctx((0, T0 + W, FLOW)))
    assert out["flow_id"].tolist() == [FLOW]


def test_per_cpu() -> None:
    """cpu 1's packet does not complete cpu 0's sample; cpu 0's own later time (a
    sample past the window) releases it as flow 0."""
    sk = SkewAdjuster(W)
    out = sk.push(sample(0, T0), ctx((1, T0 + 1_000, FLOW)))
    assert len(out) == 0
    out = sk.push(sample(0, T0 + W + 5, 0x77))
    assert sorted(out["flow_id"].tolist()) == [0, 0x77]


def test_samples_with_a_flow_pass_straight_through() -> None:
    sk = SkewAdjuster(W)
    batch = np.concatenate([sample(0, T0 + i, FLOW) for i in range(3)])
    assert len(sk.push(batch)) == 3
    assert sk.pending == 0


def test_many_samples_vectorised() -> None:
    """1000 samples on 4 CPUs, a packet 1 us after every second one."""
    sk = SkewAdjuster(W)
    n = 1000
    cpu = np.arange(n) % 4
    t = T0 + np.arange(n, dtype=np.uint64) * 1_000_000  # 1 ms apart: no overlap
    samples = make_samples(n, cpu=cpu, time_ns=t)
    has = np.arange(n) % 2 == 0
    contexts = np.zeros(int(has.sum()), dtype=CONTEXT_DTYPE)
    contexts["cpu"] = cpu[has]
    contexts["time_ns"] = t[has] + 1_000
    contexts["flow_id"] = 1000 + np.arange(n)[has]
    out = sk.push(samples, contexts, now_ns=int(t[-1]) + 10 * W)
    assert len(out) == n
    got = dict(zip(out["time_ns"].tolist(), out["flow_id"].tolist(), strict=True))
    for i in range(n):
        assert got[int(t[i])] == (1000 + i if i % 2 == 0 else 0)


def test_idle_cpu_released_by_now_and_flush() -> None:
    sk = SkewAdjuster(W)
    sk.push(sample(2, T0))
    assert len(sk.push(sample(2, T0)[:0], now_ns=T0 + W // 2)) == 0
    assert len(sk.push(sample(2, T0)[:0], now_ns=T0 + 2 * W)) == 1
    sk.push(sample(3, T0))
    left = sk.flush()
    assert left["cpu"].tolist() == [3]
    assert len(sk.flush()) == 0


def test_bounded() -> None:
    sk = SkewAdjuster(W, max_pending=10)
    out = sk.push(make_samples(25, cpu=0, time_ns=T0 + np.arange(25)))
    assert len(out) == 15
    assert out["time_ns"].max() == T0 + 14  # the oldest went first
    assert sk.pending == 10


def test_times_far_apart_use_the_search_per_cpu() -> None:
    """Packed (cpu, time) keys need the times within 2**40 ns: else one search per CPU,
    with the same answers."""
    from meridian.tools.sentinel.pipeline.skew import _first_at_or_after

    rng = np.random.default_rng(5)
    for spread in (1 << 20, 1 << 45):
        c = np.sort(rng.integers(0, 4, 200)).astype(np.uint32)
        t = np.zeros(200, dtype=np.uint64)
        for cpu in range(4):
            idx = np.flatnonzero(c == cpu)
            t[idx] = np.sort(rng.integers(T0, T0 + spread, len(idx))).astype(np.uint64)
        qc = rng.integers(0, 5, 300).astype(np.uint32)
        qt = rng.integers(T0, T0 + spread, 300).astype(np.uint64)
        got = _first_at_or_after(c, t, qc, qt)
        for i in range(300):
            same = np.flatnonzero((c == qc[i]) & (t >= qt[i]))
            if len(same):
                assert got[i] == same[0]
            else:
                assert got[i] == len(c) or c[min(got[i], len(c) - 1)] != qc[i]


def test_a_poll_pushed_in_parts_gets_the_answers_of_one_push() -> None:
    """Three packets 1 ms apart on one CPU, a flow-0 sample 50 us before each: pushed
    one sample at a time (the consumer's parts), each still finds its packet (pruning
    after the first part would drop the second packet's context: flow 0)."""
    ms = 1_000_000
    contexts = ctx((0, T0 + ms, 7), (0, T0 + 2 * ms, 8), (0, T0 + 3 * ms, 9))
    samples = np.concatenate([sample(0, T0 + k * ms - 50_000) for k in (1, 2, 3)])
    whole = SkewAdjuster(W).push(samples.copy(), contexts, now_ns=None)
    sk = SkewAdjuster(W)
    parts = list(sk.push_parts(samples.copy(), contexts, None, size=1))
    assert [len(rest) for _, rest in parts] == [2, 1, 0]
    got = np.concatenate([ready for ready, _ in parts])
    assert whole["flow_id"].tolist() == [7, 8, 9]
    assert got["flow_id"].tolist() == [7, 8, 9]
    assert sk.pending == 0
