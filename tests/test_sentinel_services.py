"""The service view of `meridian sentinel` (issue 25, "one row per connection"): the
rule that picks a flow's listening side, the host's listening sockets read from
/proc/net, the grouping of flows into services with exact sums (a window's rows, the
run's bounded totals, flows named after their first samples), the summary, the live
table and --json by service, /metrics' service series, and the runtime end to end on
a scripted source: 100 short connections to one server are one service row whose
samples are the sum of the flows'."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from children import wait_until
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics import exposition, parser

from meridian.tools.sentinel.agent.runtime import Runtime
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.flows import FlowKey, FlowNames
from meridian.tools.sentinel.model.records import RX, TX, Event
from meridian.tools.sentinel.model.rollup import Rollup
from meridian.tools.sentinel.model.services import (
    Listening,
    ServiceKey,
    ServiceTotals,
    server_side,
    service_stats,
)
from meridian.tools.sentinel.model.window import FlowStat, Totals, WindowInfo
from meridian.tools.sentinel.outputs.live import (
    render_live,
    render_summary,
    summary_json,
    window_json,
)
from meridian.tools.sentinel.outputs.metrics import MetricsSnapshot, SentinelMetrics, flow_rows
from meridian.tools.sentinel.pipeline.listening import (
    ServiceMap,
    ephemeral_range,
    listening_sockets,
    parse_proc_net,
)
from meridian.tools.sentinel.sources.mock import MockSource, make_samples

SERVER = ServiceKey("10.0.0.1", 8080, "tcp")
CPU = int(Event.CPU_CLOCK)


def conn(i: int, port: int = 8080) -> FlowKey:
    """The i-th short connection to 10.0.0.1:port, client to server."""
    return FlowKey("10.0.0.2", "10.0.0.1", 40000 + i, port, "tcp")


# ---- the rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "want"),
    [
        (conn(0), ("10.0.0.1", 8080)),  # rule 3: the client's port is ephemeral
        (FlowKey("10.0.0.1", "10.0.0.2", 443, 5000, "tcp"), ("10.0.0.1", 443)),  # 2
        (FlowKey("10.0.0.2", "10.0.0.1", 50000, 45000, "udp"), ("10.0.0.1", 45000)),  # 4
        (FlowKey("10.0.0.2", "10.0.0.1", 5353, 5353, "udp"), ("10.0.0.1", 5353)),  # addr
        (FlowKey("fd00::2", "fd00::1", 50000, 443, "tcp"), ("fd00::1", 443)),
        (FlowKey("10.0.0.2", "10.0.0.1", 0, 0, "icmp"), ("10.0.0.1", 0)),
    ],
)
def test_the_listening_side_both_ways(key: FlowKey, want: Any) -> None:
    """A flow and its reverse direction have the same service."""
    got = server_side(key)
    assert (got.addr, got.port) == tuple(want)
    assert server_side(key.reversed()) == got
    assert got.proto == key.proto


def test_a_socket_the_host_listens_on_comes_first() -> None:
    """A server on an ephemeral port above its client's: rule 4 alone picks the
    client; the host's listening socket (by address, a wildcard, IPv4-mapped) tells."""
    key = FlowKey("10.0.0.2", "10.0.0.1", 40000, 45000, "tcp")
    assert server_side(key).port == 40000
    for sockets in (
        {("tcp", "10.0.0.1", 45000)},
        {("tcp", "0.0.0.0", 45000)},
        {("tcp", "::", 45000)},
    ):
        listening = Listening(frozenset(sockets))
        assert server_side(key, listening) == ServiceKey("10.0.0.1", 45000, "tcp")
        assert server_side(key.reversed(), listening) == ServiceKey("10.0.0.1", 45000, "tcp")
    other = Listening(frozenset({("tcp", "10.9.9.9", 45000), ("udp", "0.0.0.0", 45000)}))
    assert server_side(key, other).port == 40000  # not this address, not this protocol
    mapped = FlowKey("::ffff:10.0.0.2", "::ffff:10.0.0.1", 40000, 45000, "tcp")
    assert server_side(mapped, Listening(frozenset({("tcp", "10.0.0.1", 45000)}))).port == 45000
    # the host's own ephemeral range (rule 3)
    assert server_side(key, ephemeral=(40000, 40999)).port == 45000


