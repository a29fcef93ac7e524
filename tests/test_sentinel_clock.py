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


def test_read_pair_now_is_the_midpoint_of_two_monotonic_reads_in_whole_ns() -> None:
    import time

    before = time.monotonic_ns()
    k, w = read_pair_now(3)
    after = time.monotonic_ns()
    assert type(k) is int and type(w) is int
    assert before <= k <= after


def test_wall_times_are_exact_to_the_ns_at_1e18_with_a_fractional_intercept() -> None:
    """Three pairs off any one line: least squares gives slope 1.0015 and an intercept
    of -0.5 ns (k0 = 1e18 + 7: a float64 cannot hold it, so the times must stay
    integers). Each wall time is the line's value rounded to the ns, as a Python int
    for a scalar."""
    k0 = 10**18 + 7
    cal = ClockCalibrator(read_pair=lambda cpu: (0, 0))
    for dk, dw in ((0, 0), (1000, 1000), (2000, 2003)):
        cal.add(0, k0 + dk, WALL0 + dw)
    assert abs(cal.slopes()[0] - 1.0015) < 1e-12
    # wall = WALL0 - 0.5 + 1.0015 * dk, rounded: no value here is a tie
    for dk, want in ((1000, 1001), (3000, 3004), (10_001, 10_016)):
        got = cal.to_wall(0, k0 + dk)
        assert type(got) is int and got == WALL0 + want, (dk, got - WALL0)
    many = cal.to_wall(np.array([0, 0]), np.array([k0 + 1000, k0 + 3000], dtype=np.uint64))
    assert many.tolist() == [WALL0 + 1001, WALL0 + 3004]


def test_the_fit_keeps_the_last_max_pairs() -> None:
    """A line that changes: only the last `max_pairs` pairs (32 by default) are fitted,
    so the new slope is found exactly once the old pairs are out."""
    for cal, n in ((ClockCalibrator(max_pairs=3), 3), (ClockCalibrator(), 32)):
        cal.add(0, 0, WALL0 + 999)  # off the line, first
        for i in range(1, n + 1):
            cal.add(0, i * 1000, WALL0 + i * 1010)
        assert abs(cal.slopes()[0] - 1.01) < 1e-12, n
        assert abs(cal.offsets()[0] - WALL0) < 2e3  # float gauge of a 1.7e18 value


def test_pairs_at_one_kernel_time_or_1_ns_apart() -> None:
    """Two pairs at one kernel time: no slope to fit (1), the mean offset; two pairs
    1 ns apart in kernel time and 3 ns in wall time: slope 3."""
    cal = ClockCalibrator(read_pair=lambda cpu: (0, 0))
    cal.add(0, 500, WALL0)
    cal.add(0, 500, WALL0 + 10)
    assert cal.slopes() == {0: 1.0}
    assert cal.to_wall(0, 600) == WALL0 + 105
    cal.add(1, 500, WALL0)
    cal.add(1, 501, WALL0 + 3)
    assert cal.slopes()[1] == 3.0


def test_no_pair_yet_reads_one_and_cpus_past_the_table_take_the_lowest() -> None:
    """to_wall before any pair reads one (CPU 0); a CPU array with one time broadcasts;
    the CPU just past the highest calibrated one, like any past it, takes the lowest
    calibrated CPU's line."""
    cal = ClockCalibrator(read_pair=lambda cpu: (1_000, WALL0))
    assert cal.to_wall(0, 1_500) == WALL0 + 500
    cal, _ = fake_pairs()
    cal.calibrate([1, 3])
    cal.calibrate([1, 3])
    k = 1_000_500_000_000
    both = cal.to_wall(np.array([1, 3]), np.uint64(k))
    assert both.tolist() == [cal.to_wall(1, k), cal.to_wall(3, k)]
    assert cal.to_wall(4, k) == cal.to_wall(1, k)
