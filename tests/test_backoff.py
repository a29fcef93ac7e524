"""The one backoff of the retry loops: delays that double from `base` up to `cap`,
each within the jitter around its nominal value, never past the cap, and back to
`base` after a success; the same delays for the same seed."""

from __future__ import annotations

import random

import pytest

from meridian.backoff import Backoff


def test_delays_double_within_the_jitter_up_to_the_cap() -> None:
    b = Backoff(0.25, 30.0, jitter=0.2, rand=random.Random(1).random)
    delays = [b.failed() for _ in range(14)]
    for n, d in enumerate(delays):
        nominal = min(0.25 * 2**n, 30.0)
        assert nominal * 0.8 <= d <= min(nominal * 1.2, 30.0), (n, d)
    assert b.failures == 14
    assert len(set(delays[:8])) == 8  # jittered: no two alike


def test_the_cap_holds_at_the_top_of_the_jitter_and_after_many_failures() -> None:
    b = Backoff(1.0, 5.0, jitter=0.5, rand=lambda: 0.999999)
    delays = [b.failed() for _ in range(2000)]  # 2**2000 would overflow a float
    assert delays[:3] == pytest.approx([1.5, 3.0, 5.0], rel=1e-5)
    assert max(delays) == 5.0 and delays[-1] == 5.0


def test_the_bottom_and_middle_of_the_jitter() -> None:
    low = Backoff(2.0, 60.0, jitter=0.2, rand=lambda: 0.0)
    assert [low.failed() for _ in range(3)] == pytest.approx([1.6, 3.2, 6.4])
    mid = Backoff(2.0, 60.0, jitter=0.2, rand=lambda: 0.5)
    assert [mid.failed() for _ in range(6)] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0]


def test_a_success_starts_again_from_base() -> None:
    b = Backoff(0.25, 30.0, rand=random.Random(2).random)
    for _ in range(6):
        b.failed()
    b.reset()
    assert b.failures == 0
    assert 0.2 <= b.failed() <= 0.3
    assert 0.4 <= b.failed() <= 0.6


def test_the_same_seed_gives_the_same_delays() -> None:
    def delays(seed: int) -> list[float]:
        b = Backoff(0.5, 10.0, rand=random.Random(seed).random)
        return [b.failed() for _ in range(8)]

    assert delays(5) == delays(5)
    assert delays(5) != delays(6)


def test_no_jitter_is_plain_doubling() -> None:
    b = Backoff(1.0, 5.0, jitter=0.0)
    assert [b.failed() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.parametrize(("base", "cap", "jitter"), [(0, 1, 0.2), (1, 0, 0.2), (1, 2, 1.0)])
def test_parameters_out_of_range(base: float, cap: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(base, cap, jitter)
