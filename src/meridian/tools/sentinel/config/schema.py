"""The keys of `meridian sentinel`'s configuration: nested dataclasses holding every
default, with a one-line description of each key (`dump_config` prints it). Kept apart
from reading and checking, so a key is added in one place.

Budgets are samples per second per CPU, as the kernel's per-CPU token bucket. Fields
of kind `DURATION` are seconds; keys ending in `_ns` are integer nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DIRECTIONS",
    "DURATION",
    "MODES",
    "AggregatorConfig",
    "AnomalyConfig",
    "ClickHouseConfig",
    "ControlPlaneConfig",
    "MetricsConfig",
    "MockConfig",
    "ModeConfig",
    "PerfConfig",
    "RunConfig",
    "SentinelConfig",
    "TargetsConfig",
]

MODES = ("sentinel", "diagnostic")
DIRECTIONS = ("rx", "tx", "both")
DURATION = "duration"  # field metadata kind: seconds, or a string with a unit


def _doc(doc: str, kind: str = "") -> dict[str, str]:
    """Field metadata: the one-line description dump_config prints, and a kind."""
    return {"doc": doc, "kind": kind}


def _key(default: Any, doc: str, kind: str = "") -> Any:
    """A field with an immutable default and its description."""
    return field(default=default, metadata=_doc(doc, kind))


@dataclass
class PerfConfig:
    """What the kernel samples and how much of it."""

    sentinel_samples_per_sec: int = _key(1000, "token bucket budget in sentinel mode, per CPU")
    diagnostic_samples_per_sec: int = _key(10000, "token bucket budget in diagnostic mode, per CPU")
    hard_drop_ns: int = _key(0, "after the bucket runs empty, drop every sample this long; 0: off")
    frequency: int = _key(99, "sampling frequency of each event, Hz per CPU (-F; 99 as perf -F 99)")
    sentinel_groups: list[list[str]] = field(
        default_factory=lambda: [["cycles", "llc-misses"]],
        metadata=_doc("event groups of sentinel mode (cheap), rotated"),
    )
    diagnostic_groups: list[list[str]] = field(
        default_factory=lambda: [
            ["cycles", "instructions", "llc-misses", "branch-misses"],
            ["remote-dram", "hitm"],
        ],
        metadata=_doc("event groups of diagnostic mode (richer), rotated"),
    )
    rotation_window: float = _key(1.0, "seconds each event group holds the PMU", DURATION)
    max_events_per_group: int = _key(4, "most events opened together in normal safety level")
    xdp_interfaces: list[str] = field(
        default_factory=lambda: [],
        metadata=_doc("interfaces with an XDP flow-context hook (--xdp)"),
    )


@dataclass
class ModeConfig:
    """Mode controller and safety level."""

    initial: str = _key("sentinel", "mode at start: sentinel or diagnostic (--mode)")
    auto: bool = _key(True, "switch modes on samples/s (hysteresis) and anomaly signals")
    hysteresis_high: float = _key(0.9, "to diagnostic when samples/s >= this x sentinel budget")
    hysteresis_low: float = _key(0.5, "back to sentinel when samples/s < this x sentinel budget")
    shed_high: float = _key(1.0, "shed heavy when offered samples/s > this x the mode's budget")
    shed_low: float = _key(0.5, "back to normal when offered samples/s < this x the budget")
    shed_max_events_per_group: int = _key(1, "most events per group while shedding")


@dataclass
class AnomalyConfig:
    """Throughput and latency anomaly monitor: a trigger forces diagnostic mode."""

    enabled: bool = _key(True, "watch throughput (and latency, with a probe file)")
    interfaces: list[str] = field(
        default_factory=lambda: [],
        metadata=_doc("interfaces to watch in /proc/net/dev; empty: all but lo"),
    )
    poll_interval: float = _key(1.0, "seconds between two readings", DURATION)
    throughput_direction: str = _key("rx", "bytes counted: rx (as the seed), tx or both")
    throughput_ewma_alpha: float = _key(0.2, "weight of a new reading in the baseline, (0, 1]")
    throughput_ratio_trigger: float = _key(0.5, "trigger when throughput / baseline < this, (0, 1)")
    throughput_min_bps: float = _key(
        1e6, "no throughput trigger while the baseline is below this many bits/s"
    )
    latency_probe_path: str | None = _key(
        None, "file holding one latency in microseconds, rewritten by a probe"
    )
    latency_ewma_alpha: float = _key(0.2, "weight of a new latency in its baseline, (0, 1]")
    latency_ratio_trigger: float = _key(2.0, "trigger when latency / baseline > this, > 1")
    refractory_period: float = _key(
        30.0,
        "seconds diagnostic mode is held after a trigger; triggers meanwhile ignored",
        DURATION,
    )


@dataclass
class AggregatorConfig:
    """Rollups of samples per flow, function, stack, event and time bucket."""

    time_window_ns: int = _key(1_000_000_000, "time bucket of a rollup, ns")
    flush_interval: float = _key(1.0, "seconds between two flushes (table, metrics)", DURATION)
    skew_window_ns: int = _key(200_000, "a sample may wait this long for its packet, ns")


@dataclass
class MetricsConfig:
    """The OpenMetrics endpoint (/metrics)."""

    enabled: bool = _key(True, "serve /metrics")
    listen_address: str = _key("127.0.0.1", "address to serve on (--metrics-address)")
    listen_port: int = _key(9102, "port to serve on, 0: any free port (--metrics-port)")
    top_flows: int = _key(50, "flows with series of their own; the rest sum into flow=other")


@dataclass
class ControlPlaneConfig:
    """The HTTP control plane (part 2)."""

    enabled: bool = _key(False, "serve the /api/v1 control plane")
    listen_address: str = _key("127.0.0.1", "address of the control plane")
    listen_port: int = _key(9103, "port of the control plane")
    token_file: str | None = _key(None, "file with a bearer token the API requires")


@dataclass
class ClickHouseConfig:
    """Storage of rollups, raw samples, stacks and data objects (part 2)."""

    enabled: bool = _key(False, "store rollups and samples in ClickHouse")
    data_dir: str | None = _key(None, "embedded store (chDB) directory")
    url: str | None = _key(None, "remote ClickHouse HTTP endpoint, instead of data_dir")
    user: str = _key("default", "ClickHouse user")
    password_file: str | None = _key(None, "file holding the ClickHouse password")
    database: str = _key("default", "ClickHouse database")
    batch_rows: int = _key(10000, "rows per INSERT batch at most")
    flush_interval: float = _key(1.0, "seconds before a partial batch is sent", DURATION)
    spool_max_bytes: int = _key(1 << 30, "on-disk queue while the server is unreachable")
    raw_samples: bool = _key(False, "store every sample too (ms_raw_samples), not only rollups")


@dataclass
class MockConfig:
    """The synthetic sample source (--perf-mock): no kernel needed."""

    enabled: bool = _key(False, "use the mock source instead of the kernel (--perf-mock)")
    period_ms: int = _key(10, "ms between two mock sample batches (--mock-period-ms)")
    rng_seed: int = _key(1, "seed of the mock source's random numbers")
    rate: int = _key(1000, "samples/s the mock source generates, all CPUs together")


@dataclass
class TargetsConfig:
    """What to sample; every list empty: everything."""

    flow_ids: list[int] = field(
        default_factory=lambda: [], metadata=_doc("flow ids (FNV-1a 64 of the 5-tuple)")
    )
    pids: list[int] = field(
        default_factory=lambda: [], metadata=_doc("process ids (-p), filtered in the kernel")
    )
    tids: list[int] = field(default_factory=lambda: [], metadata=_doc("thread ids"))
    cgroups: list[int] = field(default_factory=lambda: [], metadata=_doc("cgroup ids"))
    ifindexes: list[int] = field(
        default_factory=lambda: [], metadata=_doc("ingress interface indexes")
    )

    def as_targets(self) -> list[dict[str, int]]:
        """The target list of the control plane's `/api/v1/targets`: one key each."""
        keys = ("flow_id", self.flow_ids), ("pid", self.pids), ("tid", self.tids)
        more = ("cgroup", self.cgroups), ("ifindex", self.ifindexes)
        return [{k: v} for k, vs in (*keys, *more) for v in vs]