def test_labels() -> None:
    assert str(SERVER) == "10.0.0.1:8080 tcp"
    assert str(ServiceKey("fd00::1", 443, "udp")) == "[fd00::1]:443 udp"
    assert str(ServiceKey("10.0.0.1", 0, "icmp")) == "10.0.0.1 icmp"


# ---- the host's listening sockets ----------------------------------------------------

HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
TCP = HEAD + (
    "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 1\n"
    "   1: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000 0 0 2\n"
)
TCP6 = HEAD + (
    "   0: 00000000000000000000000000000000:01BB 00000000000000000000000000000000:0000 0A x\n"
    "   1: 0000000000000000FFFF00000100007F:1F91 00000000000000000000000000000000:0000 0A x\n"
    "   2: 000080FE000000000000000001000000:0016 00000000000000000000000000000000:0000 0A x\n"
)
UDP = HEAD + (
    "   0: 00000000:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000 0 0 3\n"
    "   1: 00000000:9C40 00000000:0000 07 00000000:00000000 00:00000000 00000000 0 0 4\n"
    "   2: 0100007F:14E9 0200007F:0035 01 00000000:00000000 00:00000000 00000000 0 0 5\n"
)


def fake_proc(root: Path, port_range: str = "32768\t60999\n") -> Path:
    (root / "net").mkdir(parents=True)
    (root / "sys/net/ipv4").mkdir(parents=True)
    for name, text in (("tcp", TCP), ("tcp6", TCP6), ("udp", UDP), ("udp6", HEAD)):
        (root / "net" / name).write_text(text)
    (root / "sys/net/ipv4/ip_local_port_range").write_text(port_range)
    return root


def test_proc_net_tables(tmp_path: Path) -> None:
    """TCP in LISTEN only; UDP unconnected outside the ephemeral range only (the one
    on 40000 is a client's); IPv6 words in host order, an IPv4-mapped one as IPv4."""
    assert parse_proc_net(TCP, "tcp") == {("tcp", "127.0.0.1", 8080)}
    assert parse_proc_net(TCP6, "tcp") == {
        ("tcp", "::", 443),
        ("tcp", "127.0.0.1", 8081),
        ("tcp", "fe80::1", 22),
    }
    assert parse_proc_net(UDP, "udp") == {("udp", "0.0.0.0", 53)}
    root = fake_proc(tmp_path / "proc", "1024 65000\n")
    assert ephemeral_range(str(root)) == (1024, 65000)
    assert ephemeral_range(str(tmp_path / "none")) == (32768, 60999)
    # with the range 1024-65000, udp 53 stays; 40000 is in it
    assert ("udp", "0.0.0.0", 53) in listening_sockets(str(root), (1024, 65000)).sockets


