"""JSON lines recordings lose nothing (issue 16, item 3). While capturing, `-w
FILE.jsonl` writes the raw records to a spool, as `-w FILE.raw` does, and converts
them when the capture ends. Without a kernel: the converted file is byte for byte what
a direct writer makes of the same events, and a kept spool is finished later by
`-r SPOOL -w FILE.jsonl`. With the kernel: an openat+fstat+close loop at full speed
(the rate at which the old in-capture encoding made the kernel drop, in 2 of 3 rounds)
is recorded whole, three times."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from children import build_c, ended, reap
from test_syscalls_raw import AT_FDCWD, CLOSE, DTYPE, OPENAT, READ, frame, record, trace

from meridian.cli import main
from meridian.errors import MeridianError, UsageError
from meridian.tools.syscalls import jsonl_spool
from meridian.tools.syscalls.jsonl_spool import SpooledJsonRecorder
from meridian.tools.syscalls.recording_file import Recorder
from meridian.tools.syscalls.ring_records import to_syscall

ARGS = ["syscalls", "-w", "r.jsonl"]


def _loop_records() -> list[bytes]:
    """trace() and then the same calls repeated by other threads at other times (records
    equal but for index, time and tid), and a call equal but for its result."""
    recs = trace()
    for n in range(1, 40):
        for r in trace():
            h = np.frombuffer(r[: DTYPE.itemsize], DTYPE).copy()
            h["index"] += 6 * n
            h["ts_ns"] += 1_000_003 * n
            h["tid"] = 7 + n % 3
            recs.append(h.tobytes() + r[DTYPE.itemsize :])
    recs.append(record(240, OPENAT, 0, strs=(b"/etc/shadow",), args=(AT_FDCWD, 0x1000, 0)))
    recs.append(record(241, OPENAT, 1, ret=-13))
    recs.append(record(242, READ, 1, ret=-9, comm=b"other"))
    recs.append(record(243, CLOSE, 0, args=(3,), comm=b"other"))
    return recs


def _direct(path: Path, recs: list[bytes], created: str, offset: int) -> bytes:
    """What a direct JSON lines writer makes: each record decoded on its own."""
    with Recorder(path, ARGS, created=created) as rec:
        for r in recs:
            sc = to_syscall(
                _fields(np.frombuffer(r[: DTYPE.itemsize], DTYPE)[0], r[DTYPE.itemsize :]), offset
            )
            rec.write(sc)
    return path.read_bytes()


def _fields(h: np.void, tail: bytes) -> dict[str, object]:
    l0, l1 = (int(x) for x in h["str_len"])
    lf = int(h["fd_len"])
    out = {name: h[name].tolist() for name in DTYPE.names or ()}
    out["str"] = (tail[:l0], tail[l0 : l0 + l1])
    out["fd_path"] = tail[l0 + l1 : l0 + l1 + lf]
    return out


@pytest.mark.parametrize("chunk", [1 << 20, 333])
def test_converted_json_lines_equal_the_direct_writer(tmp_path: Path, chunk: int) -> None:
    recs = _loop_records()
    buf = b"".join(frame(r) for r in recs)
    rec = SpooledJsonRecorder(tmp_path / "r.jsonl", ARGS, DTYPE, 5)
    for at in range(0, len(buf), chunk):  # drained in pieces that cut records
        rec.write_raw(buf[at : at + chunk], 0)
    rec.close()
    direct = _direct(tmp_path / "direct.jsonl", recs, rec.created, 5)
    assert len(direct.splitlines()) == 1 + len(recs) == 1 + 244
    assert (tmp_path / "r.jsonl").read_bytes() == direct


def test_a_kept_spool_is_finished_by_r_and_w(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An interrupted conversion keeps the spool and names the command; that command
    writes the same bytes an uninterrupted one does, with a progress line."""
    recs = _loop_records()
    buf = b"".join(frame(r) for r in recs)
    rec = SpooledJsonRecorder(tmp_path / "r.jsonl", ARGS, DTYPE, 5)
    rec.write_raw(buf, len(recs))

    def interrupted(self: Recorder, lines: bytes, events: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Recorder, "write_lines", interrupted)
    with pytest.raises(MeridianError) as exc:
        rec.close()
    monkeypatch.undo()
    command = str(exc.value).split("finish with: ")[1]
    assert command == f"meridian syscalls -r {rec.spool} -w {tmp_path / 'r.jsonl'}"
    assert not (tmp_path / "r.jsonl").exists() and rec.spool.exists()
    monkeypatch.setattr(jsonl_spool, "QUIET_S", 0.0)  # a progress line at once
    assert main(command.split()[1:]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"meridian syscalls: writing {tmp_path / 'r.jsonl'}: 244 events",
        f"meridian syscalls: 244 events written to {tmp_path / 'r.jsonl'}",
    ]
    direct = _direct(tmp_path / "direct.jsonl", recs, rec.created, 5)
    assert (tmp_path / "r.jsonl").read_bytes() == direct


