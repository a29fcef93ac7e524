"""Exporters without a kernel: names, options, Prometheus exposition, and OTLP against
real receivers (gRPC from the official service definitions, and HTTP/protobuf)."""

from __future__ import annotations

import argparse
import io
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

import numpy as np
import pytest
from otlp_receiver import Received, grpc_receiver, http_receiver
from prometheus_client.parser import text_string_to_metric_families

from meridian.errors import ExtraMissing, UsageError
from meridian.export import Family, HistPoint, Point, add_arguments, from_args
from meridian.export.otlp import OtlpMetrics, check_endpoint
from meridian.export.prometheus import PrometheusServer, parse_listen, prom_name


def _source(state: dict[str, int]) -> Callable[[], list[Family]]:
    """Two counters and a histogram whose values the test changes."""

    def source() -> list[Family]:
        slots = np.zeros(8, dtype=np.uint64)
        slots[1], slots[3], slots[7] = 2, state["n"], 1  # [2,4) x2, [8,16) x n, >= 128 x1
        a: dict[str, str | int | bool] = {
            "process.pid": 42,
            "process.executable.name": "dd",
            "disk.io.direction": "read",
        }
        return [
            Family("process.disk.io", "counter", "By", "bytes", [Point(a, state["bytes"])]),
            Family("process.disk.cache.hit_ratio", "gauge", "1", "ratio", [Point(a, 0.25)]),
            Family(
                "process.disk.operation.duration",
                "histogram",
                "s",
                "latency",
                [HistPoint(a, slots, 1e-6, 123e-6, 200e-6, 3e-6)],
            ),
        ]

    return source


@pytest.mark.parametrize(
    ("name", "unit", "kind", "want"),
    [
        ("process.disk.io", "By", "counter", "process_disk_io_bytes"),
        ("process.disk.operations", "{operation}", "counter", "process_disk_operations"),
        ("process.disk.operation.duration", "s", "histogram",
         "process_disk_operation_duration_seconds"),
        ("process.disk.cache.hit_ratio", "1", "gauge", "process_disk_cache_hit_ratio"),
        ("system.cpu.utilization", "1", "gauge", "system_cpu_utilization_ratio"),
        ("process.disk.io_wait", "s", "counter", "process_disk_io_wait_seconds"),
    ],
)  # fmt: skip
def test_prometheus_names_follow_opentelemetry_compatibility(
    name: str, unit: str, kind: str, want: str
) -> None:
    assert prom_name(name, unit, kind) == want


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p, logs=True)
    return p.parse_args(list(argv))


def test_options_are_checked_with_one_line_errors() -> None:
    port = _free_port()
    o = from_args(_args("--prometheus", f":{port}", "--otlp-endpoint", "http://localhost"))
    assert o.prometheus == ("0.0.0.0", port)
    assert o.otlp_endpoint == "http://localhost:4317"
    o = from_args(
        _args(
            *("--otlp-endpoint", "https://127.0.0.1:1234/", "--otlp-protocol", "http/protobuf"),
            *("--otlp-header", "Authorization=Bearer x=y", "--otlp-interval", "2.5"),
        )
    )
    assert o.otlp_endpoint == "https://127.0.0.1:1234"
    assert o.otlp_headers == {"authorization": "Bearer x=y"} and o.otlp_interval == 2.5
    assert check_endpoint("http://127.0.0.1", "http/protobuf") == "http://127.0.0.1:4318"
    assert check_endpoint("https://[::1]:9/otlp/", "http/protobuf") == "https://[::1]:9/otlp"
    for argv, needle in [
        (["--prometheus", "abc"], "[HOST]:PORT"),
        (["--prometheus", ":70000"], "[HOST]:PORT"),
        (["--otlp-endpoint", "ftp://x"], "the scheme must be http or https"),
        (["--otlp-endpoint", "http://127.0.0.1:99999"], "from 1 to 65535"),
        (["--otlp-endpoint", "http://localhost", "--otlp-header", "novalue"], "KEY=VALUE"),
        (["--otlp-endpoint", "http://[::1]", "--otlp-interval", "0"], "--otlp-interval"),
        (["--otlp-endpoint", "http://127.0.0.1", "--otlp-interval", "x"], "--otlp-interval"),
        (["--otlp-logs"], "need --otlp-endpoint"),
    ]:
        with pytest.raises(UsageError, match=None) as e:
            from_args(_args(*argv))
        assert needle in str(e.value) and "\n" not in str(e.value)
    assert parse_listen("[::1]:9") == ("::1", 9)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_endpoint_reads_the_source_on_each_scrape() -> None:
    state = {"n": 3, "bytes": 100}
    calls = []

    def source() -> list[Family]:
        calls.append(1)
        return _source(state)()

    server = PrometheusServer(source, ("127.0.0.1", 0))
    try:
        scrapes = []
        for n, b in ((3, 100), (5, 700)):
            state.update(n=n, bytes=b)
            url = f"http://127.0.0.1:{server.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                scrapes.append(
                    {
                        (s.name, s.labels.get("le", "")): s.value
                        for f in text_string_to_metric_families(r.read().decode())
                        for s in f.samples
                    }
                )
    finally:
        server.close()
    assert len(calls) == 2
    first, second = scrapes
    assert first[("process_disk_io_bytes_total", "")] == 100
    assert second[("process_disk_io_bytes_total", "")] == 700
    assert second[("process_disk_cache_hit_ratio", "")] == 0.25
    h = "process_disk_operation_duration_seconds"
    # le bounds are the log2 slot bounds in seconds, cumulative counts; the last slot
    # (everything >= 128 us) only shows in +Inf.
    assert second[(h + "_bucket", "2e-06")] == 0
    assert second[(h + "_bucket", "4e-06")] == 2
    assert second[(h + "_bucket", "1.6e-05")] == 7
    assert second[(h + "_bucket", "0.000128")] == 7
    assert second[(h + "_bucket", "+Inf")] == 8
    assert second[(h + "_count", "")] == 8
    assert second[(h + "_sum", "")] == pytest.approx(123e-6)


