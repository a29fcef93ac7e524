"""The settings of `meridian sentinel`: one pydantic model per section with every key's
default, type, limits and one-line description (`dump_config` prints it), read from
YAML, laid over by flags, changed by the control plane through the same value types
(fields.py), so that the three never disagree.

Types are strict (a YAML value must have its key's type; a flag's text is converted),
unknown keys are refused (a key that docs/requirements/sentinel.md names otherwise is
taken by either name: load.py), and a value assigned later (`cfg.perf.hard_drop_ns = 5`)
is checked as one read from a file. Budgets are samples per second per CPU, as the
kernel's per-CPU token bucket; durations are seconds, or a string with a unit (`250ms`,
`2s`, `1m`); keys ending in `_ns` are integer nanoseconds.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from .fields import (
    DURATION,
    MAX_TARGETS,
    Budget,
    EventGroups,
    HardDropNs,
    IfName,
    LbrMode,
    ModeName,
    Port,
    U32Int,
    U64Int,
    Whole,
    rule,
)
from .messages import problem

__all__ = [
    "AggregatorConfig",
    "AnomalyConfig",
    "ClickHouseConfig",
    "ControlPlaneConfig",
    "FalseSharingConfig",
    "MetricsConfig",
    "MockConfig",
    "ModeConfig",
    "PerfConfig",
    "RemoteDramConfig",
    "RunConfig",
    "SentinelConfig",
    "TargetsConfig",
]

OneOrMore = Annotated[int, Field(ge=1), rule("must be 1 or more"), Whole]
ZeroOrMore = Annotated[int, Field(ge=0), rule("must be 0 or more"), Whole]
NotNegative = Annotated[float, Field(ge=0), rule("must be 0 or more")]
Alpha = Annotated[float, Field(gt=0, le=1), rule("must be above 0 and at most 1")]
Interval = Annotated[
    float, Field(gt=0, le=3600), rule("must be above 0 and at most 3600 seconds"), DURATION
]
Host = Annotated[str, Field(pattern=r"\S"), rule("must be a host address")]
FilePath = Annotated[str, Field(min_length=1), rule("must be a path or null")]


def _key(default: Any, doc: str, seed: str | None = None) -> Any:
    """A key's default and its one-line description; `seed`: the key's name in
    docs/requirements/sentinel.md, which a file may use instead (load.py), said in the
    description."""
    if seed is None:
        return Field(default, description=doc)
    return Field(default, description=f"{doc} (seed: {seed})", json_schema_extra={"seed": seed})


def _list(doc: str, *default: Any) -> Any:
    """A list key (its own copy of the default in every config) and its description."""
    return Field(
        default_factory=lambda: [list(d) if isinstance(d, list) else d for d in default],
        description=doc,
    )


class Settings(BaseModel):
    """Strict, closed, and checked on assignment too. Built at first use, not at
    import: every `meridian` command imports the config (the sentinel's parser does)."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        validate_assignment=True,
        allow_inf_nan=False,
        defer_build=True,
    )

    def __setattr__(self, name: str, value: Any) -> None:
        """A bad value assigned is the one-line UsageError a file would get, and the
        old value stays (a section's rules across keys see the new one stored)."""
        old = self.__dict__.get(name)
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            self.__dict__[name] = old
            where = [
                s for s, f in SentinelConfig.model_fields.items() if f.annotation is type(self)
            ]
            data = {where[0]: {name: value}} if where else {name: value}
            raise problem(exc.errors(), SentinelConfig, data, str, where[:1]) from None


def _above(section: BaseModel, name: str, high: str, low: str) -> None:
    """`high` must be above `low`: a rule across two keys of section `name`."""
    hi, lo = getattr(section, high), getattr(section, low)
    if not hi > lo:
        ctx = {"key": high, "got": hi, "rule": f"must be above {name}.{low} ({lo})"}
        raise PydanticCustomError("order", "{rule}", ctx)