def test_a_destination_that_cannot_be_written_is_refused_before_capture(tmp_path: Path) -> None:
    for path in (tmp_path / "no" / "r.jsonl", tmp_path / "no" / "r.rec"):
        with pytest.raises(UsageError) as exc:
            if path.suffix == ".jsonl":
                SpooledJsonRecorder(path, ARGS, DTYPE)
            else:
                Recorder(path, ARGS, raw_dtype=DTYPE)
        assert str(exc.value) == (
            f"-w {path}: cannot write it (No such file or directory): "
            "name a file in a writable directory"
        )
    assert list(tmp_path.iterdir()) == []


# -- the kernel: the full-speed loop ----------------------------------------------------

LOOP = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* argv: FILE N OUT. N times openat+fstat+close of FILE as fast as it goes; OUT gets
 * the pid and how many of each call succeeded (the ground truth). */
int main(int argc, char **argv)
{
	long n = atol(argv[2]), opens = 0, stats = 0, closes = 0;
	struct stat st;
	FILE *out;

	for (long i = 0; i < n; i++) {
		int fd = openat(AT_FDCWD, argv[1], O_RDONLY);

		opens += fd >= 0;
		stats += fstat(fd, &st) == 0;
		closes += close(fd) == 0;
	}
	out = fopen(argv[3], "w");
	if (!out)
		return 1;
	fprintf(out, "%d %ld %ld %ld\n", getpid(), opens, stats, closes);
	return fclose(out) != 0;
}
"""
N = 100_000  # 1.2 s of tracing; with in-capture encoding 2 of 3 rounds lost 48k-154k
ROUNDS = 3
LOOP_CALLS = ("openat", "fstat", "newfstatat", "close")  # fstat(): as libc issues it


def _loop_line(pid: int) -> re.Pattern[bytes]:
    """One JSON line of `pid`'s LOOP_CALLS as Recorder writes it (the keys in this
    order), from the newline before it: name, start or end, and the rest of the line
    (arguments, fd path, result). The newline and the literals up front let the regex
    engine skip to the next line at C speed (a multi-line ^ tries every byte)."""
    calls = "|".join(LOOP_CALLS).encode()
    return re.compile(
        rb'\n\{"i":\d+,"n":"(' + calls + rb')","t":\d+,"c":"[^"]*","p":' + b"%d" % pid
        + rb',"k":\d+,"s":(true|false)([^\n]*)'
    )  # fmt: skip


def _indices(data: bytes) -> list[int]:
    """The index of every event line (the first line is the header)."""
    return [int(i) for i in re.findall(rb'\n\{"i":(\d+),', data)]


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory.mktemp("loop").resolve(), "loop", LOOP, "-O2")


def _loop_calls(data: bytes, pid: int, target: str) -> Counter[tuple[str, bool]]:
    """Starts and ends of the loop's calls on `target` by `pid`: a start counts when it
    names the file (the path, or the fd's path), an end when its start counted (one
    thread: an end follows its start). The loader's own openat/fstat/close do not."""
    got: Counter[tuple[str, bool]] = Counter()
    quoted = f'"{target}"'.encode()
    counted = False
    for name, s, rest in _loop_line(pid).findall(data):
        start = s == b"true"
        if start:
            counted = quoted in rest
        if counted:
            got[name.decode(), start] += 1
    return got


