"""runqlat's -p: a set of processes, `-p 12,34` or `-p 12 -p 34` (the shared flag of
flags.py), each a running process; bad input is one line on stderr and exit 2, before
any BPF. No kernel: the options are caught before the tool would load."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest
from children import meridian, reap
from test_cli import one_line_exit_2

from meridian.cli import build_parser
from meridian.errors import UsageError
from meridian.export import Point
from meridian.latency.cli import processes
from meridian.tools.runqlat import Options, cli
from meridian.tools.runqlat.metrics import series
from meridian.tools.runqlat.model import Snapshot

# Where a check fails to refuse, the tool would trace until Ctrl-C: a second at most.
SHORT = ("--duration", "1")


@pytest.fixture
def two() -> Iterator[tuple[int, int]]:
    """Two running processes: this one and a sleeping child."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        yield os.getpid(), child.pid
    finally:
        reap(child)


def options_of(monkeypatch: pytest.MonkeyPatch, *args: str) -> Options:
    """The options `meridian runqlat ARGS` would trace with (run_options caught)."""
    got: list[Options] = []

    def caught(opts: Options, out: TextIO) -> int:
        got.append(opts)
        return 0

    monkeypatch.setattr(cli.CLI, "run_options", caught)
    assert cli.run(build_parser().parse_args(["runqlat", *args])) == 0
    [opts] = got
    return opts


def test_pid_takes_a_list(monkeypatch: pytest.MonkeyPatch, two: tuple[int, int]) -> None:
    a, b = two
    opts = options_of(monkeypatch, "-p", f"{b},{a}")
    assert opts.pids == sorted([a, b])


def test_pid_repeats(monkeypatch: pytest.MonkeyPatch, two: tuple[int, int]) -> None:
    a, b = two
    assert options_of(monkeypatch, "-p", str(a), "--pid", str(b)).pids == sorted([a, b])
    assert options_of(monkeypatch, "-p", f"{a},{a}", "-p", str(a)).pids == [a]  # once each
    assert options_of(monkeypatch).pids == []  # no -p: every process


def test_help_says_pid_takes_a_list() -> None:
    p = meridian("runqlat", "--help")
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    assert "-p PID, --pid PID trace these processes only, all their threads" in text
    assert "(repeatable, or PID,PID)" in text
    assert "meridian runqlat -P -p 185,186" in text


@pytest.mark.parametrize(
    ("pid", "needle"),
    [
        ("abc", "argument -p/--pid: takes a process ID (a whole number greater than 0)"),
        ("0", "argument -p/--pid: takes a process ID"),
        ("-5", "argument -p/--pid: takes a process ID"),
        ("1,x", "argument -p/--pid: takes a process ID"),
        ("1,", "argument -p/--pid: takes a process ID"),
        ("999999999", "no process with PID 999999999"),
        ("1,999999999", "no process with PID 999999999"),
    ],
)
def test_bad_pid_is_one_line_and_exit_2(pid: str, needle: str) -> None:
    one_line_exit_2(meridian("runqlat", "-p", pid, *SHORT), needle)


def test_a_missing_pid_among_repeats_is_one_line_and_exit_2() -> None:
    one_line_exit_2(meridian("runqlat", "-p", "1", "-p", "999999999", *SHORT), "no process")


def test_a_thread_id_is_refused_with_its_process() -> None:
    """/proc answers to a thread's ID too; runqlat traces processes and says which."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert t.native_id is not None and t.native_id != os.getpid()
        p = meridian("runqlat", "-p", str(t.native_id), *SHORT)
    finally:
        stop.set()
        t.join()
    one_line_exit_2(p, f"-p: {t.native_id} is a thread of process {os.getpid()}")


def test_processes_checks_each_against_proc(tmp_path: Path) -> None:
    for pid, tgid in ((10, 10), (11, 10), (12, 12)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nTgid:\t{tgid}\nPid:\t{pid}\n")
    assert processes([12, 10, 12], str(tmp_path)) == [10, 12]
    assert processes(None, str(tmp_path)) == []
    with pytest.raises(UsageError, match="-p: 11 is a thread of process 10: give -p 10"):
        processes([10, 11], str(tmp_path))
    with pytest.raises(UsageError, match="no process with PID 13"):
        processes([13], str(tmp_path))


def test_pids_full_is_exported_with_pid_only() -> None:
    """A wait of a thread the full PID set could not follow is lost: counted with -p,
    the only case that has any."""
    snap = Snapshot(1.0, {}, {"hists_full": 0, "pids_full": 3})

    def lost(opts: Options) -> list[tuple[dict[str, object], float]]:
        [family] = [f for f in series(snap, opts) if f.name == "meridian.runqlat.lost"]
        return [(dict(p.attrs), p.value) for p in family.points if isinstance(p, Point)]

    assert lost(Options()) == [({"reason": "hists_full"}, 0)]
    assert lost(Options(pids=[1])) == [
        ({"reason": "hists_full"}, 0),
        ({"reason": "pids_full"}, 3),
    ]
