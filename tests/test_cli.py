"""Bad input: one line on stderr, exit code 2, no traceback; checked before any BPF."""

from __future__ import annotations

import argparse
import os
import subprocess

import pytest
from children import meridian

from meridian.cli import build_parser
from meridian.errors import UsageError
from meridian.flags import pid_list, running_pids, seconds


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
        (
            ["biolat", "--otlp-endpoint", "http://127.0.0.1:1", "--otlp-logs"],
            "--otlp-logs sends the slow requests: give --slow MS",
        ),
        (["biolat", "-d", "nosuchdisk0"], "no block device 'nosuchdisk0'"),
        (["biolat", "--duration", "0"], "argument --duration: must be greater than 0"),
        (["biolat", "--bogus"], "unrecognized arguments"),
        (["io", "--host-root", "/nonexistent"], "--host-root takes a directory"),
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


# The flags every tool adds through meridian/flags.py: one spelling, type and check.
PID_TOOLS = ["io", "memlat", "runqlat", "syscalls", "sentinel"]


@pytest.mark.parametrize("tool", [*PID_TOOLS, "biolat"])
def test_common_flags_parse_the_same_in_every_tool(tool: str) -> None:
    pid = [] if tool == "biolat" else ["-p", "7"]
    args = build_parser().parse_args([tool, *pid, "--duration", "1.5"])
    assert args.duration == 1.5
    assert getattr(args, "pid", None) == (None if tool == "biolat" else [7])
    if tool == "sentinel":
        assert args.json is None  # not given: the YAML file's value stands
    elif tool != "io":
        assert build_parser().parse_args([tool, "--json"]).json is True


@pytest.mark.parametrize("tool", [*PID_TOOLS, "biolat"])
def test_verbose_is_on_or_off_in_every_tool(tool: str) -> None:
    """-v means one thing everywhere: on (repeating it adds nothing)."""
    assert bool(build_parser().parse_args([tool]).verbose) is False
    assert build_parser().parse_args([tool, "-v", "-v"]).verbose in (True, 1)


@pytest.mark.parametrize("tool", PID_TOOLS)
def test_pid_repeats_and_takes_lists(tool: str) -> None:
    assert build_parser().parse_args([tool, "-p", "1,2", "--pid", "3"]).pid == [1, 2, 3]
    assert build_parser().parse_args([tool]).pid is None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([tool, "-p", bad], "argument -p/--pid: takes a process ID")
        for tool in PID_TOOLS
        for bad in ("abc", "0", "-5", "1,x")
    ]
    + [
        ([tool, "--duration", bad], f"argument --duration: {why}")
        for tool in [*PID_TOOLS, "biolat"]
        for bad, why in (("0", "must be greater than 0"), ("soon", "takes seconds"))
    ],
)
def test_common_flags_refuse_bad_values(args: list[str], needle: str) -> None:
    one_line_exit_2(meridian(*args), needle)


def test_flag_values() -> None:
    assert pid_list("12") == [12] and pid_list("1, 2") == [1, 2]
    assert seconds("2") == 2.0 and seconds("250ms") == 0.25 and seconds("1m") == 60.0
    for bad in ("", "1,", "2.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            pid_list(bad)
    for bad in ("-1", "0", "x", "9" * 400):
        with pytest.raises(argparse.ArgumentTypeError):
            seconds(bad)


def test_running_pids() -> None:
    assert running_pids(None) == []
    assert running_pids([os.getpid()]) == [os.getpid()]
    with pytest.raises(UsageError, match="no process with PID 999999999"):
        running_pids([999999999])


def test_doctor_lists_the_strategies_that_need_tracefs() -> None:
    """doctor's `strategy_needs` (and the * of its text): only tracepoint/ programs and
    legacy kprobes need tracefs; io's disk signals are tracepoints under its tracepoint
    strategy only."""
    from meridian.tools import doctor

    needs = doctor._tracefs_needs()
    biolat = {s["name"]: s["needs_tracefs"] for s in needs["biolat"]}
    assert biolat == {"tp_btf": False, "tracepoint": True}
    assert doctor._marked(needs["runqlat"]) == "tp_btf, tracepoint*"
    io = {s["name"]: s["needs_tracefs"] for s in needs["io"]}
    assert io == {"fentry": False, "kprobe": io["kprobe"], "tp_btf": False, "tracepoint": True}
    assert not any(s["needs_tracefs"] for s in needs["sentinel"])
    assert needs["memlat"][0] == {
        "name": "fentry",
        "needs": ["fentry", "tp_btf"],
        "needs_tracefs": False,
    }
