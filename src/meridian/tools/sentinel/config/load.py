"""The configuration of `meridian sentinel`: one YAML file with the key names of
docs/requirements/sentinel.md, read into the settings model (schema.py), the
command-line flags laid over it, and printed back (`--print-config`).

Sections: `perf` (budgets, events, rotation), `mode` (hysteresis, safety level),
`anomaly` (interfaces, EWMA baselines, triggers), `aggregator`, `metrics`, `mock`,
`targets`, `run` (duration and output), `control_plane` / `clickhouse`, and one per
detector (`false_sharing`, `remote_dram`: its thresholds).

Where docs/requirements/sentinel.md names a key otherwise (`clickhouse.endpoint` for
`clickhouse.url`, `perf.samples_per_sec` for `perf.sentinel_samples_per_sec`), a file
may use either name, not both; `--print-config` says that name in the key's description
("(seed: endpoint)").

Every mistake is a `UsageError` of one line naming the key (or the flag) and the
value: malformed YAML, an unknown key (with the closest known one), a wrong type, a
value out of its limits, an unknown event name. PyYAML is imported only to read a
file; `dump_config` writes YAML without it, so `--print-config` works everywhere.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from ....errors import ExtraMissing, UsageError
from ....export.prometheus import parse_listen
from .fields import parse_groups
from .messages import problem, seed_keys, show_value
from .schema import SentinelConfig

__all__ = [
    "SentinelConfig",
    "dump_config",
    "load_config",
    "merge_args",
    "parse_config",
    "parse_groups",
]


def _build(
    data: Mapping[str, Any], label: Callable[[str], str] = str, strict: bool = True
) -> SentinelConfig:
    """`data` (sections of keys) as the settings model; `strict` False converts text,
    as flags are."""
    try:
        return SentinelConfig.model_validate(data, strict=strict)
    except ValidationError as exc:
        raise problem(exc.errors(), SentinelConfig, data, label) from None


def _sections(data: Mapping[Any, Any]) -> dict[str, Any]:
    """YAML's mapping with text keys; an empty section (`clickhouse:`) is no key set."""
    out: dict[str, Any] = {}
    for name, body in data.items():
        if isinstance(body, Mapping):
            body = {str(k): v for k, v in body.items()}
        out[str(name)] = {} if body is None else body
    return out


def _seed_names(data: dict[str, Any]) -> dict[str, str]:
    """Rename, in place, the keys given by their name in docs/requirements/sentinel.md
    to ours; returns our key -> the name given, so that a message names the key as the
    file wrote it."""
    given: dict[str, str] = {}
    for section, names in seed_keys(SentinelConfig).items():
        body = data.get(section)
        if not isinstance(body, dict):
            continue
        for seed, ours in names.items():
            if seed not in body:
                continue
            if ours in body:
                raise UsageError(
                    f"{section}.{seed} is the seed's name of {section}.{ours}: "
                    "give one of them, not both"
                )
            body[ours] = body.pop(seed)
            given[f"{section}.{ours}"] = f"{section}.{seed}"
    return given


def parse_config(text: str, origin: str = "config") -> SentinelConfig:
    """A YAML document to a validated config; errors start with `origin`."""
    try:
        yaml: Any = importlib.import_module("yaml")
    except ImportError:
        raise ExtraMissing("--config", "sentinel") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        detail = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{origin}: not valid YAML{where}: {detail}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise UsageError(f"{origin}: expected a mapping of sections, got {show_value(data)}")
    try:
        sections = _sections(data)
        given = _seed_names(sections)
        return _build(sections, lambda key: given.get(key, key))
    except UsageError as exc:
        raise UsageError(f"{origin}: {exc}") from None


def load_config(path: str | os.PathLike[str] | None) -> SentinelConfig:
    """The config in YAML file `path` (None: every default)."""
    if path is None:
        return SentinelConfig()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"config {os.fspath(path)}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"config {os.fspath(path)}: not UTF-8 text") from None
    return parse_config(text, f"config {os.fspath(path)}")


# --- command line --------------------------------------------------------------------

