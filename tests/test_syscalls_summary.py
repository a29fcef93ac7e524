"""`meridian syscalls -c` without a kernel: which rows count as calls (strace -c's rules),
the table's order and form, the losses it must show, and the command line."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

from meridian.cli import main
from meridian.tools.syscalls.event import Syscall
from meridian.tools.syscalls.options import Options
from meridian.tools.syscalls.plain_view import Pipeline
from meridian.tools.syscalls.recording_file import Recorder
from meridian.tools.syscalls.summary import CallCounts, counts_json, counts_table, losses

T0 = 1_700_000_000_000_000_000


def call(index: int, name: str, tid: int, took_ns: int, result: int | None) -> list[Syscall]:
    """A start at T0 + index µs and, unless `result` is None, its end `took_ns` later."""
    start = Syscall(index, name, T0 + index * 1000, "t", tid, tid, is_start=True)
    if result is None:
        return [start]
    end = dataclasses.replace(
        start, index=index + 1, timestamp_ns=start.timestamp_ns + took_ns, is_start=False,
        is_end=True, have_result=True, result=result, result_text=str(result),
    )  # fmt: skip
    return [start, end]


def counted(events: list[Syscall], **opts: object) -> tuple[CallCounts, str]:
    """The events through the plain view's pipeline with -c: the counts, what it printed."""
    out = io.StringIO()
    p = Pipeline(Options(summary=True, **opts), out)  # type: ignore[arg-type]
    for sc in events:
        p.add(sc)
        p.flush()
        p.trim()  # with --max-rows: a fresh log holding only the calls still open
    p.finish()
    assert p.counts is not None
    return p.counts, out.getvalue()


def test_a_call_counts_when_its_start_and_end_were_both_seen() -> None:
    orphan_end = call(20, "read", 9, 0, 5)[1]  # its start was before the capture
    events = [
        *call(0, "openat", 1, 4000, 3),
        *call(2, "openat", 1, 6000, -2),  # ENOENT: an error
        *call(4, "read", 1, 1000, -4095),  # the lowest errno is an error too
        *call(6, "read", 1, 1000, -4096),  # an address, not an error
        orphan_end,
        *call(8, "rt_sigreturn", 1, 0, None),  # its end is never seen: counted at start
        *call(9, "write", 2, 0, None),  # in flight at the end: not counted
        *call(10, "exit_group", 1, 0, None),  # never returns: not counted (as strace)
    ]
    counts, printed = counted(events)
    assert printed == ""  # no rows with -c
    got = {n: (c.calls, c.errors, c.time_ns) for n, c in counts.by_name.items()}
    assert got == {"openat": (2, 1, 10_000), "read": (2, 1, 2000), "rt_sigreturn": (1, 0, 0)}


def test_rt_sigreturn_counts_though_its_end_never_comes() -> None:
    """Its start is complete as it is (event.NO_RETURN), so it is counted before a
    fresh log (--max-rows) forgets it, and the next start on its thread replaces it."""
    events = [*call(0, "rt_sigreturn", 1, 0, None)]
    events += [sc for i in range(1, 6) for sc in call(2 * i, "read", 1, 1000, 1)]
    counts, _ = counted(events, max_rows=2)
    assert [(c.name, c.calls) for c in counts.rows()] == [("read", 5), ("rt_sigreturn", 1)]


def test_filters_choose_what_is_counted() -> None:
    events = [*call(0, "openat", 1, 4000, 3), *call(2, "openat", 1, 6000, -2)]
    counts, _ = counted(events, failed=True)
    assert [(c.name, c.calls, c.errors) for c in counts.rows()] == [("openat", 1, 1)]


def fill(counts: CallCounts, name: str, calls: int, errors: int, time_ns: int) -> None:
    for i in range(calls):
        took = time_ns // calls + (time_ns % calls if i == 0 else 0)
        ev = call(0, name, 1, took, -2 if i < errors else 0)
        counts.add(dataclasses.replace(ev[0], have_result=True, result=ev[1].result,
                                       duration_ns=took))  # fmt: skip


