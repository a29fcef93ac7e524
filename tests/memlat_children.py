"""What memlat's kernel tests share: Options for a strategy with its start point, and
children that touch a known number of fresh pages when told to, each reporting its own
getrusage count of minor faults."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from children import reap

from meridian.tools.memlat import Options
from meridian.tools.memlat.kernel import start_of


def options(strategy: str | None = None, **kw: Any) -> Options:
    """Options that force `strategy` with the start point (--from) it times from."""
    start = start_of(strategy) if strategy else None
    return Options(strategy=strategy, start=start or "exception", **kw)


MINOR_TOUCHER = """
import json, mmap, resource, sys
def touch(m):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for off in range(0, len(m), 4096):
        m[off] = 1
    r1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    return json.dumps({{"minflt": r1 - r0}})
flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
touch(mmap.mmap(-1, 16 * 4096, flags=flags))  # every line above runs once before "go"
m = mmap.mmap(-1, {pages} * 4096, flags=flags)
m.madvise(mmap.MADV_NOHUGEPAGE)  # one fault per page
print("ready", flush=True)
sys.stdin.readline()
print(touch(m), flush=True)
sys.stdin.readline()
"""


@contextmanager
def waiting_children(*scripts: str) -> Iterator[list[subprocess.Popen[str]]]:
    """`python -c script` for each, once each has printed "ready"; reaped at the end."""
    with ExitStack() as stack:
        kids = []
        for script in scripts:
            child = subprocess.Popen(
                [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            stack.callback(reap, child)
            kids.append(child)
        for child in kids:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        yield kids


def go_and_read(kids: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """Tell every child to go on, then read each one's result line (JSON)."""
    for child in kids:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    out = []
    for child in kids:
        assert child.stdout is not None
        out.append(json.loads(child.stdout.readline()))
    return out
