"""The sentinel's YAML config: defaults, --print-config round trip, flags over the
file, and every bad input as a one-line UsageError naming the key and the value."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from meridian.errors import ExtraMissing, UsageError
from meridian.tools.sentinel.config.load import (
    SentinelConfig,
    dump_config,
    load_config,
    merge_args,
    parse_config,
)

FLAG_DESTS = [
    *("mode", "frequency", "events", "samples_per_sec", "diagnostic_samples_per_sec"),
    *("hard_drop_ns", "interface", "xdp", "pid", "metrics_port", "metrics_address"),
    *("perf_mock", "mock_period_ms", "duration", "json", "verbose"),
]


def args(**given: Any) -> argparse.Namespace:
    """The namespace R's cli gives: every flag None unless set."""
    ns = argparse.Namespace(**dict.fromkeys(FLAG_DESTS))
    for k, v in given.items():
        setattr(ns, k, v)
    return ns


def error(text: str) -> str:
    with pytest.raises(UsageError) as exc:
        parse_config(text, "config x.yaml")
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_defaults_follow_the_seed() -> None:
    cfg = load_config(None)
    assert cfg == SentinelConfig()
    assert cfg.perf.sentinel_samples_per_sec == 1000
    assert cfg.perf.diagnostic_samples_per_sec == 10000
    assert cfg.metrics.listen_address == "127.0.0.1"
    assert cfg.metrics.listen_port == 9102
    assert cfg.control_plane.listen_address == "127.0.0.1"
    assert cfg.budget("diagnostic") == 10000
    assert cfg.groups("sentinel") == [["cycles", "llc-misses"]]


def test_dump_prints_every_key_and_reads_back() -> None:
    text = dump_config()
    cfg = SentinelConfig()
    for name in SentinelConfig.model_fields:
        assert f"\n{name}:\n" in text
        for key in type(getattr(cfg, name)).model_fields:
            assert f"\n  {key}: " in text, key
    for key in (
        "sentinel_samples_per_sec",
        "diagnostic_samples_per_sec",
        "hard_drop_ns",
        "rotation_window",
        "hysteresis_high",
        "hysteresis_low",
        "throughput_ewma_alpha",
        "throughput_ratio_trigger",
        "latency_probe_path",
        "latency_ratio_trigger",
        "refractory_period",
        "interfaces",
    ):  # the names of docs/requirements/sentinel.md
        assert f"  {key}: " in text
    assert parse_config(text) == cfg


def test_dump_of_a_changed_config_reads_back() -> None:
    cfg = SentinelConfig()
    cfg.anomaly.latency_probe_path = '/run/probe "x".us'
    cfg.anomaly.throughput_min_bps = 1e-7
    cfg.run.duration = 2.5
    cfg.perf.sentinel_groups = [["raw:0x1cd:0x1e"], ["cpu-clock"]]
    assert parse_config(dump_config(cfg)) == cfg


