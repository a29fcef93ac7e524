"""Target filter: each key, several keys in one target, any target, empty = all;
what the kernel can filter itself; bad targets are one-line usage errors."""

from __future__ import annotations

import numpy as np
import pytest

from meridian.errors import UsageError
from meridian.tools.sentinel.pipeline.targets import TargetFilter
from meridian.tools.sentinel.sources.mock import make_samples

N = 12
S = make_samples(
    N,
    flow_id=np.arange(N) % 3 + 100,
    pid=np.arange(N) % 4 + 10,
    tid=np.arange(N) + 1000,
    cgroup_id=np.arange(N) % 2 + 7,
    ifindex=np.arange(N) % 5,
)


def kept(targets: list[dict[str, object]]) -> list[int]:
    out: list[int] = TargetFilter(targets).apply(S)["tid"].tolist()
    return out


def test_empty_means_everything() -> None:
    f = TargetFilter()
    assert f.apply(S) is S
    assert not f
    assert f.pids() == []


@pytest.mark.parametrize(
    ("target", "field", "value"),
    [
        ({"flow_id": 101}, "flow_id", 101),
        ({"pid": 12}, "pid", 12),
        ({"tid": 1005}, "tid", 1005),
        ({"cgroup": 8}, "cgroup_id", 8),
        ({"ifindex": 3}, "ifindex", 3),
    ],
)
def test_each_key(target: dict[str, object], field: str, value: int) -> None:
    assert kept([target]) == [1000 + i for i in range(N) if int(S[field][i]) == value]


def test_any_target_and_all_keys_of_one() -> None:
    assert kept([{"pid": 10}, {"pid": 11}]) == [1000, 1001, 1004, 1005, 1008, 1009]
    assert kept([{"pid": 10, "cgroup": 7}]) == [1000, 1004, 1008]
    assert kept([{"pid": 10, "cgroup": 8}]) == []
    assert kept([{"pid": 10, "cgroup": 7}, {"tid": 1011}]) == [1000, 1004, 1008, 1011]


def test_many_values_use_isin() -> None:
    targets: list[dict[str, object]] = [{"tid": 1000 + i} for i in range(0, N, 2)]
    targets += [{"tid": 5000 + i} for i in range(20)]
    assert kept(targets) == [1000 + i for i in range(0, N, 2)]


def test_values_as_text() -> None:
    assert kept([{"flow_id": f"{101:016x}"}]) == kept([{"flow_id": 101}])
    assert kept([{"pid": "0xc"}]) == kept([{"pid": 12}])
    assert kept([{"pid": "12"}]) == kept([{"pid": 12}])


def test_pids_for_the_kernel() -> None:
    assert TargetFilter([{"pid": 12}, {"pid": 10, "tid": 1000}]).pids() == [10, 12]
    assert TargetFilter([{"pid": 12}, {"flow_id": 1}]).pids() == []


def test_set_replaces() -> None:
    f = TargetFilter([{"pid": 10}])
    f.set([])
    assert len(f.apply(S)) == N
    f.set([{"ifindex": 0}])
    assert f.targets == [{"ifindex": 0}]
    assert len(f.apply(S)) == 3


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"port": 80}, "unknown target key 'port': use one of flow_id, pid, tid, cgroup, ifindex"),
        ({"pid": "x"}, "target pid: 'x' is not a number"),
        ({"pid": 1.5}, "target pid: 1.5 is not a number"),
        ({"pid": -1}, "target pid: -1 is out of range"),
        ({"flow_id": 1 << 64}, f"target flow_id: {1 << 64} is out of range"),
        ({"pid": True}, "target pid: True is not a number"),
        ({}, "an empty target: name at least one of flow_id, pid, tid, cgroup, ifindex"),
    ],
)
def test_bad_targets(target: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as exc:
        TargetFilter([target])
    assert str(exc.value) == message


def test_the_largest_id_and_a_union_over_keys() -> None:
    """A flow id is any u64; single-key targets of different keys add up (a sample
    passes on either); a filter with targets is true, and its mask is per sample."""
    assert TargetFilter([{"flow_id": (1 << 64) - 1}]).targets == [{"flow_id": (1 << 64) - 1}]
    assert kept([{"pid": 10}, {"cgroup": 8}]) == [
        1000,
        1001,
        1003,
        1004,
        1005,
        1007,
        1008,
        1009,
        1011,
    ]
    assert TargetFilter([{"pid": 10}])
    everything = TargetFilter().mask(S)
    assert everything.dtype == bool and everything.tolist() == [True] * N
    # 16 hex digits are a flow id as /metrics labels it; other text is decimal or 0x
    assert TargetFilter([{"flow_id": "101"}, {"pid": "1234567890123456"}]).targets == [
        {"flow_id": 101},
        {"pid": 1234567890123456},
    ]
