"""meridian io's per-CPU cache of aggregates (io.bpf.c, stats_cache.py) on the real
kernel, with one entry per CPU and (op, cached), so that processes on one CPU collide:
the first process's reads are counted in the cache, a second one's in the hash while
the first owns the entry, and a third takes the entry over once the first is retired;
every count exact, none counted twice."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from io_trace import end_child, ready_child
from io_trace import go as tell

from meridian.tools.io.kernel import FileIO
from meridian.tools.io.model import summarize
from meridian.tools.io.options import Options

pytestmark = pytest.mark.kernel

PREADS = 500
CHILD = r"""
import os, sys
os.sched_setaffinity(0, {0})
f = os.open(sys.argv[1], os.O_RDONLY)
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
for _ in range(int(sys.argv[2])):
    os.pread(f, 4096, 0)
sys.stdout.write("done\n"); sys.stdout.flush()
sys.stdin.readline()  # exits when the test closes stdin
"""


def child(path: Path) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """A process on CPU 0 that preads `path` PREADS times when told (go())."""
    return ready_child(CHILD, [path, PREADS])


def go(p: subprocess.Popen[bytes]) -> None:
    assert tell(p) == b"done\n"


def only(*children: subprocess.Popen[bytes]) -> Options:
    """Options that trace the test's children alone: any other process reading a file
    on CPU 0 while a test runs would take a cache way the test counts on."""
    return Options(pids=[p.pid for p in children])


def owners(tool: FileIO) -> set[int]:
    """The PIDs that own a live cache entry."""
    _, entries = tool.cache_entries()  # live ones: owned, not claimed, not retired
    return {int(t) >> 32 for t in entries["tag"].tolist()}


def in_hash(tool: FileIO) -> set[int]:
    assert tool.obj is not None
    keys, _ = tool.obj.maps["stats"].items()
    return set(keys["pid"].tolist())


def test_collisions_go_to_the_hash_and_a_retired_entry_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(4096))
    path.read_bytes()  # in the page cache: every pread is a cached read
    with (
        child(path) as a,
        child(path) as b,
        child(path) as c,  # started now: its own start-up reads are not traced
        FileIO(only(a, b, c), cache_ways=1) as tool,
    ):
        go(a)
        go(b)
        got = summarize(*tool.stats())
        assert got[a.pid].total("read").ops == PREADS
        assert got[b.pid].total("read").ops == PREADS
        assert a.pid in owners(tool) and b.pid not in owners(tool)  # b collided
        assert b.pid in in_hash(tool) and a.pid not in in_hash(tool)

        end_child(a)  # gone: retired, as the agent does after its grace period
        keys, _ = tool.stats()
        tool.forget_stats(keys[keys["pid"] == a.pid])
        assert a.pid not in summarize(*tool.stats())
        go(c)
        got = summarize(*tool.stats())
        assert got[c.pid].total("read").ops == PREADS  # from a zeroed entry
        assert got[b.pid].total("read").ops == PREADS
        assert c.pid in owners(tool) and a.pid not in owners(tool)
        assert c.pid not in in_hash(tool)
        end_child(c)
        end_child(b)


def test_an_exited_process_s_entry_goes_to_the_next_one_and_its_counts_stay(
    tmp_path: Path,
) -> None:
    """stats() hands an exited owner's entry back to the kernel at once, its numbers
    kept in user space until the process is retired: the next process counts in the
    cache, not the hash, and nothing is lost or counted twice."""
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(4096))
    path.read_bytes()
    with child(path) as a, child(path) as b, FileIO(only(a, b), cache_ways=1) as tool:
        go(a)
        assert owners(tool) == {a.pid}
        end_child(a)
        got = summarize(*tool.stats())  # a is gone: its entry handed back
        assert got[a.pid].total("read").ops == PREADS
        assert not owners(tool) and a.pid not in in_hash(tool)
        go(b)
        got = summarize(*tool.stats())
        assert got[a.pid].total("read").ops == PREADS
        assert got[b.pid].total("read").ops == PREADS
        assert owners(tool) == {b.pid} and b.pid not in in_hash(tool)
        keys, _ = tool.stats()
        assert tool.forget_stats(keys[keys["pid"] == a.pid]) == 1  # retired at last
        got = summarize(*tool.stats())
        assert a.pid not in got and got[b.pid].total("read").ops == PREADS
        end_child(b)


def test_a_process_takes_the_neighbouring_way_when_its_own_is_taken(tmp_path: Path) -> None:
    """Two ways a CPU: whichever way the second process hashes to, it finds one free
    (its own or the neighbour); a third finds both taken and goes to the hash."""
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(4096))
    path.read_bytes()
    with (
        child(path) as a,
        child(path) as b,
        child(path) as c,
        FileIO(only(a, b, c), cache_ways=2) as tool,
    ):
        for p in (a, b, c):
            go(p)
        got = summarize(*tool.stats())
        assert [got[p.pid].total("read").ops for p in (a, b, c)] == [PREADS] * 3
        assert owners(tool) == {a.pid, b.pid}
        assert c.pid in in_hash(tool) and not {a.pid, b.pid} & in_hash(tool)
        for p in (a, b, c):
            end_child(p)


def test_without_a_cache_every_count_is_in_the_hash(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(4096))
    path.read_bytes()
    with child(path) as a, FileIO(only(a), cache_ways=0) as tool:
        go(a)
        keys, vals = tool.stats()
        assert summarize(keys, vals)[a.pid].total("read").ops == PREADS
        assert a.pid in in_hash(tool) and not owners(tool)
        assert np.asarray(vals).ndim == 2
        end_child(a)