def test_this_hosts_own_listening_socket() -> None:
    """The real /proc/net: a socket this test listens on is found (IPv4, and IPv6
    where the host has it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        found = listening_sockets().sockets
        assert ("tcp", "127.0.0.1", port) in found
    if socket.has_ipv6 and Path("/proc/net/tcp6").exists():
        with socket.socket(socket.AF_INET6) as s:
            try:
                s.bind(("::1", 0))
            except OSError:
                return
            s.listen()
            assert ("tcp", "::1", s.getsockname()[1]) in listening_sockets().sockets
    lo, hi = ephemeral_range()
    assert 0 < lo <= hi <= 65535


def test_service_map_decides_once_and_reads_proc_at_most_every_5s(tmp_path: Path) -> None:
    root = fake_proc(tmp_path / "proc")
    keys = {1: FlowKey("127.0.0.2", "127.0.0.1", 40000, 8080, "tcp")}
    now = [100.0]
    m = ServiceMap(keys.get, str(root), clock=lambda: now[0])
    assert m(1) == ServiceKey("127.0.0.1", 8080, "tcp")
    assert m(2) is None and m(0) is None  # not named yet; no flow
    # a listener on 45000 appears: the next read sees it after 5 s, not before
    (root / "net/tcp").write_text(TCP.replace("1F90 00000000:0000 0A", "AFC8 00000000:0000 0A"))
    keys[2] = FlowKey("127.0.0.2", "127.0.0.1", 40000, 45000, "tcp")
    keys[3] = FlowKey("127.0.0.2", "127.0.0.1", 40001, 45000, "tcp")
    assert m(2) == ServiceKey("127.0.0.2", 40000, "tcp")  # rule 4: the listener not read yet
    now[0] += 5
    assert m(3) == ServiceKey("127.0.0.1", 45000, "tcp")
    assert m(2) == ServiceKey("127.0.0.2", 40000, "tcp")  # decided once, kept


# ---- grouping, with exact numbers ----------------------------------------------------

KEYS = [conn(i) for i in range(100)]
OTHER = FlowKey("10.0.0.2", "10.0.0.3", 40500, 5201, "tcp")
UNNAMED = 0xDEAD_BEEF


class Names:
    """view.Names over a dict of flows (no `service`: the rule on the 5-tuple)."""

    def __init__(self, keys: list[FlowKey]) -> None:
        self.keys = {k.flow_id: k for k in keys}

    def flow(self, flow_id: int) -> FlowKey | None:
        return self.keys.get(flow_id)

    def function(self, function_id: int) -> str:
        return f"fn{function_id}"

    def stack(self, stack_id: int) -> list[str]:
        return [f"fn{stack_id}", "main"]


def stat(flow: int, direction: int, samples: int, function: int = 1) -> FlowStat:
    s = FlowStat(flow, direction, CPU)
    r = Rollup(flow, function, function, 0, CPU, 0, direction, 0, 0, samples, samples * 0.5, 1)
    s.add(r)
    return s


def window() -> list[FlowStat]:
    """100 connections: client -> server (rx) 1-3 samples each, server -> client (tx)
    1 each; another service's flow; a flow not named; no flow."""
    stats = [stat(k.flow_id, RX, i % 3 + 1, function=1 + i % 2) for i, k in enumerate(KEYS)]
    stats += [stat(k.reversed().flow_id, TX, 1) for k in KEYS]
    stats += [stat(OTHER.flow_id, RX, 50), stat(UNNAMED, RX, 7), stat(0, RX, 9)]
    return stats


RX_SAMPLES = sum(i % 3 + 1 for i in range(100))  # 199
NAMES = Names(KEYS + [k.reversed() for k in KEYS] + [OTHER])


def rows(stats: list[Any]) -> list[tuple[str, int, int, float, int]]:
    return [
        (str(s.service or f"{s.flow_id:x}"), s.direction, s.samples, s.norm_cost, s.flows)
        for s in stats
    ]


def test_a_hundred_connections_are_one_row_per_direction() -> None:
    got = service_stats(window(), of)
    assert rows(got) == [
        ("10.0.0.1:8080 tcp", RX, RX_SAMPLES, RX_SAMPLES * 0.5, 100),
        ("10.0.0.1:8080 tcp", TX, 100, 50.0, 100),
        ("10.0.0.3:5201 tcp", RX, 50, 25.0, 1),
        ("0", RX, 9, 4.5, 0),  # no flow
        (f"{UNNAMED:x}", RX, 7, 3.5, 1),  # not named: its own row
    ]
    assert RX_SAMPLES == 199
    # the connections' functions merged: fn1 the even ones (100 samples), fn2 the odd (99)
    assert got[0].functions == {1: 50.0, 2: 49.5} and got[0].hottest(1) == [(1, 50.0)]


def of(flow_id: int) -> ServiceKey | None:
    key = NAMES.flow(flow_id)
    return server_side(key) if key is not None else None


