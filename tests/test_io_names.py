"""meridian io's name cache without a kernel: records in, the name each event takes,
bounds, and asking the kernel again on a miss."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from meridian.bpf import BpfObject, object_path
from meridian.tools.io.event_format import EventFormatter
from meridian.tools.io.names import HISTORY, NameCache

if not object_path("io").exists():
    pytest.skip("BPF objects not built (make bpf)", allow_module_level=True)


def dtypes() -> tuple[np.dtype[Any], np.dtype[Any]]:
    with BpfObject(object_path("io")) as obj:
        assert obj.btf is not None
        return obj.btf.struct_dtype("fileio_name"), obj.btf.struct_dtype("fileio_event")


def names(*rows: tuple[int, int, int, str, bool]) -> np.ndarray[Any, Any]:
    """Records of (ts_ns, dev, ino, path, deleted)."""
    dt, _ = dtypes()
    recs = np.zeros(len(rows), dtype=dt)
    for r, (ts, dev, ino, path, deleted) in zip(recs, rows, strict=True):
        raw = path.encode()
        r["ts_ns"], r["dev"], r["ino"], r["len"], r["deleted"] = ts, dev, ino, len(raw), deleted
        r["path"] = raw
    return recs


def test_each_event_takes_the_name_sent_before_it_started(tmp_path: Any) -> None:
    """An inode renamed, then unlinked, between its reads: one batch of events formatted
    after all three names came in still names each read as it was when it started."""
    cache = NameCache()
    cache.add(names((100, 7, 42, "/a/old", False), (300, 7, 42, "/a/new", False)))
    cache.add(names((500, 7, 42, "/a/new", True), (100, 7, 43, "/a/other", False)))
    _, ev_dt = dtypes()
    ev = np.zeros(5, dtype=ev_dt)
    ev["dev"], ev["ino"] = 7, [42, 42, 42, 42, 43]
    ev["latency_ns"] = 10
    ev["ts_ns"] = [210, 410, 610, 305, 900]  # starts 200, 400, 600, 295 (before 300)
    fmt = EventFormatter(proc_root=str(tmp_path), names=cache)
    files = [json.loads(x)["file"] for x in fmt.json_lines(ev).splitlines()]
    assert files == ["/a/old", "/a/new", "/a/new (deleted)", "/a/old", "/a/other"]
    assert [json.loads(f) for f in fmt.files(ev)] == files


def test_bounded_and_a_miss_asks_the_kernel_once() -> None:
    asked: list[tuple[int, int]] = []
    cache = NameCache(max_entries=4, forget=lambda d, i: asked.append((d, i)))
    cache.add(names(*((i, 1, i, f"/f{i}", False) for i in range(10))))
    assert len(cache) == 4
    assert cache.get(1, 9) == '"/f9"' and cache.get(1, 0) is None
    assert cache.get(1, 0) is None  # asked once until it is sent again
    assert asked == [(1, 0)]
    cache.add(names((20, 1, 0, "/f0", False)))
    assert cache.get(1, 0) == '"/f0"'
    for i in range(HISTORY + 5):  # renamed many times: a bounded history
        cache.add(names((100 + i, 1, 9, f"/g{i}", False)))
    assert cache.get(1, 9, HISTORY - 1) == json.dumps(f"/g{HISTORY + 4}")


def test_unresolved_name_falls_back_to_dev_inode(tmp_path: Any) -> None:
    cache = NameCache()
    cache.add(names((1, (8 << 20) | 1, 5, "", False)))
    fmt = EventFormatter(proc_root=str(tmp_path), names=cache)
    assert json.loads(fmt.path(1, 3, (8 << 20) | 1, 5)) == "8:1:5"
