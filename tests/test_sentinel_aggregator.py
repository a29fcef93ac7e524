"""Aggregation: exact samples and norm_cost on a batch whose answer is known, the
resolver called once per distinct key (a counting fake), time buckets, and the
interference class of each event."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from meridian.tools.sentinel.model.interference import InterferenceClass, classify
from meridian.tools.sentinel.model.records import IDLE, Event
from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE, UNRESOLVED, Rollup
from meridian.tools.sentinel.pipeline import aggregator
from meridian.tools.sentinel.pipeline.aggregator import SKIPPED_STACK, Aggregator, _Answers
from meridian.tools.sentinel.sources.mock import make_samples

SEC = 1_000_000_000


class CountingResolver:
    """Ids derived from the arguments, and every call counted."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[Any, ...]] = Counter()

    def function_id(self, pid: int, ip: int) -> int:
        self._count("function", pid, ip)
        return ip >> 8  # 256-byte "functions"

    def callstack_id(self, pid: int, user_stack_id: int, kernel_stack_id: int, ip: int) -> int:
        self._count("stack", pid, user_stack_id, kernel_stack_id, ip)
        return 0 if user_stack_id < 0 else 1000 + user_stack_id

    def data_object_id(self, pid: int, addr: int) -> int:
        self._count("data", pid, addr)
        return addr >> 6  # one object per cache line

    def _count(self, what: str, *args: int) -> None:
        """A resolver is asked with Python ints (a float id would lose bits)."""
        assert all(type(a) is int for a in args), args
        key = (what, *args)
        self.calls[key] += 1


def batch() -> np.ndarray[Any, Any]:
    """Flow 1: 3 cycles samples in function 0x10 (gso 1, 2, 4); flow 2: 2 LLC misses
    in function 0x20 (gso 1), one of them in the next second; 1 HITM on a line."""
    return np.concatenate(
        [
            make_samples(3, flow_id=1, pid=100, ip=[0x1000, 0x1008, 0x1000], gso_segs=[1, 2, 4],
                         event=Event.CYCLES, time_ns=[5, 6, 7], user_stack_id=3),
            make_samples(2, flow_id=2, pid=[200, 201], ip=0x2000, event=Event.LLC_MISS,
                         time_ns=[SEC - 1, SEC + 1], direction=1, numa_node=1),
            make_samples(1, flow_id=2, pid=200, ip=0x2010, event=Event.XSNP_HITM,
                         data_addr=0x7F00_0000_1048, time_ns=SEC - 2),
        ]
    )  # fmt: skip


def by_key(rows: list[Rollup]) -> dict[tuple[int, int, int, int], Rollup]:
    return {(r.flow_id, r.function_id, r.event, r.time_bucket): r for r in rows}


def test_samples_and_norm_cost_exact() -> None:
    agg = Aggregator(SEC, CountingResolver())
    agg.add(batch(), scale=3.0)
    rows = by_key(agg.flush())
    assert len(rows) == 4
    cyc = rows[(1, 0x10, Event.CYCLES, 0)]
    assert cyc.samples == 3
    assert cyc.norm_cost == pytest.approx(3.0 * (1 / 1 + 1 / 2 + 1 / 4))
    assert cyc.callstack_id == 1003
    assert cyc.interference_class == InterferenceClass.CPU
    assert cyc.pid == 100
    llc0 = rows[(2, 0x20, Event.LLC_MISS, 0)]
    llc1 = rows[(2, 0x20, Event.LLC_MISS, SEC)]
    assert (llc0.samples, llc0.norm_cost, llc0.pid) == (1, 3.0, 200)
    assert (llc1.samples, llc1.norm_cost, llc1.pid) == (1, 3.0, 201)
    assert (llc0.direction, llc0.numa_node, llc0.callstack_id) == (1, 1, 0)
    assert llc0.interference_class == InterferenceClass.CACHE
    hitm = rows[(2, 0x20, Event.XSNP_HITM, 0)]
    assert hitm.data_object_id == 0x7F00_0000_1048 >> 6
    assert hitm.interference_class == InterferenceClass.FALSE_SHARING
    assert sum(r.samples for r in rows.values()) == 6
    assert agg.flush() == []  # a new window


