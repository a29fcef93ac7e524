"""The rollout scraped as deployed (make deploy-test): Debian's Prometheus on the
shipped deploy/prometheus/prometheus.yml (tests/deploy/promstack.py: its Kubernetes
discovery replaced by the rollout's pods as endpoints of the rendered Services) with
every rules file loaded. During a quiet workload no alert is pending or firing; after
a workload that exercises them every dashboard panel's query has data; and a disk made
slow (a loop device over a FUSE file that sleeps in read) makes the io and biolat
latency alerts fire with the p99 fio measured on it, within one log2 bucket. Those two
alerts hold for HOLD here, not the shipped 10 minutes (promstack.held_rules).

The tests run in this order, on one Prometheus: the quiet one first, the slow disk last
(its alerts stay on for the 5 minutes of their rate windows)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from children import wait_until
from conftest import LoopDevice
from netns import IPERF3
from test_deploy_dashboards import TOOLS
from test_deploy_dashboards_run import (
    Prometheus,
    burst,
    panel_queries,
    panel_workload,
    recording_rules,
    scrapes_since,
    wait_for_data,
)

from deploy.promstack import (
    BASE,
    JOBS,
    alerts,
    derived,
    evaluated_since,
    have_prometheus,
    held_rules,
    rendered,
    running,
    services,
)
from deploy.slowdisk import slow_loop_device

pytestmark = pytest.mark.deploy

# the instance the shipped relabelling gives every target: the pod's node, this host
NODE = os.uname().nodename
# each read of the slow disk sleeps this long: its p99 in the log2 bucket
# (0.134, 0.268] s, over the 0.1 s of MeridianIoDiskLatencyHigh and
# MeridianBiolatLatencyHigh, at 6 reads a second (the alerts want 1 or more)
DELAY = 0.15
FIO_SECONDS = 45
LATENCY_ALERTS = ("MeridianIoDiskLatencyHigh", "MeridianBiolatLatencyHigh")
HOLD = "15s"


@pytest.fixture(scope="module")
def prom(rollout: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Prometheus scraping the rollout's pods, every target scraped once."""
    if not have_prometheus():
        pytest.skip("prometheus is not installed (Debian's prometheus; make deps)")
    assert set(rollout.targets) == set(JOBS), rollout.targets
    config = derived(rollout.targets, NODE, services(rendered(BASE)))
    root = tmp_path_factory.mktemp("prometheus")
    held_rules(root / "rules", config, dict.fromkeys(LATENCY_ALERTS, HOLD))
    with running(root, config, []) as p:
        scrapes_since(p, set(JOBS), 0, 1)
        yield p


@contextlib.contextmanager
def light_io(directory: Path) -> Iterator[None]:
    """A quiet host's file I/O, in a thread: 64 kB written, synced and read back every
    half second."""
    stop = threading.Event()

    def run() -> None:
        path = directory / "quiet.bin"
        while not stop.wait(0.5):
            with open(path, "wb") as f:
                f.write(os.urandom(64 << 10))
                os.fsync(f.fileno())
            path.read_bytes()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_quiet_workload_fires_no_alert(prom: Prometheus, ext4: Path) -> None:
    """During light file I/O, from the first evaluation after every target's first
    scrape on (before it, the Absent alerts are pending): no alert firing, and none of
    severity warning or critical even pending. An `info` alert is a notice, routed
    nowhere by the README's Alertmanager example: MeridianSentinelDiagnosticModeHeld
    goes pending whenever the CPUs are over 90 % busy, which this 2-core machine
    running the whole rollout may be (sentinel's mode follows load by design)."""
    t0 = time.time()
    with light_io(ext4):
        scrapes_since(prom, set(JOBS), t0, 2)
        evaluated_since(prom, time.time(), 30)
    now = alerts(prom)
    window = f"{math.ceil(time.time() - t0)}s"
    seen = prom.series(
        "count by (alertname, alertstate, severity) "
        f'(count_over_time(ALERTS{{severity!="info"}}[{window}]))'
    )
    seen += prom.series(
        f'count by (alertname) (count_over_time(ALERTS{{alertstate="firing"}}[{window}]))'
    )
    loud = [a for a in now if a["state"] == "firing" or a["labels"].get("severity") != "info"]
    assert not loud and not seen, {
        "now": [(a["state"], a["annotations"]["summary"]) for a in now],
        "since the quiet workload began": [s["metric"] for s in seen],
        "load average": os.getloadavg(),
    }


