"""meridian io without a kernel: event formatting, path resolution, aggregates, input."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meridian.bpf import BpfObject, object_path
from meridian.cli import build_parser
from meridian.errors import UsageError
from meridian.tools.io import event_format as io_format
from meridian.tools.io.cli import options_from_args
from meridian.tools.io.event_format import CHUNK, EventFormatter
from meridian.tools.io.model import summarize
from meridian.tools.io.report import report

if not object_path("io").exists():
    pytest.skip("BPF objects not built (make bpf)", allow_module_level=True)


def dtypes() -> tuple[np.dtype[Any], np.dtype[Any], np.dtype[Any]]:
    with BpfObject(object_path("io")) as obj:
        assert obj.btf is not None
        return (
            obj.btf.struct_dtype("fileio_event"),
            obj.maps["stats"].key_dtype,
            obj.maps["stats"].value_dtype,
        )


def test_json_lines_are_valid_json_with_every_field(tmp_path: Path) -> None:
    ev_dt, _, _ = dtypes()
    ev = np.zeros(2, dtype=ev_dt)
    ev["pid"], ev["tid"], ev["fd"] = 10, 11, 3
    ev["comm"] = [b'we"ird\\name', b"dd"]
    ev["op"] = [0, 1]
    ev["cached"] = [1, 0]
    ev["bytes"], ev["bytes_requested"], ev["disk_bytes"] = 4096, 8192, [0, 4096]
    ev["latency_ns"], ev["io_wait_ns"], ev["ts_ns"] = 1234, [0, 99], [5, 6]
    ev["dev"], ev["ino"] = (7 << 20) | 3, 42
    fmt = EventFormatter(proc_root=str(tmp_path))  # no /proc entry: dev:inode
    lines = [json.loads(x) for x in fmt.json_lines(ev).splitlines()]
    assert lines[0]["comm"] == 'we"ird\\name' and lines[1]["comm"] == "dd"
    assert [x["op"] for x in lines] == ["read", "write"]
    assert [x["cached"] for x in lines] == [True, False]
    assert lines[1]["disk_bytes"] == 4096 and lines[1]["io_wait_ns"] == 99
    assert lines[0]["file"] == "7:3:42"
    assert lines[0]["dev"] == "7:3" and lines[0]["ino"] == 42
    assert lines[0]["wall_time"].endswith("Z") and len(lines[0]["wall_time"]) == 27
    assert set(lines[0]) == {
        "pid", "tid", "comm", "op", "fd", "file", "dev", "ino", "bytes", "bytes_requested",
        "disk_bytes",
        "latency_ns", "cached", "io_wait_ns", "disk_latency_ns", "disk_requests", "sector",
        "timestamp_ns", "wall_time",
    }  # fmt: skip
    assert fmt.json_lines(ev[:0]) == ""


def test_path_from_proc_fd_only_when_it_is_the_same_inode(tmp_path: Path) -> None:
    target = tmp_path / "data file.bin"
    target.write_bytes(b"x")
    fd_dir = tmp_path / "proc" / "77" / "fd"
    fd_dir.mkdir(parents=True)
    os.symlink(target, fd_dir / "5")
    fmt = EventFormatter(proc_root=str(tmp_path / "proc"))
    ino = target.stat().st_ino
    assert json.loads(fmt.path(77, 5, 1, ino)) == str(target)
    # Another inode behind the same fd number: not this file.
    assert json.loads(fmt.path(77, 5, 1, ino + 1)) == f"0:1:{ino + 1}"
    # The inode seen before, from a process that is gone: the path seen before.
    assert json.loads(fmt.path(78, 9, 1, ino)) == str(target)


def test_summarize_sums_cpus_and_splits_op_and_cached() -> None:
    _, key_dt, val_dt = dtypes()
    keys = np.zeros(3, dtype=key_dt)
    keys["pid"] = [100, 100, 200]
    keys["op"] = [0, 0, 1]
    keys["cached"] = [1, 0, 0]
    vals = np.zeros((3, 2), dtype=val_dt)  # two CPUs
    vals["ops"] = [[3, 1], [1, 0], [2, 2]]
    vals["bytes"] = [[300, 100], [100, 0], [10, 10]]
    vals["latency_max_ns"] = [[5, 9], [100, 0], [1, 2]]
    vals["first_ns"] = [[0, 7], [3, 0], [1, 1]]
    vals["comm"][0, 1] = b"cat"
    vals["buckets"][0, 0, 3] = 4
    out = summarize(keys, vals)
    assert set(out) == {100, 200}
    cat = out[100]
    assert cat.comm == "cat"
    assert cat.total("read").ops == 5 and cat.total("read").bytes == 500
    assert cat.total("read", True).ops == 4
    assert cat.hit_ratio("read") == 0.8
    assert cat.total("read").latency_max_ns == 100
    assert cat.total("read").first_ns == 3
    assert cat.total("read", True).hist.total == 4
    assert out[200].total("write").ops == 4 and out[200].hit_ratio("write") == 0.0
    d = cat.as_dict(2.0)
    assert d["read"]["bytes_per_s"] == 250.0 and d["read"]["cache_hit_ratio"] == 0.8
    assert "write" not in d


def test_pids_must_run() -> None:
    """-p is parsed by the common flag (tests/test_cli.py); io takes running processes."""
    mine = build_parser().parse_args(["io", "-p", str(os.getpid())])
    assert options_from_args(mine).pids == [os.getpid()]
    gone = build_parser().parse_args(["io", "-p", "999999999"])
    with pytest.raises(UsageError, match="no process with PID 999999999"):
        options_from_args(gone)


def random_events(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    ev_dt, _, _ = dtypes()
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, dtype=ev_dt)
    k = rng.integers(0, 9, n)
    ev["pid"], ev["tid"], ev["fd"] = 100 + k, 200 + k % 4, np.where(k == 8, -1, 3 + k % 3)
    ev["comm"] = np.array([b"dd", b'q"uote', b"\xc3\xa9t\xc3\xa9", b"x" * 16])[k % 4]
    ev["op"], ev["cached"] = k % 2, rng.integers(0, 2, n)
    ev["dev"], ev["ino"] = (8 << 20) | (k % 2), 1000 + k
    ev["bytes"] = rng.integers(0, 1 << 40, n)
    ev["bytes_requested"] = 1 << 20
    ev["disk_bytes"] = np.where(ev["cached"] == 1, 0, ev["bytes"])
    ev["latency_ns"] = rng.integers(0, 1 << 62, n, dtype=np.uint64)
    ev["io_wait_ns"] = rng.integers(0, 10, n)
    ev["sector"] = np.where(ev["cached"] == 1, -1, rng.integers(0, 1 << 40, n))
    ev["ts_ns"] = 10**12 + np.cumsum(rng.integers(0, 3 * 10**8, n, dtype=np.uint64))
    return ev


def reference(fmt: EventFormatter, e: Any) -> dict[str, Any]:
    """One event the slow, obvious way."""
    ts = int(e["ts_ns"])
    wall_ns = ts + fmt.offset_ns
    sec = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall_ns // 10**9))
    return {
        "pid": int(e["pid"]),
        "tid": int(e["tid"]),
        "comm": e["comm"].decode(errors="replace"),
        "op": "write" if e["op"] else "read",
        "fd": int(e["fd"]),
        "file": f"8:{int(e['dev']) & 0xFFFFF}:{int(e['ino'])}",
        "dev": f"8:{int(e['dev']) & 0xFFFFF}",
        "ino": int(e["ino"]),
        "bytes": int(e["bytes"]),
        "bytes_requested": int(e["bytes_requested"]),
        "disk_bytes": int(e["disk_bytes"]),
        "latency_ns": int(e["latency_ns"]),
        "cached": bool(e["cached"]),
        "io_wait_ns": int(e["io_wait_ns"]),
        "disk_latency_ns": int(e["disk_latency_ns"]),
        "disk_requests": int(e["disk_requests"]),
        "sector": int(e["sector"]),
        "timestamp_ns": ts,
        "wall_time": f"{sec}.{wall_ns % 10**9 // 1000:06d}Z",
    }


@pytest.mark.parametrize("n", [1, 7, CHUNK, CHUNK + 5, 3 * CHUNK - 1])
def test_json_lines_equal_the_obvious_per_event_json(tmp_path: Path, n: int) -> None:
    ev = random_events(n, seed=n)
    fmt = EventFormatter(proc_root=str(tmp_path))
    text = fmt.json_lines(ev)
    assert text.endswith("\n") and text.count("\n") == n
    lines = text.splitlines()
    assert [json.loads(x) for x in lines] == [reference(fmt, e) for e in ev]
    # The same events twice in a row: the caches change nothing.
    assert fmt.json_lines(ev) == text


def test_json_lines_one_value_per_column_and_unknown_fields(tmp_path: Path) -> None:
    """Constant columns are folded into the template; a record field this module does
    not know appears under its own name."""
    ev_dt, _, _ = dtypes()
    extra = np.dtype([*ev_dt.descr, ("queue_ns", "<u8")])
    ev = np.zeros(3, dtype=extra)
    ev["pid"], ev["comm"], ev["bytes"], ev["queue_ns"] = 5, b"a", 4096, [1, 2, 2]
    lines = [json.loads(x) for x in EventFormatter(str(tmp_path)).json_lines(ev).splitlines()]
    assert [x["queue_ns"] for x in lines] == [1, 2, 2]
    assert all(x["bytes"] == 4096 and x["cached"] is False for x in lines)
    assert list(lines[0])[-3:] == ["queue_ns", "timestamp_ns", "wall_time"]


def test_hash_collision_falls_back_to_exact_identities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every identity hashed alike: the check catches it and each event keeps its own."""
    ev = random_events(50)
    monkeypatch.setattr(io_format, "_M1", np.uint64(0))
    monkeypatch.setattr(io_format, "_M2", np.uint64(0))
    monkeypatch.setattr(io_format, "_M3", np.uint64(0))
    monkeypatch.setattr(io_format, "_M4", np.uint64(0))
    ev["pid"] = 1  # pid << 32 | tid is the only part left
    ev["tid"] = 2
    fmt = EventFormatter(proc_root=str(tmp_path))
    lines = [json.loads(x) for x in fmt.json_lines(ev).splitlines()]
    assert lines == [reference(fmt, e) for e in ev]