def test_the_runs_totals_merge_flows_named_late() -> None:
    """Window 1 has half the connections before their names are known (their own
    rows); once named, the totals merge them into the service: the same sums."""
    late = {k.flow_id for k in KEYS[50:]}
    known = [True]

    def service_of(flow_id: int) -> ServiceKey | None:
        return None if flow_id in late and known[0] else of(flow_id)

    totals = ServiceTotals(service_of)
    totals.add(window())
    assert any(s.service is None and s.flow_id in late for s in totals.rows.values())
    known[0] = False
    totals.add([stat(KEYS[0].flow_id, RX, 1)])  # a second window
    top = totals.top(10)
    assert rows(top)[0] == ("10.0.0.1:8080 tcp", RX, RX_SAMPLES + 1, (RX_SAMPLES + 1) * 0.5, 100)
    assert [r for r in rows(top) if r[0] == "10.0.0.1:8080 tcp"][1][1:] == (TX, 100, 50.0, 100)


def test_totals_stay_bounded() -> None:
    totals = ServiceTotals(lambda f: None, max_rows=10, max_ids=5)
    totals.add([stat(f, RX, f) for f in range(1, 101)])  # 100 flows no one named
    assert len(totals.rows) <= 20
    assert [s.flow_id for s in totals.top(3)] == [100, 99, 98]
    named = ServiceTotals(lambda f: SERVER, max_ids=5)
    named.add([stat(f, RX, 1) for f in range(1, 101)])
    (row,) = named.top(5)
    assert (row.samples, row.flows, row.more_flows, row.flows_text()) == (100, 5, True, "5+ flows")


# ---- what people see -----------------------------------------------------------------


def info() -> WindowInfo:
    return WindowInfo(1.0, "sentinel", "mock", ["cpu-clock"], samples=600)


def test_summary_text_and_json_by_service() -> None:
    totals, services = Totals(), ServiceTotals(of)
    totals.add(window())
    services.add(window())
    out = io.StringIO()
    render_summary(totals, 1.0, info(), NAMES, out, services=services)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[2] == (
        "by service: flows grouped by listening address, port, protocol (--by flow: 5-tuples)"
    )
    head = next(i for i, line in enumerate(lines) if line.startswith("SERVICE "))
    first = lines[head + 1].split()
    assert first[:7] == ["10.0.0.1:8080", "tcp", "(100", "flows)", "rx", "cpu-clock", "199"]
    assert "\n10.0.0.1:8080 tcp (100 flows) rx cpu-clock: 199 samples, norm cost 99.5\n" in text
    assert str(KEYS[0]) not in text  # no 5-tuple row
    by_flow = io.StringIO()
    render_summary(totals, 1.0, info(), NAMES, by_flow)
    assert "-> 10.0.0.1:8080 tcp " in by_flow.getvalue()
    assert "SERVICE" not in by_flow.getvalue()

    obj = json.loads(json.dumps(summary_json(totals, 1.0, info(), NAMES, services=services)))
    top = obj["services"][0]
    assert {k: top[k] for k in ("service", "addr", "port", "proto", "flows", "direction")} == {
        "service": "10.0.0.1:8080 tcp", "addr": "10.0.0.1", "port": 8080, "proto": "tcp",
        "flows": 100, "direction": "rx",
    }  # fmt: skip
    assert (top["samples"], top["norm_cost"], top["more_flows"]) == (RX_SAMPLES, 99.5, False)
    assert top["functions"][0] == {"function": "fn1", "norm_cost": 50.0}
    assert [s["frames"] for s in top["stacks"]] == [["fn1", "main"], ["fn2", "main"]]
    unnamed = next(r for r in obj["services"] if r.get("flow") == f"{UNNAMED:016x}")
    assert unnamed["service"] is None and unnamed["samples"] == 7
    assert len(obj["flows"]) == 20  # the flows as before
    assert "services" not in summary_json(totals, 1.0, info(), NAMES)