def test_table_is_stracess_sorted_by_time_then_syscall_number() -> None:
    counts = CallCounts()
    fill(counts, "openat", 37, 17, 454_000)
    fill(counts, "wait4", 2, 1, 2_943_000)
    fill(counts, "brk", 6, 0, 0)  # nr 12
    fill(counts, "mprotect", 6, 0, 0)  # nr 10: before brk, as strace lists ties
    fill(counts, "execve", 2, 0, 0)  # nr 59
    assert counts_table(counts, losses({"lost": 0}, 0)) == (
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 86.64    0.002943        1471         2         1 wait4\n"
        " 13.36    0.000454          12        37        17 openat\n"
        "  0.00    0.000000           0         6           mprotect\n"
        "  0.00    0.000000           0         6           brk\n"
        "  0.00    0.000000           0         2           execve\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.003397          64        53        18 total\n"
    )


def test_every_loss_is_said_under_the_table_and_in_json() -> None:
    counts = CallCounts()
    fill(counts, "read", 1, 0, 1000)
    lost = losses({"lost": 12, "pids_full": 0, "bad_records": 1}, not_shown=3)
    text = counts_table(counts, lost)
    assert text.splitlines()[-3:] == [
        "incomplete: 12 events lost (ring buffer full): these counts are short",
        "incomplete: 1 bad records: these counts are short",
        "incomplete: 3 events not counted (view too slow; in the recording): these counts "
        "are short",
    ]
    assert counts_json(counts, lost)["lost"] == {
        "ring_buffer_full": 12, "pids_full": 0, "bad_records": 1, "not_shown": 3,
    }  # fmt: skip
    assert "incomplete" not in counts_table(counts, losses({}, 0))

    out = io.StringIO()  # the capture's counters reach the table
    p = Pipeline(Options(summary=True, json=True), out)
    p.print_counts({"lost": 2, "str_failed": 5}, not_shown=0)
    assert json.loads(out.getvalue())["lost"] == {
        "ring_buffer_full": 2, "pids_full": 0, "bad_records": 0, "not_shown": 0,
    }  # fmt: skip


def test_json_is_the_table_as_one_object() -> None:
    counts = CallCounts()
    fill(counts, "openat", 4, 1, 3000)
    fill(counts, "read", 1, 0, 1000)
    assert counts_json(counts, {}) == {
        "syscalls": [
            {"syscall": "openat", "calls": 4, "errors": 1, "time_ns": 3000, "avg_ns": 750,
             "time_percent": 75.0},
            {"syscall": "read", "calls": 1, "errors": 0, "time_ns": 1000, "avg_ns": 1000,
             "time_percent": 25.0},
        ],
        "total": {"syscall": "total", "calls": 5, "errors": 1, "time_ns": 4000, "avg_ns": 800,
                  "time_percent": 100.0},
        "lost": {},
    }  # fmt: skip


def test_replay_counts_a_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "r.jsonl"
    with Recorder(rec) as r:
        for sc in [*call(0, "openat", 1, 9000, 3), *call(2, "openat", 1, 2000, -2)]:
            r.write(sc)
    assert main(["syscalls", "-r", str(rec), "-c", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["total"] == {"syscall": "total", "calls": 2, "errors": 1, "time_ns": 11_000,
                            "avg_ns": 5500, "time_percent": 100.0}  # fmt: skip
    assert main(["syscalls", "-r", str(rec), "-c"]) == 0
    assert "      2         1 openat\n" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "--full"], "-c prints a table of counts, no rows: it takes no --full"),
        (["-c", "-q", "-w", "x.raw"], "-c prints a table of counts, no rows: it takes no -q"),
        (["-c", "--tui"], "-c prints a table of counts, no rows: it takes no --tui"),
        (["-c", "-r", "a.rec", "-w", "b.jsonl"], "-r FILE -w FILE.jsonl converts a recording"),
    ],
)
def test_c_refuses_what_shows_rows(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["syscalls", *args]) == 2
    assert message in capsys.readouterr().err
