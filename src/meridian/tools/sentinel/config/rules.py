"""The rules a configuration must follow beyond its types: ranges, cross-key order
(high above low), event names and interface names. Checked after a file is read and
again after flags are laid over it, so a bad value never reaches the runtime.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from ....errors import UsageError
from .schema import DIRECTIONS, MODES, SentinelConfig
from .values import show_value

__all__ = ["parse_groups", "validate"]

_IFNAME_RE = re.compile(r"^[^\s/:]{1,15}$")


def parse_groups(groups: list[list[str]], label: str) -> list[list[Any]]:
    """Event groups to `EventSpec` groups (events.parse_events); an empty list, an
    empty group or an unknown event name is a UsageError naming `label`."""
    from ..sources.pmu_events import parse_events

    if not groups:
        raise UsageError(f"{label}: needs at least one event group, got []")
    out = []
    for i, group in enumerate(groups):
        if not group:
            raise UsageError(f"{label}[{i}]: an event group needs at least one event, got []")
        try:
            out.append(parse_events(",".join(group)))
        except UsageError as exc:
            raise UsageError(f"{label}: {exc}") from None
    return out


def _no_label(key: str) -> str:
    return key


def validate(cfg: SentinelConfig, label: Callable[[str], str] = _no_label) -> None:
    """Ranges and cross-key rules; `label(key)` names a key in the message (a flag when
    the value came from the command line)."""

    def bad(key: str, value: Any, rule: str) -> UsageError:
        return UsageError(f"{label(key)}: {rule}, got {show_value(value)}")

    def at_least(key: str, value: float, low: float, rule: str) -> None:
        if not value >= low or math.isinf(value):
            raise bad(key, value, rule)

    def between(key: str, value: float, low: float, high: float, rule: str) -> None:
        if not low < value <= high:
            raise bad(key, value, rule)

    def ifnames(key: str, names: list[str]) -> None:
        for n in names:
            if not _IFNAME_RE.match(n):
                raise bad(key, n, "an interface name has 1 to 15 characters, no '/', ':' or space")

    p, m, a = cfg.perf, cfg.mode, cfg.anomaly
    for key in ("sentinel_samples_per_sec", "diagnostic_samples_per_sec"):
        at_least(
            f"perf.{key}",
            getattr(p, key),
            1,
            "a budget is samples per second per CPU and must be positive",
        )
    at_least("perf.hard_drop_ns", p.hard_drop_ns, 0, "must be 0 (off) or more nanoseconds")
    if not 1 <= p.frequency <= 1_000_000:
        raise bad("perf.frequency", p.frequency, "must be from 1 to 1000000 Hz")
    between("perf.rotation_window", p.rotation_window, 0, 86400, "must be above 0 seconds")
    at_least("perf.max_events_per_group", p.max_events_per_group, 1, "must be 1 or more")
    parse_groups(p.sentinel_groups, label("perf.sentinel_groups"))
    parse_groups(p.diagnostic_groups, label("perf.diagnostic_groups"))
    ifnames("perf.xdp_interfaces", p.xdp_interfaces)

    if m.initial not in MODES:
        raise bad("mode.initial", m.initial, "must be sentinel or diagnostic")
    at_least("mode.hysteresis_low", m.hysteresis_low, 0, "must be 0 or more")
    if not m.hysteresis_high > m.hysteresis_low:
        raise bad(
            "mode.hysteresis_high",
            m.hysteresis_high,
            f"must be above mode.hysteresis_low ({m.hysteresis_low})",
        )
    at_least("mode.shed_low", m.shed_low, 0, "must be 0 or more")
    if not m.shed_high > m.shed_low:
        raise bad("mode.shed_high", m.shed_high, f"must be above mode.shed_low ({m.shed_low})")
    at_least("mode.shed_max_events_per_group", m.shed_max_events_per_group, 1, "must be 1 or more")

    ifnames("anomaly.interfaces", a.interfaces)
    between("anomaly.poll_interval", a.poll_interval, 0, 3600, "must be above 0 seconds")
    if a.throughput_direction not in DIRECTIONS:
        raise bad("anomaly.throughput_direction", a.throughput_direction, "must be rx, tx or both")
    for key in ("throughput_ewma_alpha", "latency_ewma_alpha"):
        between(f"anomaly.{key}", getattr(a, key), 0, 1, "must be above 0 and at most 1")
    if not 0 < a.throughput_ratio_trigger < 1:
        raise bad(
            "anomaly.throughput_ratio_trigger",
            a.throughput_ratio_trigger,
            "must be between 0 and 1 (a drop)",
        )
    at_least(
        "anomaly.latency_ratio_trigger",
        a.latency_ratio_trigger,
        1.0000001,
        "must be above 1 (a spike)",
    )
    at_least("anomaly.throughput_min_bps", a.throughput_min_bps, 0, "must be 0 or more")
    at_least("anomaly.refractory_period", a.refractory_period, 0, "must be 0 or more seconds")
    if a.latency_probe_path == "":
        raise bad("anomaly.latency_probe_path", "", "must be a path or null")

    g = cfg.aggregator
    at_least("aggregator.time_window_ns", g.time_window_ns, 1_000_000, "must be 1 ms or more")
    between("aggregator.flush_interval", g.flush_interval, 0, 3600, "must be above 0 seconds")
    at_least("aggregator.skew_window_ns", g.skew_window_ns, 0, "must be 0 or more")

    for s in ("metrics", "control_plane"):
        sec = getattr(cfg, s)
        if not 0 <= sec.listen_port <= 65535:
            raise bad(f"{s}.listen_port", sec.listen_port, "must be from 0 to 65535")
        if not sec.listen_address.strip():
            raise bad(f"{s}.listen_address", sec.listen_address, "must be a host address")
    at_least("metrics.top_flows", cfg.metrics.top_flows, 1, "must be 1 or more")
    if cfg.control_plane.token_file == "":
        raise bad("control_plane.token_file", "", "must be a path or null")

    c = cfg.clickhouse
    at_least("clickhouse.batch_rows", c.batch_rows, 1, "must be 1 or more")
    between("clickhouse.flush_interval", c.flush_interval, 0, 3600, "must be above 0 seconds")
    at_least("clickhouse.spool_max_bytes", c.spool_max_bytes, 0, "must be 0 or more")

    at_least("mock.period_ms", cfg.mock.period_ms, 1, "must be 1 ms or more")
    t = cfg.targets
    for key in ("flow_ids", "pids", "tids", "cgroups", "ifindexes"):
        for v in getattr(t, key):
            at_least(f"targets.{key}", v, 0, "ids are 0 or more")
    if cfg.run.duration is not None:
        between("run.duration", cfg.run.duration, 0, math.inf, "must be above 0 seconds")
    at_least("run.verbose", cfg.run.verbose, 0, "must be 0 or more")
