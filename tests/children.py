"""Child processes of the kernel tests: ended and reaped whatever the test's outcome."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# How much slower than this host the tests run: the kernel matrix's QEMU guests emulate
# every instruction (tests/kernel_matrix.py sets it); waits for children scale with it.
SLOWDOWN = float(os.environ.get("MERIDIAN_TEST_SLOWDOWN", "1"))


def patience(seconds: float) -> float:
    """A timeout of `seconds` on this host, as long as it needs to be here."""
    return seconds * SLOWDOWN


def wait_until(cond: Callable[[], object], seconds: float, what: str, step: float = 0.02) -> None:
    """Poll `cond` every `step` seconds until it is true; fail naming `what` once
    patience(seconds) have passed."""
    limit = patience(seconds)
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, f"no {what} within {limit:g}s"
        time.sleep(step)


def reap(child: subprocess.Popen[Any]) -> None:
    """Kill the child if it still runs, wait for it and close its pipes."""
    if child.poll() is None:
        child.kill()
    child.wait()
    for pipe in (child.stdin, child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()


def wait_attached(proc: subprocess.Popen[str]) -> None:
    """Wait for meridian's ready signal: with -v it prints its strategy on stderr once
    its programs are attached. Fails with the last lines if it exits first."""
    assert proc.stderr is not None
    seen: list[str] = []
    while "strategy:" not in (line := proc.stderr.readline()):
        assert line, f"meridian exited before attaching: {''.join(seen[-5:])}"
        seen.append(line)


def meridian(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m meridian ARGS` (as a person runs it) to its end, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "meridian", *args], capture_output=True, text=True, timeout=timeout
    )


def help_text(tool: str) -> str:
    """`meridian TOOL --help`, its words joined by single spaces (argparse wraps them)."""
    p = meridian(tool, "--help")
    assert p.returncode == 0, p.stderr
    return " ".join(p.stdout.split())


@contextlib.contextmanager
def attached(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`meridian ARGS` (with -v among them: `wait_attached`), its output in text pipes,
    once its programs are attached; reaped at the end whatever happens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "meridian", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_attached(proc)
        yield proc
    finally:
        reap(proc)


def ended(
    proc: subprocess.Popen[str], timeout: float = 30, sig: int | None = signal.SIGTERM
) -> tuple[str, str]:
    """What `proc` printed (stdout, stderr) until it exited, which it must with 0:
    after `sig` (SIGINT: Ctrl-C; None: none, it ends by itself)."""
    if sig is not None:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out, err


def build_c(directory: Path, name: str, source: str, *flags: str) -> Path:
    """The C program `source` built with gcc as directory/name (`flags` before the
    source). A skip without gcc, which MERIDIAN_REQUIRE_BPF=1 turns into a failure."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (make deps)")
    (directory / f"{name}.c").write_text(source)
    exe = directory / name
    subprocess.run(["gcc", *flags, "-o", str(exe), str(directory / f"{name}.c")], check=True)
    return exe
