"""Child processes of the kernel tests: ended and reaped whatever the test's outcome."""

from __future__ import annotations

import subprocess
from typing import Any


def reap(child: subprocess.Popen[Any]) -> None:
    """Kill the child if it still runs, wait for it and close its pipes."""
    if child.poll() is None:
        child.kill()
    child.wait()
    for pipe in (child.stdin, child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()
