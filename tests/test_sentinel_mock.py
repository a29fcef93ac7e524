"""The mock source: deterministic for a seed and a clock, a batch every period at the
set rate, known flows, symbolizable stacks, and the kernel's budget, events and
targets obeyed; scripted streams for later tests (HITM lines, remote DRAM)."""

from __future__ import annotations

from typing import Any

import numpy as np

from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.records import Event, SampleSource, sample_dtype
from meridian.tools.sentinel.sources.mock import (
    DEFAULT_FLOWS,
    SHARED_LINES,
    MockSource,
    make_samples,
)
from meridian.tools.sentinel.sources.pmu_events import parse_events

MS = 1_000_000


class FakeTime:
    """An injected monotonic clock; sleeping advances it."""

    def __init__(self) -> None:
        self.ns = 1_000 * 1_000_000_000
        self.slept: list[float] = []

    def __call__(self) -> int:
        return self.ns

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.ns += int(s * 1e9)


def source(t: FakeTime, **kw: Any) -> MockSource:
    return MockSource(kw.pop("period_ms", 25), kw.pop("rng_seed", 1), t, sleep=t.sleep, **kw)


def run(src: MockSource, t: FakeTime, seconds: float, step_ms: int = 25) -> np.ndarray[Any, Any]:
    out = []
    for _ in range(int(seconds * 1000 / step_ms)):
        t.ns += step_ms * MS
        samples, lbr = src.poll(0)
        assert len(lbr) == 0
        out.append(samples)
    return np.concatenate(out)


def test_is_a_sample_source() -> None:
    src: SampleSource = MockSource()
    assert src.name == "mock"
    src.close()


def test_a_batch_every_period() -> None:
    t = FakeTime()
    src = source(t, rate=2000)
    t.ns += 10 * MS
    samples, _ = src.poll(0.005)  # not due: waits at most the timeout
    assert len(samples) == 0
    assert t.slept == [0.005]
    samples, _ = src.poll(1.0)  # sleeps the 10 ms left, then one batch of 25 ms
    assert abs(t.slept[-1] - 0.010) < 1e-9
    assert len(samples) == 50
    assert samples.dtype == sample_dtype()
    assert (np.diff(samples["time_ns"].astype(np.int64)) >= 0).all()


def test_rates_for_the_benchmarks() -> None:
    for rate in (1_000, 10_000, 100_000):
        t = FakeTime()
        assert len(run(source(t, rate=rate), t, 1.0)) == rate


def test_deterministic_for_a_seed() -> None:
    a, b, c = FakeTime(), FakeTime(), FakeTime()
    sa = run(source(a, rng_seed=7), a, 0.5)
    sb = run(source(b, rng_seed=7), b, 0.5)
    sc = run(source(c, rng_seed=8), c, 0.5)
    assert sa.tobytes() == sb.tobytes()
    assert sa.tobytes() != sc.tobytes()


def test_flows_stacks_and_symbols() -> None:
    t = FakeTime()
    src = source(t, rate=5000)
    samples = run(src, t, 0.2)
    flows = src.new_flows()
    assert flows == {f.key.flow_id: f.key for f in DEFAULT_FLOWS}
    assert str(flows[FlowKey("10.0.0.2", "10.0.0.1", 43012, 5201).flow_id]) == (
        "10.0.0.2:43012 -> 10.0.0.1:5201 tcp"
    )
    assert src.new_flows() == {}
    assert set(samples["flow_id"].tolist()) == set(flows) | {0}
    assert (samples["gso_segs"] >= 1).all()
    regions = src.symbols()

    def region(pid: int, ip: int) -> str | None:
        return next((n for p, lo, hi, n in regions if p == pid and lo <= ip < hi), None)

    for s in samples[:200]:
        pid, ip = int(s["pid"]), int(s["ip"])
        leaf = region(pid, ip)
        assert leaf is not None
        frames = src.stack_ips(int(s["user_stack_id"]))
        assert region(pid, frames[0]) == leaf
        assert region(pid, frames[-1]) == "mock_main"
    assert src.stack_ips(99_999) == ()


def test_samples_carry_the_set_events() -> None:
    t = FakeTime()
    src = source(t, rate=4000)
    assert src.set_events(parse_events("hitm,remote-dram,raw:0x1cd")) == 3.0
    samples = run(src, t, 0.5)
    assert set(samples["event"].tolist()) == {Event.XSNP_HITM, Event.REMOTE_DRAM, Event.RAW}
    hitm = samples[samples["event"] == Event.XSNP_HITM]
    lines = np.unique(hitm["data_addr"] & ~np.uint64(63))
    assert lines.tolist() == [SHARED_LINES + 64 * i for i in range(4)]
    remote = samples[samples["event"] == Event.REMOTE_DRAM]
    assert (remote["data_addr"] != 0).all()
    assert set(remote["numa_node"].tolist()) == {0, 1}
    assert set(samples[samples["event"] == Event.RAW]["raw_code"].tolist()) == {0x1CD}