def test_live_table_and_window_json_by_service() -> None:
    stats = sorted(window(), key=lambda s: -s.norm_cost)
    frame = render_live(stats, info(), NAMES, (140, 40), clock="12:00:00", by="service")
    assert "flows 202  services 2" in frame
    assert "SERVICE" in frame and "10.0.0.1:8080 tcp (100 flows) rx " in frame
    assert str(KEYS[0]) not in frame
    flat = render_live(stats, info(), NAMES, (140, 40), clock="12:00:00")
    assert "FLOW " in flat and "services" not in flat
    w = window_json(3, stats, info(), NAMES, top=50, by="service")
    assert (w["flows_total"], w["services_total"], len(w["flows"])) == (202, 2, 50)
    (rx,) = [
        r for r in w["services"] if r["service"] == "10.0.0.1:8080 tcp" and r["direction"] == "rx"
    ]
    assert (rx["samples"], rx["flows"]) == (RX_SAMPLES, 100)
    with pytest.raises(ValueError, match="by must be"):
        render_live(stats, info(), NAMES, by="host")


# ---- /metrics ------------------------------------------------------------------------


def scrape(m: SentinelMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(m)
    body = exposition.generate_latest(reg).decode()  # type: ignore[no-untyped-call]
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in parser.text_string_to_metric_families(body):  # type: ignore[no-untyped-call]
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def rollups(stats: list[FlowStat]) -> list[Rollup]:
    return [
        Rollup(s.flow_id, 1, 1, 0, CPU, 0, s.direction, 0, 0, s.samples, s.norm_cost, 1)
        for s in stats
    ]


def test_metrics_have_a_series_per_service() -> None:
    names = FlowNames()
    names.add(NAMES.keys)
    m = SentinelMetrics(top_flows=5, top_services=1)
    m.update(MetricsSnapshot(window_s=2.0, flows=flow_rows(rollups(window()), names)))
    got = scrape(m)
    svc = {"service_addr": "10.0.0.1", "service_port": "8080", "proto": "tcp"}
    other = {"service_addr": "other", "service_port": "", "proto": ""}
    # per second over the 2 s window; 5201 is past top_services=1: "other"
    assert got["ms_service_event_norm"] == [
        ({**svc, "direction": "rx", "event": "cpu-clock"}, RX_SAMPLES * 0.5 / 2),
        ({**svc, "direction": "tx", "event": "cpu-clock"}, 50.0 / 2),
        ({**other, "direction": "rx", "event": "cpu-clock"}, 25.0 / 2),
    ]
    assert got["ms_service_flows"] == [
        ({**svc, "direction": "rx"}, 100.0),
        ({**svc, "direction": "tx"}, 100.0),
        ({**other, "direction": "rx"}, 1.0),
    ]
    # the flow series as they were: 5 of their own, the rest in flow="other"
    flows = {s["flow"] for s, _ in got["ms_flow_event_norm"]}
    assert len(flows) == 6 and "other" in flows


def test_a_hundred_thousand_flows_to_many_services_stay_a_small_scrape() -> None:
    keys = [
        FlowKey(
            f"10.{f // 62500}.{f // 250 % 250}.{f % 250 + 1}", "10.0.0.1", 40000, 1 + f % 500, "udp"
        )
        for f in range(100_000)
    ]
    by_id = {k.flow_id: k for k in keys}  # each id hashed once (FNV-1a in Python: slow)
    assert len(by_id) == len(keys)
    names = FlowNames(max_flows=200_000)
    names.add(by_id)
    rows_ = [Rollup(i, 1, 1, 0, CPU, 0, RX, 0, 0, 1, 1.0, 1) for i in by_id]
    m = SentinelMetrics(top_services=50)
    m.update(MetricsSnapshot(flows=flow_rows(rows_, names)))
    t0 = time.perf_counter()
    got = scrape(m)
    assert time.perf_counter() - t0 < 10
    ports = {s["service_port"] for s, _ in got["ms_service_event_norm"]}
    assert len(ports) == 51  # 50 services and other
    assert sum(v for _, v in got["ms_service_event_norm"]) == pytest.approx(100_000.0)
    assert sum(v for _, v in got["ms_service_flows"]) == 100_000


# ---- the runtime, end to end on a scripted source ---------------------------------


def on(key: FlowKey, direction: int, n: int) -> Any:
    """n cpu-clock samples of a flow, on CPU 0, now."""
    now = time.monotonic_ns()
    return make_samples(
        n, flow_id=key.flow_id, direction=direction, cpu=0, event=CPU, time_ns=now, pid=1
    )


def test_the_runtime_sums_a_hundred_connections_into_one_service() -> None:
    """100 connections of 1-3 samples each (rx) and their replies (tx, 1 each), named
    by the source: the summary has one service row per direction, its samples the sum
    of its flows' (which the flow rows of the same run say)."""
    replies = [k.reversed() for k in KEYS]
    batches = [on(k, RX, i % 3 + 1) for i, k in enumerate(KEYS)]
    batches += [on(k, TX, 1) for k in replies]
    src = MockSource.from_samples([np.concatenate(batches)], flows=KEYS + replies)
    cfg = SentinelConfig()
    cfg.metrics.enabled = cfg.anomaly.enabled = cfg.mode.auto = False
    cfg.aggregator.flush_interval = 0.2
    cfg.perf.sentinel_samples_per_sec = 1_000_000  # the one batch is not cut by the budget
    rt = Runtime(cfg, src, cpus=[0])
    rt.start()
    try:
        wait_until(lambda: rt.totals.samples >= RX_SAMPLES + 100, 20, "the samples")
    finally:
        rt.stop()
    obj = json.loads(
        json.dumps(summary_json(rt.totals, rt.seconds, rt.info, rt.names, 200, rt.services))
    )
    svc = [r for r in obj["services"] if r["service"] is not None]
    assert [(r["service"], r["direction"], r["flows"], r["samples"]) for r in svc] == [
        ("10.0.0.1:8080 tcp", "rx", 100, RX_SAMPLES),
        ("10.0.0.1:8080 tcp", "tx", 100, 100),
    ]
    rx_flows = [r for r in obj["flows"] if r["direction"] == "rx"]
    assert len(rx_flows) == 100 and sum(r["samples"] for r in rx_flows) == RX_SAMPLES


def test_a_window_ends_with_its_flows_named() -> None:
    """The source is asked for names at most every NAMES_S, and when a window ends
    (force) while a flow waits for its name: so that the window groups it."""
    from meridian.tools.sentinel.agent.consumer import FlowNamer
    from meridian.tools.sentinel.pipeline.resolver import RuntimeNames

    class Source:
        def __init__(self) -> None:
            self.asked = 0
            self.names: dict[int, FlowKey] = {}

        def new_flows(self) -> dict[int, FlowKey]:
            self.asked += 1
            out, self.names = self.names, {}
            return out

    names = RuntimeNames(FlowNames(), threading.Lock(), None)  # type: ignore[arg-type]
    namer, src = FlowNamer(names), Source()
    a, b = KEYS[0], KEYS[1]
    src.names = {a.flow_id: a}
    namer.update(src, np.array([a.flow_id], dtype=np.uint64))  # type: ignore[arg-type]
    assert (src.asked, names.service(a.flow_id)) == (1, SERVER)
    src.names = {b.flow_id: b}
    namer.update(src, np.array([b.flow_id], dtype=np.uint64))  # type: ignore[arg-type]
    assert (src.asked, names.service(b.flow_id)) == (1, None)  # within NAMES_S
    none = np.zeros(0, dtype=np.uint64)
    namer.update(src, none, force=True)  # type: ignore[arg-type]
    assert (src.asked, names.service(b.flow_id)) == (2, SERVER)
    namer.update(src, none, force=True)  # type: ignore[arg-type]
    assert src.asked == 2  # nothing waits
