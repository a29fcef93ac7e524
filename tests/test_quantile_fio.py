"""Percentiles against fio's own: 4 KiB O_DIRECT `psync` random reads of a regular file
on a loop-device ext4, traced by meridian io's kernel session while fio measures their
completion latency. The same reads, so the same distribution: meridian's p50 and p99
within 10% of fio's (meridian's buckets are within 6.25%, fio's within 1/64; fio also
times a little of its own user-space work around each pread), its read count exactly
fio's total_ios, and every output's percentile the one function's, inside [min, max]."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from children import reap

from meridian.tools.io.kernel import FileIO
from meridian.tools.io.model import PidSummary, summarize_processes
from meridian.tools.io.options import Options
from meridian.tools.io.report import report

pytestmark = pytest.mark.kernel
IOS = 4000
TOLERANCE = 0.10


def fio_randread(path: Path) -> tuple[int, dict[str, Any]]:
    """fio's PID and its JSON for IOS 4 KiB O_DIRECT psync random reads of `path` (the
    read part). fio runs the job in a process it forks: not this PID."""
    assert shutil.which("fio"), "fio is not installed (make deps installs it)"
    p = subprocess.Popen(
        [
            "fio", "--name=t", f"--filename={path}", "--rw=randread", "--bs=4k",
            "--direct=1", "--ioengine=psync", "--size=16M", f"--number_ios={IOS}",
            "--randrepeat=1", "--output-format=json",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = p.communicate(timeout=120)
    finally:
        reap(p)
    assert p.returncode == 0, err
    read: dict[str, Any] = json.loads(out)["jobs"][0]["read"]
    return p.pid, read


def test_read_percentiles_agree_with_fio(ext4: Path) -> None:
    target = ext4 / "data"
    subprocess.run(
        ["dd", "if=/dev/urandom", f"of={target}", "bs=1M", "count=16", "conv=fsync", "status=none"],
        check=True,
    )
    with FileIO(Options(comms=["fio"], no_events=True)) as tool:
        parent, fio = fio_randread(target)
        keys, vals = tool.stats()
    clat = fio["clat_ns"]
    fio_p50, fio_p99 = clat["percentile"]["50.000000"], clat["percentile"]["99.000000"]

    # fio's job process: the reads fio timed (the parent's own reads, such as its
    # shared libraries, are not among them).
    total = PidSummary(0, "fio")
    jobs = [ps for (pid, _), ps in summarize_processes(keys, vals).items() if pid != parent]
    assert len(jobs) == 1 and jobs[0].comm == "fio"
    total.merge(jobs[0])
    reads = total.total("read", cached=False)  # O_DIRECT: every read went to the disk
    assert reads.ops == fio["total_ios"] == IOS
    assert reads.bytes == fio["io_bytes"] == IOS * 4096

    h = reads.hist
    p50, p99 = h.percentile(0.5), h.percentile(0.99)
    assert abs(p50 - fio_p50) <= TOLERANCE * fio_p50, (p50, fio_p50)
    assert abs(p99 - fio_p99) <= TOLERANCE * fio_p99, (p99, fio_p99)
    # Never below the smallest nor above the largest read seen, which fio bounds too.
    assert h.lo is not None and h.hi == reads.latency_max_ns
    assert h.lo <= p50 <= p99 <= h.hi <= clat["max"]
    # The kernel's bucket of a value is hist.py's (bits.bpf.h hist_bucket): the exact
    # min and max sit in the lowest and highest non-empty buckets.
    nz = np.flatnonzero(h.counts)
    assert h.layout is not None
    assert (h.layout.bucket_of(int(h.lo)), h.layout.bucket_of(int(h.hi))) == (nz[0], nz[-1])

    # Every output gives the same numbers for the same reads (the summary and the text
    # row are of all reads, cached or not): the summary's fields, its histogram object,
    # and the text report's columns (us).
    every = total.total("read").hist
    e50, e99 = every.percentile(0.5), every.percentile(0.99)
    d = total.as_dict(1.0)["read"]
    assert d["latency_p50_ns"] == round(e50) == round(d["latency"]["p50"])
    assert d["latency_p99_ns"] == round(e99) == round(d["latency"]["p99"])
    assert d["latency"]["max"] == d["latency_max_ns"] >= d["latency_p99_ns"]
    assert d["latency"]["min"] <= d["latency_p50_ns"]
    assert d["latency"]["relative_error"] == 0.0625
    out = io.StringIO()
    report([total], {}, 1.0, False, out)
    row = next(line.split() for line in out.getvalue().splitlines() if " read " in f" {line} ")
    assert row[6:8] == [f"{e50 / 1e3:.1f}", f"{e99 / 1e3:.1f}"], row