def test_prometheus_port_in_use_is_a_usage_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(UsageError, match=r"cannot listen on 127\.0\.0\.1"):
            PrometheusServer(lambda: [], ("127.0.0.1", s.getsockname()[1]))


def _wait(pred: Callable[[], bool], seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not pred() and time.monotonic() < end:
        time.sleep(0.05)


def _check_export(got: Received, state: dict[str, int]) -> None:
    [(a, dp)] = got.latest_points("process.disk.io")
    assert a == {"process.pid": 42, "process.executable.name": "dd", "disk.io.direction": "read"}
    assert dp.as_int == state["bytes"]
    [(_, h)] = got.latest_points("process.disk.operation.duration")
    assert list(h.bucket_counts) == [0, 2, 0, state["n"], 0, 0, 0, 1]
    assert list(h.explicit_bounds) == pytest.approx([2e-6, 4e-6, 8e-6, 16e-6, 32e-6, 64e-6, 128e-6])
    assert h.count == 3 + state["n"] and h.sum == pytest.approx(123e-6)
    assert h.HasField("max") and h.min == pytest.approx(3e-6)
    assert h.max == pytest.approx(200e-6)
    [(_, g)] = got.latest_points("process.disk.cache.hit_ratio")
    assert g.as_double == 0.25


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_metrics_reach_a_real_receiver_exactly(protocol: str) -> None:
    state = {"n": 3, "bytes": 100}
    recv = grpc_receiver() if protocol == "grpc" else http_receiver()
    with recv as (port, got):
        exp = OtlpMetrics(
            _source(state),
            "test",
            f"http://127.0.0.1:{port}",
            protocol,
            {"x-tenant": "a"},
            interval=0.2,
        )
        try:
            _wait(lambda: bool(got.metrics))
            state.update(n=5, bytes=700)  # the last totals leave on close
        finally:
            exp.close()
        _check_export(got, state)
        assert got.headers[0]["x-tenant"] == "a"
        assert exp.failures == 0


def test_unreachable_otlp_endpoint_says_so_once_and_loses_nothing() -> None:
    port = _free_port()  # nothing listens there yet
    err = io.StringIO()
    state = {"n": 3, "bytes": 100}
    exp = OtlpMetrics(_source(state), "test", f"http://127.0.0.1:{port}", interval=0.2, err=err)
    try:
        _wait(lambda: exp.failures >= 2)
        assert exp.failures >= 2
        state.update(n=9, bytes=12345)  # what happened while the collector was away
        with grpc_receiver(port) as (_, got):
            _wait(lambda: bool(got.metrics), 90)
            exp.close()
            _check_export(got, state)
    finally:
        exp._stop.set()
    lines = err.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert f"127.0.0.1:{port}" in lines[0] and "retrying" in lines[0]


@pytest.mark.parametrize(
    ("module", "argv", "extra"),
    [
        ("prometheus_client", ["--prometheus", ":9435"], "prometheus"),
        ("opentelemetry.proto", ["--otlp-endpoint", "http://127.0.0.1:4317"], "otlp"),
        ("grpc", ["--otlp-endpoint", "http://127.0.0.1:4317"], "otlp"),
    ],
)
def test_missing_extra_is_one_line_with_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, module: str, argv: list[str], extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ExtraMissing) as e:
        from_args(_args(*argv))
    assert f"pip install 'meridian-ebpf[{extra}]'" in str(e.value)
    assert e.value.exit_code == 2


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--prometheus", "abc"], "--prometheus takes [HOST]:PORT"),
        (["--otlp-endpoint", "ftp://x"], "--otlp-endpoint 'ftp://x': the scheme"),
        (["--otlp-endpoint", "http://127.0.0.1", "--otlp-logs", "--no-events"], "--no-events"),
        (["--otlp-interval", "5"], "need --otlp-endpoint"),
    ],
)
def test_io_bad_export_options_are_one_line_exit_2(argv: list[str], needle: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "meridian", "io", *argv], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr


