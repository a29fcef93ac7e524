"""Exporters end to end with the real kernel programs: a real Prometheus server
scraping `meridian io`, and real OTLP receivers taking its metrics and logs."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from children import reap, wait_attached
from conftest import LoopDevice
from otlp_receiver import Received, grpc_receiver, http_receiver

from meridian.report_loop import stop_child

pytestmark = pytest.mark.kernel

# The workload: 3 pwrites of 5000 bytes, then 7 preads of 10000 bytes, on a regular file.
READS, READ_SIZE, WRITES, WRITE_SIZE = 7, 10_000, 3, 5_000
CHILD = r"""
import os, sys
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
f = os.open(sys.argv[1], os.O_RDWR)
for i in range(3):
    os.pwrite(f, b"w" * 5000, i * 5000)
for _ in range(7):
    os.pread(f, 10000, 0)
os.close(f)
os.write(1, b"done\n")
sys.stdin.readline()  # exits when the test closes stdin
"""


class Child:
    """The workload in a child that waits for `go()`; its PID exists before tracing."""

    def __init__(self, tmp: Path) -> None:
        path = tmp / "work.bin"
        path.write_bytes(b"\0" * 20_000)
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert self.p.stdout is not None and self.p.stdout.readline() == b"ready\n"
        except BaseException:
            reap(self.p)  # __exit__ will not run
            raise
        self.pid = self.p.pid

    def go(self) -> None:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(b"go\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline() == b"done\n"

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        reap(self.p)


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports free now (all held until all are chosen). Call it
    after any receiver the test starts has bound its own port."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def meridian(*args: str, stderr: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "meridian", *args],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


@contextlib.contextmanager
def launched(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`meridian ARGS`, its stderr a pipe; stopped and the pipe closed at the end."""
    proc = meridian(*args)
    try:
        yield proc
    finally:
        stop(proc)
        if proc.stderr is not None:
            proc.stderr.close()


def stop(proc: subprocess.Popen[str]) -> None:
    stop_child(proc, 60)


