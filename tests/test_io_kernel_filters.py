"""meridian io on child processes with a known workload: the pid, cgroup and comm
filters in the kernel, non-regular files left out, and the command end to end."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from children import reap, wait_attached
from io_trace import drain, end_child, io_cli

from meridian.tools.io.kernel import FileIO
from meridian.tools.io.model import PidSummary, summarize
from meridian.tools.io.options import Options

pytestmark = pytest.mark.kernel


CHILD = r"""
import os, socket, sys
if len(sys.argv) > 2:
    open("/proc/self/comm", "w").write(sys.argv[2])
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
path = sys.argv[1]
r, w = os.pipe(); os.write(w, b"x" * 100); os.read(r, 100)
a, b = socket.socketpair(); a.send(b"y" * 100); os.read(b.fileno(), 100)
z = os.open("/dev/zero", os.O_RDONLY); os.read(z, 4096)
f = os.open(path, os.O_RDONLY)
for _ in range(3):
    os.pread(f, 4096, 0)
os.write(1, b"done\n")
sys.stdin.readline()  # exits when the test closes stdin
"""


def _child(path: Path, comm: str | None = None) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), *([comm] if comm else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    return p


def _go(p: subprocess.Popen[bytes]) -> None:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(b"go\n")
    p.stdin.flush()
    assert p.stdout.readline() == b"done\n"


@contextlib.contextmanager
def _children(path: Path, *comms: str | None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One CHILD per comm (None: its own name), reaped at the end whatever happens."""
    children: list[subprocess.Popen[bytes]] = []
    try:
        for comm in comms:
            children.append(_child(path, comm))
        yield children
    finally:
        for p in children:
            reap(p)


def _trace_pair(
    opts: Options, traced: subprocess.Popen[bytes], other: subprocess.Popen[bytes]
) -> tuple[np.ndarray[Any, Any], dict[int, PidSummary]]:
    """Both children's workload under a filter that should let only `traced` through:
    the events of `traced` and the summary of every process the kernel counted."""
    with FileIO(opts) as tool:
        _go(traced)
        _go(other)
        events = drain(tool, traced.pid, 3, timeout=2.0)
        stats = summarize(*tool.stats())
    end_child(traced)
    end_child(other)
    return events, stats


def test_pid_filter_and_non_regular_files(tmp_path: Path) -> None:
    path = tmp_path / "small.bin"
    path.write_bytes(os.urandom(4096))
    with _children(path, None, None) as (ours, other), FileIO(Options(pids=[ours.pid])) as tool:
        _go(ours)
        _go(other)
        end_child(ours)
        end_child(other)
        events = drain(tool, ours.pid, 3, timeout=2.0)
        stats = summarize(*tool.stats())
    # Only the filtered PID, and only its three preads of the regular file: the pipe,
    # the socket, /dev/zero and the pipe to stdout produced nothing.
    assert set(stats) == {ours.pid}
    assert stats[ours.pid].total("read").ops == 3
    assert stats[ours.pid].total("write").ops == 0
    assert len(events) == 3
    assert set(events["ino"].tolist()) == {path.stat().st_ino}
    assert set(events["bytes"].tolist()) == {4096}


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["-p", "abc"], "process ID"), (["-p", "999999999"], "no process with PID 999999999")],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    r = io_cli(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr


def test_cli_events_with_paths_and_summary(tmp_path: Path) -> None:
    """The command end to end: JSON events and one summary line for a traced PID."""
    path = tmp_path / "cli.bin"
    path.write_bytes(os.urandom(3 * 4096))
    child = _child(path)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "meridian", "io", "-v", "-p", str(child.pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_attached(proc)
        _go(child)
        time.sleep(0.5)  # the agent drains on a 50 ms timer; SIGTERM drains the rest
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        end_child(child)
    finally:
        reap(child)
    assert proc.returncode == 0
    lines = [json.loads(x) for x in out.splitlines()]
    events = [x for x in lines if "type" not in x]
    summary = [x for x in lines if x.get("type") == "summary"]
    assert [e["file"] for e in events] == [str(path)] * 3
    assert [e["bytes"] for e in events] == [4096] * 3
    assert all(e["comm"] == "python3" or e["comm"].startswith("python") for e in events)
    assert {e["pid"] for e in events} == {child.pid}
    assert len(summary) == 1 and summary[0]["read"]["ops"] == 3
    assert summary[0]["read"]["bytes"] == 3 * 4096


def test_cgroup_filter_in_the_kernel(tmp_path: Path) -> None:
    """--cgroup: a process moved into a test-made cgroup v2 (here a child of it) is
    traced; the same workload outside it is not."""
    from meridian.cgroup import cgroup2_mounts, resolve

    path = tmp_path / "cg.bin"
    path.write_bytes(os.urandom(4096))
    top = Path(cgroup2_mounts()[0]) / f"meridian-test-{os.getpid()}"
    inner = top / "inner"
    inner.mkdir(parents=True)
    try:
        with _children(path, None, None) as (inside, outside):
            (inner / "cgroup.procs").write_text(f"{inside.pid}\n")
            # The filter is the parent cgroup: processes in cgroups below it count too.
            events, stats = _trace_pair(
                Options(cgroup=(resolve(str(top)).id, resolve(str(top)).depth)), inside, outside
            )
    finally:
        for d in (inner, top):
            if d.exists():
                d.rmdir()
    assert set(stats) == {inside.pid}
    assert stats[inside.pid].total("read").ops == 3
    assert stats[inside.pid].total("read").bytes == 3 * 4096
    assert len(events) == 3


def test_bad_cgroup_is_one_line_exit_2() -> None:
    r = io_cli("--cgroup", "/no/such/cgroup")
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "not a cgroup v2 directory" in r.stderr


def test_comm_filter_in_the_kernel(tmp_path: Path) -> None:
    """--comm: of two identical processes only the one with that name is traced."""
    path = tmp_path / "comm.bin"
    path.write_bytes(os.urandom(4096))
    with _children(path, "meridian-comm", None) as (ours, other):
        events, stats = _trace_pair(Options(comms=["meridian-comm"]), ours, other)
    assert set(stats) == {ours.pid}
    assert stats[ours.pid].comm == "meridian-comm"
    assert stats[ours.pid].total("read").ops == 3 and len(events) == 3
