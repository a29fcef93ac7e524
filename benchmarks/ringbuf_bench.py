"""Ring buffer reader throughput: records decoded into numpy per second of agent CPU.

1. synthetic: a memfd laid out like a BPF ring buffer, filled with fixed-size records;
   only the reader's drain() is timed (CPU time of this process).
1b. variable-size records (syscalls' 112-128 B, some carrying an fd of 3 where it
   reads as a header): drain_bytes() finding the headers with numpy, against the
   header-by-header walk it falls back to, on the same ring contents.
2. kernel: a tp_btf program emits one 32-byte record per getppid() of a C loop in a
   child process; the reader drains concurrently on a 10 ms timer; records delivered,
   records lost and the reader's CPU seconds are counted.

Run as root from the repository: .venv/bin/python benchmarks/ringbuf_bench.py
"""

from __future__ import annotations

import platform
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bpfbuild import compile_bpf  # noqa: E402
from ringfake import FakeRing  # noqa: E402

from meridian.bpf import BpfObject  # noqa: E402
from meridian.bpf.ringbuf import RingBuffer  # noqa: E402

REC = np.dtype([("seq", "<u8"), ("ts_ns", "<u8"), ("pid", "<u4"), ("tid", "<u4"), ("arg", "<u8")])
LOOP_C = r"""
#include <stdlib.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    char go;
    if (read(0, &go, 1) != 1) return 1;      /* wait until the tracer is attached */
    for (long i = 0; i < n; i++) syscall(SYS_getppid);
    return 0;
}
"""


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def synthetic(batch: int = 100_000, rounds: int = 30) -> dict[str, float]:
    size = 1 << 26
    fake = FakeRing(size)
    reader = RingBuffer(fake.fd, size, REC)
    recs = np.zeros(batch, dtype=REC)
    recs["seq"] = np.arange(batch)
    total, spent = 0, 0.0
    stride = 40  # 8-byte header + 32-byte record
    for _ in range(rounds):
        if (fake.prod % size) + batch * stride > size:  # keep the fast writer from wrapping
            pad = size - fake.prod % size
            fake.prod += pad
            fake.publish()
            reader._advance(fake.prod)
        fake.write_many(recs)
        t0 = cpu()
        out = reader.drain()
        spent += cpu() - t0
        assert len(out) == batch and out["seq"][-1] == batch - 1
        total += batch
    reader.close()
    fake.close()
    return {"records": total, "cpu_s": spent, "rate": total / spent}


