"""`meridian syscalls -- COMMAND`: the command as a child process held stopped before
its exec until the kernel traces its PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal

from ...errors import UsageError

__all__ = ["Launcher"]


class Launcher:
    """`-- COMMAND`: a child that waits, stopped before exec, until its PID is in the
    kernel's set, so its first syscalls are traced. It waits in sigwait (not a file
    syscall, so nothing of the launcher shows), then execs the command."""

    GO = signal.SIGUSR1

    def __init__(self, command: list[str]) -> None:
        exe = shutil.which(command[0]) if "/" not in command[0] else command[0]
        if exe is None or not os.access(exe, os.X_OK):
            raise UsageError(f"command {command[0]!r} not found or not executable")
        self.command = command
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {self.GO})
        pid = os.fork()
        if pid == 0:  # the child: wait for the go, then become the command
            try:
                signal.sigwait({self.GO})
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
                os.execv(exe, command)
            finally:
                os._exit(127)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.pid = pid
        self.status: int | None = None

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
