"""biolat --depth against a loop device (exercise 4): the utilization, checked against
the block layer's own io_ticks and, at depth 1, against the requests' latencies; the
queue's size; the latency by the depth at issue, from fio at iodepth 1 and 32."""

from __future__ import annotations

import mmap
import os
import subprocess
import time
from pathlib import Path

import pytest
from children import reap, wait_until
from conftest import LoopDevice
from strategies import every, run_or_skip

from meridian.export import HistPoint, Point
from meridian.tools.biolat import STRATEGIES, Biolat, Options
from meridian.tools.biolat.metrics import series
from meridian.tools.biolat.model import KIND_LATENCY, Snapshot, depth_rows

pytestmark = pytest.mark.kernel


def io_ticks_ms(loop: LoopDevice) -> int:
    """Milliseconds with a request in flight, as the block layer counts them (the 10th
    field of /sys/block/X/stat: iostat's %util is its rate)."""
    return int((Path("/sys/block") / loop.name / "stat").read_text().split()[9])


def reads_done(loop: LoopDevice) -> int:
    return int((Path("/sys/block") / loop.name / "stat").read_text().split()[0])


def interval(tool: Biolat, loop: LoopDevice, iodepth: int) -> tuple[Snapshot, float]:
    """biolat's snapshot of 1.5 s inside a fio run of 512 KiB O_DIRECT sequential reads
    through libaio, `iodepth` in flight (from its first read on: fio's start-up, slow
    under load or in a guest, is no part of it), and the block layer's utilization
    over the same interval. Sequential, not random: the tracepoint strategy keys a
    request by its device and sector, and random reads over the 128 blocks of the loop
    device put two requests on one sector in flight at once, about 250 a second at
    depth 32 (at each of fio's passes over the device); their completions are then
    `unmatched` and their depth is the other's."""
    before = reads_done(loop)
    fio = subprocess.Popen(
        ["fio", "--name=depth", f"--filename={loop.path}", "--direct=1", "--rw=read",
         "--bs=512k", "--ioengine=libaio", f"--iodepth={iodepth}", "--runtime=5",
         "--time_based", "--output=/dev/null"],
    )  # fmt: skip
    try:
        wait_until(lambda: reads_done(loop) > before, 60, "fio's first read")
        start, ticks = tool.snapshot(), io_ticks_ms(loop)
        time.sleep(1.5)
        snap, ticks_end = tool.snapshot().since(start), io_ticks_ms(loop)
        assert fio.wait(60) == 0
    finally:
        reap(fio)
    return snap, (ticks_end - ticks) / 1000 / snap.seconds


