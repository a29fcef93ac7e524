"""Per-CPU kernel -> wall clock: known lines are recovered exactly, vectorised."""

from __future__ import annotations

import numpy as np

from meridian.tools.sentinel.pipeline.clock import ClockCalibrator, read_pair_now

WALL0 = 1_763_900_000_000_000_000  # 2025-11, ns since the epoch
# cpu -> (slope, offset): wall = slope * kernel + offset
LINES = {0: (1.0, WALL0), 1: (1.0 + 20e-6, WALL0 + 5_000), 3: (1.0 - 50e-6, WALL0 - 7_000)}


def fake_pairs() -> tuple[ClockCalibrator, list[int]]:
    """A calibrator whose read_pair follows LINES, the kernel clock moving 1 s a read."""
    now = [1_000_000_000_000]

    def read_pair(cpu: int) -> tuple[int, int]:
        now[0] += 1_000_000_000
        slope, offset = LINES[cpu]
        return now[0], round(slope * now[0]) + offset  # exact: no float of 1e18

    return ClockCalibrator(read_pair=read_pair), now


def test_fit_recovers_each_cpu_line() -> None:
    cal, _ = fake_pairs()
    for _ in range(5):
        cal.calibrate(LINES)
    for cpu, (slope, offset) in LINES.items():
        assert abs(cal.slopes()[cpu] - slope) < 1e-12
        assert abs(cal.offsets()[cpu] - offset) < 2e3  # float gauge of a 1.7e18 value
        k = 1_000_000_000_000 + 3_500_000_123
        assert abs(cal.to_wall(cpu, k) - (round(slope * k) + offset)) <= 1


def test_to_wall_is_vectorised_over_cpus_and_times() -> None:
    cal, _ = fake_pairs()
    for _ in range(3):
        cal.calibrate(LINES)
    k = np.array([1_002_000_000_000, 1_002_000_000_000, 1_004_000_000_500], dtype=np.uint64)
    cpu = np.array([0, 1, 3], dtype=np.uint32)
    got = cal.to_wall(cpu, k)
    want = [round(LINES[c][0] * int(t)) + LINES[c][1] for c, t in zip(cpu, k, strict=True)]
    assert got.dtype == np.int64
    assert np.abs(got - np.array(want)).max() <= 1


def test_cpu_without_pairs_uses_the_lowest_calibrated() -> None:
    cal, _ = fake_pairs()
    cal.calibrate([1, 3])
    cal.calibrate([1, 3])
    k = 1_000_500_000_000
    assert cal.to_wall(2, k) == cal.to_wall(1, k)
    assert cal.to_wall(64, k) == cal.to_wall(1, k)


def test_one_pair_means_slope_one() -> None:
    cal = ClockCalibrator(read_pair=lambda cpu: (0, 0))
    cal.add(0, 100, WALL0 + 100)
    assert cal.slopes() == {0: 1.0}
    assert cal.to_wall(0, 1_100) == WALL0 + 1_100


def test_real_clocks_are_consistent() -> None:
    """With the default reader the wall time of 'now' is close to time.time_ns()."""
    import time

    cal = ClockCalibrator()
    cal.calibrate()
    k, w = read_pair_now(0)
    assert abs(cal.to_wall(0, k) - w) < 5_000_000
    assert abs(cal.to_wall(0, time.monotonic_ns()) - time.time_ns()) < 50_000_000
