"""Prometheus scrapes of `meridian io` at 10, 100 and 1,000 processes: time and body
size, beside prometheus_client serving the same number of plain series.

The source is what `meridian io` reads on a scrape (`io_source`): a snapshot of the
kernel's aggregate map (keys and per-CPU values, 2 CPUs, 4 keys per process:
read/write x cached/disk, latencies over 8 log2 slots), ranked and summed into series
groups (`snapshot_groups`), turned into families (`series_of`), then rendered. Each
configuration is served on loopback and scraped `SCRAPES` times over HTTP (no gzip);
the median wall time is reported.

  meridian (default cap)   the exporter as shipped: at most 100 process series groups
  meridian (no cap)        --metrics-max-pids all
  before (prometheus_client objects)   the same families through prometheus_client's
                           collector and renderer, as meridian did before
  prometheus_client plain  a labelled Gauge with as many series as "no cap" has
                           samples, rendered by prometheus_client (its own cost)

Run from the repository: .venv/bin/python benchmarks/prometheus_scrape_bench.py [SCRAPES]
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from meridian.export.prometheus import PrometheusServer
from meridian.export.series import Family
from meridian.tools.io.metrics import series_of, snapshot_groups
from meridian.tools.io.options import DEFAULT_METRICS_MAX_PIDS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from io_trace import io_layouts

_, KEY, VALUE = io_layouts()

NCPU = 2


def snapshot(n: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The aggregate map of n processes, as `FileIO.stats()` returns it."""
    rng = np.random.default_rng(n)
    keys = np.zeros(4 * n, KEY)
    vals = np.zeros((4 * n, NCPU), VALUE)
    i = np.arange(4 * n)
    keys["pid"], keys["op"], keys["cached"], keys["start"] = 1000 + i // 4, i % 2, i // 2 % 2, 7
    vals["ops"] = rng.integers(1, 1000, (4 * n, NCPU))
    vals["bytes"] = vals["bytes_requested"] = vals["ops"] * 4096
    vals["disk_bytes"] = np.where((i // 2 % 2 == 0)[:, None], vals["bytes"], 0)
    vals["io_wait_ns"] = vals["ops"] * 100
    vals["latency_sum_ns"], vals["latency_max_ns"] = vals["ops"] * 5000, 1 << 20
    vals["first_ns"], vals["last_ns"] = 1, 2
    vals["buckets"][:, :, 10 * 16 : 18 * 16] = rng.integers(0, 50, (4 * n, NCPU, 8 * 16))
    comms = np.array([f"proc{j % 37}".encode() for j in range(n)])
    vals["comm"] = comms[i // 4][:, None]
    return keys, vals


def source(n: int, cap: int | None) -> Any:
    keys, vals = snapshot(n)

    def read() -> list[Family]:
        return series_of(snapshot_groups(keys, vals, cap), {"events_lost": 0}, 0)

    return read


def scrape(port: int, scrapes: int) -> tuple[float, int, int]:
    """Median seconds per scrape, body bytes, sample lines."""
    times, body = [], b""
    for _ in range(scrapes):
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as r:
            body = r.read()
        times.append(time.perf_counter() - t0)
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return statistics.median(times), len(body), samples


def plain_client(series: int, scrapes: int) -> tuple[float, int, int]:
    """prometheus_client serving a labelled Gauge with `series` series."""
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    g = Gauge("plain_series", "one value per label set", ["pid", "comm", "direction"],
              registry=registry)  # fmt: skip
    for j in range(series):
        g.labels(str(1000 + j // 4), f"proc{j % 37}", "read" if j % 2 else "write").set(j)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        return scrape(int(server.server_address[1]), scrapes)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def served(read: Any, fast: bool, scrapes: int) -> tuple[float, int, int]:
    server = PrometheusServer(read, ("127.0.0.1", 0), fast=fast)
    try:
        return scrape(server.port, scrapes)
    finally:
        server.close()


def main(scrapes: int) -> None:
    print(
        f"machine: {platform.node()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs; median of {scrapes} scrapes over loopback HTTP, no gzip\n"
    )
    print("| processes | configuration | scrape ms | body KB | samples | µs per sample |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    per_sample: dict[tuple[int, str], float] = {}
    for n in (10, 100, 1000):
        rows = {
            f"meridian (default cap {DEFAULT_METRICS_MAX_PIDS})": served(
                source(n, DEFAULT_METRICS_MAX_PIDS), True, scrapes
            ),
            "meridian (no cap)": served(source(n, None), True, scrapes),
            "before (prometheus_client objects)": served(source(n, None), False, scrapes),
        }
        rows["prometheus_client plain"] = plain_client(rows["meridian (no cap)"][2], scrapes)
        for name, (sec, size, samples) in rows.items():
            per_sample[n, name] = sec / samples * 1e6
            print(f"| {n:,} | {name} | {sec * 1e3:,.1f} | {size / 1e3:,.1f} | {samples:,} | "
                  f"{per_sample[n, name]:.2f} |", flush=True)  # fmt: skip
    print("\n| processes | meridian (no cap) per sample / prometheus_client plain per sample |")
    print("| ---: | ---: |")
    for n in (10, 100, 1000):
        ratio = per_sample[n, "meridian (no cap)"] / per_sample[n, "prometheus_client plain"]
        print(f"| {n:,} | {ratio:.2f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
