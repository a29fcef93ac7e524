"""biolat against a loop device and an O_DIRECT workload whose answer is known."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from children import attached, ended, reap
from conftest import LoopDevice
from otlp_receiver import attrs, grpc_receiver
from strategies import every, run_or_skip

from meridian.export import HistPoint, Point
from meridian.hist import Layout
from meridian.proc import dev_major, dev_minor
from meridian.tools.biolat import STRATEGIES, Biolat, Options
from meridian.tools.biolat.metrics import series
from meridian.tools.biolat.model import (
    KIND_DEPTH,
    KIND_LATENCY,
    Snapshot,
    depth_rows,
    device_rows,
    sizes_of,
)
from meridian.tools.biolat.records import slow_records

pytestmark = pytest.mark.kernel
READS, WRITES = 2000, 500


def unseen(
    counted: dict[Any, int], want: dict[Any, int], counters: dict[str, int]
) -> dict[Any, int]:
    """The workload's requests, per key, whose completion the tool did not count.

    On this VM, under `make test`, about one request in 20,000 completes without any
    tracer seeing it. Its issue was seen, and biolat's depth still holds it in flight
    afterwards. bpftrace misses the same completion. No program records a recursion
    miss. The cause in the kernel is not known. So at most one request may be unseen,
    none may be extra, and the tests that track depth check that it is still in flight."""
    short = {k: want[k] - counted.get(k, 0) for k in want}
    assert set(counted) <= set(want) and min(short.values()) >= 0, (counted, want)
    assert sum(short.values()) <= 1, (counted, want, counters)
    assert counters["recursion_misses"] == 0 and counters["unmatched"] == 0, counters
    return short


def dd(*args: str) -> int:
    """Run dd; returns its PID (the PID the kernel saw)."""
    p = subprocess.Popen(["dd", *args, "status=none"])
    assert p.wait(60) == 0
    return p.pid


def known_workload(loop: LoopDevice) -> tuple[int, int]:
    reader = dd(f"if={loop.path}", "of=/dev/null", "bs=4k", f"count={READS}", "iflag=direct")
    writer = dd("if=/dev/zero", f"of={loop.path}", "bs=64k", f"count={WRITES}", "oflag=direct")
    return reader, writer


def interrupt(p: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Ctrl-C for `p`: what it printed until it exited."""
    p.send_signal(signal.SIGINT)
    return p.communicate(timeout=timeout)


def drain(tool: Biolat, want: int, timeout: float = 5.0) -> np.ndarray[Any, Any]:
    got: list[np.ndarray[Any, Any]] = []
    end = time.monotonic() + timeout
    while sum(map(len, got)) < want and time.monotonic() < end:
        got.append(tool.events(0.05))
    return np.concatenate(got) if got else np.empty(0)


def device_stat(loop: LoopDevice) -> tuple[int, int]:
    """Reads and writes completed, as the block layer counts them (/sys/block/X/stat)."""
    fields = (Path("/sys/block") / loop.name / "stat").read_text().split()
    return int(fields[0]), int(fields[4])


