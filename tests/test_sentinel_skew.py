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


def test_counters_add_up_over_pushes_and_flush() -> None:
    """completed and expired count every sample over the run, flush's too."""
    sk = SkewAdjuster(W)
    for k in range(2):  # two samples completed, one push each
        t = T0 + k * 10 * W
        assert sk.push(sample(0, t), ctx((0, t + 10, FLOW)))["flow_id"].tolist() == [FLOW]
    for k in range(2):  # two expired, one push each
        sk.push(sample(1, T0 + k * 10 * W))
        assert len(sk.push(sample(1, T0)[:0], now_ns=T0 + k * 10 * W + W + 1)) == 1
    sk.push(sample(2, T0))
    assert len(sk.flush()) == 1
    assert (sk.completed, sk.expired, sk.pending) == (2, 3, 0)


def test_a_sample_expires_only_once_its_cpu_is_past_the_whole_window() -> None:
    sk = SkewAdjuster(W)
    sk.push(sample(0, T0))
    assert len(sk.push(sample(0, T0)[:0], now_ns=T0 + W)) == 0  # exactly the window
    assert sk.pending == 1
    assert len(sk.push(sample(0, T0)[:0], now_ns=T0 + W + 1)) == 1
    assert sk.expired == 1


def test_the_bound_keeps_exactly_max_pending_and_lets_the_oldest_go() -> None:
    sk = SkewAdjuster(W, max_pending=2)
    assert len(sk.push(make_samples(2, cpu=0, time_ns=T0 + np.array([5, 3])))) == 0
    out = sk.push(sample(0, T0 + 4))  # three waiting: the oldest (T0 + 3) goes, flow 0
    assert out["time_ns"].tolist() == [T0 + 3] and out["flow_id"].tolist() == [0]
    assert (sk.pending, sk.expired) == (2, 1)


def test_contexts_are_kept_for_twice_the_window_behind_their_cpu() -> None:
    """After a push, a CPU's contexts older than its latest time minus 2 windows are
    dropped, one exactly at that horizon is kept: a late sample then takes the oldest
    context left within its window (A, at the horizon), not one pruned (B)."""
    sk = SkewAdjuster(W)
    horizon = T0
    sk.push(sample(0, T0)[:0], ctx((0, horizon - W // 2, 0xB), (0, horizon, 0xA)))
    sk.push(sample(0, T0)[:0], ctx((0, horizon + 2 * W, 0xC)))  # the CPU's time now
    out = sk.push(sample(0, horizon - W // 2 - 10), now_ns=None)
    assert out["flow_id"].tolist() == [0xA]
    assert sk.completed == 1


def test_parts_return_each_completed_sample_with_the_first_part_and_release_by_now() -> None:
    """push_parts: the poll's contexts go in with the first part, so a flow-0 sample of
    the first part completes there; `now_ns` releases the last part's idle waiter; a
    poll of exactly two parts prunes after the second (the old context is gone for a
    later sample)."""
    contexts = ctx((0, T0 + 100, FLOW), (0, T0 + 4 * W, 0xD))
    samples = np.concatenate(
        [sample(0, T0), sample(0, T0 + 50, FLOW), sample(1, T0), sample(1, T0 + 1)]
    )
    sk = SkewAdjuster(W)
    parts = list(sk.push_parts(samples.copy(), contexts, T0 + 3 * W, size=2))
    assert [len(rest) for _, rest in parts] == [2, 0]
    assert parts[0][0]["flow_id"].tolist() == [FLOW, FLOW]
    assert parts[1][0]["cpu"].tolist() == [1, 1]  # released by now_ns: flow 0
    assert (sk.completed, sk.expired, sk.pending) == (1, 2, 0)
    # pruned after the last part: the context at T0 + 100 is behind CPU 0's time by
    # more than two windows, so a sample just before it no longer finds it
    late = sk.push(sample(0, T0 + 90), now_ns=T0 + 10 * W)
    assert late["flow_id"].tolist() == [0]


def test_times_exactly_2_to_the_40_apart_are_searched_per_cpu() -> None:
    """The packed key holds a time in 40 bits: a span of exactly 2**40 ns would carry
    into the CPU's bits, so it takes the search per CPU."""
    from meridian.tools.sentinel.pipeline.skew import _first_at_or_after

    c = np.array([0, 1], dtype=np.uint32)
    t = np.array([T0 + (1 << 40), T0], dtype=np.uint64)
    got = _first_at_or_after(
        c, t, np.array([0, 1], dtype=np.uint32), np.array([T0, T0], dtype=np.uint64)
    )
    assert got.tolist() == [0, 1]


def test_contexts_of_another_layout_are_read_by_field_name() -> None:
    """Contexts with the fields in another order and one more (a reader's own layout)."""
    other = np.dtype(
        [("pad", "u8"), *((n, CONTEXT_DTYPE[n]) for n in reversed(CONTEXT_DTYPE.names or ()))]
    )
    contexts = np.zeros(1, dtype=other)
    for name in CONTEXT_DTYPE.names or ():
        contexts[name] = ctx((0, T0 + 10, FLOW))[name]
    out = SkewAdjuster(W).push(sample(0, T0), contexts)
    assert out["flow_id"].tolist() == [FLOW] and int(out["ifindex"][0]) == 7
