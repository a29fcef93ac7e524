"""meridian io without a kernel: event formatting, path resolution, aggregates, input."""

from __future__ import annotations

import datetime
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
from meridian.proc import start_wall_ns
from meridian.tools.io import event_format as io_format
from meridian.tools.io.cli import options_from_args
from meridian.tools.io.event_format import CHUNK, EventFormatter
from meridian.tools.io.model import (
    OpStats,
    PidSummary,
    first_comm,
    interface_name,
    latency_hist,
    op_name,
    summarize,
)
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
    ev = np.zeros(4, dtype=ev_dt)
    ev["pid"], ev["tid"], ev["fd"] = 10, 11, 3
    ev["comm"] = [b'we"ird\\name', b"dd", b"fio", b"fio"]
    ev["op"] = [0, 1, 2, 3]  # enum io_op: bit 0 the direction, bit 1 io_uring
    ev["cached"] = [1, 0, 1, 1]
    ev["bytes"], ev["bytes_requested"], ev["disk_bytes"] = 4096, 8192, [0, 4096, 0, 0]
    ev["latency_ns"], ev["io_wait_ns"], ev["ts_ns"] = 1234, [0, 99, 0, 0], [5, 6, 7, 8]
    ev["dev"], ev["ino"] = (7 << 20) | 3, 42
    fmt = EventFormatter(proc_root=str(tmp_path))  # no /proc entry: dev:inode
    lines = [json.loads(x) for x in fmt.json_lines(ev).splitlines()]
    assert lines[0]["comm"] == 'we"ird\\name' and lines[1]["comm"] == "dd"
    assert [x["op"] for x in lines] == ["read", "write", "read", "write"]
    assert [x["interface"] for x in lines] == ["syscall", "syscall", "io_uring", "io_uring"]
    assert [x["cached"] for x in lines] == [True, False, True, True]
    assert lines[1]["disk_bytes"] == 4096 and lines[1]["io_wait_ns"] == 99
    assert lines[0]["file"] == "7:3:42"
    assert lines[0]["dev"] == "7:3" and lines[0]["ino"] == 42
    assert lines[0]["wall_time"].endswith("Z") and len(lines[0]["wall_time"]) == 27
    assert set(lines[0]) == {
        "pid", "tid", "comm", "op", "interface", "fd", "file", "dev", "ino", "bytes",
        "bytes_requested", "disk_bytes",
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
    assert cat.total("read", True, "syscall").ops == 4
    assert cat.hit_ratio("read") == 0.8
    assert cat.total("read").latency_max_ns == 100
    assert cat.total("read").first_ns == 3
    assert cat.total("read", True, "syscall").hist.total == 4
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
    ev["op"], ev["cached"] = k % 4, rng.integers(0, 2, n)  # 2, 3: through io_uring
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
        "op": "write" if e["op"] & 1 else "read",
        "interface": "io_uring" if e["op"] & 2 else "syscall",
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
        op = ("u" if ref["interface"] == "io_uring" else "") + ref["op"]
        assert f" {op:<6} " in line


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


def test_summary_json_has_every_field_of_each_op() -> None:
    """One process's reads (60 cached at ~1 us, 39 from disk at ~1 us, 1 at ~1 ms) and
    writes (1 cached, 2 from disk) on two CPUs, as the kernel keeps them, to JSON."""
    from meridian.hist import Layout
    from meridian.tools.io.model import NBUCKETS, summarize_processes

    _, key_dt, val_dt = dtypes()
    keys = np.zeros(4, dtype=key_dt)
    keys["pid"], keys["start"] = 100, 7
    keys["op"] = [0, 0, 1, 5]  # 5: past write reads as write
    keys["cached"] = [1, 0, 1, 0]
    vals = np.zeros((4, 2), dtype=val_dt)
    vals["ops"] = [[20, 40], [39, 1], [1, 0], [0, 2]]
    vals["bytes"] = [[2000, 4000], [3900, 100], [1000, 0], [0, 2000]]
    vals["bytes_requested"] = [[4000, 8000], [7800, 200], [1000, 0], [0, 2000]]
    vals["disk_bytes"] = [[0, 0], [4096, 4096], [0, 0], [0, 8192]]
    vals["io_wait_ns"] = [[0, 0], [5000, 7000], [0, 0], [0, 900]]
    vals["latency_sum_ns"] = [[20000, 40000], [39000, 1_000_050], [500, 0], [0, 1000]]
    vals["latency_min_ns"] = [[1030, 1040], [1050, 0], [500, 0], [0, 1]]
    vals["latency_max_ns"] = [[1050, 1060], [1070, 1_048_581], [500, 0], [0, 999]]
    vals["first_ns"] = [[0, 1], [3, 0], [9, 0], [0, 0]]  # the disk writes: no first time
    vals["last_ns"] = [[5, 8], [6, 0], [9, 0], [0, 12]]
    vals["comm"][0, 1] = b"ca\xfft"
    lay = Layout(NBUCKETS)
    vals["buckets"][0, 0, lay.bucket_of(1030)] = 20
    vals["buckets"][0, 1, lay.bucket_of(1030)] = 40
    vals["buckets"][1, 0, lay.bucket_of(1030)] = 39
    vals["buckets"][1, 1, lay.bucket_of(1 << 20)] = 1
    vals["buckets"][2, 0, lay.bucket_of(500)] = 1
    vals["buckets"][3, 1, lay.bucket_of(1)] = 1
    vals["buckets"][3, 1, lay.bucket_of(999)] = 1
    with pytest.raises(ValueError):
        summarize_processes(keys[:3], vals)  # one value per key
    (ps,) = summarize_processes(keys, vals).values()
    assert (ps.pid, ps.start, ps.comm) == (100, 7, "ca\ufffdt")
    rd, wr = ps.total("read"), ps.total("write")
    assert (wr.hist.lo, wr.hist.hi, wr.hist.unit) == (1.0, 999.0, "nsecs")  # a min of 1 ns
    assert (rd.first_ns, wr.first_ns, ps.total("write", False, "syscall").first_ns) == (1, 9, 0)
    d = ps.as_dict(3.0)
    started = datetime.datetime.fromisoformat(d["start_time"]).timestamp()
    assert abs(started - start_wall_ns(7) / 1e9) < 0.01  # 7 ticks after boot
    assert d["read"]["latency"] == rd.hist.to_json()
    assert d["write"]["latency"] == wr.hist.to_json()
    assert {k: v for k, v in d.items() if k not in ("read", "write", "start_time")} == {
        "type": "summary", "pid": 100, "comm": "ca\ufffdt"
    }  # fmt: skip
    assert {k: v for k, v in d["read"].items() if k != "latency"} == {
        "ops": 100,
        "bytes": 10000,
        "bytes_requested": 20000,
        "disk_bytes": 8192,
        "cached_ops": 60,
        "disk_ops": 40,
        "io_wait_ns": 12000,
        "bytes_per_s": 3333.3,
        "latency_avg_ns": 10990,  # 1_099_050 // 100, whole ns
        "latency_p50_ns": 1059,  # rank 50 of 99 in [1024, 1088) narrowed to min 1030
        "latency_p99_ns": 1088,  # rank 99 of 99: that bucket's high
        "latency_max_ns": 1_048_581,
        "cache_hit_ratio": 0.6,
        "first_ns": 1,
        "last_ns": 8,
    }
    assert {k: v for k, v in d["write"].items() if k != "latency"} == {
        "ops": 3,
        "bytes": 3000,
        "bytes_requested": 3000,
        "disk_bytes": 8192,
        "cached_ops": 1,
        "disk_ops": 2,
        "io_wait_ns": 900,
        "bytes_per_s": 1000.0,
        "latency_avg_ns": 500,
        "latency_p50_ns": 504,  # rank 1.5 of 3: the middle of [496, 512)
        "latency_p99_ns": 999,  # rank 2.97 of 3 in [992, 1024) narrowed to max 999
        "latency_max_ns": 999,
        "cache_hit_ratio": 0.333333,
        "first_ns": 9,
        "last_ns": 12,
    }
    assert ps.as_dict(0.5)["write"]["bytes_per_s"] == 6000.0
    assert ps.as_dict(0.0)["write"]["bytes_per_s"] is None
    dd_write = ("write", False, "syscall")
    writer = PidSummary(1, "dd", {dd_write: ps.cells[dd_write]})
    wd = writer.as_dict(1.0)  # no reads: only a write entry, none of it cached
    assert "read" not in wd and wd["write"]["cache_hit_ratio"] == 0.0
    assert writer.hit_ratio("read") is None and writer.hit_ratio("write") == 0.0


def test_op_stats_and_summaries_add_up() -> None:
    a = OpStats(ops=1, bytes_requested=10, latency_sum_ns=100, disk_bytes=4096)
    a.add(OpStats(ops=2, bytes_requested=5, latency_sum_ns=50))
    assert (a.ops, a.bytes_requested, a.latency_sum_ns, a.disk_bytes, a.first_ns) == (
        3, 15, 150, 4096, 0
    )  # fmt: skip
    assert a.hist.unit == "nsecs" and a.hist.total == 0
    a.add(OpStats(ops=1, first_ns=7))
    assert a.first_ns == 7
    x = PidSummary(1, "a", {("read", True, "syscall"): OpStats(ops=2, bytes=20)})
    y = PidSummary(2, "b", {("read", True, "syscall"): OpStats(ops=3, bytes=30)})
    y.cells[("write", False, "syscall")] = OpStats(ops=1, bytes=4096)
    x.merge(y)
    assert {c: (s.ops, s.bytes) for c, s in x.cells.items()} == {
        ("read", True, "syscall"): (5, 50), ("write", False, "syscall"): (1, 4096)
    }  # fmt: skip
    x.cells[("write", False, "syscall")].add(OpStats(ops=1))
    assert y.cells[("write", False, "syscall")].ops == 1  # merged into a cell of its own
    assert op_name(0) == op_name(2) == "read" and op_name(1) == op_name(3) == "write"
    assert interface_name(1) == "syscall" and interface_name(2) == interface_name(3) == "io_uring"
    _, _, val_dt = dtypes()
    nothing = np.zeros(2, dtype=val_dt)
    assert first_comm(nothing) == ""
    h = latency_hist(nothing)
    assert (h.total, h.lo, h.hi, h.unit) == (0, None, None, "nsecs")


def test_doctor_names_what_io_cannot_count_without_its_hooks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel without io_uring's tracepoints (before 5.x's renames, or built without
    CONFIG_IO_URING) or block_io_start (6.1): doctor says what io leaves out, and why."""
    from meridian.tools.io import kernel

    present = {"tp_btf/io_uring_submit_sqe", "tp_btf/io_uring_complete", "tp_btf/block_rq_complete"}
    monkeypatch.setattr(kernel, "hook_exists", lambda section: section in present)
    assert kernel.missing_hooks() == {
        "block requests by submitting process": "block_io_start"
    }  # 6.1: the older submission tracepoint is enough for io_uring
    present -= {"tp_btf/io_uring_submit_sqe"}
    assert kernel.missing_hooks()["io_uring reads and writes"] == (
        "io_uring_submit_req or io_uring_submit_sqe"
    )