@pytest.mark.parametrize("strategy", every(STRATEGIES))
def test_exact_counts_sizes_slow_events_and_depth(loop_device: LoopDevice, strategy: str) -> None:
    run_or_skip(STRATEGIES, strategy)
    opts = Options(per_disk=True, disk=loop_device.dev, slow_ms=0.0, depth=True, strategy=strategy)
    with loop_device.udev_held_off(), Biolat(opts) as tool:
        start, stat0 = tool.snapshot(), device_stat(loop_device)
        reader, writer = known_workload(loop_device)
        events = drain(tool, READS + WRITES)
        snap, stat1 = tool.snapshot().since(start), device_stat(loop_device)
    # The device's own count: the workload's requests, no more (the ground truth).
    assert (stat1[0] - stat0[0], stat1[1] - stat0[1]) == (READS, WRITES)

    rows = {r.op: r for r in device_rows(snap, opts)}
    assert set(rows) == {"read", "write"}
    assert rows["read"].disk == loop_device.name
    short = unseen({op: r.count for op, r in rows.items()}, {"read": READS, "write": WRITES},
                   snap.counters)  # fmt: skip
    reads_n, writes_n = READS - short["read"], WRITES - short["write"]
    assert (rows["read"].count, rows["read"].bytes) == (reads_n, reads_n * 4096)
    assert (rows["write"].count, rows["write"].bytes) == (writes_n, writes_n * 65536)
    assert rows["read"].hist.total == reads_n  # histogram total is the sum of its slots

    # Exercise 2: every read in the 4 KiB size slot, every write in the 64 KiB one.
    sizes = {
        (op, slot): c.count for (_, op, kind, slot), c in snap.cells.items() if kind == KIND_LATENCY
    }
    assert sizes == {(0, 12): reads_n, (1, 16): writes_n}
    # --sizes counts exact sizes: every read 4096 bytes, every write 65536.
    reads, writes = sizes_of(snap, loop_device.dev, 0), sizes_of(snap, loop_device.dev, 1)
    assert (reads.counts, writes.counts) == ({4096: reads_n}, {65536: writes_n})
    assert reads.percentile(0.5) == reads.percentile(0.99) == 4096
    assert writes.percentile(0.5) == writes.percentile(0.99) == 65536
    assert snap.counters["sizes_full"] == 0

    # Exercise 3: threshold 0 streams every request, attributed to the dd that queued it.
    recs = list(slow_records(events))
    assert len(recs) == reads_n + writes_n
    by_op = {op: [r for r in recs if r["op"] == op] for op in ("read", "write")}
    assert {r["pid"] for r in by_op["read"]} == {reader}
    assert {r["pid"] for r in by_op["write"]} == {writer}
    assert {r["comm"] for r in recs} == {"dd"}
    assert {r["bytes"] for r in by_op["write"]} == {65536}
    assert all(r["latency_ns"] > 0 and r["disk"] == loop_device.name for r in recs)
    assert {r["rwbs"][0] for r in by_op["read"]} == {"R"}

    # Exercise 4: each request saw itself in flight; nothing left in flight after but
    # the completion unseen, if any: the requests after it count it too.
    depth = depth_rows(snap, opts)[loop_device.dev]
    missed = sum(short.values())
    assert depth["hist"].total == READS + WRITES  # every issue was seen
    assert depth["inflight"] == missed  # the unseen completion, if any
    # one synchronous dd at a time: each request alone (or with the unseen one)
    assert 1 <= depth["max"] <= 1 + missed
    assert depth["hist"].percentile(0.0) == 1
    assert sum(c.count for k, c in snap.cells.items() if k[2] == KIND_DEPTH) == READS + WRITES
    # ... and exported (Prometheus, OTLP) as they are shown.
    fams = {f.name: f.points for f in series(snap, opts)}
    (hist,) = fams["meridian.biolat.queue.depth"]
    assert isinstance(hist, HistPoint) and hist.attrs == {"system.device": loop_device.name}
    assert (hist.count, hist.sum, hist.max) == (READS + WRITES, depth["sum"], depth["max"])
    assert depth["sum"] <= (READS + WRITES) * (1 + missed)
    assert hist.slots.tolist() == depth["hist"].slots.tolist()
    (now,) = fams["meridian.biolat.inflight"]
    assert isinstance(now, Point) and now.value == depth["inflight"]
    assert snap.counters["events_lost"] == 0
    assert snap.counters["reqs_full"] == 0 and snap.counters["hists_full"] == 0


