"""`meridian syscalls -- COMMAND`: the command as a child process held stopped before
its exec until the kernel traces its PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal

from ...errors import UsageError
from ...proc import start_environment
from .event import Syscall

__all__ = ["Launcher"]


class Launcher:
    """`-- COMMAND`: a child that waits, stopped before exec, until its PID is in the
    kernel's set, so its first syscalls are traced. It waits in sigwait (not a file
    syscall, so nothing of the launcher shows), then execs the command as strace would:
    in the environment this tool was started with, and with the signals Python ignores
    back to their default (an ignored signal stays ignored across exec)."""

    GO = signal.SIGUSR1
    PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)

    def __init__(self, command: list[str], exec_traced: bool = False) -> None:
        exe = shutil.which(command[0]) if "/" not in command[0] else command[0]
        if exe is None or not os.access(exe, os.X_OK):
            raise UsageError(f"command {command[0]!r} not found or not executable")
        self.command = command
        env = start_environment()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {self.GO})
        pid = os.fork()
        if pid == 0:  # the child: wait for the go, then become the command
            try:
                for sig in self.PYTHON_IGNORES:
                    signal.signal(sig, signal.SIG_DFL)
                signal.sigwait({self.GO})
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
                os.execve(exe, command, env)
            finally:
                os._exit(127)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.pid = pid
        self.status: int | None = None
        self._before_exec = exec_traced  # hiding the launcher's calls until its exec

    def command_calls(self, events: list[Syscall]) -> list[Syscall]:
        """`events` without the launcher's own calls, traced from the moment its PID
        joined the kernel's set to its exec of the command (the end of sigwait, the
        signal mask put back), which are not the command's: strace shows none of its
        own either. The exec is the boundary, so only when execve is traced."""
        if not self._before_exec:
            return events
        kept = []
        for sc in events:
            if self._before_exec and sc.pid == self.pid:
                if not (sc.is_start and sc.name == "execve"):
                    continue
                self._before_exec = False
            kept.append(sc)
        return kept

    def go(self) -> None:
        os.kill(self.pid, self.GO)

    def poll(self) -> int | None:
        """The exit code once the command has exited, else None."""
        if self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
        return self.status

    def kill(self) -> None:
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            _, st = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(st)
