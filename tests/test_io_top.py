"""`meridian io --top` without a kernel: frames from a fake PID table, sorting, the
terminal check, and the options that drive it."""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np
import pytest
from test_io_table import FakeMap

from meridian.cli import main
from meridian.errors import UsageError
from meridian.screen import ENTER, LEAVE
from meridian.tools.io.pid_table import NS, PidTable
from meridian.tools.io.top import check_terminal, fmt_ns, render, run_top


def table_of(rates: dict[int, tuple[int, int, int]]) -> PidTable:
    """pid -> (bytes read, bytes written, latency slot) in the last second."""
    m, t = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    t.update(*m.snapshot(), 0)
    for pid, (r, w, slot) in rates.items():
        m.comms[pid] = b"p%d" % pid
        if r:
            m.io(pid, 0, 1, 4, r, slot)
        if w:
            m.io(pid, 1, 0, 1, w, slot)
    t.update(*m.snapshot(), NS)
    return t


def plain(frame: str) -> list[str]:
    return [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", x) for x in frame.splitlines()]


def test_frame_columns_and_sort_orders() -> None:
    t = table_of({1: (4096, 0, 20), 2: (0, 1 << 20, 10), 3: (100, 100, 30)})
    lines = plain(render(t.rows(), "bytes", 1.0, {"events_lost": 0}, clock=lambda: "12:00:00"))
    assert lines[0].startswith("meridian io --top  12:00:00  every 1s  sorted by bytes")
    assert lines[1] == "total read 4.1K/s  write 1M/s"  # nothing lost: not shown
    assert lines[3].split() == ["PID", "COMM", "R/s", "W/s", "DISK", "R/s", "DISK", "W/s",
                                "IO%", "R", "OPS", "W", "OPS", "P50", "P99", "HIT%"]  # fmt: skip
    body = [x.split() for x in lines[4:] if x.strip()]
    assert [b[0] for b in body] == ["2", "1", "3"]
    # 4 latencies of 2**20 ns: p50 and p99 are that value (min == max clamps them)
    assert body[1] == ["1", "p1", "4K", "0", "0", "0", "0.0", "4", "0", "1.0ms", "1.0ms", "100.0"]
    assert body[0][-1] == "0.0" and body[2][-1] == "80.0"  # 4 cached reads of 5 ops
    by_lat = [x.split()[0] for x in plain(render(t.rows(), "latency", 1.0, {}))[4:] if x]
    assert by_lat == ["3", "1", "2"]
    by_ops = [x.split()[0] for x in plain(render(t.rows(), "ops", 1.0, {}))[4:] if x]
    assert by_ops[0] == "3"  # 5 operations


def test_frame_fits_the_terminal_and_shows_losses() -> None:
    t = table_of({pid: (1000 * pid, 0, 10) for pid in range(1, 50)})
    frame = render(t.rows(), "bytes", 2.0, {"events_lost": 7}, size=(40, 10))
    lines = plain(frame)
    assert len([x for x in lines if x]) <= 10
    assert all(len(x) <= 40 for x in lines)
    assert "lost: events_lost=7" in plain(render(t.rows(), "bytes", 2, {"events_lost": 7}))[1]


def test_disk_columns_are_iotops() -> None:
    """DISK R/s and DISK W/s: what the disk moved for the calls in the last second; IO%:
    the share of that second the process waited on the disk (its threads summed)."""
    m, t = FakeMap(), PidTable(start_ns=0, alive=lambda pid, start: True)
    t.update(*m.snapshot(), 0)
    m.io(7, 0, 0, 3, 3 * 65536, 20, disk=(3 * 65536, NS // 4))  # 3 reads from the disk
    m.io(7, 0, 1, 5, 5 * 4096, 10)  # 5 from the cache
    m.io(7, 1, 0, 1, 8192, 12, disk=(4096, NS // 10))
    m.io(8, 1, 0, 2, 2 * 4096, 12, disk=(0, 3 * NS // 2))  # two threads waited 1.5 s
    t.update(*m.snapshot(), NS)
    rows = {x.split()[0]: x.split() for x in plain(render(t.rows(), "bytes", 1.0, {}))[4:] if x}
    assert rows["7"][2:7] == ["212K", "8K", "192K", "4K", "35.0"]
    assert rows["8"][4:7] == ["0", "0", "150.0"]


def test_writeback_without_a_dirtier_is_not_shown_as_lost() -> None:
    """A first run shows the writeback of pages dirtied before it started: no loss."""
    t = table_of({1: (1000, 0, 10)})
    counters = {"wb_unattributed": 461, "failed": 2, "events_lost": 0}
    assert "lost" not in plain(render(t.rows(), "bytes", 2, counters))[1]


def test_capped_rows_are_labelled_with_process_counts() -> None:
    t = table_of({1: (5000, 0, 10), 2: (4000, 0, 10), 3: (3000, 0, 10)})
    lines = plain(render(t.rows(max_pids=1), "bytes", 1.0, {}))
    body = [x.split() for x in lines[4:] if x.strip()]
    assert [b[:2] for b in body] == [["1", "p1"], ["(1)", "p2"], ["(1)", "other"]]


def test_fmt_ns() -> None:
    assert [fmt_ns(x) for x in (None, 850, 12_300, 4_100_000, 1.2e9, 250e6)] == [
        "-", "850ns", "12.3us", "4.1ms", "1.2s", "250ms"
    ]  # fmt: skip


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeTool:
    def __init__(self, m: FakeMap) -> None:
        self.m = m
        self.reads = 0

    def stats(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        self.reads += 1
        if self.reads == 3:
            raise KeyboardInterrupt  # Ctrl-C while drawing
        self.m.io(9, 0, 1, 1, 100)
        return self.m.snapshot()

    def counters(self) -> dict[str, int]:
        return {"events_lost": 0}


def test_ctrl_c_restores_the_screen() -> None:
    out = Tty()
    opts = type("O", (), {"duration": None, "interval": 0.01, "max_series": None, "sort": "bytes"})
    table = PidTable(0, alive=lambda pid, start: True)
    run_top(FakeTool(FakeMap()), table, opts, out, lambda keys: None)
    text = out.getvalue()
    assert text.startswith(ENTER) and text.endswith(LEAVE)
    assert text.count("meridian io --top") == 2
    assert [ps.total().ops for ps in table.summaries() if ps.pid == 9] == [2]


def test_top_needs_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="needs a terminal"):
        check_terminal(io.StringIO())
    assert main(["io", "--top"]) == 2  # stdout is captured here: not a terminal
    err = capsys.readouterr().err
    assert "needs a terminal" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-pids", "0"], "--max-pids must be at least 1"),
        (["--interval", "0"], "--interval must be at least 0.05"),
        (["--grace", "x"], "--grace must be a number"),
    ],
)
def test_bad_agent_options(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["io", *args]) == 2
    assert needle in capsys.readouterr().err
