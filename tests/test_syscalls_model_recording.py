"""Record and replay of `meridian syscalls` without a kernel: a recording (plain or
zstd) replays as it was written, and a damaged one names its line."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from syscall_events import cat_opens, end, start

from meridian.errors import UsageError
from meridian.tools.syscalls.compact import CompactLog
from meridian.tools.syscalls.event import Syscall
from meridian.tools.syscalls.full_log import Aggregator
from meridian.tools.syscalls.recording_file import Recorder, read_events
from meridian.tools.syscalls.render import compact_line

pytestmark = pytest.mark.usefixtures("utc")


def _events() -> list[Syscall]:
    return [
        cat_opens(0, "/etc/passwd", raw=(1, 2)),
        start(1, "nautilus", 900, "stat", ('"/home"', "0x1")),
        end(2, "nautilus", 900, "stat", 0),
        end(3, "cat", 812, "openat", 3),
        end(4, "x", 5, "read", -2, "-2 ENOENT"),
        start(5, "x", 5, "exit_group", ("0",)),
    ]


def _compact_lines(events: list[Syscall]) -> list[str]:
    agg = Aggregator()
    compact = CompactLog(agg.log)
    for e in events:
        agg.add(dataclasses.replace(e))
    return [compact_line(r) for r in compact]


def _record(path: Path) -> bytes:
    """_events() recorded as JSON lines at `path`: the file's bytes."""
    with Recorder(path) as rec:
        for e in _events():
            rec.write(e)
    return path.read_bytes()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_record_then_replay_is_identical(tmp_path: Path, suffix: str) -> None:
    if suffix.endswith(".zst") and shutil.which("zstd") is None:
        pytest.skip("no zstd program")
    path = tmp_path / f"rec{suffix}"
    _record(path)
    back = list(read_events(path))
    assert back == _events()
    assert _compact_lines(back) == _compact_lines(_events())


def test_replay_errors_name_the_line(tmp_path: Path) -> None:
    data = _record(tmp_path / "rec.jsonl")
    damaged = {  # file name: (content, the error)
        "cut.jsonl": (data[: len(data) - 10], r"line 7 is truncated"),
        "foreign.jsonl": (
            b'{"event": "slow_io", "disk": "vda"}\n',
            r"line 1 is not a meridian syscalls header",
        ),
        "bad.jsonl": (data.splitlines()[0] + b'\n{"i": 1}\n', r"line 2 is not a syscall event"),
        "empty.jsonl": (b"", r"line 1: empty file"),
    }
    for name, (content, error) in damaged.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UsageError, match=error):
            list(read_events(tmp_path / name))
    with pytest.raises(UsageError, match="does not exist"):
        list(read_events(tmp_path / "nope"))


def test_cut_off_zstd_recording_says_zstd_failed(tmp_path: Path) -> None:
    if shutil.which("zstd") is None:
        pytest.skip("no zstd program")
    path = tmp_path / "rec.jsonl.zst"
    data = _record(path)
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match=r"zstd could not decompress it"):
        list(read_events(cut))
    whole = list(read_events(path))
    assert len(whole) == len(_events())
    first = next(iter(read_events(path)))  # a reader that stops early is no error
    assert first == _events()[0]


def test_a_path_that_is_not_utf8_is_recorded_and_replayed(tmp_path: Path) -> None:
    """File names are bytes: one that is not UTF-8 decodes with surrogate escapes,
    which orjson refuses to write; the line is written by the standard encoder."""
    odd = os.fsdecode(b"/tmp/caf\xe9")
    events = [cat_opens(0, odd), end(1, "cat", 812, "openat", 3)]
    path = tmp_path / "rec.jsonl"
    with Recorder(path) as rec:
        for e in events:
            rec.write(e)
        rec.write_many(events)
    assert list(read_events(path)) == events + events
