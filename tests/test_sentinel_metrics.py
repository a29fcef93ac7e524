"""The sentinel's OpenMetrics endpoint: the names of docs/requirements/sentinel.md
(§3.8, §4.2), values from the snapshot, top flows plus flow="other", parsed with
prometheus_client's OpenMetrics parser."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics import exposition, parser

from meridian.errors import UsageError
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.flows import FlowKey, FlowNames
from meridian.tools.sentinel.model.rollup import Rollup
from meridian.tools.sentinel.outputs.metrics import (
    FlowRow,
    MetricsSnapshot,
    SentinelMetrics,
    flow_rows,
    serve,
)
from meridian.tools.sentinel.pipeline.anomaly import AnomalyGauges

FLOW_A = 0x1234_5678_9ABC_DEF0
FLOW_B = 0x0000_0000_0000_00FF
TCP = {"src": "10.0.0.1", "dst": "10.0.0.2", "sport": 5201, "dport": 43012, "proto": "tcp"}
# prometheus_client's OpenMetrics functions carry no annotations
generate_latest: Callable[[CollectorRegistry], bytes] = exposition.generate_latest
text_string_to_metric_families: Callable[[str], Iterator[Any]] = (
    parser.text_string_to_metric_families
)


def tcp(flow: int, event: str, direction: str, samples: int, cost: float) -> FlowRow:
    return FlowRow(
        flow, event, direction, samples, cost, "10.0.0.1", "10.0.0.2", 5201, 43012, "tcp"
    )


def snapshot(flows: list[FlowRow] | None = None) -> MetricsSnapshot:
    return MetricsSnapshot(
        mode=1,
        samples_per_sec=1234.5,
        pmu_scales={"llc-misses": 2.0, "cpu-clock": 1.0},
        throttled=True,
        window_s=2.0,
        flows=flows
        if flows is not None
        else [
            tcp(FLOW_A, "llc-misses", "rx", 10, 40.0),
            tcp(FLOW_A, "hitm", "rx", 1, 4.0),
            tcp(FLOW_A, "branch-misses", "tx", 3, 6.0),
            FlowRow(FLOW_B, "cpu-clock", "rx", 2, 2.0),  # no 5-tuple known
        ],
        dropped={"token_bucket": 7, "ring_full": 0},
        labelled={"stack_gone": 3, "function_unresolved": 0},
        tsc_slope={0: 1.0, 1: 0.999},
        tsc_offset_ns={0: 12.5, 1: -3.0},
        anomaly=AnomalyGauges({"eth0": 0.25}, {"eth0": 8e6}, 3.0, 450.0),
    )


def scrape(m: SentinelMetrics) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(m)
    return generate_latest(reg).decode()


def parsed(body: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """metric sample name -> (labels, value), through the OpenMetrics parser."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def labels(flow: str, direction: str, **more: str) -> dict[str, str]:
    base = {"flow": flow, "src": "", "dst": "", "sport": "", "dport": "", "proto": ""}
    if flow == f"{FLOW_A:016x}":
        base |= {k: str(v) for k, v in TCP.items()}
    return {**base, "direction": direction, **more}


def test_every_seed_metric_with_its_value() -> None:
    m = SentinelMetrics()
    m.update(snapshot())
    got = parsed(scrape(m))
    a, b = f"{FLOW_A:016x}", f"{FLOW_B:016x}"
    assert a == "123456789abcdef0" and b == "00000000000000ff"
    assert got["ms_agent_mode"] == [({}, 1.0)]
    assert got["ms_samples_per_sec"] == [({}, 1234.5)]
    # each event's own scale (its share of the PMU), by event name
    assert got["ms_pmu_scale"] == [({"event": "cpu-clock"}, 1.0), ({"event": "llc-misses"}, 2.0)]
    assert got["ms_sampling_throttled"] == [({}, 1.0)]
    # per second over a 2 s window, highest-cost flow first
    assert got["ms_flow_event_norm"] == [
        (labels(a, "rx", event="hitm"), 2.0),
        (labels(a, "rx", event="llc-misses"), 20.0),
        (labels(a, "tx", event="branch-misses"), 3.0),
        (labels(b, "rx", event="cpu-clock"), 1.0),
    ]
    assert got["ms_flow_micromiss_rate"] == [(labels(a, "rx"), 22.0)]
    assert got["ms_branch_mispred_rate"] == [(labels(a, "tx"), 3.0)]
    assert got["ms_throughput_ratio"] == [({"interface": "eth0"}, 0.25)]
    assert got["ms_throughput_bps"] == [({"interface": "eth0"}, 8e6)]
    assert got["ms_latency_ratio"] == [({}, 3.0)]
    assert got["ms_latency_us"] == [({}, 450.0)]
    assert got["ms_tsc_slope"] == [({"cpu": "0"}, 1.0), ({"cpu": "1"}, 0.999)]
    assert got["ms_tsc_offset_ns"] == [({"cpu": "0"}, 12.5), ({"cpu": "1"}, -3.0)]
    assert got["ms_dropped_samples_total"] == [
        ({"reason": "ring_full"}, 0.0),
        ({"reason": "token_bucket"}, 7.0),
    ]
    assert got["ms_labelled_samples_total"] == [
        ({"label": "function_unresolved"}, 0.0),
        ({"label": "stack_gone"}, 3.0),
    ]


