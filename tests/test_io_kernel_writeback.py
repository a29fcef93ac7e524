"""meridian io charges writeback to the process that dirtied the pages: dd writes 64 MiB
through the page cache of an ext4 file system on a loop device, `sync` makes the
flusher write it, and the device's own write counter (/sys/block/NAME/stat) is the
ground truth the charges are compared with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from children import attached, ended, reap

from meridian.export.series import Point
from meridian.proc import kernel_dev
from meridian.tools.io.block import summarize_block
from meridian.tools.io.kernel import FileIO
from meridian.tools.io.metrics import block_series, io_source
from meridian.tools.io.options import Options
from meridian.tools.io.writeback import WritebackStats, by_process, summarize_writeback

pytestmark = pytest.mark.kernel
MiB = 1 << 20
SIZE = 64 * MiB


class Disk:
    """A mounted ext4 file system on its own 256 MiB loop device."""

    def __init__(self, name: str, dev: int, mnt: Path) -> None:
        self.name, self.dev, self.mnt = name, dev, mnt

    def written(self) -> int:
        """Bytes the device has completed writing (sectors written, field 7)."""
        return int(Path(f"/sys/block/{self.name}/stat").read_text().split()[6]) * 512


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    """Larger than conftest's loop device (64 MiB of data must fit), with the inode
    tables and journal initialised by mkfs, so no background thread writes to it while
    the test measures. Unmounted and detached even when the test fails."""
    backing = tmp_path / "wb.img"
    with open(backing, "wb") as f:
        f.truncate(256 * MiB)
    path = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], check=True, capture_output=True, text=True
    ).stdout.strip()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = False
    try:
        init = "lazy_itable_init=0,lazy_journal_init=0"
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", init, path], check=True)
        subprocess.run(["mount", path, str(mnt)], check=True)
        mounted = True
        name = os.path.basename(path)
        major, minor = Path(f"/sys/class/block/{name}/dev").read_text().strip().split(":")
        os.sync()
        yield Disk(name, kernel_dev(int(major), int(minor)), mnt)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", path], check=False)


def dd_then_sync(disk: Disk) -> tuple[int, int]:
    """dd writes SIZE bytes into the page cache (no fsync: it issues no write itself),
    then `sync` has them written. Returns dd's PID and the bytes the device wrote."""
    before = disk.written()
    dd = subprocess.Popen(
        ["dd", "if=/dev/zero", f"of={disk.mnt / 'f'}", "bs=1M", f"count={SIZE // MiB}"],
        stderr=subprocess.DEVNULL,
    )
    assert dd.wait(60) == 0
    subprocess.run(["sync"], check=True, timeout=60)
    return dd.pid, disk.written() - before


def charged(stats: list[WritebackStats], pid: int, disk: Disk) -> int:
    return sum(w.block.bytes for w in stats if w.pid == pid and w.dev == disk.dev)


def test_writeback_is_charged_to_dd(disk: Disk) -> None:
    with FileIO(Options(no_events=True)) as tool:
        assert "tp_dirty_folio" in tool.selected
        pid, written = dd_then_sync(disk)
        wb = summarize_writeback(*tool.writeback_stats())
        block = summarize_block(*tool.disk_stats())
        counters = tool.counters()
        exported = {f.name: f for f in io_source(tool)()}
    ours = [w for w in wb if w.pid == pid]
    assert ours and {w.comm for w in ours} == {"dd"} and {w.device for w in ours} == {disk.name}
    dd_bytes = charged(wb, pid, disk)
    on_disk = sum(w.block.bytes for w in wb if w.dev == disk.dev)
    # Every page of the file is written back, and charged to dd; nothing twice.
    assert SIZE <= dd_bytes <= on_disk <= written
    assert dd_bytes >= 0.95 * written, (dd_bytes, written)
    # dd issued no write of its own: its writes are all in the writeback section, and
    # the kernel threads' own share (journal, loop backing file) stays theirs.
    assert not [b for b in block if b.pid == pid and b.op == "write"]
    ours_dict = ours[0].as_dict()
    assert ours_dict["type"] == "writeback" and ours_dict["requests"] == ours[0].block.requests
    assert ours_dict["latency_max_ns"] > 0 and "op" not in ours_dict
    assert counters["wb_evicted"] == 0
    # The exporters: the same bytes in meridian.block.io, `meridian.io.writeback` true.
    fams = {f.name: f for f in block_series(block, None, by_process(wb))}
    points = [p for p in fams["meridian.block.io"].points if p.attrs["process.pid"] == pid]
    assert [
        (p.attrs["disk.io.direction"], p.value)
        for p in points
        if isinstance(p, Point) and p.attrs["meridian.io.writeback"]
    ] == [("write", dd_bytes)]  # (dd's own start-up reads have `false`)
    # ... and in process.disk.io, as the process's own file I/O is, told apart by it.
    disk_io = [p for p in exported["process.disk.io"].points if p.attrs["process.pid"] == pid]
    assert {
        (p.attrs["disk.io.direction"], p.attrs["meridian.io.writeback"]): p.value
        for p in disk_io
        if isinstance(p, Point)
    }[("write", True)] == dd_bytes


def test_pid_filter_selects_the_writer(disk: Disk) -> None:
    """-p of a process that is not dd: dd's writeback is not counted, nor the flusher's
    own requests (it is not the traced process either)."""
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        with FileIO(Options(no_events=True, pids=[other.pid])) as tool:
            pid, _ = dd_then_sync(disk)
            wb = summarize_writeback(*tool.writeback_stats())
            block = summarize_block(*tool.disk_stats())
    finally:
        reap(other)
    assert wb == [] and block == []
    assert pid != other.pid


def test_cli_comm_filter_and_summary(disk: Disk) -> None:
    """`meridian io --comm dd`: the writeback object of dd in the JSON summary (the
    flusher that issued the writes is not dd: no block object of its own), and the
    text table's section."""
    for fmt in ("json", "text"):
        with attached("io", "-v", "--comm", "dd", "--no-events", "--format", fmt) as proc:
            pid, written = dd_then_sync(disk)
            (disk.mnt / "f").unlink()
            time.sleep(0.2)
            out, _ = ended(proc)
        if fmt == "json":
            lines = [json.loads(x) for x in out.splitlines()]
            wb = [x for x in lines if x.get("type") == "writeback"]
            assert [(w["pid"], w["comm"], w["device"]) for w in wb] == [(pid, "dd", disk.name)]
            assert SIZE <= wb[0]["bytes"] <= written
            assert {x["comm"] for x in lines if x.get("type") == "block"} <= {"dd"}
            assert "wb_unattributed" in lines[-1] and "wb_evicted" in lines[-1]
        else:
            _, _, section = out.partition("written back on behalf of")
            assert section, out
            rows = [r.split() for r in section.splitlines()[2:] if r.strip()]
            assert rows[0][:3] == ["dd", str(pid), disk.name]
