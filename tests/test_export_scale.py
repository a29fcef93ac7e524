"""The exporters at scale, without a kernel: OTLP log records encoded by hand (checked
against the generated opentelemetry-proto messages), every record accounted for
against real receivers, and the Prometheus text rendered straight from the families
(checked byte for byte against prometheus_client's own renderer)."""

from __future__ import annotations

import io
import json
import os
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from export_fakes import free_port, wait_for
from io_trace import io_layouts
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1 import logs_pb2
from otlp_receiver import attrs, grpc_receiver, http_receiver
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meridian.export.exposition import render
from meridian.export.logs import OtlpLogs
from meridian.export.prometheus import PrometheusServer, SeriesCollector
from meridian.export.series import Family
from meridian.export.wire import MAX_REQUEST_BYTES, LogEncoder
from meridian.hist import Log2Hist
from meridian.tools.io.event_format import EventFormatter
from meridian.tools.io.logs import IoLogs
from meridian.tools.io.metrics import io_series
from meridian.tools.io.model import OpStats, PidSummary

EVENT, KEY, VALUE = io_layouts()

# ---- OTLP logs --------------------------------------------------------------------------


def test_log_encoder_writes_what_the_generated_messages_read() -> None:
    enc = LogEncoder({"service.name": "meridian", "n": 3}, "meridian.io", "1.2", "meridian.io")
    bodies = [b'{"a":1}', b"x" * 300, "é".encode(), b""]
    ts = np.array([0, 1, 2**40, 2**63 + 5], dtype=np.uint64)
    ints = np.array([0, 127, 128, -1], dtype=np.int64)
    flags = np.array([True, False, True, False])
    paths = ["/a", "/b", "é/c", "/a"]
    recs = enc.records(bodies, ts, 77, [("i", ints), ("b", flags), ("p", paths), ("i", ints)])
    [(body, count)] = enc.requests(recs)
    assert count == len(bodies)
    req = ExportLogsServiceRequest.FromString(body)
    want = ExportLogsServiceRequest()
    rl = want.resource_logs.add()
    for k, v in (("service.name", "meridian"), ("n", 3)):
        kv = rl.resource.attributes.add()
        kv.key = k
        if isinstance(v, int):
            kv.value.int_value = v
        else:
            kv.value.string_value = v
    sl = rl.scope_logs.add()
    sl.scope.name, sl.scope.version = "meridian.io", "1.2"
    for i, text in enumerate(bodies):
        lr = sl.log_records.add()
        lr.time_unix_nano, lr.observed_time_unix_nano = int(ts[i]), 77
        lr.severity_number, lr.severity_text = logs_pb2.SEVERITY_NUMBER_INFO, "INFO"
        lr.body.string_value = text.decode()
        lr.event_name = "meridian.io"
        for key, col in (("i", ints), ("b", flags), ("p", paths), ("i", ints)):
            kv = lr.attributes.add()
            kv.key = key
            v = col[i]
            if isinstance(v, np.bool_):
                kv.value.bool_value = bool(v)
            elif isinstance(v, np.integer):
                kv.value.int_value = int(v)
            else:
                kv.value.string_value = str(v)
    assert req == want
    # an explicit zero and false are set (AnyValue is a oneof), not left empty
    first = req.resource_logs[0].scope_logs[0].log_records[0]
    # records over MAX_REQUEST_BYTES go in several requests, every one once, in order
    many = enc.records([b"y" * 1000] * 3000, np.arange(3000), 1, [("i", np.arange(3000))])
    got = [ExportLogsServiceRequest.FromString(b) for b, _ in enc.requests(many)]
    assert len(got) == 4  # 3000 records of 1,052 bytes (3.0 MiB)
    assert all(len(b) <= MAX_REQUEST_BYTES + 100 for b, _ in enc.requests(many))  # + wrapping
    seen = [lr.time_unix_nano for r in got for lr in r.resource_logs[0].scope_logs[0].log_records]
    assert seen == list(range(3000))
    assert first.attributes[0].value.WhichOneof("value") == "int_value"
    assert first.attributes[1].value.WhichOneof("value") == "bool_value"


def events(n: int, fd: int, ino: int, dev: int) -> np.ndarray:
    """n reads and writes of this process on `fd`, with varied numbers."""
    ev = np.zeros(n, dtype=EVENT)
    i = np.arange(n)
    ev["ts_ns"] = 10**12 + i * 1000
    ev["latency_ns"] = (i * 7919) % 5_000_000
    ev["bytes"] = ev["bytes_requested"] = 4096
    ev["disk_bytes"] = np.where(i % 3 == 0, 4096, 0)
    ev["io_wait_ns"] = np.where(i % 3 == 0, i, 0)
    ev["ino"], ev["dev"], ev["fd"] = ino, dev, fd
    ev["pid"], ev["tid"] = os.getpid(), os.getpid() + i % 4
    ev["op"], ev["cached"] = i % 4, i % 3 != 0  # 2, 3: through io_uring
    ev["comm"] = np.where(i % 5 == 0, b"dd", b"cat")
    return ev