class PerfConfig(Settings):
    """What the kernel samples and how much of it."""

    sentinel_samples_per_sec: Budget = _key(
        1000, "token bucket budget in sentinel mode, per CPU", seed="samples_per_sec"
    )
    diagnostic_samples_per_sec: Budget = _key(
        10000, "token bucket budget in diagnostic mode, per CPU"
    )
    hard_drop_ns: HardDropNs = _key(
        0, "after the bucket runs empty, drop every sample this long; 0: off"
    )
    frequency: Annotated[
        int, Field(ge=1, le=1_000_000), rule("must be from 1 to 1000000 Hz"), Whole
    ] = _key(99, "sampling frequency of each event, Hz per CPU (-F; 99 as perf -F 99)")
    sentinel_groups: EventGroups = _list(
        "event groups of sentinel mode (cheap), rotated", ["cycles", "llc-misses"]
    )
    diagnostic_groups: EventGroups = _list(
        "event groups of diagnostic mode (richer), rotated",
        ["cycles", "instructions", "llc-misses", "branch-misses"],
        ["remote-dram", "hitm"],
    )
    rotation_window: Annotated[
        float, Field(gt=0, le=86400), rule("must be above 0 and at most 86400 seconds"), DURATION
    ] = _key(1.0, "seconds each event group holds the PMU")
    max_events_per_group: OneOrMore = _key(4, "most events opened together in normal safety level")
    xdp_interfaces: list[IfName] = _list("interfaces with an XDP flow-context hook (--xdp)")
    lbr: LbrMode = _key(
        "off",
        "branch records (LBR) of each sample, in ms_raw_samples: off, branch-stack (on) "
        "or snapshot (--lbr); refused where the CPU has no LBR",
    )


class ModeConfig(Settings):
    """Mode controller and safety level."""

    initial: ModeName = _key("sentinel", "mode at start: sentinel or diagnostic (--mode)")
    auto: bool = _key(True, "switch modes on samples/s (hysteresis) and anomaly signals")
    hysteresis_high: NotNegative = _key(
        0.9, "to diagnostic when busy samples/s >= this x what sentinel mode can deliver"
    )
    hysteresis_low: NotNegative = _key(
        0.5, "back to sentinel when busy samples/s < this x what sentinel mode can deliver"
    )
    shed_high: NotNegative = _key(
        1.0, "shed heavy when offered samples/s > this x the mode's budget"
    )
    shed_low: NotNegative = _key(0.5, "back to normal when offered samples/s < this x the budget")
    shed_max_events_per_group: OneOrMore = _key(1, "most events per group while shedding")

    @model_validator(mode="after")
    def _highs_above_lows(self) -> ModeConfig:
        _above(self, "mode", "hysteresis_high", "hysteresis_low")
        _above(self, "mode", "shed_high", "shed_low")
        return self


class AnomalyConfig(Settings):
    """Throughput and latency anomaly monitor: a trigger forces diagnostic mode."""

    enabled: bool = _key(True, "watch throughput (and latency, with a probe file)")
    interfaces: list[IfName] = _list("interfaces to watch in /proc/net/dev; empty: all but lo")
    poll_interval: Interval = _key(1.0, "seconds between two readings")
    throughput_direction: Literal["rx", "tx", "both"] = _key(
        "rx", "bytes counted: rx (as the seed), tx or both"
    )
    throughput_ewma_alpha: Alpha = _key(0.2, "weight of a new reading in the baseline, (0, 1]")
    throughput_ratio_trigger: Annotated[
        float, Field(gt=0, lt=1), rule("must be between 0 and 1 (a drop)")
    ] = _key(0.5, "trigger when throughput / baseline < this, (0, 1)")
    throughput_min_bps: NotNegative = _key(
        1e6, "no throughput trigger while the baseline is below this many bits/s"
    )
    latency_probe_path: FilePath | None = _key(
        None, "file holding one latency in microseconds, rewritten by a probe"
    )
    latency_ewma_alpha: Alpha = _key(0.2, "weight of a new latency in its baseline, (0, 1]")
    latency_ratio_trigger: Annotated[float, Field(gt=1), rule("must be above 1 (a spike)")] = _key(
        2.0, "trigger when latency / baseline > this, > 1"
    )
    refractory_period: Annotated[
        float, Field(ge=0), rule("must be 0 or more seconds"), DURATION
    ] = _key(30.0, "seconds diagnostic mode is held after a trigger; triggers meanwhile ignored")


