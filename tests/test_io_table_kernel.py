"""The PID table on the real aggregate map: a process that exits is retired, its keys
are deleted from the kernel map, and its totals stay exact in the table."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from meridian.tools.io import FileIO, Options, summarize
from meridian.tools.io_table import PidTable, delete_keys

pytestmark = pytest.mark.kernel

CHILD = r"""
import os, sys
f = os.open(sys.argv[1], os.O_RDONLY)
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
for i in range(int(sys.argv[2])):
    os.pread(f, 4096, (i % 4) * 4096)
"""


def test_a_process_that_exits_is_retired_and_leaves_the_kernel_map(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"z" * 16384)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data), "25"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        with FileIO(Options(pids=[child.pid], no_events=True)) as tool:
            assert tool.obj is not None
            stats = tool.obj.maps["stats"]
            table = PidTable(time.monotonic_ns(), grace_s=0.3)
            table.update(*tool.stats(), time.monotonic_ns())
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.wait(30) == 0
            gone = None
            for _ in range(100):  # the grace period is 0.3 s; stop at the first retirement
                time.sleep(0.05)
                keys = table.update(*tool.stats(), time.monotonic_ns())
                if len(keys):
                    gone = keys
                    break
            assert gone is not None, "the exited process was never retired"
            assert set(gone["pid"].tolist()) == {child.pid}
            assert delete_keys(stats, gone) == len(gone)
            assert child.pid not in summarize(*tool.stats())
            table.update(*tool.stats(), time.monotonic_ns())
            assert [r.pid for r in table.rows()] == []
            final = table.summaries()[child.pid]
            assert final.total("read").ops == 25
            assert final.total("read").bytes == 25 * 4096
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
