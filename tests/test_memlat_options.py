"""memlat's options without a kernel: -p takes a list (a PID set in the kernel), --from
picks the start point and its strategies (refused in one line where the kernel has
neither fentry nor kprobes), and `validate`'s verdict and exit status."""

from __future__ import annotations

import os
from typing import Any

import pytest
from children import help_text, meridian
from test_cli import one_line_exit_2

from meridian.bpf import features
from meridian.cli import build_parser, main
from meridian.errors import NotSupported, UsageError
from meridian.latency.cli import processes
from meridian.tools.memlat import cli as memlat_cli
from meridian.tools.memlat.kernel import (
    FROM_EXCEPTION,
    FROM_HANDLE_MM_FAULT,
    STRATEGIES,
    choose_strategy,
    start_of,
)
from meridian.tools.memlat.model import Options
from meridian.tools.memlat.validate import high_buckets, verdict


def options_of(*argv: str) -> Options:
    """The Options `meridian memlat ARGV` runs with (no kernel involved)."""
    args = build_parser(["memlat"]).parse_args(["memlat", *argv])
    cli = memlat_cli.CLI
    common = {"per_process": args.pids, "pids": processes(args.pid)}
    return cli.options(args, common)


def test_pid_takes_a_list_and_repeats() -> None:
    a, b = os.getpid(), os.getppid()
    assert options_of("-p", f"{a},{b}").pids == sorted({a, b})
    assert options_of("-p", str(a), "-p", str(b)).pids == sorted({a, b})
    assert options_of("-p", f"{a},{a}", "-p", str(a)).pids == [a]  # a set
    assert options_of().pids == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--from", "nowhere"], "argument --from: invalid choice"),
        (["--from", "exception", "--strategy", "hmf_fentry"], "--strategy hmf_fentry times"),
        (["--from", "handle_mm_fault", "--strategy", "fentry"], "use --from exception"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    one_line_exit_2(meridian("memlat", *args), needle)


def test_help_says_from_and_validate_its_exit_status() -> None:
    text = help_text("memlat")
    assert "--from {exception,handle_mm_fault}" in text
    assert "exit status is 0 when every check passed, 1 when one failed" in text


def test_from_picks_the_start_point() -> None:
    assert options_of().start == "exception"
    assert options_of("--from", "handle_mm_fault").start == "handle_mm_fault"
    # a strategy alone says where it starts
    assert options_of("--strategy", "hmf_kprobe").start == "handle_mm_fault"
    assert options_of("--strategy", "kprobe").start == "exception"
    assert {start_of(s.name) for s in FROM_HANDLE_MM_FAULT} == {"handle_mm_fault"}
    assert {start_of(s.name) for s in FROM_EXCEPTION} == {"exception"}
    assert STRATEGIES[: len(FROM_EXCEPTION)] == FROM_EXCEPTION  # the default's first
    with pytest.raises(UsageError, match="use --from handle_mm_fault"):
        choose_strategy("exception", "hmf_fentry")


def fake_kernel(monkeypatch: pytest.MonkeyPatch, have: set[str]) -> None:
    def probe(feature: str) -> features.Probe:
        return features.Probe(feature, feature in have, "refused (fake)")

    monkeypatch.setattr(features, "probe", probe)


@pytest.mark.parametrize(
    ("have", "exception", "handle_mm_fault"),
    [
        ({"fentry", "kprobe", "tp_btf", "tracepoint", "perf_event"}, "fentry", "hmf_fentry"),
        ({"kprobe", "tp_btf", "tracepoint", "perf_event"}, "kprobe", "hmf_kprobe"),
        ({"tp_btf", "tracepoint", "perf_event"}, "tp_btf+perf", None),
        ({"tracepoint", "perf_event"}, "tracepoint+perf", None),
    ],
)
def test_each_start_point_has_its_strategies(
    monkeypatch: pytest.MonkeyPatch, have: set[str], exception: str, handle_mm_fault: str | None
) -> None:
    fake_kernel(monkeypatch, have)
    assert choose_strategy("exception").name == exception
    assert features.choose(STRATEGIES).name == exception  # doctor's, the default's
    if handle_mm_fault:
        assert choose_strategy("handle_mm_fault").name == handle_mm_fault
        return
    # neither fentry nor kprobes: one line that says why and what to do, exit 2
    with pytest.raises(NotSupported) as refused:
        choose_strategy("handle_mm_fault")
    msg = str(refused.value)
    assert "\n" not in msg and refused.value.exit_code == 2
    assert "needs fentry/fexit or kprobes, and this kernel allows neither" in msg
    assert "hmf_fentry: fentry refused (fake)" in msg
    assert "hmf_kprobe: kprobe refused (fake)" in msg
    assert "run without --from (--from exception, the default" in msg


def test_from_handle_mm_fault_refused_on_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_kernel(monkeypatch, {"tp_btf", "tracepoint", "perf_event"})
    assert main(["memlat", "--from", "handle_mm_fault", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("meridian memlat: error: --from handle_mm_fault is not supported")


# ---- validate's verdict -----------------------------------------------------------


def test_verdict_fails_when_the_tail_does_not_grow() -> None:
    ok = verdict(1000, 136, 90_000, 186, 16_384, 16_384)
    assert ok == dict.fromkeys(ok, True)
    same_tail = verdict(1000, 136, 90_000, 136, 16_384, 16_384)
    assert same_tail["more_tail_events"] is False and same_tail["more_faults"]
    assert verdict(1000, 136, 90_000, 100, 16_384, 16_384)["more_tail_events"] is False
    assert verdict(1000, 0, 1000, 1, 16_384, 16_384)["more_faults"] is False
    off_by_6pct = verdict(1000, 1, 90_000, 2, 16_384 + 984, 16_384)
    assert off_by_6pct["workload_faults_within_5pct"] is False
    assert verdict(0, 0, 1, 1, 0, 0)["workload_faults_within_5pct"] is False  # no pages


def report(checks: dict[str, bool]) -> dict[str, Any]:
    """A validate report with these checks (what validate_text prints)."""

    def b(low: int, high: int, count: int) -> dict[str, int]:
        return {"low": low, "high": high, "count": count}

    def case(name: str, count: int, tail: int, buckets: list[dict[str, int]]) -> dict[str, Any]:
        return {
            "case": name,
            "seconds": 1.0,
            "count": count,
            "tail_count": tail,
            "tail_share": tail / count,
            "p50_ns": 2000,
            "p99_ns": 9000,
            "max_ns": 300_000,
            "hist": {"buckets": buckets},
        }

    return {
        "seconds": 1.0,
        "strategy": "tp_btf+perf",
        "from": "exception",
        "unit": "usecs",
        "unit_ns": 1000,
        "tail_threshold_us": 8.0,
        "cases": [
            case("OFF", 100, 3, [b(1, 1, 97), b(8, 15, 3)]),
            case("ON", 900, 3, [b(8, 15, 2), b(128, 255, 1)]),
        ],
        "workload": {"pid": 1, "pages_touched": 800, "faults": 800, "error": 0.0},
        "checks": checks,
        "passed": all(checks.values()),
    }


@pytest.mark.parametrize("tail_grows", [True, False])
def test_validate_exit_status_is_1_when_a_check_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tail_grows: bool
) -> None:
    checks = verdict(100, 3, 900, 4 if tail_grows else 3, 800, 800)
    rep = report(checks)
    monkeypatch.setattr(memlat_cli, "validate", lambda opts, s, mb: (rep["passed"], rep))
    assert main(["memlat", "validate", "--seconds", "1"]) == (0 if tail_grows else 1)
    out = capsys.readouterr().out
    assert ("FAIL  more tail events" in out) is not tail_grows
    assert "8 -> 15" in out and "128 -> 255" in out  # the high buckets, OFF and ON


def test_high_buckets_are_those_at_or_above_the_threshold() -> None:
    rep = report(verdict(100, 3, 900, 3, 800, 800))
    assert high_buckets(rep) == [(8, 15, [3, 2]), (128, 255, [0, 1])]
    rep["tail_threshold_us"] = 16.0
    assert high_buckets(rep) == [(128, 255, [0, 1])]