def until(pred: Callable[[], bool], seconds: float = 30.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


# ---- Prometheus ----------------------------------------------------------------------


def promql(port: int, query: str) -> dict[str, float]:
    """An instant query: {first label value (or ''): value}."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return {
        next(iter(x["metric"].values()), ""): float(x["value"][1]) for x in body["data"]["result"]
    }


def test_real_prometheus_scrapes_the_workload_bytes(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    assert binary, "Prometheus is not installed: make deps (Debian package prometheus)"
    mport, pport = free_ports(2)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: meridian\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{mport}']}}]\n"
    )
    io = prom = None
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 (closed in finally)
    child = Child(tmp_path)
    try:
        io = meridian(
            *("io", "-v", "--no-events", "-p", str(child.pid)),
            *("--prometheus", f"127.0.0.1:{mport}"),
        )
        wait_attached(io)
        prom = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{pport}",
            ],
            stdout=log,
            stderr=log,
        )

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{pport}/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        assert until(ready), (tmp_path / "prometheus.log").read_text()[-2000:]
        child.go()
        pid = f'process_pid="{child.pid}"'
        want = {"read": READS * READ_SIZE, "write": WRITES * WRITE_SIZE}
        q = f"sum by (disk_io_direction) (process_disk_io_bytes_total{{{pid}}})"
        until(lambda: promql(pport, q) == want)
        assert promql(pport, q) == want
        # The latency histogram counts every operation; its buckets are cumulative.
        q = f"sum by (disk_io_direction) (process_disk_operation_duration_seconds_count{{{pid}}})"
        assert promql(pport, q) == {"read": READS, "write": WRITES}
        q = (
            "sum by (disk_io_direction) "
            f'(process_disk_operation_duration_seconds_bucket{{{pid},le="+Inf"}})'
        )
        assert promql(pport, q) == {"read": READS, "write": WRITES}
        q = f"sum by (disk_io_direction) (process_disk_operations_total{{{pid}}})"
        assert promql(pport, q) == {"read": READS, "write": WRITES}
        assert promql(pport, 'sum(up{job="meridian"})') == {"": 1.0}
    finally:
        for p in (prom, io):
            if p is not None:
                p.kill()
                p.wait()
        if io is not None and io.stderr is not None:
            io.stderr.close()
        log.close()
        reap(child.p)


def test_prometheus_port_in_use_is_one_line_exit_2() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = subprocess.run(
            [
                *(sys.executable, "-m", "meridian", "io", "--no-events", "--duration", "1"),
                *("--prometheus", f"127.0.0.1:{s.getsockname()[1]}"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "cannot listen" in r.stderr


# ---- OTLP ----------------------------------------------------------------------------


def by_direction(got: Received, name: str, pid: int, field: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a, dp in got.latest_points(name):
        if a.get("process.pid") == pid:
            d = a["disk.io.direction"]
            out[d] = out.get(d, 0) + getattr(dp, field)
    return out


def check_metrics(got: Received, pid: int) -> None:
    assert by_direction(got, "process.disk.io", pid, "as_int") == {
        "read": READS * READ_SIZE,
        "write": WRITES * WRITE_SIZE,
    }
    assert by_direction(got, "process.disk.operations", pid, "as_int") == {
        "read": READS,
        "write": WRITES,
    }
    assert by_direction(got, "process.disk.operation.duration", pid, "count") == {
        "read": READS,
        "write": WRITES,
    }
    for a, h in got.latest_points("process.disk.operation.duration"):
        if a.get("process.pid") == pid:
            assert sum(h.bucket_counts) == h.count
            assert len(h.bucket_counts) == len(h.explicit_bounds) + 1
            assert h.sum > 0 and h.max <= h.sum
            assert a["process.executable.name"].startswith("python")
            assert a["meridian.io.cached"] is True


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_receiver_gets_the_workload_metrics_and_logs(tmp_path: Path, protocol: str) -> None:
    recv = grpc_receiver() if protocol == "grpc" else http_receiver()
    with Child(tmp_path) as child, recv as (port, got):
        with launched(
            *("io", "-v", "-p", str(child.pid), "--otlp-logs"),
            *("--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", protocol),
            *("--otlp-interval", "0.5", "--otlp-header", "x-scope=meridian"),
        ) as io:
            wait_attached(io)
            child.go()
            until(lambda: by_direction(got, "process.disk.io", child.pid, "as_int") != {})
            stop(io)
            assert io.stderr is not None
            err = io.stderr.read()
        check_metrics(got, child.pid)
        records = [r for r in got.log_records() if r.attributes]
    assert io.returncode == 0
    assert "OTLP" not in err
    assert all(h.get("x-scope") == "meridian" for h in got.headers)
    logs = []
    for r in records:
        a = {kv.key: kv.value for kv in r.attributes}
        if a["process.pid"].int_value == child.pid:
            logs.append((a["disk.io.direction"].string_value, a["meridian.io.bytes"].int_value))
            assert json.loads(r.body.string_value)["pid"] == child.pid
            assert r.time_unix_nano > 0
    assert sorted(logs) == sorted([("read", READ_SIZE)] * READS + [("write", WRITE_SIZE)] * WRITES)


def test_unreachable_otlp_endpoint_keeps_running_and_loses_nothing(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there until the workload is over
    with (
        Child(tmp_path) as child,
        launched(
            *("io", "--no-events", "-p", str(child.pid)),
            *("--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-interval", "0.5"),
        ) as io,
    ):
        assert io.stderr is not None
        said = io.stderr.readline()  # the first failed export: attached, and said once
        assert f"127.0.0.1:{port}" in said and "retrying" in said
        child.go()
        time.sleep(1.0)  # more failed exports (not a timed assertion)
        assert io.poll() is None
        with grpc_receiver(port) as (_, got):
            until(lambda: by_direction(got, "process.disk.io", child.pid, "as_int") != {}, 90)
            stop(io)
            check_metrics(got, child.pid)
        rest = io.stderr.read()
    assert io.returncode == 0
    assert "Traceback" not in rest, rest
    # the summary at the end: how many exports failed, and that the last totals arrived
    [line] = [x for x in rest.splitlines() if "OTLP" in x]
    assert f"OTLP metric exports to http://127.0.0.1:{port} failed" in line
    assert line.endswith("the last totals arrived"), line


# ---- memlat and runqlat --------------------------------------------------------------


def scrape(port: int) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return [s for f in text_string_to_metric_families(r.read().decode()) for s in f.samples]


def test_memlat_exports_its_histograms_on_prometheus_and_otlp() -> None:
    from meridian.tools.memlat.validate import page_toucher, run_toucher

    pages = (64 << 20) // 4096
    with grpc_receiver() as (port, got), page_toucher(64) as child:
        mport = free_port()  # after the receiver bound its own
        with launched(
            *("memlat", "-v", "-P", "-p", str(child.pid)),
            *("--prometheus", f"127.0.0.1:{mport}"),
            *("--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-interval", "0.5"),
        ) as memlat:
            wait_attached(memlat)
            result = run_toucher(child)  # the child has exited when this returns
            samples = scrape(mport)
            stop(memlat)
    pid = result["pid"]
    assert result["pages"] == pages
    mine = [s for s in samples if s.labels.get("process_pid") == str(pid)]
    faults = {
        s.labels["system_paging_type"]: s.value
        for s in mine
        if s.name == "system_paging_faults_total"
    }
    assert abs(sum(faults.values()) - pages) <= 0.05 * pages, faults
    assert faults["minor"] >= pages  # every touched page faulted (and python's own)
    # The scrape (after the child exited) and the last OTLP export agree to the fault,
    # bucket by bucket: Prometheus' cumulative `le` counts are OTLP's running sums.
    points = {
        a["system.paging.type"]: dp
        for a, dp in got.latest_points("system.paging.fault.duration")
        if a.get("process.pid") == pid
    }
    assert {k: dp.count for k, dp in points.items()} == faults
    for kind, dp in points.items():
        assert dp.explicit_bounds[0] == pytest.approx(2e-6)  # usecs slots: 2**(i+1) us
        cum = {
            s.labels["le"]: s.value
            for s in mine
            if s.name == "system_paging_fault_duration_seconds_bucket"
            and s.labels["system_paging_type"] == kind
        }
        # the same bounds on both, every one of the family's (2 us .. 67.1 s)
        assert list(cum) == [*map(repr, dp.explicit_bounds), "+Inf"]
        assert dp.explicit_bounds[-1] == pytest.approx(2**26 * 1e-6)
        running = 0
        for bound, n in zip(dp.explicit_bounds, dp.bucket_counts, strict=False):
            running += n
            assert cum[repr(bound)] == running
        assert cum["+Inf"] == dp.count == sum(dp.bucket_counts)
        total = [
            s.value
            for s in mine
            if s.name == "system_paging_fault_duration_seconds_sum"
            and s.labels["system_paging_type"] == kind
        ]
        assert total == [pytest.approx(dp.sum)]
        assert 0 < dp.max <= dp.sum
        # The kernel's exact minimum lies in the first non-empty bucket.
        first = next(i for i, n in enumerate(dp.bucket_counts) if n)
        assert 0 < dp.min <= dp.max
        assert (first == 0 or dp.explicit_bounds[first - 1] <= dp.min) and (
            first == len(dp.explicit_bounds) or dp.min < dp.explicit_bounds[first]
        )


def test_runqlat_exports_its_histogram_over_otlp_http() -> None:
    with http_receiver() as (port, got):
        with launched(
            *("runqlat", "-v", "--duration", "3"),
            *("--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol"),
            *("http/protobuf", "--otlp-interval", "0.5"),
        ) as runq:
            wait_attached(runq)
            assert runq.wait(60) == 0
        [(a, dp)] = got.latest_points("system.runqueue.duration")
    assert a == {}
    assert dp.count > 0 and sum(dp.bucket_counts) == dp.count
    # usecs slots, the latency range's bounds: 2**1 .. 2**26 us (2 us .. 67.1 s)
    assert len(dp.explicit_bounds) == len(dp.bucket_counts) - 1 == 26
    [(lost_a, lost)] = got.latest_points("meridian.runqlat.lost")
    assert lost_a == {"reason": "hists_full"} and lost.as_int == 0


def test_biolat_exports_per_disk_metrics_on_prometheus_and_otlp(loop_device: LoopDevice) -> None:
    with grpc_receiver() as (port, got):
        mport = free_port()  # after the receiver bound its own
        with launched(
            *("biolat", "-v", "-d", loop_device.name, "--prometheus", f"127.0.0.1:{mport}"),
            *("--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-interval", "0.5"),
        ) as bio:
            wait_attached(bio)
            dev = loop_device.path
            for args in (
                (f"if={dev}", "of=/dev/null", "bs=4k", "count=100", "iflag=direct"),
                ("if=/dev/zero", f"of={dev}", "bs=64k", "count=16", "oflag=direct"),
            ):
                subprocess.run(["dd", *args, "status=none"], check=True, timeout=60)
            samples = scrape(mport)
            stop(bio)
    want_bytes = {"read": 100 * 4096, "write": 16 * 65536}
    want_ops = {"read": 100, "write": 16}

    def prom(name: str) -> dict[str, float]:
        return {
            s.labels["disk_io_direction"]: s.value
            for s in samples
            if s.name == name
            and s.labels["system_device"] == loop_device.name
            and s.labels.get("le", "+Inf") == "+Inf"
        }

    assert prom("system_disk_io_bytes_total") == want_bytes
    assert prom("system_disk_operations_total") == want_ops
    assert prom("system_disk_operation_duration_seconds_bucket") == want_ops
    otlp = {
        a["disk.io.direction"]: dp.as_int
        for a, dp in got.latest_points("system.disk.io")
        if a["system.device"] == loop_device.name
    }
    assert otlp == want_bytes
    hists = {
        a["disk.io.direction"]: dp
        for a, dp in got.latest_points("system.disk.operation.duration")
        if a["system.device"] == loop_device.name
    }
    assert {k: h.count for k, h in hists.items()} == want_ops
    assert all(sum(h.bucket_counts) == h.count for h in hists.values())
