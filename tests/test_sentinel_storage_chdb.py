"""ClickHouse storage of meridian sentinel in the embedded store (chDB): rows kept across
a reopen, a store in use by another process, a damaged data directory."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from sentinel_store import counts, rollups, wait_stored

from meridian.errors import UsageError
from meridian.tools.sentinel.storage import (
    BatchingSink,
    ChdbBackend,
    Reporter,
    StoreUnavailable,
    holder_pid,
    open_backend,
)
from meridian.tools.sentinel.symbols.symbolizer import Frame


@pytest.fixture
def chdb_ok() -> None:
    pytest.importorskip("chdb", reason="chDB is not installed (pip install chdb)")


@dataclass
class Cfg:
    data_dir: str | None = None
    url: str | None = None
    user: str = "default"
    password_file: str | None = None
    database: str = "default"
    batch_rows: int = 1000
    flush_interval: float = 0.2
    spool_max_bytes: int = 1 << 24
    retention_days: int = 14


@pytest.mark.usefixtures("chdb_ok")
def test_chdb_persists_across_reopen(tmp_path: Path) -> None:
    data = tmp_path / "store"
    backend = open_backend(Cfg(data_dir=str(data)))
    assert isinstance(backend, ChdbBackend)
    sink = BatchingSink(backend, spool_dir=str(data / "spool"), batch_rows=1000)
    try:
        sink.write_rollups(rollups(0, 2500))
        sink.write_stacks([(1, (Frame("/bin/x", "main", "x.c", 3, 4096),))])
        wait_stored(sink, 30)
        assert holder_pid(data) == os.getpid()
    finally:
        sink.close()
    assert holder_pid(data) is None
    again = ChdbBackend(data)
    again.open()  # the schema applied once more
    try:
        assert counts(again) == (2500, 2500)
        (row,) = again.query("SELECT functions FROM ms_callstacks")
        assert row == {"functions": ["main"]}
    finally:
        again.close()


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.usefixtures("chdb_ok")
def test_chdb_in_use_names_the_holder(tmp_path: Path) -> None:
    data = tmp_path / "store"
    data.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(data / ".meridian-sentinel.lock")],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"held\n"
        assert holder_pid(data) == child.pid
        holder = re.escape(f"in use by another process (pid {child.pid})")
        with pytest.raises(StoreUnavailable, match=holder):
            ChdbBackend(data).open()
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.usefixtures("chdb_ok")
def test_chdb_corrupt_dir_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "store"
    first = ChdbBackend(data)
    first.open()
    first.close()
    # damage the catalog: the database's metadata link becomes a directory of garbage
    meta = data / "metadata" / "default"
    meta.unlink() if meta.is_symlink() else shutil.rmtree(meta)
    meta.mkdir()
    (meta / "ms_flow_rollup.sql").write_text("garbage (((")
    reporter = Reporter(err=io.StringIO())
    sink = BatchingSink(
        ChdbBackend(data), spool_dir=str(tmp_path / "spool"), reporter=reporter, max_backoff=0.1
    )
    try:
        for i in range(5):
            sink.write_rollups(rollups(i * 10, 10))  # never raises
            sink.flush(timeout=1.0)
        st = sink.stats()
        assert st.spooled_rows == 50 and st.flush_errors >= 1
        (line,) = reporter.lines
        assert f"embedded store {data} cannot be used: " in line
        assert "--data-dir" in line and "\n" not in line
    finally:
        sink.close()
    with pytest.raises(StoreUnavailable) as err:
        ChdbBackend(data).open()
    assert "\n" not in str(err.value) and len(str(err.value)) < 600
    # a data directory that is a file, a database that is not a name: said at start
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is not a directory"):
        open_backend(Cfg(data_dir=str(tmp_path / "file")))
    with pytest.raises(UsageError, match=r"clickhouse\.database"):
        open_backend(Cfg(data_dir=str(data), database="a;DROP"))
