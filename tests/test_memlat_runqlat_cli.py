"""memlat and runqlat: bad input is one line on stderr and exit 2, before any BPF;
snapshot arithmetic without a kernel."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
from children import help_text, meridian
from test_cli import one_line_exit_2

from meridian.errors import UsageError
from meridian.hist import Layout
from meridian.latency.cli import processes
from meridian.tools.memlat.model import Cell, Options, Snapshot

# Bad input that both tools check the same way (their shared command line); `{tool}`
# stands for the tool's name.
BOTH = [
    (["--duration", "-1"], "argument --duration: must be greater than 0"),
    (["--duration", "soon"], "argument --duration: takes seconds"),
    (["-p", "abc"], "argument -p/--pid: takes a process ID"),
    (["-p", "-5"], "argument -p/--pid: takes a process ID (a whole number greater than 0)"),
    (["-p", "0"], "argument -p/--pid: takes a process ID"),
    (["-p", "1,x"], "argument -p/--pid: takes a process ID"),
    (["-p", "1,"], "argument -p/--pid: takes a process ID"),
    (["-p", "999999999"], "no process with PID 999999999"),
    (["-p", "1,999999999"], "no process with PID 999999999"),
    (["-p", "1", "-p", "999999999"], "no process with PID 999999999"),
    (["0"], "interval must be greater than 0"),
    (["-1"], "interval must be greater than 0"),
    (["1", "1.5"], "count must be a whole number"),
    (["--seconds", "3"], "belong to 'meridian {tool} validate'"),
    (["validate", "--seconds", "-2"], "--seconds must be greater than 0"),
    (["validate", "3"], "validate takes no count"),
    (["--strategy", "magic"], "invalid choice"),
]
ONLY = {
    "memlat": [
        (["-o", "/nonexistent/dir/faults.txt"], "directory /nonexistent/dir does not"),
        (["-o", "/tmp"], "it is a directory"),
        (["--threshold", "x"], "--threshold must be a number"),
    ],
    "runqlat": [(["validate", "--workers", "0"], "--workers must be greater than 0")],
}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([tool, *args], needle.format(tool=tool))
        for tool in ("memlat", "runqlat")
        for args, needle in BOTH + ONLY[tool]
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    one_line_exit_2(meridian(*args), needle)


@pytest.mark.parametrize("tool", ["memlat", "runqlat"])
def test_a_thread_id_is_refused_with_its_process(tool: str) -> None:
    """/proc answers to a thread's ID too; the tools trace processes and say which."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert t.native_id is not None and t.native_id != os.getpid()
        p = meridian(tool, "-p", str(t.native_id), "--duration", "1")
    finally:
        stop.set()
        t.join()
    one_line_exit_2(p, f"-p: {t.native_id} is a thread of process {os.getpid()}")


def test_processes_checks_each_against_proc(tmp_path: Path) -> None:
    for pid, tgid in ((10, 10), (11, 10), (12, 12)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nTgid:\t{tgid}\nPid:\t{pid}\n")
    assert processes([12, 10, 12], str(tmp_path)) == [10, 12]
    assert processes(None, str(tmp_path)) == []
    with pytest.raises(UsageError, match="-p: 11 is a thread of process 10: give -p 10"):
        processes([10, 11], str(tmp_path))
    with pytest.raises(UsageError, match="no process with PID 13"):
        processes([13], str(tmp_path))


@pytest.mark.parametrize("tool", ["memlat", "runqlat"])
def test_help_says_pid_takes_a_list(tool: str) -> None:
    text = help_text(tool)
    assert "-p PID, --pid PID trace these processes only, all their threads" in text
    assert "(repeatable, or PID,PID)" in text


@pytest.mark.parametrize("tool", ["memlat", "runqlat"])
def test_help_ends_with_examples(tool: str) -> None:
    p = meridian(tool, "--help")
    assert p.returncode == 0
    assert "examples:" in p.stdout
    assert p.stdout.rstrip().splitlines()[-1].strip().startswith(f"meridian {tool}")


NBUCKETS = 464  # MEMLAT_BUCKETS


def cell(slots: dict[int, int], sum_ns: int, max_ns: int, tail: int) -> Cell:
    """n values of 2**i usecs for each log2 slot i: n, in the kernel's buckets."""
    layout = Layout(NBUCKETS)
    arr = np.zeros(NBUCKETS, dtype=np.uint64)
    for i, n in slots.items():
        arr[layout.bucket_of(1 << i)] = n
    return Cell(arr, sum_ns, max_ns, tail)


def test_interval_is_a_difference_and_max_is_honest() -> None:
    key = (0, 0, "")
    a = Snapshot(1.0, {key: cell({1: 10, 9: 1}, 5000, 900_000, 1)}, {"matched": 11})
    b = Snapshot(3.0, {key: cell({1: 30, 2: 5, 9: 1}, 9000, 900_000, 1)}, {"matched": 46})
    d = b.since(a)
    assert d.seconds == 2.0
    got = d.cells[key]
    slots = got.hist("usecs", 1000).slots
    assert int(slots[1]) == 20 and int(slots[2]) == 5 and got.count == 25
    assert (got.sum_ns, got.tail) == (4000, 0)
    # The 900 us maximum happened before the interval: the interval's is at most the
    # top of its highest bucket, [4, 5) us, so below 5000 ns.
    assert got.max_ns == 4999
    assert d.counters == {"matched": 35}
    s = d.total("usecs")
    assert s.count == 25
    assert s.as_dict(Options())["p99_ns"] <= got.max_ns


@pytest.mark.parametrize(
    ("have", "memlat_pick", "runqlat_pick"),
    [
        ({"fentry", "kprobe", "tp_btf", "tracepoint", "perf_event"}, "fentry", "tp_btf"),
        ({"kprobe", "tp_btf", "tracepoint", "perf_event"}, "kprobe", "tp_btf"),
        ({"tp_btf", "tracepoint", "perf_event"}, "tp_btf+perf", "tp_btf"),
        ({"tracepoint", "perf_event"}, "tracepoint+perf", "tracepoint"),
    ],
)
def test_strategy_order_best_first(
    monkeypatch: pytest.MonkeyPatch, have: set[str], memlat_pick: str, runqlat_pick: str
) -> None:
    from meridian.bpf import features
    from meridian.tools import memlat, runqlat

    def fake(feature: str) -> features.Probe:
        return features.Probe(feature, feature in have, "fake")

    monkeypatch.setattr(features, "probe", fake)
    assert features.choose(memlat.STRATEGIES).name == memlat_pick
    assert features.choose(runqlat.STRATEGIES).name == runqlat_pick


def test_memlat_without_perf_events_has_no_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    from meridian.bpf import features
    from meridian.errors import NotSupported
    from meridian.tools import memlat

    monkeypatch.setattr(
        features, "probe", lambda f: features.Probe(f, f in {"tracepoint", "tp_btf"}, "fake")
    )
    with pytest.raises(NotSupported):
        features.choose(memlat.STRATEGIES)