def test_resolver_called_once_per_distinct_key() -> None:
    r = CountingResolver()
    agg = Aggregator(SEC, r)
    big = np.concatenate([batch()] * 500)  # 3000 samples, same keys
    agg.add(big, 1.0)
    agg.add(batch(), 1.0)  # same window: answers reused
    assert max(r.calls.values()) == 1
    distinct_ip = {(int(s["pid"]), int(s["ip"])) for s in batch()}
    assert sum(1 for k in r.calls if k[0] == "function") == len(distinct_ip)
    assert sum(1 for k in r.calls if k[0] == "data") == 1  # only the non-zero address
    rows = by_key(agg.flush())
    assert rows[(1, 0x10, Event.CYCLES, 0)].samples == 3 * 501
    agg.add(batch(), 1.0)  # next window asks again
    assert max(r.calls.values()) == 2


class BatchResolver(CountingResolver):
    """CountingResolver with `function_ids`: a batch's addresses in one call."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def function_ids(self, pids: Any, ips: Any) -> list[int]:
        self.batches += 1
        return [self.function_id(p, ip) for p, ip in zip(pids.tolist(), ips.tolist(), strict=True)]


def test_a_batch_resolver_is_asked_once_per_batch_and_key() -> None:
    """function_ids gets a batch's (pid, ip) not answered yet in the window, in one
    call: the window's answers are looked up with numpy, the same ids as one by one."""
    r = BatchResolver()
    agg = Aggregator(SEC, r)
    agg.add(batch(), 1.0)
    agg.add(np.concatenate([batch()] * 3), 1.0)  # the same keys: no call
    assert r.batches == 1 and max(r.calls.values()) == 1
    want = Aggregator(SEC, CountingResolver())
    want.add(np.concatenate([batch()] * 4), 1.0)
    assert agg.flush() == want.flush()
    agg.add(batch(), 1.0)  # a new window asks again
    assert r.batches == 2 and max(r.calls.values()) == 2


def test_time_buckets_and_wall_times() -> None:
    agg = Aggregator(250_000_000, CountingResolver())
    s = make_samples(8, flow_id=5, time_ns=np.arange(8) * 100_000_000)
    agg.add(s, 1.0)
    rows = agg.flush()
    assert [(r.time_bucket, r.samples) for r in rows] == [
        (0, 3),
        (250_000_000, 2),
        (500_000_000, 3),
    ]
    wall = np.full(8, 1_700_000_000_123_456_789, dtype=np.int64)
    agg.add(s, 1.0, time_ns=wall)
    (row,) = agg.flush()
    assert row.time_bucket == 1_700_000_000_000_000_000
    assert row.samples == 8


def test_parts_merge_and_order() -> None:
    agg = Aggregator(SEC, CountingResolver())
    agg.add(make_samples(2, flow_id=1, pid=9), 1.0)
    agg.add(make_samples(3, flow_id=2, pid=8), 1.0)
    agg.add(make_samples(1, flow_id=1, pid=7), 1.0)
    arr = agg.flush_array()
    assert arr.dtype == ROLLUP_DTYPE
    assert arr["flow_id"].tolist() == [1, 2]  # highest cost first
    assert arr["samples"].tolist() == [3, 3]
    assert arr["pid"].tolist() == [9, 8]  # of the first sample
    assert agg.samples_total == 6


def test_zero_gso_counts_as_one() -> None:
    agg = Aggregator(SEC, CountingResolver())
    agg.add(make_samples(2, gso_segs=0), 2.0)
    (row,) = agg.flush()
    assert row.norm_cost == 4.0


def test_empty_batch() -> None:
    r = CountingResolver()
    agg = Aggregator(SEC, r)
    agg.add(make_samples(0), 1.0)
    assert agg.flush() == []
    assert not r.calls


def test_classify() -> None:
    assert classify(Event.CYCLES) == InterferenceClass.CPU
    assert classify(Event.CPU_CLOCK) == InterferenceClass.CPU
    assert classify(Event.LLC_MISS) == InterferenceClass.CACHE
    assert classify(Event.BRANCH_MISS) == InterferenceClass.BRANCH
    assert classify(Event.REMOTE_DRAM) == InterferenceClass.MEMORY_REMOTE
    assert classify(Event.XSNP_HITM) == InterferenceClass.FALSE_SHARING
    assert classify(Event.RAW) == InterferenceClass.NONE
    assert classify(999) == InterferenceClass.NONE
    events = np.array([e.value for e in Event] + [999], dtype=np.uint16)
    got = classify(events)
    assert got.tolist() == [int(classify(int(e))) for e in events]