@dataclass
class RunConfig:
    """How long to run and what to print."""

    duration: float | None = _key(None, "stop after this many seconds; null: at Ctrl-C", DURATION)
    json: bool = _key(False, "print one JSON object per flush window (--json)")
    verbose: int = _key(0, "detail on stderr: strategies, mode changes (-v)")


@dataclass
class SentinelConfig:
    """Everything `meridian sentinel` reads; `SentinelConfig()` is every default."""

    perf: PerfConfig = field(default_factory=PerfConfig)
    mode: ModeConfig = field(default_factory=ModeConfig)
    anomaly: AnomalyConfig = field(default_factory=AnomalyConfig)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    control_plane: ControlPlaneConfig = field(default_factory=ControlPlaneConfig)
    clickhouse: ClickHouseConfig = field(default_factory=ClickHouseConfig)
    mock: MockConfig = field(default_factory=MockConfig)
    targets: TargetsConfig = field(default_factory=TargetsConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def budget(self, mode: str) -> int:
        """The per-CPU samples/s budget of a mode (`sentinel` or `diagnostic`)."""
        p = self.perf
        return p.diagnostic_samples_per_sec if mode == "diagnostic" else p.sentinel_samples_per_sec

    def groups(self, mode: str) -> list[list[str]]:
        """The event groups of a mode, in rotation order."""
        p = self.perf
        return p.diagnostic_groups if mode == "diagnostic" else p.sentinel_groups