# The detectors' sections: their keys are keyword arguments of the detectors' own
# constructors, with the same defaults (the config does not import the detectors,
# a plug-in layer; test_sentinel_detector_config checks that the two agree). Each
# finding is a series of its gauge, each key a row of some 50 bytes in a window.
MAX_FINDINGS = 10_000
MAX_KEYS = 1 << 24
Findings = Annotated[
    int, Field(ge=1, le=MAX_FINDINGS), rule(f"must be from 1 to {MAX_FINDINGS}"), Whole
]
Keys = Annotated[int, Field(ge=1, le=MAX_KEYS), rule(f"must be from 1 to {MAX_KEYS}"), Whole]
WindowNs = Annotated[
    int,
    Field(ge=0, le=3600 * 10**9),
    rule("must be from 0 (every flush) to 3600000000000 nanoseconds (an hour)"),
    Whole,
]
_WINDOW = "a window closes at the first flush this long after it opened, ns; 0: every flush"


class FalseSharingConfig(Settings):
    """The false-sharing detector (ms_false_sharing_score): HITM samples per cache line."""

    min_hits: OneOrMore = _key(
        4, "HITM samples a CPU (or process) needs on a line in a window to share it"
    )
    min_sharers: Annotated[int, Field(ge=2), rule("must be 2 or more"), Whole] = _key(
        2, "CPUs, or processes, sharing a line (min_hits each) to report it"
    )
    min_window_ns: WindowNs = _key(0, _WINDOW)
    max_keys: Keys = _key(
        1 << 16, "(line, cpu, pid) counts kept per window; past it the coldest are dropped"
    )
    max_findings: Findings = _key(100, "lines reported per window at most, the highest scores")


class RemoteDramConfig(Settings):
    """The remote-DRAM detector (ms_remote_dram_hotspot): samples per flow, node, interface."""

    min_samples: OneOrMore = _key(
        1, "remote-DRAM samples a (flow, node, interface) needs in a window"
    )
    min_window_ns: WindowNs = _key(0, _WINDOW)
    max_keys: Keys = _key(
        1 << 16, "(flow, node, interface) counts kept per window; past it the coldest drop"
    )
    max_findings: Findings = _key(
        100, "entries reported per window at most, the most samples first"
    )


class AggregatorConfig(Settings):
    """Rollups of samples per flow, function, stack, event and time bucket."""

    time_window_ns: Annotated[int, Field(ge=1_000_000), rule("must be 1 ms or more"), Whole] = _key(
        1_000_000_000, "time bucket of a rollup, ns"
    )
    flush_interval: Interval = _key(1.0, "seconds between two flushes (table, metrics)")
    skew_window_ns: ZeroOrMore = _key(200_000, "a sample may wait this long for its packet, ns")


class MetricsConfig(Settings):
    """The OpenMetrics endpoint (/metrics)."""

    enabled: bool = _key(True, "serve /metrics")
    listen_address: Host = _key("127.0.0.1", "address to serve on (--prometheus HOST:PORT)")
    listen_port: Port = _key(9102, "port to serve on, 0: any free port (--prometheus)")
    top_flows: OneOrMore = _key(50, "flows with series of their own; the rest sum into flow=other")
    top_services: OneOrMore = _key(
        50, "services with series of their own; the rest sum into service_addr=other"
    )


class ControlPlaneConfig(Settings):
    """The HTTP control plane (part 2)."""

    enabled: bool = _key(False, "serve the /api/v1 control plane")
    listen_address: Host = _key("127.0.0.1", "address of the control plane")
    listen_port: Port = _key(9103, "port of the control plane")
    token_file: FilePath | None = _key(None, "file with a bearer token the API requires")


class ClickHouseConfig(Settings):
    """Storage of rollups, raw samples, stacks and data objects (part 2)."""

    enabled: bool = _key(False, "store rollups and samples in ClickHouse")
    data_dir: str | None = _key(None, "embedded store (chDB) directory")
    url: str | None = _key(
        None, "remote ClickHouse HTTP endpoint, instead of data_dir", seed="endpoint"
    )
    user: str = _key("default", "ClickHouse user")
    password_file: str | None = _key(None, "file holding the ClickHouse password")
    database: str = _key("default", "ClickHouse database")
    retention_days: ZeroOrMore = _key(
        14, "days rollups and raw samples are kept (the tables' TTL); 0: forever"
    )
    batch_rows: OneOrMore = _key(10000, "rows per INSERT batch at most")
    flush_interval: Interval = _key(1.0, "seconds before a partial batch is sent")
    spool_dir: str | None = _key(
        None, "every batch waits here on disk until the store has it (one agent per spool)"
    )
    spool_max_bytes: ZeroOrMore = _key(1 << 30, "the spool's size at most; past it rows drop")
    max_backoff: Interval = _key(10.0, "seconds between two tries of a store that is down")
    raw_samples: bool = _key(False, "store every sample too (ms_raw_samples), not only rollups")


