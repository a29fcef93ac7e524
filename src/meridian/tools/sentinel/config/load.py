"""The configuration of `meridian sentinel`: one YAML file with the seed's key names,
nested dataclasses with every default, strict validation, and the command-line flags
laid over it.

Sections: `perf` (budgets, events, rotation), `mode` (hysteresis, safety level),
`anomaly` (interfaces, EWMA baselines, triggers), `aggregator`, `metrics`, `mock`,
`targets`, `run` (duration and output), and `control_plane` / `clickhouse`, read by
part 2. Budgets are samples per second per CPU, as the kernel's per-CPU token bucket.
Durations are seconds, or a string with a unit (`250ms`, `2s`, `1m`); keys ending in
`_ns` are integer nanoseconds.

Every mistake is a `UsageError` of one line naming the key and the value: malformed
YAML, an unknown key (with the closest known one), a wrong type, a negative budget,
an unknown event name. PyYAML is imported only to read a file; `dump_config` writes
YAML without it, so `--print-config` works everywhere.

This module reads, merges and prints; the keys and their defaults are in
`config_schema`, reading one value in `config_values`, the rules in `config_rules`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
from collections.abc import Mapping
from typing import Any

from ....errors import ExtraMissing, UsageError
from .rules import parse_groups, validate
from .schema import SentinelConfig
from .values import copy_value, key_fields, set_key, show_value, unknown_key

__all__ = [
    "SentinelConfig",
    "dump_config",
    "load_config",
    "merge_args",
    "parse_config",
    "parse_groups",
    "validate",
]


def _from_mapping(data: Mapping[Any, Any]) -> SentinelConfig:
    cfg = SentinelConfig()
    sections = key_fields(cfg)
    for sname, body in data.items():
        sname = str(sname)
        if sname not in sections:
            raise unknown_key(sname, list(sections), "")
        if body is None:
            continue
        if not isinstance(body, Mapping):
            raise UsageError(f"{sname}: expected a mapping of keys, got {show_value(body)}")
        section = getattr(cfg, sname)
        keys = key_fields(section)
        for key, value in body.items():
            key = str(key)
            if key not in keys:
                raise unknown_key(key, list(keys), sname)
            set_key(section, key, value, f"{sname}.{key}")
    return cfg


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
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{origin}: not valid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise UsageError(f"{origin}: expected a mapping of sections, got {show_value(data)}")
    try:
        cfg = _from_mapping(data)
        validate(cfg)
    except UsageError as exc:
        raise UsageError(f"{origin}: {exc}") from None
    return cfg


def load_config(path: str | os.PathLike[str] | None) -> SentinelConfig:
    """The config in YAML file `path` (None: every default)."""
    if path is None:
        cfg = SentinelConfig()
        validate(cfg)
        return cfg
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
    "raw_samples": ("clickhouse.raw_samples", "--raw-samples"),
    "perf_mock": ("mock.enabled", "--perf-mock"),
    "mock_period_ms": ("mock.period_ms", "--mock-period-ms"),
    "duration": ("run.duration", "--duration"),
    "json": ("run.json", "--json"),
    "verbose": ("run.verbose", "-v"),
}


def _clone(cfg: SentinelConfig) -> SentinelConfig:
    out = SentinelConfig()
    for s in key_fields(cfg):
        sec = getattr(cfg, s)
        copies = {k: copy_value(getattr(sec, k)) for k in key_fields(sec)}
        setattr(out, s, dataclasses.replace(sec, **copies))
    return out


def merge_args(cfg: SentinelConfig, args: argparse.Namespace) -> SentinelConfig:
    """A copy of `cfg` with every flag that was given (not None) laid over it, checked
    again; messages name the flag. `--events A,B;C` sets the groups of both modes
    (`;` separates groups that take turns on the PMU; a repeated flag's list gives
    one group per item)."""
    out = _clone(cfg)
    given: dict[str, str] = {}
    for dest, (key, flag) in FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        sname, name = key.split(".")
        if isinstance(value, tuple):
            value = list(value)
        set_key(getattr(out, sname), name, value, flag, text_ok=True)
        given[key] = flag
    events = getattr(args, "events", None)
    if events is not None:
        texts = events if isinstance(events, (list, tuple)) else str(events).split(";")
        groups = [[e.strip() for e in str(g).split(",") if e.strip()] for g in texts]
        groups = [g for g in groups if g]
        if not groups:
            raise UsageError(f"--events: name at least one event, e.g. cycles, got {events!r}")
        out.perf.sentinel_groups = copy_value(groups)
        out.perf.diagnostic_groups = copy_value(groups)
        given["perf.sentinel_groups"] = given["perf.diagnostic_groups"] = "--events"
    if given.get("metrics.listen_port"):
        out.metrics.enabled = True
    if given.get("control_plane.listen_port"):
        out.control_plane.enabled = True
    for key in ("control_plane.listen_address", "control_plane.token_file"):
        if key in given and not out.control_plane.enabled:
            raise UsageError(f"{given[key]} needs --api-port (or control_plane.enabled: true)")
    if given.get("clickhouse.data_dir") or given.get("clickhouse.url"):
        out.clickhouse.enabled = True

    def label(key: str) -> str:
        return given.get(key, key)

    validate(out, label)
    return out


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
        if "e" in text or "inf" in text or "nan" in text:  # PyYAML reads 1e-06 as a string
            text = f"{v:.20f}".rstrip("0")
            text += "0" if text.endswith(".") else ""
        return text
    if isinstance(v, list):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False)


def dump_config(cfg: SentinelConfig | None = None) -> str:
    """YAML of every key with its value and description (--print-config); reading it
    back gives the same config."""
    cfg = cfg if cfg is not None else SentinelConfig()
    lines = [
        "# meridian sentinel configuration: every key, with its default unless overridden.",
        "# Budgets are samples per second per CPU. Durations are seconds or strings such",
        '# as "250ms", "2s", "1m"; keys ending in _ns are integer nanoseconds.',
    ]
    for sname in key_fields(cfg):
        section = getattr(cfg, sname)
        doc = (type(section).__doc__ or "").strip().splitlines()[0]
        lines += ["", f"# {doc}", f"{sname}:"]
        for name, (f, _) in key_fields(section).items():
            lines.append(f"  # {f.metadata.get('doc', '')}")
            lines.append(f"  {name}: {_yaml_scalar(getattr(section, name))}")
    return "\n".join(lines) + "\n"