def test_string_caches_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io_format, "CACHE_MAX", 10)
    fmt = EventFormatter(proc_root=str(tmp_path))
    for i in range(100):
        fmt.path(i, 3, 1, i)
        fmt.comm(str(i).encode())
    assert max(fmt.cache_sizes().values()) <= 10


def test_text_lines_are_aligned_columns(tmp_path: Path) -> None:
    ev = random_events(3)
    fmt = EventFormatter(proc_root=str(tmp_path))
    lines = fmt.text_lines(ev).splitlines()
    assert len(lines) == 3
    for line, e in zip(lines, ev, strict=True):
        ref = reference(fmt, e)
        cells = line.split()
        assert line[:15] == ref["wall_time"][11:26]
        assert int(cells[-9 if len(cells) == 11 else -8]) in (ref["pid"], ref["tid"])
        assert cells[-1] == ref["file"]
        assert cells[-2] == (str(ref["sector"]) if ref["sector"] >= 0 else "-")
        assert line[16:32].rstrip() == ref["comm"]
        assert f" {ref['latency_ns'] / 1e6:9.3f} " in line
        assert (" C " if ref["cached"] else " D ") in line


def test_summary_names_the_process_start_as_ps_does() -> None:
    """A summary's start_time (from the kernel key's start ticks) agrees with ps."""
    import datetime
    import subprocess

    from meridian.proc import proc_start
    from meridian.tools.io.model import PidSummary

    start = proc_start(os.getpid())
    assert start is not None
    d = PidSummary(os.getpid(), "python", start=start).as_dict(1.0)
    ours = datetime.datetime.fromisoformat(d["start_time"]).timestamp()
    lstart = subprocess.run(
        ["ps", "-o", "lstart=", "-p", str(os.getpid())], capture_output=True, text=True, check=True
    ).stdout.strip()
    theirs = datetime.datetime.strptime(lstart, "%a %b %d %H:%M:%S %Y").timestamp()
    assert abs(ours - theirs) < 2.0  # ps: boot time and start both cut to whole seconds
    assert "start_time" not in PidSummary(1, "x").as_dict(1.0)


def test_summary_tells_losses_from_what_had_no_process_to_charge() -> None:
    """`wb_unattributed` (writeback of pages dirtied before tracing) and `failed` calls are
    explained on lines of their own; only real losses follow `lost:`."""
    out = io.StringIO()
    counters = {"events_lost": 3, "wb_unattributed": 461, "failed": 0, "evicted": 0}
    report([], counters, 1.0, False, out)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "lost: events_lost=3"
    assert lines[-2].startswith("wb_unattributed=461: block writes of pages dirtied before")
    assert not any(x.startswith("failed") for x in lines)
    out = io.StringIO()
    report([], {"wb_unattributed": 5}, 1.0, False, out)
    assert "lost" not in out.getvalue().replace("not a loss", "")