@pytest.mark.parametrize("strategy", every(STRATEGIES))
def test_utilization_and_latency_by_depth_at_iodepth_1_and_32(
    loop_device: LoopDevice, strategy: str
) -> None:
    """At iodepth 32 fio keeps the loop device saturated: utilization near 100 %, within
    2 points of io_ticks' over the same interval. At iodepth 1 the device idles while
    fio reaps one request and submits the next (a loop request is short). io_ticks then
    reads a few points higher: the block layer adds it in whole jiffies at requests'
    starts and ends, an approximation at partial use (the next test checks the busy
    time exactly). Measured here, 512 KiB sequential reads: depth 1 0.62-0.68 against
    io_ticks' 0.70-0.76; depth 32 0.998-1.000 against 0.999-1.002 (random reads, under
    load: depth 1 0.74-0.82 against 0.76-0.86). At depth 32 the requests wait in the
    loop driver behind each other, so those issued deep in the queue take longer than
    those issued alone at depth 1 (avg 2.3-3.1 ms against 63-81 µs)."""
    run_or_skip(STRATEGIES, strategy)
    opts = Options(per_disk=True, disk=loop_device.dev, depth=True, strategy=strategy)
    with loop_device.udev_held_off(), Biolat(opts) as tool:
        shallow, ticks_shallow = interval(tool, loop_device, 1)
        deep, ticks_deep = interval(tool, loop_device, 32)
    one = depth_rows(shallow, opts)[loop_device.dev]
    many = depth_rows(deep, opts)[loop_device.dev]
    print(f"utilization {one['utilization']} at depth 1 (io_ticks {ticks_shallow:.4f}), "
          f"{many['utilization']} at 32 (io_ticks {ticks_deep:.4f})")  # fmt: skip
    assert abs(many["utilization"] - ticks_deep) <= 0.02
    assert many["utilization"] >= 0.95
    assert 0.1 < one["utilization"] <= ticks_shallow + 0.02
    # Every request issued alone, but for some with one more in flight: seen once in a
    # few runs under load with depth 32's maximum still 32 (a few requests: one of
    # fio's reads issued as two requests, or another process's request; not told
    # apart), and after a completion no tracer saw (about one request in 20,000, see
    # test_biolat_kernel.unseen) all the requests that follow, at depth 32 too.
    alone, *more = one["latency_by_depth"]
    assert alone.depths == (1, 1)
    assert [d.depths for d in more] in ([], [(2, 3)]), one["latency_by_depth"]
    assert one["max"] == 1 + len(more)
    # fio's 32, and as above; but a 512 KiB read that the block layer splits is two or
    # more requests in flight, bounded by the smallest request seen (its size slot).
    # (Twice under make test, with random reads, the tracepoint strategy's maximum was
    # 64 for 512 KiB requests: see interval() for the sectors those reads shared.)
    smallest = min(k[3] for k, c in deep.cells.items() if k[2] == KIND_LATENCY and c.count)
    parts = max(1, (512 << 10) >> smallest)
    assert 32 <= many["max"] <= 32 * parts + 1 + len(more), (many, deep.counters)
    deep_rows = [d for d in many["latency_by_depth"] if d.depths[0] >= 16]
    deep_avg = sum(d.sum_ns for d in deep_rows) / sum(d.hist.total for d in deep_rows)
    print(f"depth 1: avg {alone.sum_ns / alone.hist.total:.0f} ns; 16+: {deep_avg:.0f} ns")
    assert deep_avg > 2 * alone.sum_ns / alone.hist.total
    # The queue's size, as sysfs has it for a loop device.
    queue = Path("/sys/block") / loop_device.name / "queue"
    assert many["nr_requests"] == int((queue / "nr_requests").read_text())
    assert many["hw_queue_depth"] == int(
        (Path("/sys/block") / loop_device.name / "mq" / "0" / "nr_tags").read_text()
    )


def test_busy_time_at_depth_1_is_the_sum_of_the_latencies(loop_device: LoopDevice) -> None:
    """One request at a time with pauses between: the disk is busy exactly while each
    request is in flight, from its issue to its completion, which is its latency (no
    -Q). Both are taken from the same clock readings, so the sums are equal to the
    nanosecond; the pauses keep the utilization low (a busy time that also counted the
    pauses, or never ended a period, fails). io_ticks is not compared here: it counts
    whole jiffies, and a 20 us request adds 0 or one 4 ms tick."""
    opts = Options(disk=loop_device.dev, depth=True)
    fd = os.open(loop_device.path, os.O_RDONLY | os.O_DIRECT)
    aligned = mmap.mmap(-1, 4096)  # O_DIRECT wants an aligned buffer: a page is
    try:
        with loop_device.udev_held_off(), Biolat(opts) as tool:
            start = tool.snapshot()
            for i in range(300):
                os.preadv(fd, [aligned], i * 4096)
                time.sleep(0.001)
            snap = tool.snapshot().since(start)
    finally:
        os.close(fd)
        aligned.close()
    info = depth_rows(snap, opts)[loop_device.dev]
    lat = [c for k, c in snap.cells.items() if k[2] == KIND_LATENCY]
    assert sum(c.count for c in lat) == 300 and info["max"] == 1
    assert info["busy_ns"] == sum(c.sum_ns for c in lat)
    assert 0 < info["utilization"] < 0.5
    # ... exported as the semantic conventions' system.disk.io_time, in seconds.
    fams = {f.name: f.points for f in series(snap, opts)}
    (io_time,) = fams["system.disk.io_time"]
    assert isinstance(io_time, Point) and io_time.value == info["busy_ns"] / 1e9
    (at_depth,) = fams["meridian.biolat.operation.duration_by_depth"]
    assert isinstance(at_depth, HistPoint) and at_depth.count == 300
    assert at_depth.attrs["meridian.biolat.depth"] == "1"