# argparse dest -> (config key, flag as the person typed it)
FLAGS: dict[str, tuple[str, str]] = {
    "mode": ("mode.initial", "--mode"),
    "frequency": ("perf.frequency", "-F/--frequency"),
    "samples_per_sec": ("perf.sentinel_samples_per_sec", "--samples-per-sec"),
    "diagnostic_samples_per_sec": (
        "perf.diagnostic_samples_per_sec",
        "--diagnostic-samples-per-sec",
    ),
    "hard_drop_ns": ("perf.hard_drop_ns", "--hard-drop-ns"),
    "interface": ("anomaly.interfaces", "--interface"),
    "xdp": ("perf.xdp_interfaces", "--xdp"),
    "lbr": ("perf.lbr", "--lbr"),
    "pid": ("targets.pids", "-p/--pid"),
    "metrics_port": ("metrics.listen_port", "--metrics-port"),
    "metrics_address": ("metrics.listen_address", "--metrics-address"),
    "api_port": ("control_plane.listen_port", "--api-port"),
    "api_address": ("control_plane.listen_address", "--api-address"),
    "api_token_file": ("control_plane.token_file", "--api-token-file"),
    "data_dir": ("clickhouse.data_dir", "--data-dir"),
    "clickhouse_url": ("clickhouse.url", "--clickhouse-url"),
    "clickhouse_user": ("clickhouse.user", "--clickhouse-user"),
    "clickhouse_password_file": ("clickhouse.password_file", "--clickhouse-password-file"),
    "spool_dir": ("clickhouse.spool_dir", "--spool-dir"),
    "raw_samples": ("clickhouse.raw_samples", "--raw-samples"),
    "perf_mock": ("mock.enabled", "--perf-mock"),
    "mock_period_ms": ("mock.period_ms", "--mock-period-ms"),
    "duration": ("run.duration", "--duration"),
    "json": ("run.json", "--json"),
    "by": ("run.group_by", "--by"),
    "verbose": ("run.verbose", "-v"),
}
# a flag that names what to serve or store turns it on
_TURNS_ON = {
    "metrics.listen_port": "metrics.enabled",
    "control_plane.listen_port": "control_plane.enabled",
    "clickhouse.data_dir": "clickhouse.enabled",
    "clickhouse.url": "clickhouse.enabled",
}


def _event_groups(events: Any) -> list[list[str]] | None:
    """`--events A,B;C` (or a repeated flag's list, one group per item) as groups."""
    if events is None:
        return None
    texts = events if isinstance(events, (list, tuple)) else str(events).split(";")
    groups = [[e.strip() for e in str(g).split(",") if e.strip()] for g in texts]
    groups = [g for g in groups if g]
    if not groups:
        raise UsageError(f"--events: name at least one event, e.g. cycles, got {events!r}")
    return groups


def merge_args(cfg: SentinelConfig, args: argparse.Namespace) -> SentinelConfig:
    """A copy of `cfg` with every flag that was given (not None) laid over it, checked
    again; messages name the flag. `--events A,B;C` sets the groups of both modes
    (`;` separates groups that take turns on the PMU)."""
    data = cfg.model_dump()
    given: dict[str, str] = {}

    def put(key: str, value: Any, flag: str) -> None:
        section, name = key.split(".")
        data[section][name] = value
        given[key] = flag

    for dest, (key, flag) in FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            put(key, list(value) if isinstance(value, tuple) else value, flag)
    prometheus = getattr(args, "prometheus", None)
    if prometheus is not None:
        for key in ("metrics.listen_port", "metrics.listen_address"):
            if key in given:
                raise UsageError(f"--prometheus and {given[key]} both set /metrics: give one")
        host, port = parse_listen(prometheus, any_port=True)
        put("metrics.listen_address", host, "--prometheus")
        put("metrics.listen_port", port, "--prometheus")
    groups = _event_groups(getattr(args, "events", None))
    if groups is not None:
        put("perf.sentinel_groups", groups, "--events")
        put("perf.diagnostic_groups", [list(g) for g in groups], "--events")
    for key, switch in _TURNS_ON.items():
        if given.get(key):
            section, name = switch.split(".")
            data[section][name] = True
    for key in ("control_plane.listen_address", "control_plane.token_file"):
        if key in given and not data["control_plane"]["enabled"]:
            raise UsageError(f"{given[key]} needs --api-port (or control_plane.enabled: true)")
    return _build(data, lambda key: given.get(key, key), strict=False)


# --- printing ------------------------------------------------------------------------


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = repr(v)
        if "e" in text:  # PyYAML reads 1e-06 as a string
            text = f"{v:.20f}".rstrip("0")
            text += "0" if text.endswith(".") else ""
        return text
    if isinstance(v, list):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False)


def dump_config(cfg: SentinelConfig | None = None, unset: dict[str, str] | None = None) -> str:
    """YAML of every key with its value and description (--print-config); reading it
    back gives the same config. `unset`: key -> what a null there means on this host."""
    cfg = cfg if cfg is not None else SentinelConfig()
    lines = [
        "# meridian sentinel configuration: every key, with its default unless overridden.",
        "# Budgets are samples per second per CPU. Durations are seconds or strings such",
        '# as "250ms", "2s", "1m"; keys ending in _ns are integer nanoseconds.',
    ]
    for sname in type(cfg).model_fields:
        section = getattr(cfg, sname)
        doc = (type(section).__doc__ or "").strip().splitlines()[0]
        lines += ["", f"# {doc}", f"{sname}:"]
        for name, f in type(section).model_fields.items():
            value = getattr(section, name)
            meaning = (unset or {}).get(f"{sname}.{name}") if value is None else None
            lines.append(f"  # {f.description or ''}" + (f" (null: {meaning})" if meaning else ""))
            lines.append(f"  {name}: {_yaml_scalar(value)}")
    return "\n".join(lines) + "\n"
