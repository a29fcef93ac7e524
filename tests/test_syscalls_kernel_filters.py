"""`meridian syscalls` against the real kernel, what it keeps: a syscall set and
--failed, a command's children, a running process (-p), a cgroup and those below it,
and process names (--comm), each filtered in the kernel."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from syscalls_prog import CONTENT, build_prog, json_lines, meridian

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def prog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_prog(tmp_path_factory)


def test_syscall_set_and_failed_filter(prog: Path, tmp_path: Path) -> None:
    tmp = tmp_path.resolve()
    src, missing = tmp / "input.txt", tmp / "missing.txt"
    src.write_bytes(CONTENT)
    live = meridian(
        "-e", "openat", "--failed", "--full", "--", str(prog),
        str(src), str(missing), str(tmp / "nope"), str(tmp / "b"),
    )  # fmt: skip
    assert live.returncode == 3  # the command's exit status (rename failed)
    lines = live.stdout.splitlines()
    mine = [line for line in lines if str(tmp) in line or "= -2 ENOENT" in line]
    assert any(f'openat(AT_FDCWD, "{missing}", O_RDONLY) ... [end #' in line for line in mine)
    assert all("rename" not in line and str(src) not in line for line in lines)
    # the start row precedes its end, and each names the other
    start = next(line for line in lines if str(missing) in line)
    s_idx = int(start.split()[0][1:])
    e_idx = int(start.rsplit("#", 1)[1].rstrip("]"))
    assert lines[lines.index(start) + 1].startswith(f"#{e_idx} ")
    assert lines[lines.index(start) + 1].endswith(f"= -2 ENOENT [start #{s_idx}]")


def test_children_are_followed(tmp_path: Path) -> None:
    tmp = tmp_path.resolve()
    src = tmp / "input.txt"
    src.write_bytes(CONTENT)
    live = meridian(
        "--json", "-e", "openat,execve", "--", "/bin/sh", "-c", f"cat {src} >/dev/null; true"
    )
    assert live.returncode == 0, live.stderr
    rows = json_lines(live.stdout)
    sh = rows[0]["pid"]
    cat = [r for r in rows if r["comm"] == "cat" and r.get("paths") == [str(src)]]
    assert len(cat) == 1 and cat[0]["pid"] != sh and cat[0]["result"] >= 0


def test_attach_to_a_running_process(tmp_path: Path) -> None:
    tmp = tmp_path.resolve()
    code = f"import os, sys; sys.stdin.readline(); os.stat({str(tmp)!r} + '/gone')"
    target = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    tracer = subprocess.Popen(
        [sys.executable, "-m", "meridian", "syscalls", "-p", str(target.pid), "-e", "newfstatat"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert tracer.stderr is not None and target.stdin is not None
        assert tracer.stderr.readline().startswith("Tracing file-system syscalls")
        target.stdin.write(b"go\n")
        target.stdin.close()
        target.wait(30)
        out, err = tracer.communicate(timeout=30)  # stops once the process is gone
        assert tracer.returncode == 0, err
        assert f'newfstatat(AT_FDCWD, "{tmp}/gone", ' in out and "= -2 ENOENT <" in out
    finally:
        for p in (tracer, target):
            p.kill()
            p.wait()


def test_cgroup_filter(tmp_path: Path) -> None:
    """--cgroup keeps the tasks of that cgroup and of those below it (here the target
    sits in a child of the cgroup named), as io's does."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    root = next((m.split()[1] for m in mounts if m.split()[2] == "cgroup2"), None)
    if root is None:
        pytest.skip("no cgroup2 mount")
    cg = Path(root) / f"meridian-test-{tmp_path.name}"
    inner = cg / "inner"
    inner.mkdir(parents=True)
    tmp = tmp_path.resolve()
    (tmp / "input.txt").write_bytes(CONTENT)
    code = (
        "import os, sys; sys.stdin.readline(); "
        f"os.open({str(tmp / 'input.txt')!r}, os.O_RDONLY); os.path.exists({str(tmp)!r} + '/x')"
    )
    target = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    tracer = None
    try:
        (inner / "cgroup.procs").write_text(str(target.pid))
        tracer = subprocess.Popen(
            [sys.executable, "-m", "meridian", "syscalls", "--cgroup", str(cg),
             "-e", "openat,newfstatat", "--duration", "4"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert tracer.stderr is not None and target.stdin is not None
        assert tracer.stderr.readline().startswith("Tracing")  # loaded and attached
        target.stdin.write(b"go\n")
        target.stdin.close()
        target.wait(30)
        out, err = tracer.communicate(timeout=30)
        assert tracer.returncode == 0, err
        lines = out.splitlines()
        assert lines and all(f"({target.pid}:{target.pid})" in line for line in lines)
        assert any(
            f'openat(AT_FDCWD, "{tmp}/input.txt", O_RDONLY|O_CLOEXEC) = ' in x for x in lines
        )
        assert any(f'newfstatat(AT_FDCWD, "{tmp}/x", ' in x and "-2 ENOENT" in x for x in lines)
    finally:
        for p in (tracer, target):
            if p is not None:
                p.kill()
                p.wait()
        inner.rmdir()
        cg.rmdir()


def test_comm_is_filtered_in_the_kernel(prog: Path, tmp_path: Path) -> None:
    """--comm: the kernel sends only the events of matching process names (a lower
    case pattern matches any case), so the recording holds no other."""
    tmp = tmp_path.resolve()
    src, a = tmp / "input.txt", tmp / "a"
    src.write_bytes(CONTENT)
    upper = tmp / "MyProg"
    shutil.copy(prog, upper)
    run = f"{upper} {src} {tmp}/none {a} {tmp}/b; {prog} {src} {tmp}/none {a} {tmp}/b; true"
    rec = tmp / "rec.raw"
    live = meridian("--comm", "myprog", "-q", "-w", str(rec), "--", "/bin/sh", "-c", run)
    assert live.returncode == 0, live.stderr
    full = json_lines(meridian("-r", str(rec), "--json", "--full").stdout)
    assert full and {r["comm"] for r in full} == {"MyProg"}
    assert any(r.get("paths") == [str(src)] for r in full)
    # the kernel skipped the others: no index is taken by them, nothing was lost
    assert re.findall(r"(\d+) lost", live.stderr) == ["0"], live.stderr
    assert sorted(r["index"] for r in full) == list(range(len(full)))
