"""`meridian syscalls` command line without a kernel: bad input is one line and exit 2,
replay of a recording through the plain, full, JSON and filtered views."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from meridian.cli import main
from meridian.tools.syscalls.event import Syscall
from meridian.tools.syscalls.kernel import MAX_NR, meta_table
from meridian.tools.syscalls.recording_file import Recorder, read_until_damage

T0 = 1_700_000_000_000_000_000


def _rec(path: Path) -> Path:
    base = Syscall(0, "openat", T0, "cat", 7, 7)
    events = [
        dataclasses.replace(
            base, args=("AT_FDCWD", '"/etc/passwd"', "O_RDONLY"), paths=("/etc/passwd",),
            is_start=True,
        ),
        dataclasses.replace(
            base, index=1, timestamp_ns=T0 + 9000, is_end=True, have_result=True, result=3,
            result_text="3",
        ),
        dataclasses.replace(
            base, index=2, timestamp_ns=T0 + 10000, args=("AT_FDCWD", '"/nope"', "O_RDONLY"),
            paths=("/nope",), is_start=True,
        ),
        dataclasses.replace(
            base, index=3, timestamp_ns=T0 + 12000, is_end=True, have_result=True, result=-2,
            result_text="-2 ENOENT",
        ),
    ]  # fmt: skip
    with Recorder(path) as r:
        for e in events:
            r.write(e)
    return path


pytestmark = pytest.mark.usefixtures("utc")  # conftest's: restored after each test


def test_unknown_syscall_is_one_line_with_close_matches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["syscalls", "-e", "openat,opnat"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "meridian syscalls: error: unknown syscall 'opnat'; "
        "did you mean openat, openat2, open, fchownat?\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-p", "abc"], "argument -p/--pid: takes a process ID"),
        (["--duration", "0"], "argument --duration: must be greater than 0"),
    ],
)
def test_bad_flag_values(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused by the flag's type (meridian/flags.py): argparse's one line, exit 2."""
    with pytest.raises(SystemExit) as exc:
        main(["syscalls", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-p", "999999999"], "no process with PID 999999999"),
        (["--filter", "(", "--regex", "-r", "x"], "bad regular expression '('"),
        (["-r", "x", "--", "ls"], "-r replays a recording: it takes no command"),
        (["-r", "x", "-w", "y"], "-r x -w y: converting writes JSON lines: name it .jsonl"),
        (["-q"], "-q records only: it needs -w FILE"),
        (["-e", "read", "--all"], "give either -e SYSCALLS or --all, not both"),
    ],
)
def test_bad_input(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["syscalls", *argv]) == 2
    assert message in capsys.readouterr().err


def test_replay_views(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = str(_rec(tmp_path / "r.jsonl"))
    assert main(["syscalls", "-r", rec]) == 0
    assert capsys.readouterr().out.splitlines() == [
        '22:13:20.000000 cat(7:7) openat(AT_FDCWD, "/etc/passwd", O_RDONLY) = 3 <9us>',
        '22:13:20.000010 cat(7:7) openat(AT_FDCWD, "/nope", O_RDONLY) = -2 ENOENT <2us>',
    ]
    assert main(["syscalls", "-r", rec, "--full", "--errno", "enoent"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        '#2 22:13:20.000010 cat(7:7) openat(AT_FDCWD, "/nope", O_RDONLY) ... [end #3]',
        "#3 22:13:20.000012 cat(7:7) openat() = -2 ENOENT [start #2]",
    ]
    assert main(["syscalls", "-r", rec, "--json", "--path", "passwd"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["index"], row["start_index"], row["end_index"], row["result"]) == (0, 0, 1, 3)
    assert row["duration_us"] == 9.0
    assert main(["syscalls", "-r", rec, "-p", "8"]) == 0
    assert capsys.readouterr().out == ""


def test_replay_of_a_damaged_file_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = _rec(tmp_path / "r.jsonl")
    rec.write_bytes(rec.read_bytes()[:-20])
    assert main(["syscalls", "-r", str(rec)]) == 2
    out, err = capsys.readouterr()
    assert err == (
        f"meridian syscalls: error: {rec}: line 5 is truncated: the recording is damaged\n"
    )
    # What precedes the damage is shown: a whole call, and one whose end was lost.
    assert out.splitlines() == [
        '22:13:20.000000 cat(7:7) openat(AT_FDCWD, "/etc/passwd", O_RDONLY) = 3 <9us>',
        '22:13:20.000010 cat(7:7) openat(AT_FDCWD, "/nope", O_RDONLY) = ?',
    ]
    events, damage = read_until_damage(str(rec))
    assert [e.index for e in events] == [0, 1, 2] and damage is not None
    assert "line 5 is truncated" in str(damage)
    other = tmp_path / "biolat.jsonl"
    other.write_text('{"time": "x", "devices": []}\n')
    assert main(["syscalls", "-r", str(other)]) == 2
    assert "line 1 is not a meridian syscalls header" in capsys.readouterr().err


def test_meta_table_positions() -> None:
    rows = meta_table({"openat", "read", "renameat2", "mmap"})
    assert len(rows) == MAX_NR
    none = {"out_pos": -1, "out_kind": 0}
    assert rows[257] == {"traced": 1, "str_pos": [1, -1], "fd_pos": 0, "need_fd": 0, **none}
    assert rows[0] == {"traced": 1, "str_pos": [-1, -1], "fd_pos": 0, "need_fd": 0, **none}
    assert rows[316]["str_pos"] == [1, 3] and rows[316]["traced"] == 1
    assert rows[9] == {"traced": 1, "str_pos": [-1, -1], "fd_pos": 4, "need_fd": 1, **none}
    assert rows[2]["traced"] == 0  # open: not asked for
    assert rows[511] == {"traced": 0, "str_pos": [-1, -1], "fd_pos": -1, "need_fd": 0, **none}
    # Outputs read at exit: pipe2's fds (enum syscalls_out 1), newfstatat's stat (2).
    assert (rows[293]["out_pos"], rows[293]["out_kind"]) == (0, 1)
    assert (rows[262]["out_pos"], rows[262]["out_kind"]) == (2, 2)
    assert meta_table({"mmap"}, anon_mmap=True)[9]["need_fd"] == 0  # -e mmap, --all


def test_plain_view_memory_is_bounded_and_pairs_across_trims() -> None:
    import io

    from meridian.tools.syscalls.options import Options
    from meridian.tools.syscalls.plain_view import Pipeline

    out = io.StringIO()
    p = Pipeline(Options(max_rows=10), out)
    base = Syscall(0, "read", T0, "a", 1, 1)
    # a long call on tid 1 spans many trims while tid 2 makes 50 short calls
    p.add(dataclasses.replace(base, args=("3",), is_start=True))
    for i in range(50):
        s = dataclasses.replace(base, index=1 + 2 * i, tid=2, name="close", args=("4",))
        s.is_start = True
        e = dataclasses.replace(
            base, index=2 + 2 * i, tid=2, name="close", is_end=True, have_result=True,
            result_text="0",
        )  # fmt: skip
        p.add(s)
        p.add(e)
        p.flush()
        p.trim()
        assert len(p.agg.log) <= 12
    p.add(
        dataclasses.replace(
            base, index=101, is_end=True, have_result=True, result=5, result_text="5",
            timestamp_ns=T0 + 7000,
        )
    )  # fmt: skip
    p.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 51 and p.unmatched_ends == 0
    assert lines[-1] == "22:13:20.000000 a(1:1) read(3) = 5 <7us>"
    assert all(line.endswith("close(4) = 0 <0us>") for line in lines[:-1])