@pytest.mark.parametrize("tool", ["memlat", "runqlat"])
def test_validate_with_export_options_is_one_line_exit_2(tool: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "meridian", tool, "validate", "--prometheus", ":9435"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "validate exports nothing" in r.stderr


def test_le_buckets_are_every_bound_of_the_range_whatever_the_slots() -> None:
    from meridian.export.prometheus import log2_le_buckets
    from meridian.export.series import COUNTS

    slots = np.zeros(10, dtype=np.uint64)
    slots[3], slots[4], slots[7] = 1, 2, 3
    got = log2_le_buckets(HistPoint({}, slots, 1.0, 0.0), COUNTS)
    # every slot bound from 2 to 512 (slot 9 is the overflow: only in +Inf), cumulative
    assert got == [("2.0", 0), ("4.0", 0), ("8.0", 0), ("16.0", 1), ("32.0", 3), ("64.0", 3),
                   ("128.0", 3), ("256.0", 6), ("512.0", 6), ("+Inf", 6)]  # fmt: skip
    slots[:] = 0
    slots[9] = 4  # only the overflow slot: every bound 0, then +Inf
    assert log2_le_buckets(HistPoint({}, slots, 1.0, 0.0), COUNTS) == [
        *((str(float(2**k)), 0) for k in range(1, 10)),
        ("+Inf", 4),
    ]
    empty = HistPoint({}, np.zeros(4, np.uint64), 1.0, 0.0)
    assert log2_le_buckets(empty, COUNTS) == [("2.0", 0), ("4.0", 0), ("8.0", 0), ("+Inf", 0)]


def test_metrics_cap_keeps_the_busiest_and_sums_the_rest_into_other() -> None:
    from meridian.tools.io.metrics import capped, io_series
    from meridian.tools.io.model import OpStats, PidSummary

    def proc(pid: int, comm: str, nbytes: int) -> PidSummary:
        return PidSummary(pid, comm, {("read", True, "syscall"): OpStats(ops=1, bytes=nbytes)})

    pids = {
        1: proc(1, "big", 1000),
        2: proc(2, "dd", 10),
        3: proc(3, "dd", 20),
        4: proc(4, "cat", 5),
        5: proc(5, "ls", 1),
    }
    rows = capped(pids, 3)  # at most 3 groups: the 2 busiest, then the other 3 summed
    assert [(a, ps.total().bytes, ps.total().ops) for a, ps in rows] == [
        ({"process.pid": 1, "process.executable.name": "big"}, 1000, 1),
        ({"process.pid": 3, "process.executable.name": "dd"}, 20, 1),
        ({"process.pid": "other", "process.executable.name": "other"}, 16, 3),
    ]
    assert len(capped(pids, None)) == len(capped(pids, 5)) == len(pids)
    assert len(capped(pids, 1)) == 1
    fams = {f.name: f for f in io_series(pids, {}, 0, max_series=2)}
    points = [p for p in fams["process.disk.io"].points if isinstance(p, Point)]
    assert len(points) == 2
    assert sum(p.value for p in points) == sum(ps.total().bytes for ps in pids.values())