def test_a_file_overrides_defaults(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "perf:\n  sentinel_samples_per_sec: 200\n  rotation_window: 250ms\n"
        "  sentinel_groups: [[cpu-clock]]\n"
        "anomaly:\n  interfaces: [eth0, veth1]\n  refractory_period: 1m\n"
        "metrics:\n  listen_port: 0\n"
        "clickhouse:\n"  # an empty section is allowed
    )
    cfg = load_config(path)
    assert cfg.perf.sentinel_samples_per_sec == 200
    assert cfg.perf.rotation_window == 0.25
    assert cfg.perf.sentinel_groups == [["cpu-clock"]]
    assert cfg.anomaly.interfaces == ["eth0", "veth1"]
    assert cfg.anomaly.refractory_period == 60.0
    assert cfg.metrics.listen_port == 0
    assert cfg.perf.diagnostic_samples_per_sec == 10000  # untouched
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\n")
    assert load_config(empty) == SentinelConfig()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("perf: [1, 2\n", "config x.yaml: not valid YAML at line 2, column 1"),
        ("perf:\n  sentinel_samples_per_sec: 1\n bad", "config x.yaml: not valid YAML at line"),
        ("- 1\n- 2\n", "config x.yaml: expected a mapping of sections, got [1, 2]"),
        ("perf: 5\n", "config x.yaml: perf: expected a mapping of keys, got 5"),
        (
            "perf:\n  sentinel_sample_per_sec: 5\n",
            "config x.yaml: unknown key perf.sentinel_sample_per_sec: "
            "did you mean perf.sentinel_samples_per_sec?",
        ),
        (
            "perf:\n  interfaces: [eth0]\n",
            "config x.yaml: unknown key perf.interfaces: did you mean anomaly.interfaces?",
        ),
        (
            "anomaly:\n  refractory: 5\n",
            "config x.yaml: unknown key anomaly.refractory: "
            "did you mean anomaly.refractory_period?",
        ),
        ("metric:\n  listen_port: 1\n", "config x.yaml: unknown key metric: did you mean metrics?"),
        (
            "perf:\n  sentinel_samples_per_sec: abc\n",
            "config x.yaml: perf.sentinel_samples_per_sec: expected an integer, got 'abc'",
        ),
        (
            "perf:\n  sentinel_samples_per_sec: 1.5\n",
            "config x.yaml: perf.sentinel_samples_per_sec: expected an integer, got 1.5",
        ),
        (
            "metrics:\n  enabled: 1\n",
            "config x.yaml: metrics.enabled: expected true or false, got 1",
        ),
        (
            "anomaly:\n  interfaces: eth0\n",
            "config x.yaml: anomaly.interfaces: expected a list of strings, got 'eth0'",
        ),
        (
            "perf:\n  sentinel_groups: [cycles, llc-misses]\n",
            "config x.yaml: perf.sentinel_groups: expected a list of lists, such as "
            "[[cycles, llc-misses]], got ['cycles', 'llc-misses']",
        ),
        (
            "targets:\n  pids: [1, two]\n",
            "config x.yaml: targets.pids: expected a list of integers, got [1, 'two']",
        ),
        (
            "anomaly:\n  latency_probe_path: 5\n",
            "config x.yaml: anomaly.latency_probe_path: expected a string or null, got 5",
        ),
        (
            "perf:\n  sentinel_samples_per_sec: -5\n",
            "config x.yaml: perf.sentinel_samples_per_sec: a budget is samples per second per "
            "CPU and must be positive and at most 10000000, got -5",
        ),
        (
            "perf:\n  diagnostic_samples_per_sec: -1\n",
            "config x.yaml: perf.diagnostic_samples_per_sec: a budget is samples per second "
            "per CPU and must be positive and at most 10000000, got -1",
        ),
        (
            "perf:\n  hard_drop_ns: -1\n",
            "config x.yaml: perf.hard_drop_ns: must be from 0 (off) to 3600000000000 "
            "nanoseconds (an hour), got -1",
        ),
        (
            "perf:\n  sentinel_groups: [[cycles, llc-mises]]\n",
            "config x.yaml: perf.sentinel_groups: unknown event 'llc-mises'",
        ),
        (
            "perf:\n  diagnostic_groups: [[]]\n",
            "config x.yaml: perf.diagnostic_groups: an event group needs 1 to 16 events, got []",
        ),
        (
            "perf:\n  rotation_window: soon\n",
            "config x.yaml: perf.rotation_window: expected seconds or a duration such as "
            "250ms, 2s, 1m, got 'soon'",
        ),
        (
            "mode:\n  initial: turbo\n",
            "config x.yaml: mode.initial: must be sentinel or diagnostic",
        ),
        (
            "mode:\n  hysteresis_high: 0.4\n",
            "config x.yaml: mode.hysteresis_high: must be above mode.hysteresis_low (0.5), got 0.4",
        ),
        (
            "anomaly:\n  throughput_ratio_trigger: 1.5\n",
            "config x.yaml: anomaly.throughput_ratio_trigger: must be between 0 and 1",
        ),
        (
            "anomaly:\n  latency_ratio_trigger: 0.5\n",
            "config x.yaml: anomaly.latency_ratio_trigger: must be above 1 (a spike), got 0.5",
        ),
        (
            "anomaly:\n  interfaces: [eth0/1]\n",
            "config x.yaml: anomaly.interfaces: an interface name has 1 to 15 characters",
        ),
        (
            "metrics:\n  listen_port: 70000\n",
            "config x.yaml: metrics.listen_port: must be from 0 to 65535, got 70000",
        ),
        (
            "control_plane:\n  listen_port: -1\n",
            "config x.yaml: control_plane.listen_port: must be from 0 to 65535, got -1",
        ),
    ],
)
def test_bad_input_is_one_line_naming_key_and_value(text: str, want: str) -> None:
    assert error(text).startswith(want)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^config .*/nope.yaml: cannot read it: No such file"):
        load_config(tmp_path / "nope.yaml")


def test_without_pyyaml_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml -> ImportError
    with pytest.raises(ExtraMissing, match=r"meridian-ebpf\[sentinel\]"):
        parse_config("perf: {}")
    assert "sentinel_samples_per_sec: 1000" in dump_config()  # --print-config needs no yaml