def variable(batch: int = 300_000, rounds: int = 5) -> dict[str, float]:
    """CPU seconds per million records to find drain_bytes()' records: the numpy
    chain and the walk (the copy of the data that follows is the same for both)."""
    size = 1 << 26
    fake = FakeRing(size)
    reader = RingBuffer(fake.fd, size, REC)
    lens = 112 + np.arange(batch) % 3 * 8 - (np.arange(batch) % 5 == 0)  # 111..128 B
    frames = bytearray()
    for n in lens.tolist():
        body = struct.pack("<II", 3, 3) * (n // 8) + bytes(n % 8)  # fd 3: page 0's pg_off
        head = struct.pack("<II", n, 0)
        frames += (head + body)[: 8 + n] + bytes(-n % 8)
    spent = {"numpy": 0.0, "walk": 0.0}
    for _ in range(rounds):
        fake.prod = fake.consumer()  # from the ring's start each round: no wrap
        fake.prod -= fake.prod % size
        reader._advance(fake.prod)
        fake.put_fast(fake.prod, bytes(frames))
        at = 0
        for length in lens.tolist():  # each header's pg_off, as the kernel writes it
            struct.pack_into("<I", fake.mem, 2 * fake.page + at + 4, fake.pg_off(at))
            at += 8 + (length + 7) // 8 * 8
        fake.prod += len(frames)
        fake.publish()
        cons = fake.consumer()
        t0 = cpu()
        walked = reader._walk_headers(cons, fake.prod)
        spent["walk"] += cpu() - t0
        t0 = cpu()
        found = reader._chain(cons, fake.prod)
        spent["numpy"] += cpu() - t0
        assert found == walked and walked[1] == batch
        reader._advance(fake.prod)
    reader.close()
    fake.close()
    return {k: v / (batch * rounds) * 1e6 for k, v in spent.items()}


def build_producer(tmp: Path) -> Path:
    obj = compile_bpf(ROOT / "benchmarks" / "ringbuf_producer.bpf.c", tmp / "producer.bpf.o")
    exe = tmp / "getppid_loop"
    src = tmp / "loop.c"
    src.write_text(LOOP_C)
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    return obj


def kernel(n: int, tmp: Path, obj_path: Path) -> dict[str, Any]:
    child = subprocess.Popen([str(tmp / "getppid_loop"), str(n)], stdin=subprocess.PIPE)
    assert child.stdin is not None
    with BpfObject(obj_path) as obj:
        ring_map = obj.maps["events"]
        obj.set_rodata({"target_tgid": child.pid, "wakeup_bytes": ring_map.max_entries // 4})
        obj.load()
        obj.attach()
        assert obj.btf is not None
        reader = RingBuffer.of_map(ring_map, obj.btf.struct_dtype("bench_rec"))
        got, last = 0, -1
        in_order = True
        c0, t0 = cpu(), time.monotonic()
        child.stdin.write(b"g")
        child.stdin.close()
        while True:
            batch = reader.poll(0.01)
            if len(batch):
                in_order &= bool(batch["seq"][0] == last + 1 and (np.diff(batch["seq"]) == 1).all())
                last = int(batch["seq"][-1])
                got += len(batch)
            if child.poll() is not None and reader.pending_bytes() == 0:
                break
        wall, spent = time.monotonic() - t0, cpu() - c0
        lost = int(obj.read_globals()["lost"])
        reader.close()
    return {"records": got, "lost": lost, "wall_s": wall, "cpu_s": spent, "in_order": in_order}


def main() -> int:
    print(f"machine: {platform.node()} {platform.release()} {platform.machine()}")
    s = synthetic()
    print("\n| reader | records | agent CPU s | records/s per agent core | CPU s per million |")
    print("| --- | ---: | ---: | ---: | ---: |")
    per_m = s["cpu_s"] / s["records"] * 1e6
    print(
        f"| synthetic ring, 32 B records | {s['records']:,} | {s['cpu_s']:.3f} | "
        f"{s['rate'] / 1e6:.1f} M | {per_m:.3f} |"
    )
    v = variable()
    print(
        f"| variable-size records, drain_bytes' headers: numpy chain | 1,500,000 | | "
        f"{1 / v['numpy']:.1f} M | {v['numpy']:.3f} |"
    )
    print(
        f"| same records, header-by-header walk (the fallback) | 1,500,000 | | "
        f"{1 / v['walk']:.1f} M | {v['walk']:.3f} (x{v['walk'] / v['numpy']:.1f}) |"
    )
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        obj = build_producer(tmp)
        n = 2_000_000
        k = kernel(n, tmp, obj)
        rate = k["records"] / k["cpu_s"] if k["cpu_s"] else float("inf")
        produced = k["records"] / k["wall_s"] / 1e6
        per_m = k["cpu_s"] / max(k["records"], 1) * 1e6
        print(
            f"| BPF producer, getppid loop ({n:,} calls, {produced:.2f} M/s produced) | "
            f"{k['records']:,} (lost {k['lost']}, in order: {k['in_order']}) | "
            f"{k['cpu_s']:.3f} | {rate / 1e6:.1f} M | {per_m:.3f} |"
        )
        if k["records"] + k["lost"] != n:
            print(f"error: {k['records']} + {k['lost']} lost != {n} produced", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
