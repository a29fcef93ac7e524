"""io names the container of each process from the cgroup id the kernel records with its
aggregates: a reader moved into a cgroup laid out as podman lays out a container's
(`libpod-<id>.scope`) is charged with its exact bytes, under that container id, in the
summary and in the exported series."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from children import reap
from io_trace import end_child, go

from meridian.cgroup import cgroup2_mounts
from meridian.containers import Containers
from meridian.tools.io.kernel import FileIO
from meridian.tools.io.metrics import snapshot_groups
from meridian.tools.io.model import summarize
from meridian.tools.io.options import Options

pytestmark = pytest.mark.kernel

READER = """
import sys
print("ready", flush=True)
sys.stdin.readline()
with open(sys.argv[1], "rb", buffering=0) as f:
    while f.read(65536):
        pass
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def container_cgroup() -> Iterator[tuple[Path, str]]:
    """A cgroup v2 directory named as podman names a container's; removed after."""
    mounts = cgroup2_mounts()
    if not mounts:
        pytest.skip("no cgroup2 file system mounted")
    cid = (uuid.uuid4().hex * 2)[:64]
    top = Path(mounts[0]) / f"meridian-test-{os.getpid()}"
    scope = top / f"libpod-{cid}.scope"
    scope.mkdir(parents=True)
    try:
        yield scope, cid
    finally:
        for d in (scope, top):  # empty once the reader has exited
            if d.exists():
                d.rmdir()


def test_a_containers_reads_carry_its_id(
    container_cgroup: tuple[Path, str], tmp_path: Path
) -> None:
    scope, cid = container_cgroup
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(1 << 20))
    procs = scope / "cgroup.procs"
    with FileIO(Options()) as tool:
        # Into the container's cgroup between fork and exec, as a runtime starts one: the
        # kernel records the cgroup with a process's first aggregate.
        child = subprocess.Popen(
            [sys.executable, "-c", READER, str(data)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            preexec_fn=lambda: procs.write_text(f"{os.getpid()}\n"),
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"
            assert go(child) == b"done\n"
            keys, vals = tool.stats()
            ps = summarize(keys, vals)[child.pid]
            groups = snapshot_groups(keys, vals, None, tool.containers.attrs)
            end_child(child)
        finally:
            reap(child)
    assert ps.cgroup_id == scope.stat().st_ino
    on_file = ps.total("read")
    assert on_file.bytes >= 1 << 20  # the file, and python's own start-up reads
    want = {"container.id": cid, "container.runtime": "podman"}
    assert tool.containers.attrs(ps.cgroup_id) == want
    (attrs,) = [a for a, g in groups if g.pid == child.pid]
    assert {k: attrs[k] for k in want} == want
    assert ps.as_dict(1.0, want)["container"] == want
    # A process outside any container has none.
    host = [a for a, g in groups if g.pid != child.pid]
    assert all("container.id" not in a for a in host)


def test_container_filter_keeps_its_processes_only(
    container_cgroup: tuple[Path, str], tmp_path: Path
) -> None:
    """--container with a prefix of the id: the kernel keeps the reader in the
    container's cgroup, exactly its file's bytes, and nothing of the same reader
    outside it."""
    scope, cid = container_cgroup
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(1 << 20))
    found = Containers().cgroup_of(container=cid[:12])
    assert (found.id, found.path) == (scope.stat().st_ino, str(scope))
    procs = scope / "cgroup.procs"

    def start(into: Path | None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", READER, str(data)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            preexec_fn=None if into is None else lambda: into.write_text(f"{os.getpid()}\n"),
        )

    with FileIO(Options(cgroup=(found.id, found.depth))) as tool:
        inside, outside = start(procs), start(None)
        try:
            for child in (inside, outside):
                assert child.stdout is not None and child.stdout.readline() == b"ready\n"
            before = summarize(*tool.stats())
            for child in (inside, outside):
                assert go(child) == b"done\n"
            stats = summarize(*tool.stats())
            for child in (inside, outside):
                end_child(child)
        finally:
            reap(inside)
            reap(outside)
    assert set(stats) == {inside.pid}
    # between the two snapshots the reader read its file, exactly, and nothing else
    read = stats[inside.pid].total("read").bytes - before[inside.pid].total("read").bytes
    assert read == 1 << 20