def test_flags_override_the_file() -> None:
    cfg = parse_config("perf:\n  sentinel_samples_per_sec: 200\n  hard_drop_ns: 5\n")
    out = merge_args(
        cfg,
        args(
            mode="diagnostic",
            frequency=99,
            events="cycles,llc-misses;cpu-clock",
            samples_per_sec=300,
            diagnostic_samples_per_sec="4000",  # a string from argparse is converted
            interface=["eth0"],
            xdp=["veth0", "veth1"],
            pid=[1, 2],
            metrics_port=9102,
            metrics_address="0.0.0.0",
            perf_mock=True,
            mock_period_ms=25,
            duration="2",
            json=True,
            verbose=2,
        ),
    )
    assert out.mode.initial == "diagnostic"
    assert out.perf.frequency == 99
    assert out.perf.sentinel_groups == [["cycles", "llc-misses"], ["cpu-clock"]]
    assert out.perf.diagnostic_groups == out.perf.sentinel_groups
    assert out.perf.sentinel_samples_per_sec == 300
    assert out.perf.diagnostic_samples_per_sec == 4000
    assert out.perf.hard_drop_ns == 5  # from the file: the flag was not given
    assert out.anomaly.interfaces == ["eth0"]
    assert out.perf.xdp_interfaces == ["veth0", "veth1"]
    assert out.targets.pids == [1, 2]
    assert out.targets.as_targets() == [{"pid": 1}, {"pid": 2}]
    assert out.metrics.listen_port == 9102 and out.metrics.listen_address == "0.0.0.0"
    assert out.mock.enabled and out.mock.period_ms == 25
    assert out.run.duration == 2.0 and out.run.json and out.run.verbose == 2
    assert cfg.perf.sentinel_samples_per_sec == 200  # the input is not changed
    repeated = merge_args(cfg, args(events=["cycles,instructions", "cpu-clock"]))
    assert repeated.perf.sentinel_groups == [["cycles", "instructions"], ["cpu-clock"]]
    assert merge_args(cfg, args()) == cfg  # nothing given: nothing changes
    assert merge_args(cfg, argparse.Namespace()) == cfg  # flags R does not define


def test_the_seeds_own_check_parses() -> None:
    out = merge_args(SentinelConfig(), args(perf_mock=True, mock_period_ms=25, metrics_port=9102))
    assert out.mock.enabled and out.mock.period_ms == 25 and out.metrics.listen_port == 9102


@pytest.mark.parametrize(
    ("given", "want"),
    [
        (
            {"samples_per_sec": -5},
            "--samples-per-sec: a budget is samples per second per CPU "
            "and must be positive and at most 10000000, got -5",
        ),
        (
            {"diagnostic_samples_per_sec": "lots"},
            "--diagnostic-samples-per-sec: expected an integer, got 'lots'",
        ),
        ({"hard_drop_ns": -1}, "--hard-drop-ns: must be from 0 (off) to 3600000000000"),
        ({"events": "cycles,bogus"}, "--events: unknown event 'bogus'"),
        ({"events": " ; "}, "--events: name at least one event"),
        ({"mode": "turbo"}, "--mode: must be sentinel or diagnostic, got 'turbo'"),
        ({"metrics_port": 65536}, "--metrics-port: must be from 0 to 65535, got 65536"),
        ({"mock_period_ms": 0}, "--mock-period-ms: must be 1 ms or more, got 0"),
        ({"duration": "-1"}, "--duration: must be above 0 seconds, got -1.0"),
        ({"frequency": 0}, "-F/--frequency: must be from 1 to 1000000 Hz, got 0"),
        ({"interface": ["a b"]}, "--interface: an interface name has 1 to 15 characters"),
    ],
)
def test_bad_flags_name_the_flag(given: dict[str, Any], want: str) -> None:
    with pytest.raises(UsageError) as exc:
        merge_args(SentinelConfig(), args(**given))
    assert str(exc.value).startswith(want)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "perf:\n  sentinel_samples_per_sec: 50000000\n",
            "config x.yaml: perf.sentinel_samples_per_sec: a budget is samples per second per "
            "CPU and must be positive and at most 10000000, got 50000000",
        ),
        (
            "perf:\n  hard_drop_ns: 3600000000001\n",
            "config x.yaml: perf.hard_drop_ns: must be from 0 (off) to 3600000000000 "
            "nanoseconds (an hour), got 3600000000001",
        ),
        (
            "perf:\n  diagnostic_groups: [" + ", ".join(["[cycles]"] * 17) + "]\n",
            "config x.yaml: perf.diagnostic_groups: needs 1 to 16 event groups, got [['cycles'], ",
        ),
        (
            "perf:\n  sentinel_groups: [[" + ", ".join(["cycles"] * 17) + "]]\n",
            "config x.yaml: perf.sentinel_groups: an event group needs 1 to 16 events, got [",
        ),
        (
            "perf:\n  sentinel_groups: [[cache-misses]]\n",
            "config x.yaml: perf.sentinel_groups: event 'cache-misses': write it 'llc-misses', "
            "got 'cache-misses'",
        ),
        (
            "targets:\n  pids: [4294967296]\n",
            "config x.yaml: targets.pids: must be from 0 to 4294967295, got 4294967296",
        ),
    ],
)
def test_the_control_planes_limits_hold_in_the_file(text: str, want: str) -> None:
    """Limits the API had alone (budget, hard drop, group sizes, canonical event names,
    32-bit pids) now refuse a file too; the API says the same (test_sentinel_api)."""
    assert error(text).startswith(want)


