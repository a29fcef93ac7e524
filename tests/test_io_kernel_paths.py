"""meridian io names files from the kernel: short-lived `cat` and `dd` on the root file
system and on an ext4 loop mount below it (the walk crosses the mount), and files
renamed or unlinked while open, named as /proc/PID/fd shows them at that moment.

The formatter gets an empty /proc, so every path in these tests came from the
kernel's name records, none from user space after the fact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from children import attached, ended, reap
from io_trace import drain

from meridian.tools.io.event_format import EventFormatter
from meridian.tools.io.kernel import FileIO
from meridian.tools.io.options import Options

pytestmark = pytest.mark.kernel


def lines_of(tool: FileIO, tmp_path: Path, ev: np.ndarray[Any, Any]) -> list[dict[str, Any]]:
    """JSON events as the agent prints them, with no /proc to fall back on."""
    noproc = tmp_path / "noproc"
    noproc.mkdir(exist_ok=True)
    fmt = EventFormatter(proc_root=str(noproc), names=tool.names)
    return [json.loads(x) for x in fmt.json_lines(ev).splitlines()]


def run(*cmd: str) -> int:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert p.wait(30) == 0
    return p.pid


def test_short_lived_cat_and_dd_on_root_and_loop_mount(tmp_path: Path, ext4: Path) -> None:
    files = [tmp_path / "root file.txt", ext4 / "sub" / "data.bin"]
    files[1].parent.mkdir()
    for i, f in enumerate(files):
        f.write_bytes(os.urandom(8192 + i))
    with FileIO(Options()) as tool:
        got = []
        for f in files:
            for cmd in (("cat", str(f)), ("dd", f"if={f}", "of=/dev/null", "bs=4k")):
                pid = run(*cmd)
                ev = drain(tool, pid, 1 << 30, timeout=1.0)  # all of them
                got.append((f, cmd[0], pid, lines_of(tool, tmp_path, ev)))
        assert tool.counters()["names_lost"] == 0
    for f, comm, pid, lines in got:
        ino = f.stat().st_ino
        dev = os.stat(f).st_dev
        ours = [
            x for x in lines if x["ino"] == ino and x["dev"] == f"{os.major(dev)}:{os.minor(dev)}"
        ]
        size = f.stat().st_size
        # cat: one read of the whole file, then EOF; dd: 4 KiB blocks, then EOF.
        want = 2 if comm == "cat" else -(-size // 4096) + 1
        assert len(ours) == want, (comm, lines)
        assert sum(x["bytes"] for x in ours) == size
        assert {x["file"] for x in ours} == {str(f)}
        assert {x["comm"] for x in ours} == {comm} and {x["pid"] for x in ours} == {pid}
        # Every event of the process has a kernel path (libc, locale files too).
        assert all(x["file"].startswith("/") for x in lines)


CHILD = r"""
import os, sys
path, new, how = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(path, os.O_RDONLY)
os.pread(fd, 10, 0)
if how == "rename":
    os.rename(path, new)
else:
    os.unlink(path)
seen = os.readlink(f"/proc/self/fd/{fd}")
os.pread(fd, 10, 0)
print(seen, flush=True)
"""


@pytest.mark.parametrize("how", ["rename", "unlink"])
@pytest.mark.parametrize("strategy", ["tracepoint", "tp_btf"])
def test_renamed_or_unlinked_while_open(tmp_path: Path, how: str, strategy: str) -> None:
    old, new = tmp_path / "before.txt", tmp_path / "after.txt"
    old.write_bytes(b"x" * 100)
    ino = old.stat().st_ino
    with FileIO(Options(strategy=strategy)) as tool:
        p = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(old), str(new), how], stdout=subprocess.PIPE
        )
        try:
            out, _ = p.communicate(timeout=30)
        finally:
            reap(p)
        assert p.returncode == 0
        ev = drain(tool, p.pid, 1 << 30, timeout=1.0)
        lines = [x for x in lines_of(tool, tmp_path, ev) if x["ino"] == ino]
    seen = out.decode().strip()
    assert seen == (str(new) if how == "rename" else f"{old} (deleted)")
    assert [x["file"] for x in lines] == [str(old), seen]


def test_cli_names_files_of_cat(tmp_path: Path) -> None:
    """`meridian io --comm cat` while `cat` reads a file: the path on every line."""
    f = tmp_path / "passwd-copy"
    f.write_bytes(Path("/etc/passwd").read_bytes())
    with attached("io", "-v", "--comm", "cat") as proc:
        pid = run("cat", str(f))
        time.sleep(0.3)
        out, _ = ended(proc)
    events = [json.loads(x) for x in out.splitlines()]
    events = [x for x in events if "type" not in x and x["pid"] == pid]
    ours = [x for x in events if x["ino"] == f.stat().st_ino]
    assert len(ours) == 2 and {x["file"] for x in ours} == {str(f)}
    assert all(x["file"].startswith("/") for x in events)
