"""The OpenMetrics endpoint of `meridian sentinel`, with the metric names of
docs/requirements/sentinel.md (§3.8, §4.2).

The runtime hands a `MetricsSnapshot` to `SentinelMetrics.update` once per flush
window; a scrape renders that snapshot and nothing else (prometheus_client's
collector pattern: only `collect()`, nothing kept between scrapes). Served through
the project's `PrometheusServer`.

| metric                          | labels              | value                              |
| ------------------------------- | ------------------- | ---------------------------------- |
| ms_agent_mode                   |                     | 0 sentinel, 1 diagnostic           |
| ms_samples_per_sec              |                     | delivered samples/s, all CPUs      |
| ms_pmu_scale                    | event               | sample scale of the event's cost   |
| ms_sampling_throttled           |                     | 1 while the safety level sheds     |
| ms_flow_event_norm              | F, direction, event | norm cost per second               |
| ms_flow_micromiss_rate          | F, direction        | norm cost/s of cache-miss events   |
| ms_branch_mispred_rate          | F, direction        | norm cost/s of branch misses       |
| ms_service_event_norm           | S, direction, event | norm cost per second               |
| ms_service_flows                | S, direction        | flows of the service in the window |
| ms_throughput_ratio, _bps       | interface           | reading / EWMA baseline; bits/s    |
| ms_latency_ratio, ms_latency_us |                     | probe reading / baseline; µs       |
| ms_tsc_slope, ms_tsc_offset_ns  | cpu                 | kernel ns -> wall ns, per CPU      |
| ms_dropped_samples_total        | reason              | samples dropped, cumulative        |
| ms_labelled_samples_total       | label               | samples under a label, cumulative  |

F: `flow` (16 hex digits of the flow id) and, where known, `src`, `dst`, `sport`,
`dport`, `proto` (empty when not known, which Prometheus treats as absent). The
`top_flows` flows with the highest norm cost in the window keep series of their own;
the others are summed per direction and event into `flow="other"`, so a host with a
million flows scrapes as fast as one with fifty.

S: `service_addr`, `service_port`, `proto`: the flow's listening side (model/services.py),
the flows summed per service, direction and event beside their own series; bounded
likewise by `top_services` (the rest in `service_addr="other"`). Only flows whose
5-tuple is known have a service: flow 0 and a flow not named yet are in the flow
series only.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from ....export.prometheus import PrometheusServer, families
from ....export.series import Attrs, Family, HistPoint, Point
from ..model.groups import in_order
from ..model.rollup import Rollup, as_rows
from ..model.services import server_side
from ..pipeline.anomaly import AnomalyGauges

if TYPE_CHECKING:
    from ..config.load import SentinelConfig
    from ..model.flows import FlowKey

__all__ = [
    "BRANCH_EVENTS",
    "CACHE_EVENTS",
    "FlowLookup",
    "FlowRow",
    "MetricsSnapshot",
    "SentinelMetrics",
    "flow_rows",
    "serve",
]

OTHER = "other"
CACHE_EVENTS = frozenset({"llc-misses", "remote-dram", "hitm"})  # ms_flow_micromiss_rate
BRANCH_EVENTS = frozenset({"branch-misses"})  # ms_branch_mispred_rate
DIRECTIONS = ("rx", "tx", "idle")  # idle: flow 0's samples in the kernel's idle code
FLOW_LABELS = ("flow", "src", "dst", "sport", "dport", "proto")
SERVICE_LABELS = ("service_addr", "service_port", "proto")
Svc = tuple[str, int, str]  # a service's labels: address, port, protocol
_K = TypeVar("_K", str, int)  # a label value
GAUGE_HELP = {
    "ms_agent_mode": "sampling mode: 0 sentinel, 1 diagnostic",
    "ms_samples_per_sec": "samples delivered per second, all CPUs",
    "ms_pmu_scale": "sample scale of an event: the inverse of the share of the time it "
    "was really sampled (PMU rotation, kernel multiplexing)",
    "ms_sampling_throttled": "1 while the safety level limits events per group",
    "ms_flow_event_norm": "norm cost per second (samples x scale / gso segments) by flow and event",
    "ms_flow_micromiss_rate": "norm cost per second of cache-miss events "
    "(llc-misses, remote-dram, hitm)",
    "ms_branch_mispred_rate": "norm cost per second of branch mispredictions",
    "ms_service_event_norm": "norm cost per second by service (the listening address, "
    "port and protocol of the flows) and event",
    "ms_service_flows": "flows of a service with samples in the window",
    "ms_throughput_ratio": "interface throughput over its EWMA baseline",
    "ms_throughput_bps": "interface throughput, bits per second",
    "ms_latency_ratio": "latency probe reading over its EWMA baseline",
    "ms_latency_us": "latency probe reading, microseconds",
    "ms_tsc_slope": "wall ns per kernel ns of the per-CPU clock model",
    "ms_tsc_offset_ns": "wall minus kernel ns of the per-CPU clock model",
}


@dataclass(frozen=True)
class FlowRow:
    """One flow's cost for one event and direction over the snapshot's window."""

    flow_id: int
    event: str
    direction: str  # rx or tx; idle for flow 0 in the kernel's idle code
    samples: int
    norm_cost: float
    src: str = ""
    dst: str = ""
    sport: int | None = None
    dport: int | None = None
    proto: str = ""
    service_addr: str = ""  # the listening side: "" while the 5-tuple is not known
    service_port: int | None = None

    def flow_labels(self) -> dict[str, str | int | bool]:
        return {
            "flow": f"{self.flow_id:016x}",
            "src": self.src,
            "dst": self.dst,
            "sport": "" if self.sport is None else self.sport,
            "dport": "" if self.dport is None else self.dport,
            "proto": self.proto,
        }

    def service(self) -> Svc | None:
        if not self.service_addr or self.service_port is None:
            return None
        return (self.service_addr, self.service_port, self.proto)


@dataclass
class MetricsSnapshot:
    """Everything a scrape shows, filled by the runtime at the end of a flush window."""

    mode: int = 0
    samples_per_sec: float = 0.0
    pmu_scales: Mapping[str, float] = field(default_factory=dict)  # by event name
    throttled: bool = False
    window_s: float = 1.0  # the flush window the flow rows cover
    flows: Sequence[FlowRow] = ()
    dropped: Mapping[str, int] = field(default_factory=dict)  # cumulative, by reason
    # cumulative: samples kept under a label instead of a symbol or frames, by label
    labelled: Mapping[str, int] = field(default_factory=dict)
    tsc_slope: Mapping[int, float] = field(default_factory=dict)
    tsc_offset_ns: Mapping[int, float] = field(default_factory=dict)
    anomaly: AnomalyGauges = field(default_factory=AnomalyGauges)


class FlowLookup(Protocol):
    """What names a flow id: a FlowNames, or the runtime's names (which also have
    `service(flow_id)`, the flow's listening side by the host's sockets)."""

    def get(self, flow_id: int) -> FlowKey | None: ...


def _event_names() -> Callable[[int], str]:
    from ..model.records import EVENT_NAMES

    def name(event: int) -> str:
        return EVENT_NAMES[event] if 0 <= event < len(EVENT_NAMES) else str(event)

    return name


def flow_rows(
    rollups: np.ndarray[Any, Any] | Iterable[Rollup],
    names: FlowLookup | None = None,
    event_name: Callable[[int], str] | None = None,
) -> list[FlowRow]:
    """Aggregator rollups (ROLLUP_DTYPE rows, or Rollup objects) summed per (flow,
    direction, event), column-wise, in the order the cells first occur, with the
    5-tuple and the service where `names` knows it."""
    label = event_name or _event_names()
    service_of = getattr(names, "service", None)
    rows = as_rows(rollups)
    first, cell = in_order(rows["flow_id"], rows["direction"], rows["event"])
    samples = np.zeros(len(first), dtype=np.uint64)
    np.add.at(samples, cell, rows["samples"].astype(np.uint64))
    cost = np.bincount(cell, weights=rows["norm_cost"].astype(np.float64), minlength=len(first))
    keys = zip(*(rows[k][first].tolist() for k in ("flow_id", "direction", "event")), strict=True)
    out = []
    sums = zip(keys, samples.tolist(), cost.tolist(), strict=True)
    for (flow_id, direction, event), n, c in sums:
        key = names.get(flow_id) if names is not None and flow_id else None
        where: dict[str, Any] = {}
        if key is not None:
            where = {
                "src": key.src,
                "dst": key.dst,
                "sport": key.sport,
                "dport": key.dport,
                "proto": str(key.proto),
            }
            svc = service_of(flow_id) if service_of is not None else server_side(key)
            if svc is not None:
                where.update(service_addr=svc.addr, service_port=svc.port)
        d = DIRECTIONS[direction] if 0 <= direction < len(DIRECTIONS) else str(direction)
        out.append(FlowRow(flow_id, label(event), d, n, c, **where))
    return out


class SentinelMetrics:
    """A prometheus_client collector over the latest `MetricsSnapshot`."""

    def __init__(self, top_flows: int = 50, top_services: int = 50) -> None:
        self.top_flows = top_flows
        self.top_services = top_services
        self._snapshot = MetricsSnapshot()
        self._lock = threading.Lock()
        self._more: list[Callable[[], list[Family]]] = []

    def add_source(self, source: Callable[[], list[Family]]) -> None:
        """More families for every scrape (the store's counters, detectors' findings)."""
        self._more.append(source)

    def update(self, snapshot: MetricsSnapshot) -> None:
        """Replace the snapshot (the flush thread); scrapes see the old or the new one."""
        with self._lock:
            self._snapshot = snapshot

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return self._snapshot

    def collect(self) -> Iterator[Any]:
        return families(self.source)

    def source(self) -> list[Family]:
        """The families of the current snapshot (a `meridian.export.Source`)."""
        s = self.snapshot()

        def one(value: float | None) -> list[Point]:
            """One unlabelled point; none while the value is unknown (no probe)."""
            return [] if value is None else [Point({}, value)]

        def by(label: str, values: Mapping[_K, float]) -> list[Point]:
            """One point per key (an interface, a CPU), in key order."""
            return [Point({label: k}, v) for k, v in sorted(values.items())]

        a = s.anomaly
        out = [
            _gauge("ms_agent_mode", one(s.mode)),
            _gauge("ms_samples_per_sec", one(s.samples_per_sec)),
            _gauge("ms_pmu_scale", by("event", s.pmu_scales)),
            _gauge("ms_sampling_throttled", one(1 if s.throttled else 0)),
            *self._flow_families(s),
            *self._service_families(s),
            _gauge("ms_throughput_ratio", by("interface", a.throughput_ratio)),
            _gauge("ms_throughput_bps", by("interface", a.throughput_bps)),
            _gauge("ms_latency_ratio", one(a.latency_ratio)),
            _gauge("ms_latency_us", one(a.latency_us)),
            _gauge("ms_tsc_slope", by("cpu", s.tsc_slope)),
            _gauge("ms_tsc_offset_ns", by("cpu", s.tsc_offset_ns)),
            Family(
                "ms_dropped_samples",
                "counter",
                "",
                "samples dropped, by reason",
                [Point({"reason": k}, int(v)) for k, v in sorted(s.dropped.items())],
            ),
            Family(
                "ms_labelled_samples",
                "counter",
                "",
                "samples kept under a label instead of their symbol or stack, by label",
                [Point({"label": k}, int(v)) for k, v in sorted(s.labelled.items())],
            ),
        ]
        for more in list(self._more):
            out.extend(more())
        return out

    def _flow_families(self, s: MetricsSnapshot) -> list[Family]:
        """ms_flow_event_norm, ms_flow_micromiss_rate, ms_branch_mispred_rate: the top
        flows by cost, the rest in flow="other"."""
        total: dict[int, float] = {}
        for r in s.flows:
            total[r.flow_id] = total.get(r.flow_id, 0.0) + r.norm_cost
        top = {
            f
            for f, _ in heapq.nlargest(
                self.top_flows, total.items(), key=lambda kv: (kv[1], -kv[0])
            )
        }
        per_s = 1.0 / s.window_s if s.window_s > 0 else 1.0
        # (flow labels, direction, event) -> norm cost; flow labels None: other
        cells: dict[tuple[int | None, str, str], float] = {}
        labels: dict[int, dict[str, str | int | bool]] = {}
        for r in s.flows:
            fid: int | None = r.flow_id if r.flow_id in top else None
            if fid is not None and fid not in labels:
                labels[fid] = r.flow_labels()
            k = (fid, r.direction, r.event)
            cells[k] = cells.get(k, 0.0) + r.norm_cost
        other: dict[str, str | int | bool] = dict.fromkeys(FLOW_LABELS, "")
        other["flow"] = OTHER

        def attrs(fid: int | None, direction: str, **more: str) -> Attrs:
            base = labels[fid] if fid is not None else other
            return {**base, "direction": direction, **more}

        def order(k: tuple[int | None, str, str]) -> tuple[float, str, str, str]:
            fid = k[0]
            return (
                -total[fid] if fid is not None else 0.0,
                "" if fid is None else f"{fid:016x}",
                k[1],
                k[2],
            )

        norm: list[Point] = []
        miss: dict[tuple[int | None, str], float] = {}
        mispred: dict[tuple[int | None, str], float] = {}
        for k in sorted(cells, key=order):
            fid, direction, event = k
            v = cells[k] * per_s
            norm.append(Point(attrs(fid, direction, event=event), v))
            if event in CACHE_EVENTS:
                miss[(fid, direction)] = miss.get((fid, direction), 0.0) + v
            if event in BRANCH_EVENTS:
                mispred[(fid, direction)] = mispred.get((fid, direction), 0.0) + v
        return [
            _gauge("ms_flow_event_norm", norm),
            _gauge(
                "ms_flow_micromiss_rate",
                [Point(attrs(f, d), v) for (f, d), v in sorted(miss.items(), key=_by_cost)],
            ),
            _gauge(
                "ms_branch_mispred_rate",
                [Point(attrs(f, d), v) for (f, d), v in sorted(mispred.items(), key=_by_cost)],
            ),
        ]

    def _service_families(self, s: MetricsSnapshot) -> list[Family]:
        """ms_service_event_norm and ms_service_flows: the top services by cost, the
        rest in service_addr="other"."""
        total: dict[Svc, float] = {}
        for r in s.flows:
            if (svc := r.service()) is not None:
                total[svc] = total.get(svc, 0.0) + r.norm_cost
        ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))
        top = {k for k, _ in ranked[: self.top_services]}
        rank = {k: i for i, (k, _) in enumerate(ranked[: self.top_services])}
        per_s = 1.0 / s.window_s if s.window_s > 0 else 1.0
        # (service, direction, event) -> norm cost, (service, direction) -> flow ids;
        # service None: the others
        cells: dict[tuple[Svc | None, str, str], float] = {}
        flows: dict[tuple[Svc | None, str], set[int]] = {}
        for r in s.flows:
            if (svc := r.service()) is None:
                continue
            k = svc if svc in top else None
            cells[(k, r.direction, r.event)] = cells.get((k, r.direction, r.event), 0.0)
            cells[(k, r.direction, r.event)] += r.norm_cost
            flows.setdefault((k, r.direction), set()).add(r.flow_id)

        def attrs(svc: Svc | None, direction: str, **more: str) -> Attrs:
            base: Attrs = dict(zip(SERVICE_LABELS, svc or (OTHER, "", ""), strict=True))
            return {**base, "direction": direction, **more}

        def order(k: tuple[Svc | None, str] | tuple[Svc | None, str, str]) -> tuple[int, ...]:
            """Highest cost first, service_addr="other" last."""
            return (rank[k[0]] if k[0] is not None else len(rank),)

        norm = [
            Point(attrs(k[0], k[1], event=k[2]), v * per_s)
            for k, v in sorted(cells.items(), key=lambda kv: (order(kv[0]), kv[0][1:]))
        ]
        counts = [
            Point(attrs(k[0], k[1]), len(ids))
            for k, ids in sorted(flows.items(), key=lambda kv: (order(kv[0]), kv[0][1]))
        ]
        return [_gauge("ms_service_event_norm", norm), _gauge("ms_service_flows", counts)]


def _gauge(name: str, points: list[Point]) -> Family:
    """The gauge family `name` (no unit, its GAUGE_HELP) with these points."""
    return Family(name, "gauge", "", GAUGE_HELP[name], list[Point | HistPoint](points))


def _by_cost(kv: tuple[tuple[int | None, str], float]) -> tuple[bool, float, str]:
    """Highest first, flow="other" last."""
    return (kv[0][0] is None, -kv[1], kv[0][1])


def serve(cfg: SentinelConfig, metrics: SentinelMetrics) -> PrometheusServer:
    """Serve /metrics on `metrics.listen_address:listen_port` from a thread until the
    server's `close()`; a port in use is a one-line UsageError."""
    host, port = cfg.metrics.listen_address, cfg.metrics.listen_port
    return PrometheusServer(metrics.source, (host, port))