def test_hash_collisions_fall_back_to_exact_grouping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row hashing alike (a zero multiplier) still groups exactly."""
    from meridian.tools.sentinel.model import groups

    monkeypatch.setattr(groups, "_MIX", np.uint64(0))
    test_samples_and_norm_cost_exact()
    first, inv = groups.group(np.array([3, 1, 3, 2, 1]), np.array([0, 0, 0, 0, 1]))
    assert first.tolist() == [1, 4, 3, 0]  # sorted rows (1,0) (1,1) (2,0) (3,0)
    assert inv.tolist() == [3, 0, 3, 2, 1]


def test_a_stack_is_asked_once_whatever_the_ip() -> None:
    """Samples with a stack are keyed by their stack ids, not their ips; a stack whose
    frames are gone (id 0) is asked again with the sampled ip, as one without ids."""

    class Gone(CountingResolver):
        def callstack_id(self, pid: int, user_stack_id: int, kernel_stack_id: int, ip: int) -> int:
            super().callstack_id(pid, user_stack_id, kernel_stack_id, ip)
            if user_stack_id == 9:  # gone from the stack map
                return ip >> 4 if ip else 0
            return 0 if user_stack_id < 0 else 1000 + user_stack_id

    r = Gone()
    agg = Aggregator(SEC, r)
    s = np.concatenate(
        [
            make_samples(50, pid=1, ip=0x1000 + 4 * np.arange(50), user_stack_id=3),
            make_samples(2, pid=1, ip=[0x2000, 0x2010], user_stack_id=9),
            make_samples(2, pid=1, ip=[0x3000, 0x3010]),  # no stack: the ip alone
        ]
    )
    agg.add(s, 1.0)
    stacks = sorted(k[1:] for k in r.calls if k[0] == "stack")
    assert stacks == sorted(
        [
            (1, 3, -14, 0),
            (1, 9, -14, 0),
            (1, 9, -14, 0x2000),
            (1, 9, -14, 0x2010),
            (1, -14, -14, 0x3000),
            (1, -14, -14, 0x3010),
        ]
    )
    rows = {r.callstack_id: r.samples for r in agg.flush()}
    assert rows[1003] == 50 and rows[0x200] == 1 and rows[0x201] == 1 and rows[0] == 2


def test_new_stacks_per_window_are_bounded_and_the_rest_labelled() -> None:
    """A stack per sample (code without frame pointers): only `stacks_per_window` new
    stacks are asked of the resolver in a window, the hottest first; the others are
    keyed SKIPPED_STACK (not UNRESOLVED: no read is waited for). Samples and norm_cost
    stay exact whatever is resolved."""
    r = CountingResolver()
    agg = Aggregator(SEC, r, stacks_per_window=10)
    hot = make_samples(50, flow_id=1, pid=100, ip=0x1000, user_stack_id=7, gso_segs=2)
    cold = make_samples(
        500, flow_id=1, pid=100, ip=0x1000, user_stack_id=np.arange(1000, 1500), gso_segs=2
    )
    agg.add(np.concatenate([cold[:250], hot, cold[250:]]), scale=2.0)
    agg.add(make_samples(20, flow_id=1, pid=100, ip=0x1000, user_stack_id=np.arange(20)))
    stacks = [k for k in r.calls if k[0] == "stack"]
    assert len(stacks) == 10 and ("stack", 100, 7, -14, 0) in r.calls  # the hot one
    rows = agg.flush()
    assert sum(x.samples for x in rows) == 570
    assert sum(x.norm_cost for x in rows) == pytest.approx(550 * 2.0 / 2 + 20)
    unresolved = [x for x in rows if x.callstack_id == SKIPPED_STACK]
    assert not [x for x in rows if x.callstack_id == UNRESOLVED]
    # the budget spent on the hot stack and 9 cold ones; in the second batch only
    # stack 7 is known (this window's answer), the 19 others are over the budget
    assert sum(x.samples for x in unresolved) == (500 - 9) + 19
    assert next(x for x in rows if x.callstack_id == 1007).samples == 50 + 1
    r.calls.clear()
    agg.add(make_samples(25, pid=100, ip=0x1000, user_stack_id=np.arange(1000, 1025)))
    assert len([k for k in r.calls if k[0] == "stack"]) == 10  # a new window, a new budget


def test_no_stack_bound() -> None:
    r = CountingResolver()
    agg = Aggregator(SEC, r, stacks_per_window=None)
    agg.add(make_samples(300, pid=1, ip=0x1000, user_stack_id=np.arange(300)))
    assert len([k for k in r.calls if k[0] == "stack"]) == 300
    assert all(x.callstack_id not in (UNRESOLVED, SKIPPED_STACK) for x in agg.flush())


def test_a_window_s_answers_are_found_after_batches_merged_in_any_order() -> None:
    """The answers (pid, ip) -> id, added batch by batch: each found with its own id,
    a key never added not found."""
    rng = np.random.default_rng(3)
    pids = rng.integers(1, 50, size=3000).astype(np.uint64)
    ips = rng.integers(0, 1 << 40, size=3000).astype(np.uint64)
    ids = np.arange(1, 3001, dtype=np.uint64)
    answers = _Answers()
    for lo in range(0, 3000, 700):
        got, found = answers.find([pids[lo : lo + 700], ips[lo : lo + 700]])
        assert not found.any()  # new keys
        answers.add([pids[lo : lo + 700], ips[lo : lo + 700]], ids[lo : lo + 700])
    order = rng.permutation(3000)
    got, found = answers.find([pids[order], ips[order]])
    assert found.all() and (got == ids[order]).all()
    got, found = answers.find([np.array([99], dtype=np.uint64), np.array([1], dtype=np.uint64)])
    assert not found.any() and got.tolist() == [0]


def test_an_answer_is_found_only_for_its_whole_key() -> None:
    """A key that shares a column with an answer, or lands next to one, is not found."""
    answers = _Answers()

    def u64(*v: int) -> np.ndarray[Any, Any]:
        return np.array(v, dtype=np.uint64)

    answers.add([u64(1), u64(5)], u64(7))
    got, found = answers.find([u64(2, 1, 1), u64(5, 5, 6)])
    assert found.tolist() == [False, True, False] and got.tolist() == [0, 7, 0]


def test_the_window_is_a_positive_number_of_ns() -> None:
    with pytest.raises(ValueError, match=r"^time_window_ns must be positive$"):
        Aggregator(0, CountingResolver())
    agg = Aggregator(1, CountingResolver())
    agg.add(make_samples(2, time_ns=[6, 5]))
    assert [r.time_bucket for r in agg.flush()] == [5, 6]


def test_time_buckets_of_wall_times_are_exact_to_the_ns() -> None:
    """A wall time 1 ns before a second's end is in that second (as a float it would
    round up into the next)."""
    agg = Aggregator(SEC, CountingResolver())
    agg.add(make_samples(1), time_ns=np.array([1_700_000_000_999_999_999], dtype=np.int64))
    (row,) = agg.flush()
    assert row.time_bucket == 1_700_000_000_000_000_000


def test_rows_by_time_bucket_then_cost_highest_first() -> None:
    agg = Aggregator(SEC, CountingResolver())
    agg.add(make_samples(4, flow_id=[1, 2, 2, 3], time_ns=[SEC + 1, 5, 6, 7]), scale=1.0)
    agg.add(make_samples(3, flow_id=3, time_ns=9), scale=1.0)  # flow 3: 4 samples in all
    arr = agg.flush_array()
    assert arr["flow_id"].tolist() == [3, 2, 1]
    assert arr["time_bucket"].tolist() == [0, 0, SEC]


def test_ids_are_exact_over_64_bits() -> None:
    """Function, stack and data object ids past 2**53 stay exact (uint64 throughout)."""

    class Wide(CountingResolver):
        def function_id(self, pid: int, ip: int) -> int:
            super().function_id(pid, ip)
            return (1 << 64) - 5

        def callstack_id(self, pid: int, user_stack_id: int, kernel_stack_id: int, ip: int) -> int:
            super().callstack_id(pid, user_stack_id, kernel_stack_id, ip)
            return (1 << 63) + 3

        def data_object_id(self, pid: int, addr: int) -> int:
            super().data_object_id(pid, addr)
            return (1 << 63) + 9

    agg = Aggregator(SEC, Wide())
    agg.add(make_samples(1, ip=0x1000, user_stack_id=2, data_addr=0x40))
    (row,) = agg.flush()
    assert (row.function_id, row.callstack_id, row.data_object_id) == (
        (1 << 64) - 5, (1 << 63) + 3, (1 << 63) + 9
    )  # fmt: skip


class StackResolver(CountingResolver):
    """A stack's id from both its ids (never 0: no frames gone)."""

    def callstack_id(self, pid: int, user_stack_id: int, kernel_stack_id: int, ip: int) -> int:
        super().callstack_id(pid, user_stack_id, kernel_stack_id, ip)
        return (user_stack_id + 20) * 100 + kernel_stack_id + 20


