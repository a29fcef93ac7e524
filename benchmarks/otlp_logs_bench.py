"""OTLP logs: records per second per core, the SDK's path against the direct encoder,
on the same events in one run, into a local gRPC receiver in another process.

The events: N `meridian io` records (a mix of reads and writes, several processes,
files, varied latencies), formatted once into their JSON lines (both paths take the
lines; formatting is the event stream's cost, not the exporter's). Per round and path:
CPU time of this process (all its threads: encoding, queueing, gRPC) from the first
record handed over until the last was acknowledged, and the records the receiver
counted (it must be N). Rounds alternate the paths.

  sdk     what meridian did before: per line json.loads, an SDK `LogRecord`, the SDK's
          `BatchLogRecordProcessor` and `OTLPLogExporter` (gRPC), queue sized to N so
          that it drops nothing
  direct  `IoLogs` + `OtlpLogs`: columns encoded into protobuf batches, sent from a
          bounded queue by one thread (gRPC)

Run from the repository: .venv/bin/python benchmarks/otlp_logs_bench.py [N] [ROUNDS]
(default 200000 events, 3 rounds). The SDK baseline needs the `bench` extra.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from io_trace import io_layouts  # noqa: E402

EVENT = io_layouts()[0]

RECEIVER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from otlp_receiver import grpc_receiver
with grpc_receiver() as (port, got):
    print(port, flush=True)
    for line in sys.stdin:  # "count": records so far
        n = sum(len(sl.log_records) for r in list(got.logs) for rl in r.resource_logs
                for sl in rl.scope_logs)
        print(n, flush=True)
"""


def events(n: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(1)
    ev = np.zeros(n, dtype=EVENT)
    i = np.arange(n)
    ev["ts_ns"] = 10**12 + i * 5000
    ev["latency_ns"] = rng.integers(300, 5_000_000, n)
    ev["bytes"] = ev["bytes_requested"] = rng.choice([512, 4096, 65536], n)
    ev["disk_bytes"] = np.where(i % 4 == 0, ev["bytes"], 0)
    ev["io_wait_ns"] = np.where(i % 4 == 0, rng.integers(1000, 100000, n), 0)
    ev["pid"] = 4000 + i % 16
    ev["tid"] = ev["pid"] + i % 3
    ev["fd"], ev["dev"] = 3 + i % 4, (254 << 20) | 1
    ev["ino"] = 1000 + i % 64  # 64 files; named MAJOR:MINOR:INODE (no such process)
    ev["op"], ev["cached"] = i % 2, i % 4 != 0
    ev["comm"] = np.array([b"postgres", b"dd", b"cp", b"tar"])[i % 4]
    return ev


class Receiver:
    """The receiver process: `count()` asks how many records it has."""

    def __init__(self) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", RECEIVER, str(HERE.parent / "tests")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.p.stdout is not None
        self.port = int(self.p.stdout.readline())

    def count(self) -> int:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write("count\n")
        self.p.stdin.flush()
        return int(self.p.stdout.readline())

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait(30)


def sdk_path(url: str, chunks: list[tuple[np.ndarray[Any, Any], str]], n: int) -> None:
    """The SDK path as meridian had it (export/otlp.py's OtlpLogs before the change)."""
    from opentelemetry._logs import LogRecord, SeverityNumber
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.resources import Resource

    from meridian.tools.io.logs import IDENTITY_ATTRS, NUMBER_ATTRS

    names = {k: v for k, v in IDENTITY_ATTRS + NUMBER_ATTRS}
    names["timestamp_ns"] = names.pop("ts_ns")
    provider = LoggerProvider(resource=Resource.create({"service.name": "meridian"}))
    exporter = OTLPLogExporter(url.removeprefix("http://"), insecure=True, timeout=30)
    provider.add_log_record_processor(
        BatchLogRecordProcessor(
            exporter, schedule_delay_millis=1000, max_export_batch_size=2048, max_queue_size=n
        )
    )
    logger = provider.get_logger("meridian.io", "bench")
    offset = time.time_ns() - time.monotonic_ns()
    for _, text in chunks:
        now = time.time_ns()
        for line in text.splitlines():
            ev = json.loads(line)
            logger.emit(
                LogRecord(
                    timestamp=ev["timestamp_ns"] + offset,
                    observed_timestamp=now,
                    severity_number=SeverityNumber.INFO,
                    severity_text="INFO",
                    body=line,
                    attributes={names[k]: v for k, v in ev.items() if k in names},
                    event_name="meridian.io",
                )
            )
    provider.force_flush(120_000)
    provider.shutdown()


def direct_path(url: str, chunks: list[tuple[np.ndarray[Any, Any], str]], n: int) -> None:
    from meridian.export.logs import OtlpLogs
    from meridian.tools.io.logs import IoLogs

    logs = OtlpLogs("io", url, "grpc")
    sink = IoLogs(logs, time.time_ns() - time.monotonic_ns())
    for recs, text in chunks:
        sink.emit(recs, text)
    logs.close(time.monotonic() + 120)
    assert logs.sent == n, logs.lost()


def main(n: int, rounds: int) -> None:
    from meridian.tools.io.event_format import CHUNK, EventFormatter

    ev = events(n)
    fmt = EventFormatter(proc_root="/nonexistent")
    chunks = [(ev[i : i + CHUNK], fmt.json_lines(ev[i : i + CHUNK])) for i in range(0, n, CHUNK)]
    paths = {"sdk": sdk_path, "direct": direct_path}
    rates: dict[str, list[float]] = {name: [] for name in paths}
    recv = Receiver()
    try:
        for _ in range(rounds):
            for name, path in paths.items():
                before = recv.count()
                t0 = time.process_time()
                w0 = time.monotonic()
                path(f"http://127.0.0.1:{recv.port}", chunks, n)
                cpu, wall = time.process_time() - t0, time.monotonic() - w0
                got = recv.count() - before
                assert got == n, f"{name}: the receiver counted {got} of {n}"
                rates[name].append(n / cpu)
                print(f"{name}: {n / cpu:,.0f} records/s per core (cpu {cpu:.2f} s, wall "
                      f"{wall:.2f} s), {got} received", flush=True)  # fmt: skip
    finally:
        recv.close()
    print(
        f"\nmachine: {platform.node()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs; {n:,} events, {rounds} rounds, gRPC to a receiver process"
    )
    base = statistics.median(rates["sdk"])
    print("\n| path | median records/s per core | ratio to the SDK (median of rounds) |")
    print("| --- | ---: | ---: |")
    for name, values in rates.items():
        ratios = [v / b for v, b in zip(values, rates["sdk"], strict=True)]
        each = ", ".join(f"{r:.1f}" for r in ratios)
        ratio = "1.00" if name == "sdk" else f"{statistics.median(ratios):.1f} (rounds: {each})"
        print(f"| {name} | {statistics.median(values):,.0f} | {ratio} |")
    print(f"\n(SDK median {base:,.0f} records/s per core)")


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 200_000,
        int(sys.argv[2]) if len(sys.argv) > 2 else 3,
    )
