"""runqlat against CPU oversubscription: more busy processes than CPUs must make
runnable tasks wait longer."""

from __future__ import annotations

import time

import pytest

from meridian.tools.runqlat import Options, Runqlat
from meridian.tools.runqlat.validate import spinners, validate

pytestmark = pytest.mark.kernel


@pytest.mark.parametrize("strategy", ["tp_btf", "tracepoint"])
def test_four_busy_processes_on_two_cpus_wait_longer_than_one(strategy: str) -> None:
    """The validate experiment: 1 busy process vs 4 (on this 2-CPU machine), p99 rises."""
    report = validate(Options(strategy=strategy), seconds=1.5, workers=4)
    assert report["strategy"] == strategy
    off, on = report["cases"]
    assert (off["busy_processes"], on["busy_processes"]) == (1, 4)
    assert off["count"] > 0 and on["count"] > 0
    assert on["p99_ns"] > off["p99_ns"], report
    assert report["passed"]


def test_per_process_and_pid_filter() -> None:
    with spinners(2, 3) as pids:
        with Runqlat(Options(per_process=True)) as tool:
            s0 = tool.snapshot()
            time.sleep(1.0)
            snap = tool.snapshot().since(s0)
        assert snap.cells and all(c.count for c in snap.cells.values())
        assert {pid for pid, _ in snap.cells} & set(pids)  # the spinners waited
        with Runqlat(Options(pid=pids[0], per_process=True)) as tool:
            s0 = tool.snapshot()
            time.sleep(1.0)
            snap = tool.snapshot().since(s0)
        assert {pid for pid, _ in snap.cells} <= {pids[0]}