def test_the_limits_hold_on_the_command_line() -> None:
    with pytest.raises(UsageError, match=r"^--samples-per-sec: .* at most 10000000, got 50000000$"):
        merge_args(SentinelConfig(), args(samples_per_sec="50000000"))
    with pytest.raises(UsageError, match=r"^--events: needs 1 to 16 event groups, got "):
        merge_args(SentinelConfig(), args(events=";".join(["cycles"] * 17)))


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "perf:\n  sentinel_sample_per_sec: 5\n",
            "unknown key perf.sentinel_sample_per_sec: did you mean perf.sentinel_samples_per_sec?",
        ),
        (
            "mode:\n  interfaces: [eth0]\n",
            "unknown key mode.interfaces: did you mean anomaly.interfaces?",
        ),
        (
            "run:\n  latency_ewma: 0.5\n",
            "unknown key run.latency_ewma: did you mean anomaly.latency_ewma_alpha?",
        ),
        ("aggregate:\n  flush_interval: 1\n", "unknown key aggregate: did you mean aggregator?"),
        ("run:\n  zzz: 1\n", "unknown key run.zzz; known: duration, json, group_by, verbose"),
    ],
)
def test_an_unknown_key_names_the_closest_one(text: str, want: str) -> None:
    """Whatever else is wrong: a typo explains the rest."""
    assert error(text + "metrics:\n  listen_port: -1\n") == f"config x.yaml: {want}"


def test_durations_take_a_unit() -> None:
    cfg = parse_config(
        "perf:\n  rotation_window: 250ms\nanomaly:\n  poll_interval: 2s\n"
        "  refractory_period: 1.5m\nclickhouse:\n  flush_interval: 500us\nrun:\n  duration: 1h\n"
    )
    assert cfg.perf.rotation_window == 0.25
    assert cfg.anomaly.poll_interval == 2.0 and cfg.anomaly.refractory_period == 90.0
    assert cfg.clickhouse.flush_interval == pytest.approx(0.0005)
    assert cfg.run.duration == 3600.0
    assert merge_args(cfg, args(duration="1m")).run.duration == 60.0
    assert parse_config(dump_config(cfg)) == cfg  # printed as seconds, read back
    assert error("aggregator:\n  flush_interval: 2h\n") == (
        "config x.yaml: aggregator.flush_interval: must be above 0 and at most 3600 seconds, "
        "got 7200.0"
    )
    assert error("run:\n  duration: 3 days\n") == (
        "config x.yaml: run.duration: expected seconds or a duration such as 250ms, 2s, 1m, "
        "got '3 days'"
    )


def test_a_value_assigned_is_checked_as_one_read() -> None:
    """What the agent and the API change later follows the same rules; a refused value
    leaves the old one."""
    cfg = SentinelConfig()
    cfg.aggregator.flush_interval = "250ms"  # type: ignore[assignment]
    assert cfg.aggregator.flush_interval == 0.25
    with pytest.raises(UsageError) as exc:
        cfg.perf.sentinel_samples_per_sec = 50_000_000
    assert str(exc.value) == (
        "perf.sentinel_samples_per_sec: a budget is samples per second per CPU and must be "
        "positive and at most 10000000, got 50000000"
    )
    assert cfg.perf.sentinel_samples_per_sec == 1000
    with pytest.raises(UsageError, match=r"^mode.hysteresis_high: must be above "):
        cfg.mode.hysteresis_high = 0.1  # below hysteresis_low: a rule across keys
    assert cfg.mode.hysteresis_high == 0.9
    with pytest.raises(UsageError, match=r"^perf.sentinel_groups: unknown event 'bogus'"):
        cfg.perf.sentinel_groups = [["bogus"]]
    assert cfg.perf.sentinel_groups == [["cycles", "llc-misses"]]