def test_budget_per_cpu_token_bucket() -> None:
    """Budget 200/s per CPU, 4 CPUs, 8000 samples/s offered for 5 s: each CPU gets
    its budget (plus the initial headroom), the rest is counted as token_bucket."""
    t = FakeTime()
    src = source(t, rate=8000, cpus=4)
    src.set_budget(200, 0)
    samples = run(src, t, 5.0)
    per_cpu = np.bincount(samples["cpu"], minlength=4)
    headroom = 200 * 0.1
    assert ((per_cpu >= 1000) & (per_cpu <= 1000 + headroom)).all()
    dropped = src.dropped()
    assert dropped["token_bucket"] == 8000 * 5 - len(samples)
    assert dropped["hard_drop"] == 0
    src.set_budget(0, 0)  # no limit again
    assert len(run(src, t, 1.0)) == 8000


def test_a_long_poll_is_not_a_burst() -> None:
    """Polled every 500 ms at a rate within the budget (1,000/s over 4 CPUs, 1,000 per
    CPU), nothing is dropped: the bucket meets the samples one period at a time, as
    the kernel's meets them one by one, not as one burst at the poll."""
    t = FakeTime()
    src = source(t, rate=1000, cpus=4, period_ms=10)
    src.set_budget(1000, 0)
    samples = run(src, t, 5.0, step_ms=500)
    assert len(samples) == 5000
    assert src.dropped()["token_bucket"] == 0


def test_hard_drop_after_an_empty_bucket() -> None:
    t = FakeTime()
    src = source(t, rate=8000, cpus=2)
    src.set_budget(100, 60 * MS)
    samples = run(src, t, 2.0)
    d = src.dropped()
    assert d["hard_drop"] > 0
    assert d["token_bucket"] + d["hard_drop"] + len(samples) == 16000
    assert len(samples) <= 2 * (100 * 2 + 10)  # the budget and the headroom, no more


def test_targets() -> None:
    t = FakeTime()
    src = source(t, rate=4000)
    src.set_targets([4202])
    samples = run(src, t, 0.25)
    assert set(samples["pid"].tolist()) == {4202}
    assert src.dropped()["target_filtered"] == 1000 - len(samples) > 0


def test_ring_full_when_the_reader_stalls() -> None:
    t = FakeTime()
    src = source(t, rate=100_000, ring_samples=50_000)
    t.ns += 1_000 * MS
    samples, _ = src.poll(0)
    assert len(samples) == 50_000
    assert src.dropped()["ring_full"] == 50_000


def test_scripted_streams() -> None:
    """Known HITM and remote-DRAM samples, one batch per poll, then nothing."""
    flow = FlowKey("10.0.0.1", "10.0.0.2", 5201, 43012)
    line = 0x7F00_0000_1000
    hitm = make_samples(
        8, event=Event.XSNP_HITM, flow_id=flow.flow_id, cpu=np.arange(8) % 2,
        pid=np.arange(8) % 2 + 50, data_addr=line + np.arange(8) % 2 * 8, time_ns=np.arange(8),
    )  # fmt: skip
    remote = make_samples(4, event=Event.REMOTE_DRAM, numa_node=1, data_addr=0x9000, pid=51)
    slept: list[float] = []
    src = MockSource.from_samples([hitm, remote], flows=[flow], stacks={5: (1, 2)},
                                  sleep=slept.append)  # fmt: skip
    src.set_targets([51])
    a, _ = src.poll(1.0)
    assert a.tobytes() == hitm[hitm["pid"] == 51].tobytes()
    assert src.new_flows() == {flow.flow_id: flow}
    assert src.dropped()["target_filtered"] == 4
    src.set_targets([])
    src.feed(hitm[:1])
    b, _ = src.poll(1.0)
    assert b["numa_node"].tolist() == [1] * 4
    c, _ = src.poll(1.0)
    assert len(c) == 1
    assert src.stack_ips(5) == (1, 2)
    d, _ = src.poll(0.5)
    assert len(d) == 0
    assert slept == [0.5]
    src.close()
    assert len(src.poll(0)[0]) == 0


def test_late_packets_for_the_skew_adjuster() -> None:
    """About half of the flow-0 samples have their packet just after them: the skew
    adjuster completes those, the rest stay flow 0."""
    from meridian.tools.sentinel.pipeline.skew import SkewAdjuster

    t = FakeTime()
    src = source(t, rate=10_000)
    sk = SkewAdjuster(200_000)
    out = []
    for _ in range(40):
        t.ns += 25 * MS
        samples, _ = src.poll(0)
        out.append(sk.push(samples, src.contexts()))
    out.append(sk.flush())
    got = np.concatenate(out)
    assert len(got) == 10_000
    no_flow = 10_000 * 0.10
    assert 0.4 * no_flow < sk.completed < 0.6 * no_flow
    assert int((got["flow_id"] == 0).sum()) == sk.expired
    assert len(src.contexts()) == 0
