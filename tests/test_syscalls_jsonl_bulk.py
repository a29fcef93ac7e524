"""JSON lines made in bulk from raw records (jsonl_bulk): the text between the
per-event numbers is made once per distinct content and checked against the row's own
line; a batch that cannot be cut that way is written row by row; the table of contents
is bounded. Without a kernel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_syscalls_jsonl_lossless import ARGS, _direct, _loop_records
from test_syscalls_raw import DTYPE, frame, trace

from meridian.json_columns import join_lines, number_texts, numbers
from meridian.output import dumps
from meridian.tools.syscalls import jsonl_bulk
from meridian.tools.syscalls.event import Syscall
from meridian.tools.syscalls.jsonl_bulk import JsonLines, template
from meridian.tools.syscalls.jsonl_spool import convert
from meridian.tools.syscalls.recording_file import Recorder, encode, json_line
from meridian.tools.syscalls.ring_records import ByContent, decode_frames, frames


def _spool(path: Path, recs: list[bytes], offset: int) -> Recorder:
    with Recorder(path, ARGS, raw_dtype=DTYPE, wall_offset_ns=offset) as rec:
        rec.write_raw(b"".join(frame(r) for r in recs), len(recs))
    return rec


@pytest.mark.parametrize("offset", [5, 1_764_000_000_000_000_000])
def test_bulk_lines_are_the_direct_writers(tmp_path: Path, offset: int) -> None:
    recs = _loop_records()
    spool = _spool(tmp_path / "r.rec", recs, offset)
    assert convert(tmp_path / "r.rec", tmp_path / "r.jsonl") == len(recs)
    direct = _direct(tmp_path / "direct.jsonl", recs, spool.created, offset)
    assert (tmp_path / "r.jsonl").read_bytes() == direct


def test_one_content_one_thread_folds_every_constant() -> None:
    """Records equal but for index and time: one text per line around two numbers."""
    fr = frames(b"".join(frame(r) for r in _loop_records()[:6]) * 3)
    rows = decode_frames(fr, DTYPE, 7)
    assert JsonLines().lines(fr, DTYPE, 7) == "".join(json_line(sc) for sc in rows).encode()


def test_a_template_is_checked_against_the_rows_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = decode_frames(frames(frame(trace()[0])), DTYPE, 3)[0]
    pieces = template(sc)
    nums = [str(v) for v in (sc.index, sc.timestamp_ns, sc.pid, sc.tid)]
    assert '{"i":' + "".join(n + p for n, p in zip(nums, pieces, strict=True)) == json_line(sc)
    # a line laid out otherwise (spaces, another order) cannot be cut: no template
    monkeypatch.setattr(jsonl_bulk, "json_line", lambda sc: json.dumps(encode(sc)) + "\n")
    assert template(sc) == ()
    reordered = {"i": sc.index, "t": sc.timestamp_ns, "n": sc.name}
    monkeypatch.setattr(jsonl_bulk, "json_line", lambda sc: dumps(reordered) + "\n")
    assert template(sc) == ()


def test_a_batch_without_templates_is_written_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonl_bulk, "template", lambda sc: ())
    fr = frames(b"".join(frame(r) for r in _loop_records()))
    rows = decode_frames(fr, DTYPE, 5)
    assert JsonLines().lines(fr, DTYPE, 5, 3) == "".join(json_line(sc) for sc in rows[3:]).encode()


def test_contents_are_made_once_and_the_table_is_bounded() -> None:
    made: list[int] = []

    def make(sc: Syscall) -> int:
        made.append(sc.index)
        return sc.index

    fr = frames(b"".join(frame(r) for r in _loop_records()))
    by = ByContent(make, limit=1000)
    first = by.batch(fr, DTYPE)
    assert len(made) == len(first.made) == 10  # trace()'s 6 calls and the 4 others
    assert [first.made[j] for j in first.ids[:6]] == list(range(6))
    by.batch(fr, DTYPE)
    assert len(made) == 10  # remembered across batches
    small = ByContent(make, limit=3)
    small.batch(fr, DTYPE)
    small.batch(fr, DTYPE)  # more than 3 kept: the table starts over
    assert len(made) == 30


def test_number_columns_print_as_python_does() -> None:
    col = np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)
    assert number_texts(col) == [str(v) for v in col.tolist()]
    assert numbers(np.array([7, 7], dtype=np.uint32)) == "7"
    assert join_lines(["a", ["1", "2"], "b\n"], 2) == "a1b\na2b\n"
