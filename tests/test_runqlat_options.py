"""runqlat's -p: a set of processes, `-p 12,34` or `-p 12 -p 34` (the shared flag of
flags.py), each a running process; bad input is one line on stderr and exit 2, before
any BPF. No kernel: the options are caught before the tool would load."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import TextIO

import pytest
from children import help_text, reap

from meridian.cli import build_parser
from meridian.export import Point
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


def test_help_has_a_pid_list_example() -> None:
    assert "meridian runqlat -P -p 185,186" in help_text("runqlat")


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