def test_stack_id_0_is_a_stack() -> None:
    """The stack map's ids start at 0: a sample with user or kernel stack 0 is keyed by
    its stack, not by its ip."""
    r = StackResolver()
    agg = Aggregator(SEC, r)
    agg.add(
        np.concatenate(
            [
                make_samples(2, pid=1, ip=[0x1000, 0x2000], user_stack_id=0),
                make_samples(2, pid=1, ip=[0x1000, 0x2000], kernel_stack_id=0),
            ]
        )
    )
    assert sorted(k[1:] for k in r.calls if k[0] == "stack") == [(1, -14, 0, 0), (1, 0, -14, 0)]
    got: Counter[int] = Counter()
    for x in agg.flush():
        got[x.callstack_id] += x.samples
    assert got == {2006: 2, 620: 2}


def test_a_gone_stack_at_ip_1_is_asked_with_its_ip() -> None:
    class Gone(CountingResolver):
        def callstack_id(self, pid: int, user_stack_id: int, kernel_stack_id: int, ip: int) -> int:
            super().callstack_id(pid, user_stack_id, kernel_stack_id, ip)
            return ip + 0x100 if ip else 0

    agg = Aggregator(SEC, Gone())
    agg.add(make_samples(1, pid=1, ip=1, user_stack_id=9))
    (row,) = agg.flush()
    assert row.callstack_id == 0x101


