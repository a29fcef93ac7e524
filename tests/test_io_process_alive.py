"""ProcessAlive: is the process that had this PID and start still there? /proc/PID/stat
read again only now and then (the PID table's liveness check, pid_table.py)."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from meridian.proc import proc_start
from meridian.tools.io.pid_table import NS, ProcessAlive


def test_process_alive_checks_the_start_and_rechecks_it_only_now_and_then(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "42"
    proc.mkdir()
    stat = "42 (a b) S" + " 0" * 18 + " {start} 0\n"  # field 22 is the start
    (proc / "stat").write_text(stat.format(start=500))
    alive = ProcessAlive(recheck_s=10, proc_root=str(tmp_path))
    clock = [0]
    monkeypatch.setattr("meridian.tools.io.pid_table.time.monotonic_ns", lambda: clock[0])
    assert alive(42, 500) and not alive(42, 499) and not alive(7, 500)
    (proc / "stat").write_text(stat.format(start=900))  # PID 42 given to another process
    clock[0] = 5 * NS
    assert alive(42, 500)  # not re-read yet: the directory is there
    clock[0] = 11 * NS
    assert not alive(42, 500) and alive(42, 900)


def write_stat(root: Any, pid: int, start: int) -> None:
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    (d / "stat").write_text(f"{pid} (a b) S" + " 0" * 18 + f" {start} 0\n")  # field 22


def test_process_alive_rereads_the_start_10_s_after_the_last_match_by_default(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recheck is 10 s after the time of the last match (not of the clock's
    origin): just before, the directory is enough; at 10 s the start is read again."""
    write_stat(tmp_path, 42, 500)
    alive = ProcessAlive(proc_root=str(tmp_path))
    clock = [3 * NS]
    monkeypatch.setattr("meridian.tools.io.pid_table.time.monotonic_ns", lambda: clock[0])
    assert alive(42, 500)
    write_stat(tmp_path, 42, 900)  # PID 42 given to another process
    clock[0] = 13 * NS - 1
    assert alive(42, 500)
    clock[0] = 13 * NS
    assert not alive(42, 500)


def test_process_alive_forgets_a_process_found_gone(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its /proc directory is gone, a process is never taken as alive again on the
    strength of its old match, even when its PID's directory comes back."""
    write_stat(tmp_path, 42, 500)
    alive = ProcessAlive(recheck_s=10, proc_root=str(tmp_path))
    clock = [0]
    monkeypatch.setattr("meridian.tools.io.pid_table.time.monotonic_ns", lambda: clock[0])
    assert alive(42, 500)
    shutil.rmtree(tmp_path / "42")
    clock[0] = 1 * NS
    assert not alive(42, 500)
    write_stat(tmp_path, 42, 900)
    clock[0] = 2 * NS
    assert not alive(42, 500) and alive(42, 900)
    assert list(alive.checked) == [(42, 900)]


def test_process_alive_clears_its_cache_past_65536_processes(tmp_path: Any) -> None:
    """The cache of matched processes is bounded: past 1 << 16 entries it starts over."""
    write_stat(tmp_path, 42, 500)
    write_stat(tmp_path, 43, 600)
    alive = ProcessAlive(proc_root=str(tmp_path))
    alive.checked = {(1000 + i, 1): 0 for i in range(1 << 16)}
    assert alive(42, 500) and len(alive.checked) == (1 << 16) + 1  # 65536: not past yet
    assert alive(43, 600) and list(alive.checked) == [(43, 600)]


def test_process_alive_reads_proc_by_default() -> None:
    """Without a root, the real /proc: this test's own process is alive with its start
    and not with another."""
    start = proc_start(os.getpid())
    assert start is not None
    alive = ProcessAlive()
    assert alive(os.getpid(), start) and not alive(os.getpid(), (start + 1) & 0xFFFFFFFF)
