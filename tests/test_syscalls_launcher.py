"""`meridian syscalls -- COMMAND` without a kernel: the command runs as it would
untraced (the environment the tool was started with, not the one Python coerced; the
signals Python ignores back to their default), and the launcher's own calls before
its exec are not the command's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from meridian.proc import start_environment
from meridian.tools.syscalls.event import Syscall

LAUNCH = """
import sys
from meridian.tools.syscalls.launcher import Launcher
launcher = Launcher(sys.argv[1:])
launcher.go()
while launcher.poll() is None:
    pass
"""


def launched(*command: str) -> str:
    """What `command` prints when the launcher runs it in a Python started with only
    PATH set (as a service or a container: no locale, so Python coerces LC_CTYPE)."""
    env = {"PATH": os.environ["PATH"]}
    run = subprocess.run(
        [sys.executable, "-c", LAUNCH, *command], env=env, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_the_command_gets_the_environment_the_tool_started_with() -> None:
    assert launched("env") == f"PATH={os.environ['PATH']}\n"  # no LC_CTYPE=C.UTF-8


def test_the_command_does_not_inherit_the_signals_python_ignores() -> None:
    status = launched("cat", "/proc/self/status")
    ignored = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
    mask = int(ignored.split()[1], 16)  # bit n-1: signal n ignored
    # SIGPIPE and SIGXFSZ as a shell leaves them (what the caller ignores, it may)
    assert not mask & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)), hex(mask)


def test_start_environment_is_the_exec_s_not_the_current_one(tmp_path: Path) -> None:
    environ = tmp_path / "environ"
    environ.write_bytes(b"A=1\0B=x=y\0A=2\0junk\0=nameless\0EMPTY=\0")
    assert start_environment(environ) == {b"A": b"1", b"B": b"x=y", b"EMPTY": b""}
    os.environ["MERIDIAN_TEST_SET_LATER"] = "1"  # setenv: not in /proc/self/environ
    try:
        assert b"MERIDIAN_TEST_SET_LATER" not in start_environment()
    finally:
        del os.environ["MERIDIAN_TEST_SET_LATER"]
    assert start_environment(tmp_path / "no-proc") == dict(os.environb)


def test_the_launchers_calls_before_its_exec_are_left_out() -> None:
    from meridian.tools.syscalls.launcher import Launcher

    launcher = Launcher(["true"], exec_traced=True)
    launcher.go()
    pid, other = launcher.pid, launcher.pid + 1

    def ev(index: int, name: str, on: int, start: bool) -> Syscall:
        return Syscall(index, name, 0, "x", on, on, is_start=start, is_end=not start)

    sigwait_end = ev(0, "rt_sigtimedwait", pid, False)
    mask = [ev(1, "rt_sigprocmask", pid, True), ev(2, "rt_sigprocmask", pid, False)]
    elsewhere = ev(3, "read", other, True)
    execve = [ev(4, "execve", pid, True), ev(5, "execve", pid, False)]
    after = ev(6, "rt_sigprocmask", pid, True)
    got = launcher.command_calls([sigwait_end, *mask, elsewhere, execve[0]])
    assert got == [elsewhere, execve[0]]
    assert launcher.command_calls([execve[1], after]) == [execve[1], after]
    launcher.kill()