def test_past_the_stack_candidates_the_hottest_are_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """More distinct stacks in a batch than STACK_CANDIDATES: only the hottest that many
    are weighed, and of them the budget's hottest asked; at exactly STACK_CANDIDATES
    all are weighed; without a budget all are asked."""
    monkeypatch.setattr(aggregator, "STACK_CANDIDATES", 200)  # numpy's partition of fewer
    rng = np.random.default_rng(7)  # comes out sorted: the hottest first anyway
    for stacks, budget in ((300, 3), (200, 3), (300, None)):
        r = CountingResolver()
        agg = Aggregator(SEC, r, stacks_per_window=budget)
        counts = rng.permutation(np.arange(1, stacks + 1))  # stack k: counts[k] samples
        ids = np.repeat(np.arange(stacks), counts)
        agg.add(make_samples(len(ids), pid=1, ip=0x1000, user_stack_id=rng.permutation(ids)))
        asked = sorted(np.argsort(-counts)[: budget or stacks].tolist())
        assert sorted(k[2] for k in r.calls if k[0] == "stack") == asked
        rows = {x.callstack_id: x.samples for x in agg.flush()}
        want = {1000 + k: int(counts[k]) for k in asked}
        if len(asked) < stacks:
            want[SKIPPED_STACK] = int(counts.sum()) - sum(want.values())
        assert rows == want


WIDE = 1 << 60  # function ids past 2**53: as floats, 0x10 and 0x20 above it are one


class IdleResolver(CountingResolver):
    def __init__(self, idle: set[int]) -> None:
        super().__init__()
        self.idle = frozenset(WIDE + f for f in idle)

    def function_id(self, pid: int, ip: int) -> int:
        return WIDE + super().function_id(pid, ip)

    def idle_function_ids(self) -> frozenset[int]:
        return self.idle


def test_samples_in_the_idle_code_are_no_flow_s_cost() -> None:
    """A sample in the kernel's idle code is keyed to no flow, direction IDLE, whatever
    its pid; the softirq of a flow on an idle CPU (pid 0, another function) stays the
    flow's. A resolver with no idle ids changes nothing."""
    s = np.concatenate(
        [
            make_samples(3, flow_id=7, pid=0, ip=0x1000, direction=1),  # function 0x10
            make_samples(2, flow_id=7, pid=0, ip=0x2000, direction=1),  # function 0x20
            make_samples(1, flow_id=8, pid=5, ip=0x1000, direction=2),
        ]
    )
    want = {
        frozenset({0x10}): {(0, IDLE, 0x10): 4, (7, 1, 0x20): 2},
        frozenset(): {(7, 1, 0x10): 3, (7, 1, 0x20): 2, (8, 2, 0x10): 1},
    }
    for idle, rows in want.items():
        agg = Aggregator(SEC, IdleResolver(set(idle)))
        agg.add(s)
        got = {(r.flow_id, r.direction, r.function_id - WIDE): r.samples for r in agg.flush()}
        assert got == rows
