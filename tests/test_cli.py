"""Bad input: one line on stderr, exit code 2, no traceback; checked before any BPF."""

from __future__ import annotations

import subprocess
import sys

import pytest


def meridian(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meridian", *args], capture_output=True, text=True, timeout=60
    )


def one_line_exit_2(p: subprocess.CompletedProcess[str], needle: str) -> None:
    """What every tool does with bad input: one line naming it, exit 2, no traceback."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert needle in p.stderr, p.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["biolat", "-1"], "interval must be greater than 0"),
        (["biolat", "abc"], "interval must be a number"),
        (["biolat", "1", "0"], "count must be greater than 0"),
        (["biolat", "1", "2.5"], "count must be a whole number"),
        (["biolat", "--slow", "fast"], "--slow takes milliseconds as a number"),
        (["biolat", "--slow", "-3"], "--slow must be 0 or more"),
        (["biolat", "-d", "nosuchdisk0"], "no block device 'nosuchdisk0'"),
        (["biolat", "--duration", "0"], "--duration must be greater than 0"),
        (["biolat", "--bogus"], "unrecognized arguments"),
        (["nosuchtool"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    one_line_exit_2(meridian(*args), needle)


def test_help_ends_with_examples() -> None:
    p = meridian("biolat", "--help")
    assert p.returncode == 0
    assert "examples:" in p.stdout
    assert p.stdout.rstrip().splitlines()[-1].strip().startswith("meridian biolat")