class MockConfig(Settings):
    """The synthetic sample source (--perf-mock): no kernel needed."""

    enabled: bool = _key(False, "use the mock source instead of the kernel (--perf-mock)")
    period_ms: Annotated[int, Field(ge=1), rule("must be 1 ms or more"), Whole] = _key(
        10, "ms between two mock sample batches (--mock-period-ms)"
    )
    rng_seed: int = _key(1, "seed of the mock source's random numbers")
    rate: int = _key(1000, "samples/s the mock source generates, all CPUs together")


class TargetsConfig(Settings):
    """What to sample; every list empty: everything."""

    flow_ids: list[U64Int] = _list("flow ids (FNV-1a 64 of the 5-tuple)")
    pids: list[U32Int] = _list("process ids (-p), filtered in the kernel")
    tids: list[U32Int] = _list("thread ids")
    cgroups: list[U64Int] = _list("cgroup ids")
    ifindexes: list[U32Int] = _list("ingress interface indexes")

    @model_validator(mode="after")
    def _fit(self) -> TargetsConfig:
        """As many targets as the control plane takes (every pid fits the kernel map)."""
        lists = {k: getattr(self, k) for k in type(self).model_fields}
        total = sum(len(v) for v in lists.values())
        if total > MAX_TARGETS:
            rule = f"at most {MAX_TARGETS} targets in all ({', '.join(lists)})"
            ctx = {"key": max(lists, key=lambda k: len(lists[k])), "got": total, "rule": rule}
            raise PydanticCustomError("too_many", "{rule}", ctx)
        return self

    def as_targets(self) -> list[dict[str, int]]:
        """The target list of the control plane's `/api/v1/targets`: one key each."""
        keys = ("flow_id", self.flow_ids), ("pid", self.pids), ("tid", self.tids)
        more = ("cgroup", self.cgroups), ("ifindex", self.ifindexes)
        return [{k: v} for k, vs in (*keys, *more) for v in vs]


# `json` is the key's given name (--json's); it shadows BaseModel's deprecated json(),
# which nothing calls
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", 'Field name "json"', UserWarning)

    class RunConfig(Settings):
        """How long to run and what to print."""

        duration: (
            Annotated[float, Field(gt=0), rule("must be above 0 seconds"), DURATION] | None
        ) = _key(None, "stop after this many seconds; null: at Ctrl-C")
        json: bool = _key(False, "print one JSON object per flush window (--json)")  # type: ignore[assignment]
        group_by: Literal["service", "flow"] = _key(
            "service",
            "rows of the live table and the summary: one per service (the listening "
            "address, port and protocol) or one per flow (5-tuple) (--by)",
        )
        verbose: ZeroOrMore = _key(0, "detail on stderr: strategies, mode changes (-v)")


class SentinelConfig(Settings):
    """Everything `meridian sentinel` reads; `SentinelConfig()` is every default."""

    perf: PerfConfig = Field(default_factory=PerfConfig)
    mode: ModeConfig = Field(default_factory=ModeConfig)
    anomaly: AnomalyConfig = Field(default_factory=AnomalyConfig)
    aggregator: AggregatorConfig = Field(default_factory=AggregatorConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    control_plane: ControlPlaneConfig = Field(default_factory=ControlPlaneConfig)
    clickhouse: ClickHouseConfig = Field(default_factory=ClickHouseConfig)
    mock: MockConfig = Field(default_factory=MockConfig)
    targets: TargetsConfig = Field(default_factory=TargetsConfig)
    # a section per detector, named as it (its keys: the detector's keyword arguments)
    false_sharing: FalseSharingConfig = Field(default_factory=FalseSharingConfig)
    remote_dram: RemoteDramConfig = Field(default_factory=RemoteDramConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    def budget(self, mode: str) -> int:
        """The per-CPU samples/s budget of a mode (`sentinel` or `diagnostic`)."""
        p = self.perf
        return p.diagnostic_samples_per_sec if mode == "diagnostic" else p.sentinel_samples_per_sec

    def groups(self, mode: str) -> list[list[str]]:
        """The event groups of a mode, in rotation order."""
        p = self.perf
        return p.diagnostic_groups if mode == "diagnostic" else p.sentinel_groups
