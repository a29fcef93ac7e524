"""The sentinel KernelSource without a kernel: the strategy chosen on a faked kernel,
and arguments refused before anything loads."""

from __future__ import annotations

import pytest
from sentinel_source import CLOCK

from meridian.bpf import Probe
from meridian.tools.sentinel.sources.kernel import KernelSource


def _fake_kernel(monkeypatch: pytest.MonkeyPatch, refused: set[str], no_hooks: set[str]) -> None:
    from meridian.bpf import features
    from meridian.tools.sentinel.sources import kernel

    def fake_probe(feature: str) -> Probe:
        return Probe(feature, feature not in refused, "refused" if feature in refused else "ok")

    monkeypatch.setattr(features, "probe", fake_probe)
    monkeypatch.setattr(kernel, "hook_exists", lambda section: section not in no_hooks)


@pytest.mark.parametrize(
    ("refused", "no_hooks", "chosen"),
    [
        (set(), set(), "fentry"),
        ({"fentry"}, set(), "tp_btf"),  # this workplace: fentry loads are refused
        (set(), {"fentry/__dev_queue_xmit"}, "tp_btf"),  # an older kernel
    ],
)
def test_strategy_choice(
    monkeypatch: pytest.MonkeyPatch, refused: set[str], no_hooks: set[str], chosen: str
) -> None:
    from meridian.tools.sentinel.sources.kernel import _pick

    _fake_kernel(monkeypatch, refused, no_hooks)
    assert _pick(None).name == chosen


def test_strategy_forced_and_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from meridian.errors import NotSupported, UsageError
    from meridian.tools.sentinel.sources.kernel import _pick

    _fake_kernel(monkeypatch, {"fentry"}, set())
    assert _pick("tp_btf").name == "tp_btf"
    with pytest.raises(NotSupported, match="fentry"):
        _pick("fentry")
    with pytest.raises(UsageError, match="kprobe"):
        _pick("kprobe")
    _fake_kernel(monkeypatch, {"fentry", "tp_btf"}, set())
    with pytest.raises(NotSupported):
        _pick(None)


def test_unknown_xdp_interface_is_a_usage_error() -> None:
    from meridian.errors import UsageError

    with pytest.raises(UsageError, match="nosuchif0"):
        KernelSource(CLOCK, xdp=["nosuchif0"])


def test_bad_frequency_is_a_usage_error() -> None:
    from meridian.errors import UsageError

    with pytest.raises(UsageError, match="-F 0"):
        KernelSource(CLOCK, frequency=0)
    with pytest.raises(UsageError, match="-F 10000000"):
        KernelSource(CLOCK, frequency=10_000_000)


@pytest.mark.kernel
def test_strategy_chosen_on_this_kernel_is_the_one_the_host_facts_predict() -> None:
    """No fakes: the strategy _pick takes here equals the first one whose features
    bpftool and tracefs grant and whose hooks the kernel's BTF has (fentry loads are
    refused on this workplace's kernels: tp_btf); a refused one cannot be forced."""
    from host_facts import expected_strategy, features

    from meridian.errors import NotSupported
    from meridian.tools.sentinel.sources.kernel import NET_PROGRAMS, STRATEGIES, _pick

    expected = expected_strategy(STRATEGIES, NET_PROGRAMS)
    assert _pick(None).name == expected
    for s in STRATEGIES:
        if all(features()[f] for f in s.needs):
            assert _pick(s.name).name == s.name
        else:
            with pytest.raises(NotSupported):
                _pick(s.name)
