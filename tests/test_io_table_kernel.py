"""The PID table on the real aggregate map: a process that exits is retired, its keys
are deleted from the kernel map, and its totals stay exact in the table."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from children import build_c, reap

from meridian.tools.io.kernel import FileIO
from meridian.tools.io.model import summarize
from meridian.tools.io.options import Options
from meridian.tools.io.pid_table import PidTable

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
            assert tool.forget_stats(gone) == len(gone)  # each in the hash or the cache
            assert child.pid not in summarize(*tool.stats())
            table.update(*tool.stats(), time.monotonic_ns())
            assert [r.pid for r in table.rows()] == []
            (final,) = [ps for ps in table.summaries() if ps.pid == child.pid]
            assert final.total("read").ops == 25
            assert final.total("read").bytes == 25 * 4096
    finally:
        reap(child)


def test_top_draws_a_busy_process_on_a_terminal_and_exits_clean(tmp_path: Path) -> None:
    """`meridian io --top` on a pseudo-terminal: frames name a process doing preads,
    the screen is restored, and the summary follows."""
    import os
    import pty
    import re

    data = tmp_path / "data.bin"
    data.write_bytes(b"z" * 16384)
    busy = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data), "100000000"],  # killed at the end
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    master, slave = pty.openpty()
    try:
        assert busy.stdout is not None and busy.stdin is not None
        assert busy.stdout.readline() == "ready\n"
        busy.stdin.write("go\n")
        busy.stdin.flush()
        top = subprocess.run(
            [sys.executable, "-m", "meridian", "io", "--top", "-p", str(busy.pid),
             "--duration", "2.5", "--interval", "0.5", "--format", "text"],
            stdout=slave, stderr=subprocess.PIPE, timeout=60, check=False,
        )  # fmt: skip
        os.close(slave)
        slave = -1
        chunks = []
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the other side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
        out = b"".join(chunks).decode(errors="replace")
        assert top.returncode == 0, top.stderr
        assert out.count("meridian io --top") >= 3
        assert "\x1b[?1049l" in out and out.rindex("\x1b[?1049l") < out.rindex("HIT")
        frames = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f) for f in out.split("\x1b[H")]
        assert any(re.search(rf"^\s*{busy.pid} python", f, re.M) for f in frames[1:]), frames[-2:]
        summary = out[out.rindex("\x1b[?1049l") :]
        assert re.search(rf"python\S*\s+{busy.pid}\s+read", summary)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
        reap(busy)


PREADER_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	char buf[4096], line[8];
	int fd = open(argv[1], O_RDONLY), n = atoi(argv[2]);

	printf("ready\n");
	fflush(stdout);
	if (read(0, line, sizeof(line)) <= 0)	/* a pipe: not a file read */
		return 1;
	for (int i = 0; i < n; i++)
		if (pread(fd, buf, sizeof(buf), (i % 4) * 4096) != sizeof(buf))
			return 1;
	return 0;
}
"""


def _reader(prog: Path, data: Path, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(prog), str(data), str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _run(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline() == "ready\n"
    child.stdin.write("go\n")
    child.stdin.close()
    assert child.wait(30) == 0
    child.stdout.close()


def test_a_reused_pid_is_counted_as_another_process(tmp_path: Path) -> None:
    """A process exits, and the next one is given its PID (through ns_last_pid): the
    kernel keys tell them apart by start time, the table retires the first at once
    (not after the 30 s grace) and each keeps its own exact counts. The reader is a
    static C program, so no loader reads blur the counts."""
    prog = build_c(tmp_path, "preader", PREADER_C, "-static", "-O2")
    data = tmp_path / "data.bin"
    data.write_bytes(b"z" * 16384)
    children: list[subprocess.Popen[str]] = []
    try:
        with FileIO(Options(no_events=True)) as tool:
            table = PidTable(time.monotonic_ns(), grace_s=30)
            first = _reader(prog, data, 25)
            children.append(first)
            _run(first)
            table.update(*tool.stats(), time.monotonic_ns())
            # Start times are in clock ticks (10 ms): a PID given again within the same
            # tick would look like the same process. Wrapping pid_max takes far longer.
            time.sleep(0.05)
            for _ in range(20):  # another fork on the machine may take the PID first
                Path("/proc/sys/kernel/ns_last_pid").write_text(str(first.pid - 1))
                second = _reader(prog, data, 40)
                children.append(second)
                if second.pid == first.pid:
                    break
                second.kill()
                second.wait()
            else:
                pytest.fail(f"PID {first.pid} was never given again")
            _run(second)
            gone = table.update(*tool.stats(), time.monotonic_ns())
            assert set(gone["pid"].tolist()) == {first.pid}
            assert tool.forget_stats(gone) == len(gone)
            procs = [ps for ps in table.summaries() if ps.pid == first.pid]
            assert [ps.total("read").ops for ps in procs] == [25, 40]
            assert [ps.total("read").bytes for ps in procs] == [25 * 4096, 40 * 4096]
            assert procs[0].start < procs[1].start
            assert summarize(*tool.stats())[first.pid].total("read").ops == 40
    finally:
        for child in children:
            reap(child)
