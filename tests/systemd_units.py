"""The units of deploy/systemd, for test_deploy_systemd.py (their files) and
test_deploy_systemd_run.py (their processes): their names, the capabilities each tool
was found to need, a unit parsed, and a unit's text or arguments changed for a test."""

from __future__ import annotations

import shlex
from pathlib import Path

from unit_sandbox import Unit, parse_unit

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "systemd"
IO, BIOLAT, SENTINEL = "meridian-io-exporter", "meridian-biolat-exporter", "meridian-sentinel"
UNITS = [IO, BIOLAT, SENTINEL]
# What each tool was found to need (see the units' comments); nothing more.
CAPS = {
    IO: {"bpf", "perfmon"},
    BIOLAT: {"bpf", "perfmon"},
    SENTINEL: {"bpf", "perfmon", "syslog", "sys_ptrace", "dac_read_search", "checkpoint_restore"},
}


def unit(name: str) -> Unit:
    return parse_unit((DEPLOY / f"{name}.service").read_text())


def with_exec_start(text: str, command: list[str], *more: str) -> str:
    """The unit file's text with its ExecStart= line running `command` (and lines `more`
    after it)."""
    lines = text.splitlines()
    (i,) = [n for n, line in enumerate(lines) if line.startswith("ExecStart=")]
    lines[i : i + 1] = [f"ExecStart={shlex.join(command)}", *more]
    return "\n".join(lines) + "\n"


def replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with the value after `flag` replaced (the flag must be there)."""
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]