def test_before_the_first_window() -> None:
    got = parsed(scrape(SentinelMetrics()))
    assert got["ms_agent_mode"] == [({}, 0.0)]
    assert "ms_pmu_scale" not in got  # no event sampled yet
    assert "ms_flow_event_norm" not in got and "ms_latency_us" not in got


def test_the_rest_sums_into_other() -> None:
    rows = [FlowRow(i, "cpu-clock", "rx", 1, float(i)) for i in range(1, 6)]
    rows += [FlowRow(3, "llc-misses", "tx", 1, 10.0), FlowRow(1, "llc-misses", "tx", 1, 0.5)]
    m = SentinelMetrics(top_flows=2)  # flow 3 (13) and flow 5 (5) keep their series
    m.update(MetricsSnapshot(flows=rows))
    got = parsed(scrape(m))
    norm = [(s["flow"], s["direction"], s["event"], v) for s, v in got["ms_flow_event_norm"]]
    assert norm == [
        ("0000000000000003", "rx", "cpu-clock", 3.0),
        ("0000000000000003", "tx", "llc-misses", 10.0),
        ("0000000000000005", "rx", "cpu-clock", 5.0),
        ("other", "rx", "cpu-clock", 1.0 + 2.0 + 4.0),
        ("other", "tx", "llc-misses", 0.5),
    ]
    miss = [(s["flow"], v) for s, v in got["ms_flow_micromiss_rate"]]
    assert miss == [("0000000000000003", 10.0), ("other", 0.5)]


def test_a_hundred_thousand_flows_stay_a_small_scrape() -> None:
    rows = [
        FlowRow(f * 7919, ev, d, 1, float(f % 1000), "10.0.0.1", "10.0.0.2", 1000, f % 65536, "udp")
        for f in range(100_000)
        for ev, d in (("cpu-clock", "rx"), ("llc-misses", "tx"))
    ]
    m = SentinelMetrics(top_flows=50)
    m.update(MetricsSnapshot(flows=rows))
    t0 = time.perf_counter()
    body = scrape(m)
    took = time.perf_counter() - t0
    assert len(body) < 64 * 1024, len(body)
    got = parsed(body)
    flows = {s["flow"] for s, _ in got["ms_flow_event_norm"]}
    assert len(flows) == 51 and "other" in flows
    total = sum(v for _, v in got["ms_flow_event_norm"])
    assert total == pytest.approx(2 * sum(float(f % 1000) for f in range(100_000)))
    assert took < 10  # generous: the machine is shared; typically well under a second


def rollup(
    flow_id: int, event: int, direction: int, samples: int, cost: float, function_id: int = 0
) -> Rollup:
    """An aggregator Rollup with the keys flow_rows reads; the others zero."""
    # zero: callstack, data object, NUMA node, interference class, time bucket, pid
    return Rollup(flow_id, function_id, 0, 0, event, 0, direction, 0, 0, samples, cost, pid=0)


def test_flow_rows_from_rollups() -> None:
    rollups = [
        rollup(FLOW_A, 2, 0, 3, 6.0, function_id=1),
        rollup(FLOW_A, 2, 0, 1, 2.0, function_id=2),  # same flow, event, direction
        rollup(FLOW_A, 6, 1, 1, 0.5),
        rollup(0, 6, 0, 4, 4.0),  # no flow
    ]
    names = FlowNames()
    names.add({FLOW_A: FlowKey("10.0.0.1", "10.0.0.2", 5201, 43012, "tcp")})
    rows = flow_rows(rollups, names)
    a = ("10.0.0.1", "10.0.0.2", 5201, 43012, "tcp", "10.0.0.1", 5201)  # service: :5201
    assert rows == [
        FlowRow(FLOW_A, "llc-misses", "rx", 4, 8.0, *a),
        FlowRow(FLOW_A, "cpu-clock", "tx", 1, 0.5, *a),
        FlowRow(0, "cpu-clock", "rx", 4, 4.0),
    ]
    assert flow_rows(rollups[3:], None, event_name=lambda e: f"e{e}") == [
        FlowRow(0, "e6", "rx", 4, 4.0)
    ]


@pytest.fixture
def served() -> Iterator[tuple[Any, SentinelMetrics]]:
    cfg = SentinelConfig()
    cfg.metrics.listen_port = 0  # any free port
    m = SentinelMetrics()
    server = serve(cfg, m)
    try:
        yield server, m
    finally:
        server.close()


def test_served_over_http_as_openmetrics(served: tuple[Any, SentinelMetrics]) -> None:
    server, m = served
    m.update(snapshot())
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        body = resp.read().decode()
    got = parsed(body)
    assert got["ms_agent_mode"] == [({}, 1.0)]
    assert len(got["ms_flow_event_norm"]) == 4
    m.update(MetricsSnapshot(mode=0))  # the next scrape shows only the new snapshot
    with urllib.request.urlopen(req, timeout=10) as resp:
        got = parsed(resp.read().decode())
    assert got["ms_agent_mode"] == [({}, 0.0)] and "ms_flow_event_norm" not in got


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = SentinelConfig()
        cfg.metrics.listen_port = port
        with pytest.raises(UsageError) as exc:
            serve(cfg, SentinelMetrics())
    assert str(exc.value) == (
        f"--prometheus cannot listen on 127.0.0.1:{port}: Address already in use"
    )