@pytest.fixture
def opened(tmp_path: object) -> Iterator[tuple[int, int, int, str]]:
    """An open file of this process: (fd, ino, dev, path)."""
    path = os.path.join(str(tmp_path), "data.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    st = os.fstat(fd)
    try:
        yield fd, st.st_ino, st.st_dev, path
    finally:
        os.close(fd)


# What each attribute is in the JSON body.
ATTR_OF_FIELD = {
    "process.pid": "pid",
    "thread.id": "tid",
    "meridian.io.fd": "fd",
    "process.executable.name": "comm",
    "disk.io.direction": "op",
    "meridian.io.interface": "interface",
    "file.path": "file",
    "meridian.io.bytes": "bytes",
    "meridian.io.bytes_requested": "bytes_requested",
    "meridian.io.disk_bytes": "disk_bytes",
    "meridian.io.latency_ns": "latency_ns",
    "meridian.io.cached": "cached",
    "meridian.io.io_wait_ns": "io_wait_ns",
    "meridian.io.sector": "sector",
    "meridian.io.timestamp_ns": "timestamp_ns",
}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_every_io_event_arrives_once_with_its_body_and_attributes(
    opened: tuple[int, int, int, str], protocol: str
) -> None:
    n = 10_000  # several requests (1 MiB each) and several emits
    fd, ino, dev, path = opened
    ev = events(n, fd, ino, dev)
    fmt = EventFormatter()
    lines: list[str] = []
    recv = grpc_receiver() if protocol == "grpc" else http_receiver()
    with recv as (port, got):
        err = io.StringIO()
        logs = OtlpLogs("io", f"http://127.0.0.1:{port}", protocol, {"x-t": "1"}, err=err)
        sink = IoLogs(logs, fmt.offset_ns)
        for start in range(0, n, 3000):
            batch = ev[start : start + 3000]
            text = fmt.json_lines(batch)
            lines += text.splitlines()
            sink.emit(batch, text)
        logs.close()
        records = got.log_records()
    assert err.getvalue() == ""
    assert (logs.emitted, logs.sent) == (n, n)
    assert logs.lost() == {"otlp_logs_dropped": 0, "otlp_logs_rejected": 0, "otlp_logs_unsent": 0}
    assert len(records) == n
    assert [r.body.string_value for r in records] == lines
    for r, line in zip(records, lines, strict=True):
        body = json.loads(line)
        a = attrs(r.attributes)
        assert {k: body[f] for k, f in ATTR_OF_FIELD.items()} == a
        assert r.time_unix_nano == body["timestamp_ns"] + fmt.offset_ns
    assert json.loads(lines[0])["file"] == path  # the formatter named the real file


def test_collector_down_counts_every_record_not_delivered(
    opened: tuple[int, int, int, str],
) -> None:
    fd, ino, dev, _ = opened
    fmt = EventFormatter()
    err = io.StringIO()
    logs = OtlpLogs("io", f"http://127.0.0.1:{free_port()}", err=err, max_queue=1000)
    sink = IoLogs(logs, fmt.offset_ns)
    for size in (600, 600, 300, 200):  # queued, dropped (no room), queued, dropped
        batch = events(size, fd, ino, dev)
        sink.emit(batch, fmt.json_lines(batch))
    logs.close(time.monotonic() + 0.5)
    assert (logs.emitted, logs.sent) == (1700, 0)
    assert logs.lost() == {"otlp_logs_dropped": 800, "otlp_logs_rejected": 0,
                           "otlp_logs_unsent": 900}  # fmt: skip
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and "retrying" in lines[0]
    assert logs.summary().startswith("meridian: 1700 of 1700 OTLP log records were not delivered")


def test_collector_that_comes_back_gets_every_record(opened: tuple[int, int, int, str]) -> None:
    fd, ino, dev, _ = opened
    port = free_port()  # nothing listens there yet
    fmt = EventFormatter()
    logs = OtlpLogs("io", f"http://127.0.0.1:{port}", err=io.StringIO())
    sink = IoLogs(logs, fmt.offset_ns)
    batch = events(5000, fd, ino, dev)
    sink.emit(batch, fmt.json_lines(batch))
    try:
        assert wait_for(lambda: logs.failures >= 2, 30)
        with grpc_receiver(port) as (_, got):
            assert wait_for(lambda: len(got.log_records()) == 5000, 90)
            logs.close()
            assert len(got.log_records()) == 5000
    finally:
        logs.close()
    assert (logs.emitted, logs.sent) == (5000, 5000)
    assert not any(logs.lost().values())


# ---- Prometheus -------------------------------------------------------------------------


def processes(n: int) -> dict[int, PidSummary]:
    """n processes, each with reads and writes, cached and not; bytes differ."""
    out = {}
    for i in range(n):
        ps = PidSummary(1000 + i, f"p{i % 37:04d}")
        cells = (("read", True, "syscall"), ("read", False, "syscall"), ("write", True, "syscall"))
        for j, cell in enumerate(cells):
            slots = np.zeros(40, dtype=np.uint64)
            slots[10 + j], slots[12 + i % 5] = i + 1, 3
            ps.cells[cell] = OpStats(
                ops=int(slots.sum()),
                bytes=4096 * (i + 1) + j,
                disk_bytes=0 if cell[1] else 4096,
                io_wait_ns=i * 1000,
                latency_sum_ns=int(slots.sum()) * 5000 + i,
                latency_max_ns=1 << 16,
                first_ns=1,
                last_ns=2 + i,
                hist=Log2Hist(slots, "nsecs"),
            )
        out[ps.pid] = ps
    return out


def client_text(fams: list[Family]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SeriesCollector(lambda: fams))
    return generate_latest(registry).decode()


@pytest.mark.parametrize(("n", "cap"), [(1, None), (30, None), (30, 10)])
def test_rendered_text_is_prometheus_clients_byte_for_byte(n: int, cap: int | None) -> None:
    fams = io_series(processes(n), {"events_lost": 3, "evicted": 0}, 10**18, cap)
    assert render(fams) == client_text(fams)


def test_default_cap_keeps_a_1000_process_scrape_at_the_size_of_100() -> None:
    pids = processes(1000)
    samples, sizes = {}, {}
    for n, cap in ((100, 100), (1000, 100), (1000, None)):
        some = dict(list(pids.items())[:n])
        text = render(io_series(some, {"events_lost": 0}, 0, cap))
        fams = list(text_string_to_metric_families(text))  # it parses
        # every sample, `le` included: each histogram series shows all its family's bounds
        samples[n, cap] = len(
            {(s.name, tuple(sorted(s.labels.items()))) for f in fams for s in f.samples}
        )
        sizes[n, cap] = len(text)
        got = sum(s.value for f in fams if f.name == "process_disk_io_bytes" for s in f.samples)
        assert got == sum(ps.total().bytes for ps in some.values())  # nothing lost by the cap
    # The same samples; the text differs by numbers and label values ("other" against a
    # PID) only.
    assert samples[1000, 100] == samples[100, 100]
    assert sizes[1000, 100] < 1.02 * sizes[100, 100]
    assert samples[1000, None] > 9 * samples[100, 100]


def test_server_serves_the_rendered_text_and_gzip() -> None:
    import gzip

    fams = io_series(processes(20), {}, 0, None)
    server = PrometheusServer(lambda: fams, ("127.0.0.1", 0), fast=True)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            plain = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            zipped = gzip.decompress(r.read()).decode()
    finally:
        server.close()
    assert plain == zipped == client_text(fams)


def map_snapshot(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The aggregate map of n processes (2 CPUs), 3 of whose PIDs were reused (an older
    process with the same PID is still in the map), in no particular order."""
    rng = np.random.default_rng(n)
    rows = [(p, op, c, 7) for p in range(1000, 1000 + n) for op in (0, 1) for c in (0, 1)]
    rows += [(p, 0, 1, 3) for p in (1000, 1001, 1002)]  # the older processes
    keys = np.array(rows, dtype=KEY)[rng.permutation(len(rows))]
    vals = np.zeros((len(keys), 2), VALUE)
    vals["ops"] = rng.integers(0, 1000, vals.shape)
    vals["bytes"] = vals["ops"] * rng.integers(1, 9000, vals.shape)
    vals["latency_sum_ns"], vals["latency_max_ns"] = vals["ops"] * 900, rng.integers(1, 1 << 30)
    vals["first_ns"] = rng.integers(0, 10, vals.shape)  # 0: that CPU saw none
    vals["last_ns"] = rng.integers(10, 99, vals.shape)
    vals["buckets"][:, :, 5 * 16 : 20 * 16] = rng.integers(0, 9, (*vals.shape, 15 * 16))
    vals["comm"] = np.array([f"c{p % 13}".encode() for p in keys["pid"]])[:, None]
    return keys, vals


@pytest.mark.parametrize(("n", "cap"), [(50, 100), (300, 100), (300, 1), (300, None)])
def test_snapshot_groups_are_the_summaries_capped(n: int, cap: int | None) -> None:
    """The scrape's fast path (rank with numpy, sum the rest as one key's CPUs) gives
    exactly what summarizing every process and then capping gives."""
    from meridian.tools.io.metrics import capped, series_of, snapshot_groups
    from meridian.tools.io.model import summarize

    keys, vals = map_snapshot(n)
    want = series_of(capped(summarize(keys, vals), cap), {"events_lost": 1}, 5)
    got = series_of(snapshot_groups(keys, vals, cap), {"events_lost": 1}, 5)
    assert render(got) == render(want)
    assert len(got[0].points) == 2 * min(n, cap or n)