@pytest.mark.kernel
def test_full_speed_loop_recorded_as_json_lines_loses_nothing(loop: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("x")
    for n in range(ROUNDS):
        rec, truth = tmp_path / f"rec{n}.jsonl", tmp_path / f"truth{n}"
        run = subprocess.run(
            [sys.executable, "-m", "meridian", "syscalls", "-w", str(rec), "--no-tui",
             "--", str(loop), str(target), str(N), str(truth)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        pid, opens, stats, closes = (int(x) for x in truth.read_text().split())
        assert opens == stats == closes == N  # the program did what it was asked
        summary = run.stderr.splitlines()[-1]
        lost = re.search(r", (\d+) lost \(ring buffer full\)", summary)
        recorded = re.search(r"^meridian syscalls: (\d+) events recorded", summary)
        assert lost is not None and recorded is not None, summary
        assert int(lost[1]) == 0, summary
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(rec.name)) == [
            rec.name
        ]  # the spool is gone
        data = rec.read_bytes()
        indices = _indices(data)
        assert len(indices) == int(recorded[1]) == data.count(b"\n") - 1
        assert indices == list(range(indices[0], indices[0] + len(indices)))  # no gap
        got = _loop_calls(data, pid, str(target))
        stat = "newfstatat" if got["newfstatat", True] else "fstat"
        assert got == {
            ("openat", True): N, ("openat", False): N,
            (stat, True): N, (stat, False): N,
            ("close", True): N, ("close", False): N,
        }, (n, summary)  # fmt: skip


@pytest.mark.kernel
def test_sigterm_ends_a_json_lines_capture_with_every_event(loop: Path, tmp_path: Path) -> None:
    """SIGTERM (as Ctrl-C) while the loop runs at full speed: the capture ends, nothing
    is traced or lost after it, and every event drained is in the JSON lines."""
    target = tmp_path / "target"
    target.write_text("x")
    rec = tmp_path / "rec.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-m", "meridian", "syscalls", "-w", str(rec), "--no-tui",
         "--", str(loop), str(target), str(10**9), str(tmp_path / "truth")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not any(p.stat().st_size > 32 << 20 for p in tmp_path.glob("rec.jsonl.*.part.rec")):
            assert child.poll() is None and time.monotonic() < deadline, "no spool grew"
            time.sleep(0.05)
        _, err = ended(child, 120)
    finally:
        reap(child)
    summary = err.splitlines()[-1]
    lost = re.search(r", (\d+) lost \(ring buffer full\)", summary)
    recorded = re.search(r"^meridian syscalls: (\d+) events recorded", summary)
    assert lost is not None and recorded is not None, summary
    assert int(lost[1]) == 0, summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec.jsonl", "target"]
    data = rec.read_bytes()
    indices = _indices(data)
    # 32 MB of raw records at least: over 100,000 (their size goes with the paths in them)
    assert len(indices) == int(recorded[1]) > 100_000
    assert indices == list(range(indices[0], indices[0] + len(indices)))
    pid = int(re.findall(rb'"c":"loop","p":(\d+),', data[-4096:])[-1])
    got = _loop_calls(data, pid, str(target))
    stat = "newfstatat" if got["newfstatat", True] else "fstat"
    opens = got["openat", True]
    # Ended anywhere in the loop: each call started as often as the one before it, or
    # once less, and ended as often as it started, or once less (the last one cut).
    assert opens - 1 <= got[stat, True] <= opens and opens - 1 <= got["close", True] <= opens
    for name in ("openat", stat, "close"):
        assert got[name, True] - 1 <= got[name, False] <= got[name, True]
    assert (tmp_path / "truth").exists() is False  # killed in the loop, as asked
