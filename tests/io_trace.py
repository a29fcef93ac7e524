"""Shared by the io kernel tests: the events of one process read from a FileIO, the
names of the operations, a child workload (started, told to go, ended), and the
command."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from children import reap

from meridian.tools.io.kernel import FileIO

OPS = ("read", "write")


def drain(tool: FileIO, pid: int, want: int, timeout: float = 5.0) -> np.ndarray[Any, Any]:
    """Events of `pid` until `want` of them arrived (or the timeout)."""
    got: list[np.ndarray[Any, Any]] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ev = tool.events(0.05)
        if len(ev):
            got.append(ev[ev["pid"] == pid])
        if sum(map(len, got)) >= want:
            break
    return np.concatenate(got) if got else np.empty(0)


@contextlib.contextmanager
def ready_child(script: str, args: list[Any]) -> Iterator[subprocess.Popen[bytes]]:
    """A child running `script` with `args`, once it has said "ready"; reaped after."""
    p = subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        yield p
    finally:
        reap(p)


def go(p: subprocess.Popen[bytes]) -> bytes:
    """Tell the child to go; the line it answers with when done."""
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(b"go\n")
    p.stdin.flush()
    return p.stdout.readline()


def end_child(p: subprocess.Popen[bytes]) -> None:
    """Close the child's stdin, on which it waits to exit; it exits 0."""
    assert p.stdin is not None and p.stdout is not None
    p.stdin.close()
    assert p.wait(30) == 0
    p.stdout.close()


def io_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`meridian io` with these arguments, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "meridian", "io", *args], capture_output=True, text=True, timeout=60
    )


def io_layouts() -> tuple[np.dtype[Any], np.dtype[Any], np.dtype[Any]]:
    """`fileio_event`, and the aggregate map's key and per-CPU value, as io.bpf.o's BTF
    declares them (opening the object needs no root): synthetic events and map
    snapshots in tests and benchmarks keep the kernel's layout without a copy of it."""
    from meridian.bpf import BpfObject, object_path

    with BpfObject(object_path("io")) as obj:
        assert obj.btf is not None
        stats = obj.maps["stats"]
        return obj.btf.struct_dtype("fileio_event"), stats.key_dtype, stats.value_dtype
