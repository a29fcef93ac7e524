"""`meridian sentinel` command line: bad input is one line naming the offending value
and exit code 2, never a traceback; --print-config round-trips through --config;
--help ends with examples. Run as a person would: `python -m meridian sentinel`."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from children import meridian
from test_cli import one_line_exit_2


def sentinel(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return meridian("sentinel", *args, timeout=timeout)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("perf: [unclosed\n", "not valid YAML"),
        ("perf:\n  sentinel_samples_per_secc: 5\n", "unknown key perf.sentinel_samples_per_secc"),
        ("nosection:\n  x: 1\n", "unknown key nosection"),
        ("perf:\n  sentinel_samples_per_sec: -5\n", "perf.sentinel_samples_per_sec"),
        ("perf:\n  sentinel_samples_per_sec: lots\n", "'lots'"),
        ("perf:\n  sentinel_groups: [[cycles, bogus-event]]\n", "'bogus-event'"),
        ("- just\n- a list\n", "expected a mapping"),
    ],
)
def test_bad_config_file(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "sentinel.yaml"
    cfg.write_text(text)
    p = sentinel("--config", str(cfg), "--perf-mock", "--duration", "1")
    one_line_exit_2(p, needle)
    assert str(cfg) in p.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--events", "cycles,bogus"], "unknown event 'bogus'"),
        (["--events", ""], "--events"),
        (["--samples-per-sec", "-5"], "--samples-per-sec"),
        (["--samples-per-sec", "0"], "must be positive"),
        (["--diagnostic-samples-per-sec", "-1"], "--diagnostic-samples-per-sec"),
        (["--hard-drop-ns", "-1"], "--hard-drop-ns"),
        (["--samples-per-sec", "many"], "'many'"),
        (["-F", "0"], "-F/--frequency"),
        (["--interface", "nosuchif0"], "no interface 'nosuchif0'"),
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--prometheus", ":70000"], "--prometheus"),
        (["--prometheus", "localhost"], "--prometheus takes [HOST]:PORT"),
        (["--prometheus", ":9102", "--metrics-port", "9103"], "give one"),
        (["--mock-period-ms", "0"], "--mock-period-ms"),
        (["--duration", "0"], "--duration"),
        (["--duration", "soon"], "--duration"),
        (["-p", "abc"], "-p/--pid"),
        (["--mode", "turbo"], "invalid choice: 'turbo'"),
        (["--config", "/nonexistent/sentinel.yaml"], "cannot read it"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_flags(args: list[str], needle: str) -> None:
    one_line_exit_2(sentinel("--perf-mock", "--duration", "1", *args), needle)


def test_xdp_interface_that_does_not_exist() -> None:
    """Checked before anything is loaded, so it needs no root."""
    one_line_exit_2(
        sentinel("--xdp", "nosuchif0", "--duration", "1", "--prometheus", "127.0.0.1:0"),
        "no interface 'nosuchif0'",
    )


def test_pid_that_does_not_exist() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    one_line_exit_2(sentinel("-p", str(pid_max + 1), "--duration", "1"), "no process with PID")


def test_port_in_use(busy_port: int) -> None:
    p = sentinel("--perf-mock", "--duration", "5", "--prometheus", f"127.0.0.1:{busy_port}")
    one_line_exit_2(p, "--prometheus")
    assert str(busy_port) in p.stderr
    assert "in use" in p.stderr


def printed(p: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    """The configuration --print-config printed, parsed."""
    assert p.returncode == 0, p.stderr
    cfg = yaml.safe_load(p.stdout)
    assert isinstance(cfg, dict) and all(isinstance(v, dict) for v in cfg.values()), cfg
    return cfg


def assert_config(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]]) -> None:
    """Section by section, key by key."""
    assert got.keys() == want.keys()
    for section, keys in want.items():
        assert got[section].keys() == keys.keys(), section
        for key, value in keys.items():
            assert got[section][key] == value, f"{section}.{key}"


def test_print_config_round_trips(tmp_path: Path) -> None:
    defaults = printed(sentinel("--print-config"))
    groups = [["cycles", "llc-misses"], ["branch-misses"]]
    want = copy.deepcopy(defaults)
    want["perf"].update(sentinel_samples_per_sec=1234, sentinel_groups=groups)
    want["perf"]["diagnostic_groups"] = groups  # --events is both modes'
    want["metrics"].update(enabled=True, listen_port=9911)
    want["mode"]["initial"] = "diagnostic"
    assert want != defaults and want["control_plane"] == defaults["control_plane"]
    first = sentinel(
        "--print-config",
        "--samples-per-sec",
        "1234",
        "--events",
        "cycles,llc-misses;branch-misses",
        "--prometheus",
        "127.0.0.1:9911",
        "--mode",
        "diagnostic",
    )
    assert_config(printed(first), want)
    cfg = tmp_path / "sentinel.yaml"
    cfg.write_text(first.stdout)
    again = sentinel("--config", str(cfg), "--print-config")
    assert_config(printed(again), want)
    assert again.stdout == first.stdout
    # flags still win over the file
    over = sentinel("--config", str(cfg), "--samples-per-sec", "77", "--print-config")
    want["perf"]["sentinel_samples_per_sec"] = 77
    assert_config(printed(over), want)


def test_print_config_shows_every_default() -> None:
    p = sentinel("--print-config")
    assert p.returncode == 0, p.stderr
    for section in ("perf:", "mode:", "anomaly:", "aggregator:", "metrics:", "mock:"):
        assert f"\n{section}\n" in p.stdout
    for key in ("sentinel_samples_per_sec", "hard_drop_ns", "rotation_window", "top_flows"):
        assert f"  {key}: " in p.stdout


def test_help_ends_with_examples() -> None:
    p = sentinel("--help")
    assert p.returncode == 0
    assert "examples:" in p.stdout
    lines = p.stdout.rstrip().splitlines()
    assert lines[-1].strip().startswith("meridian sentinel")
    # the check of docs/requirements/sentinel.md §7.2 is one of them, as written
    assert "meridian sentinel --perf-mock --mock-period-ms=25 --prometheus=:9102" in p.stdout
    for flag in ("--print-config", "--events", "--samples-per-sec", "--xdp", "--json"):
        assert flag in p.stdout


def test_a_store_named_but_not_enabled_is_said_once(tmp_path: Path) -> None:
    """A config with clickhouse.url and no `enabled: true` stores nothing: it says so."""
    cfg = tmp_path / "sentinel.yaml"
    cfg.write_text("clickhouse:\n  url: http://127.0.0.1:1\n")
    p = sentinel("--config", str(cfg), "--perf-mock", "--duration", "1")
    assert p.returncode == 0, p.stderr
    said = [line for line in p.stderr.splitlines() if "clickhouse.url is set" in line]
    assert said == [
        "meridian sentinel: clickhouse.url is set but clickhouse.enabled is false: "
        "nothing is stored (set clickhouse.enabled: true)"
    ], p.stderr