def test_every_dashboard_panel_has_data(
    prom: Prometheus, ext4: Path, loop_device: LoopDevice, tmp_path: Path
) -> None:
    """tests/test_deploy_dashboards_run.py's workload (file I/O, O_DIRECT and writeback on a
    loop device, page faults, an iperf3 stream for sentinel's flows) under the
    deployment's tools: each panel's query, as Grafana sends it for this node, has data."""
    if not Path(IPERF3).exists():
        pytest.skip(f"{IPERF3} is not installed (Debian package iperf3; make deps)")
    with (
        open(tmp_path / "workload.log", "w") as log,
        panel_workload(ext4, log, "p") as (_, faulter),
    ):
        t0 = time.time()
        burst(ext4, faulter)
        scrapes_since(prom, set(JOBS), t0, 2)
        instances = dict.fromkeys(TOOLS, NODE)
        pending = panel_queries(prom, instances, {"device": loop_device.name, "event": "cpu-clock"})
        wait_for_data(prom, pending | recording_rules(prom), 45)


def fio_p99(mnt: Path, seconds: int) -> float:
    """Random 4 kB O_DIRECT reads of a file on `mnt` for `seconds`, one at a time: the
    p99 of their completion latency (fio's clat percentiles), in seconds."""
    job = ["fio", "--name=slow", f"--filename={mnt / 'fio.dat'}", "--size=4m", "--bs=4k"]
    subprocess.run([*job, "--rw=read", "--create_only=1"], check=True, capture_output=True)
    out = subprocess.run(
        [*job, "--rw=randread", "--direct=1", "--time_based", f"--runtime={seconds}",
         "--output-format=json"],
        check=True, capture_output=True, text=True, timeout=seconds + 60,
    ).stdout  # fmt: skip
    [read] = [j["read"] for j in json.loads(out)["jobs"]]
    assert read["total_ios"] >= seconds, read["total_ios"]  # 1 a second or more
    p99: float = read["clat_ns"]["percentile"]["99.000000"] / 1e9
    return p99


def test_a_slow_disk_makes_the_latency_alerts_fire_with_fios_p99(
    prom: Prometheus, tmp_path: Path
) -> None:
    """Reads that take DELAY s on a loop device: MeridianIoDiskLatencyHigh (io's reads
    that reach a disk, this host) and MeridianBiolatLatencyHigh (the device's reads)
    fire, each with a p99 within one log2 bucket (a factor of 2) of fio's, once they
    held for HOLD (10 minutes as shipped, which only waits longer)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with slow_loop_device(tmp_path, 64 << 20) as loop:
        subprocess.run(["mkfs.ext4", "-q", "-F", loop.device], check=True)
        subprocess.run(["mount", loop.device, str(mnt)], check=True)
        try:
            loop.slow(DELAY)
            p99 = fio_p99(mnt, FIO_SECONDS)
        finally:
            loop.slow(0)
            subprocess.run(["umount", str(mnt)], check=True)
    wanted = {
        "MeridianIoDiskLatencyHigh": {"instance": NODE, "disk_io_direction": "read"},
        "MeridianBiolatLatencyHigh": {"system_device": loop.name, "disk_io_direction": "read"},
    }
    assert set(wanted) == set(LATENCY_ALERTS)
    got: dict[str, dict[str, Any]] = {}

    def firing() -> bool:
        for a in alerts(prom):
            name = a["labels"]["alertname"]
            if name in wanted and wanted[name].items() <= a["labels"].items():
                got[name] = a
        return all(got.get(name, {}).get("state") == "firing" for name in wanted)

    try:
        wait_until(firing, 90, "both latency alerts firing", step=1)
    except AssertionError:
        now = [(a["labels"], a["state"], a["value"]) for a in alerts(prom)]
        raise AssertionError(f"pending or firing: {now}; fio's p99 {p99:.3f} s") from None
    for name, a in got.items():
        value = float(a["value"])
        assert abs(math.log2(value / p99)) <= 1, f"{name}: p99 {value:.3f} s, fio's {p99:.3f} s"