def test_slow_events_above_a_threshold_equal_the_histograms_count_above_it(
    loop_device: LoopDevice,
) -> None:
    """Exercise 3 at a threshold above 0 (the bucket edge that splits a first run most
    evenly, so requests fall on both sides): every request of a latency bucket above the
    one that holds the threshold is streamed, none of a bucket below it, and at most
    that bucket's count in between; each streamed latency is at least the threshold."""
    with Biolat(Options(disk=loop_device.dev)) as tool:
        start = tool.snapshot()
        known_workload(loop_device)
        first = latency_buckets(tool.snapshot().since(start))
    layout = Layout(len(first))
    threshold_us = max(1, int(layout.lows[even_split(first)]))
    opts = Options(disk=loop_device.dev, slow_ms=threshold_us / 1000)
    with Biolat(opts) as tool:
        start = tool.snapshot()
        known_workload(loop_device)
        snap = tool.snapshot().since(start)
        counts = latency_buckets(snap)
        events = drain(tool, int(counts.sum()), timeout=2.0)
    latencies = [r["latency_ns"] for r in slow_records(events)]
    assert min(latencies) >= threshold_us * 1000
    at = layout.bucket_of(threshold_us)
    streamed = np.zeros(len(counts), np.int64)
    for ns in latencies:
        streamed[layout.bucket_of(ns // 1000)] += 1
    assert streamed[at + 1 :].tolist() == counts[at + 1 :].tolist()  # above: every one
    assert streamed[:at].sum() == 0 and 0 <= streamed[at] <= counts[at]
    assert 0 < len(latencies) < counts.sum()  # the threshold split the requests
    assert snap.counters["events_lost"] == 0


def latency_buckets(snap: Snapshot) -> np.ndarray[Any, Any]:
    """The snapshot's latency buckets (usecs), summed over ops and size classes."""
    cells = [c.buckets for k, c in snap.cells.items() if k[2] == KIND_LATENCY]
    total: np.ndarray[Any, Any] = np.sum(cells, axis=0).astype(np.int64)
    return total


def even_split(counts: np.ndarray[Any, Any]) -> int:
    """The bucket whose lower edge leaves as many requests below it as at or above it.
    (Not the median's bucket: when it is the lowest one filled, nothing falls below.)"""
    below = np.cumsum(counts) - counts
    return int(np.argmin(np.abs(2 * below - counts.sum())))


def test_plain_latency_counts_exactly_with_the_lightest_path(loop_device: LoopDevice) -> None:
    """No -Q, --slow or --depth: one map operation at issue; counts stay exact."""
    opts = Options(disk=loop_device.dev)
    with loop_device.udev_held_off(), Biolat(opts) as tool:
        start = tool.snapshot()
        known_workload(loop_device)
        snap = tool.snapshot().since(start)
    rows = {r.op: (r.count, r.bytes) for r in device_rows(snap, opts)}
    short = unseen({op: n for op, (n, _) in rows.items()}, {"read": READS, "write": WRITES},
                   snap.counters)  # fmt: skip
    reads_n, writes_n = READS - short["read"], WRITES - short["write"]
    assert rows == {"read": (reads_n, reads_n * 4096), "write": (writes_n, writes_n * 65536)}
    assert not any(k[2] == KIND_DEPTH for k in snap.cells)
    assert not {"meridian.biolat.queue.depth", "meridian.biolat.inflight"} & {
        f.name for f in series(snap, opts)
    }
    assert snap.counters["unmatched"] == 0


def test_device_filter_sees_only_its_disk(loop_device: LoopDevice, tmp_path: Any) -> None:
    other = tmp_path / "other.img"
    other.write_bytes(bytes(1 << 20))
    path2 = subprocess.run(
        ["losetup", "--find", "--show", str(other)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        opts = Options(per_disk=True, disk=loop_device.dev)
        with Biolat(opts) as tool:
            start = tool.snapshot()
            dd(f"if={path2}", "of=/dev/null", "bs=4k", "count=50", "iflag=direct")
            dd(f"if={loop_device.path}", "of=/dev/null", "bs=4k", "count=30", "iflag=direct")
            snap = tool.snapshot().since(start)
    finally:
        subprocess.run(["losetup", "-d", path2], check=False)
    rows = device_rows(snap, opts)
    assert [(r.disk, r.op, r.count) for r in rows] == [(loop_device.name, "read", 30)]


def test_cli_json_interval_and_ctrl_c_summary(loop_device: LoopDevice) -> None:
    """The command a person runs: JSON reports, and Ctrl-C prints the last one."""
    with attached("biolat", "-v", "--json", "-D", "-d", loop_device.name) as p:
        dd(f"if={loop_device.path}", "of=/dev/null", "bs=4k", "count=100", "iflag=direct")
        out, _ = ended(p, 20, signal.SIGINT)
    report = json.loads(out.strip().splitlines()[-1])
    [dev] = report["devices"]
    assert (dev["disk"], dev["op"], dev["count"], dev["bytes"]) == (
        loop_device.name,
        "read",
        100,
        409600,
    )
    assert dev["latency"]["count"] == 100
    lat = dev["latency"]
    assert lat["min"] <= lat["p50"] <= lat["p99"] <= lat["max"]
    assert lat["relative_error"] == 0.0625
    sizes = dev["sizes"]
    assert (sizes["p50"], sizes["p99"], sizes["min"], sizes["max"]) == (4096, 4096, 4096, 4096)
    assert sizes["values"] == [{"value": 4096, "count": 100}] and sizes["not_counted"] == 0
    assert report["lost"]["events_lost"] == 0


def test_text_report_has_the_bcc_histogram(loop_device: LoopDevice) -> None:
    args = ("-v", "-D", "-d", loop_device.name, "--sizes", "--depth", "--duration", "4")
    with attached("biolat", *args) as proc:
        dd(f"if={loop_device.path}", "of=/dev/null", "bs=4k", "count=64", "iflag=direct")
        out, _ = ended(proc, 30, None)
    assert "usecs               : count    distribution" in out
    assert "op = read" in out
    assert "      4096 -> 8191       : 64 " in out
    assert "sizes exact: p50 4096 bytes, p99 4096 bytes\n" in out
    numbers = f"{dev_major(loop_device.dev)}:{dev_minor(loop_device.dev)}"
    assert f"disk = {loop_device.name} ({numbers}), op = read" in out
    assert f"disk = {loop_device.name} ({numbers}), queue depth at issue" in out
    row = next(line.split() for line in out.splitlines() if line.startswith(loop_device.name))
    assert row[1:4] == [numbers, "read", "64"]


def test_sizes_of_a_mix_are_counted_exactly(loop_device: LoopDevice) -> None:
    """Two request sizes in one log2 slot's neighbourhood (4 KiB and 12 KiB, slots 12
    and 13): each counted exactly, and the quantiles are those sizes."""
    opts = Options(disk=loop_device.dev, sizes=True)
    with Biolat(opts) as tool:
        start = tool.snapshot()
        dd(f"if={loop_device.path}", "of=/dev/null", "bs=4k", "count=300", "iflag=direct")
        dd(f"if={loop_device.path}", "of=/dev/null", "bs=12k", "count=100", "iflag=direct")
        snap = tool.snapshot().since(start)
    sizes = sizes_of(snap, None, 0)
    short = unseen(sizes.counts, {4096: 300, 12288: 100}, snap.counters)
    small, large = 300 - short[4096], 100 - short[12288]  # 300 and 100 but for an unseen one
    edge = small / (small + large)  # 0.75: the last 4 KiB read
    assert (sizes.percentile(0.5), sizes.percentile(edge), sizes.percentile(edge + 0.01)) == (
        4096,
        4096,
        12288,
    )
    assert sizes.percentile(0.99) == 12288
    assert sizes.slots.tolist()[12:14] == [small, large]  # the log2 text histogram's slots


def test_counts_match_bpftrace_on_the_same_run(loop_device: LoopDevice) -> None:
    """bpftrace counts the same completions on the same workload: the numbers agree."""
    script = (
        'BEGIN { printf("ready\\n"); } '  # BEGIN runs once every probe is attached
        f"tracepoint:block:block_rq_complete /args->dev == {loop_device.dev}/ "
        "{ @n = count(); @sectors = sum(args->nr_sector); }"
    )
    bt = subprocess.Popen(["bpftrace", "-e", script], stdout=subprocess.PIPE, text=True)
    try:
        assert bt.stdout is not None
        while (line := bt.stdout.readline()) and line.strip() != "ready":
            pass
        assert line.strip() == "ready", "bpftrace did not start"
        opts = Options(disk=loop_device.dev)
        with loop_device.udev_held_off(), Biolat(opts) as tool:
            start = tool.snapshot()
            known_workload(loop_device)
            snap = tool.snapshot().since(start)
        out, _ = interrupt(bt, 30)
    finally:
        reap(bt)
    maps = dict(line.split(": ") for line in out.split("\n") if line.startswith("@"))
    rows = device_rows(snap, opts)
    # Exact agreement, request for request. The workload's own count is checked exactly
    # by test_exact_counts_sizes_slow_events_and_depth; with bpftrace attached too, about
    # one run in fifteen here has one completion that both tracers miss while
    # /sys/block/loopN/stat counts it (no recursion miss recorded on any program).
    assert int(maps["@n"]) == sum(r.count for r in rows) >= READS + WRITES - 1
    assert int(maps["@sectors"]) * 512 == sum(r.bytes for r in rows)


def test_a_full_ring_counts_every_lost_record(loop_device: LoopDevice) -> None:
    """A one-page ring that nobody drains: what is not delivered is counted as lost."""
    opts = Options(disk=loop_device.dev, slow_ms=0.0, ring_bytes=4096)
    with loop_device.udev_held_off(), Biolat(opts) as tool:
        start = tool.snapshot()
        known_workload(loop_device)
        delivered = len(drain(tool, READS + WRITES, timeout=1.0))
        snap = tool.snapshot().since(start)
    lost = snap.counters["events_lost"]
    counted = sum(r.count for r in device_rows(snap, opts))
    assert 0 < delivered < READS + WRITES
    # Every completion the aggregates counted was either delivered or counted lost ...
    assert delivered + lost == counted, (delivered, lost, counted, snap.counters)
    # ... and they counted the workload.
    unseen({"all": counted}, {"all": READS + WRITES}, snap.counters)


def test_slow_requests_go_out_as_otlp_log_records(loop_device: LoopDevice) -> None:
    """--otlp-logs: each streamed request is one log record (exercise 3, as io's events
    are), its body the JSON object, its attributes the request's disk, op, process,
    sector, size and latency; the count is the device's own."""
    with grpc_receiver() as (port, got):
        args = ("-v", "-d", loop_device.name, "--slow", "0", "--json")  # dd: 512-byte reads
        otlp = ("--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-logs")
        with attached("biolat", *args, *otlp) as proc:
            stat0 = device_stat(loop_device)
            reader = dd(f"if={loop_device.path}", "of=/dev/null", "count=50", "iflag=direct")
            stat1 = device_stat(loop_device)
            out, _ = ended(proc, 30, signal.SIGINT)
    assert stat1[0] - stat0[0] == 50 and stat1[1] == stat0[1]
    streamed = [json.loads(x) for x in out.splitlines() if '"slow_io"' in x]
    records = got.log_records()
    assert len(records) == len(streamed) == 50
    assert [json.loads(r.body.string_value) for r in records] == streamed
    for r, s in zip(records, streamed, strict=True):
        a = attrs(r.attributes)
        assert a["system.device"] == loop_device.name and a["disk.io.direction"] == "read"
        assert (a["process.pid"], a["process.executable.name"]) == (reader, "dd")
        assert (a["meridian.biolat.sector"], a["meridian.biolat.bytes"]) == (s["sector"], 512)
        assert a["meridian.biolat.latency_ns"] == s["latency_ns"] > 0
        completed = datetime.fromisoformat(s["wall_time"]).timestamp()
        assert abs(r.time_unix_nano / 1e9 - completed) < 0.001  # timed at completion
