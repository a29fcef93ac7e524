"""The detectors' thresholds are config keys (issue 25 item 8.1): a section per detector,
named as it, read by the detectors the agent creates (agent/findings.py), printed by
--print-config with their descriptions, refused out of their limits like any key; a
threshold set in YAML changes exactly what is reported."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest
from sentinel_values import remote
from test_sentinel_detectors import SEC, T0, A, hitm

from meridian.errors import UsageError
from meridian.tools.sentinel.agent.findings import Findings, detector_context
from meridian.tools.sentinel.config.load import SentinelConfig, dump_config, parse_config
from meridian.tools.sentinel.detectors import detector_types
from meridian.tools.sentinel.detectors.false_sharing import FalseSharing, FalseSharingFinding
from meridian.tools.sentinel.detectors.remote_dram import RemoteDram, RemoteDramFinding
from meridian.tools.sentinel.model.records import concat

L1, L2 = 0x7F10_0000_0040, 0x7F10_0000_1000


def reported(cfg: SentinelConfig, samples: Any) -> list[Any]:
    """The findings of one window over `samples`, from the detectors as the agent
    creates them from `cfg`."""
    findings = Findings(detector_context(cfg, None), lambda flow_id: None)
    findings.on_samples(SimpleNamespace(samples=samples))
    findings.on_window(SimpleNamespace(end_ns=T0 + SEC))
    return findings.last


def lines(found: list[Any]) -> list[tuple[int, float, tuple[tuple[int, int], ...]]]:
    return [(f.line, f.score, f.cpus) for f in found if isinstance(f, FalseSharingFinding)]


def flows(found: list[Any]) -> list[tuple[int, int]]:
    return [(f.flow_id, f.samples) for f in found if isinstance(f, RemoteDramFinding)]


def test_false_sharing_thresholds_from_yaml_change_what_is_reported() -> None:
    """L1: three CPUs with 2 HITM samples each; L2: two CPUs with 4 each. By default
    (4 samples, 2 sharers) only L2 is sharing; with min_hits 2 and min_sharers 3 only
    L1 is."""
    samples = concat(
        [hitm([(0, A, 2), (1, A, 2), (2, A, 2)], L1), hitm([(3, A, 4), (4, A, 4)], L2)]
    )
    assert lines(reported(SentinelConfig(), samples)) == [(L2, 8.0, ((3, 4), (4, 4)))]
    cfg = parse_config("false_sharing:\n  min_hits: 2\n  min_sharers: 3\n")
    assert (cfg.false_sharing.min_hits, cfg.false_sharing.min_sharers) == (2, 3)
    assert lines(reported(cfg, samples)) == [(L1, 6.0, ((0, 2), (1, 2), (2, 2)))]
    cfg = parse_config("false_sharing:\n  max_findings: 1\n  min_hits: 2\n")
    assert lines(reported(cfg, samples)) == [(L2, 8.0, ((3, 4), (4, 4)))]  # the hotter one


def test_remote_dram_threshold_from_yaml_changes_what_is_reported() -> None:
    samples = remote([(0xAB, 1, 2, 3), (0xCD, 0, 2, 2), (0xEF, 0, 3, 1)])
    assert flows(reported(SentinelConfig(), samples)) == [(0xAB, 3), (0xCD, 2), (0xEF, 1)]
    assert flows(reported(parse_config("remote_dram:\n  min_samples: 2\n"), samples)) == [
        (0xAB, 3),
        (0xCD, 2),
    ]
    assert flows(reported(parse_config("remote_dram:\n  min_samples: 3\n"), samples)) == [(0xAB, 3)]


def test_a_window_set_in_yaml_spans_flushes() -> None:
    cfg = parse_config(f"remote_dram:\n  min_window_ns: {2 * SEC}\n")
    findings = Findings(detector_context(cfg, None), lambda flow_id: None)
    findings.on_samples(SimpleNamespace(samples=remote([(0xAB, 1, 2, 3)])))
    findings.on_window(SimpleNamespace(end_ns=T0 + SEC))
    assert flows(findings.last) == []  # the window is still open
    findings.on_window(SimpleNamespace(end_ns=T0 + 2 * SEC))
    assert flows(findings.last) == [(0xAB, 3)]


def test_every_detector_has_a_section_of_its_constructor_keywords() -> None:
    """A section per registered detector, named as it; its keys are keyword arguments
    of the detector's constructor with the same defaults."""
    cfg = SentinelConfig()
    for name, cls in detector_types().items():
        assert name in SentinelConfig.model_fields, f"no config section {name}"
        params = inspect.signature(cls.__init__).parameters
        section = getattr(cfg, name).model_dump()
        assert section, name
        for key, value in section.items():
            assert key in params, f"{name}.{key} is no keyword of {cls.__name__}"
            assert params[key].default == value, f"{name}.{key}"
    ctx = detector_context(cfg, None)
    assert set(ctx.settings) == set(detector_types())


def test_print_config_shows_each_threshold_with_its_description() -> None:
    text = dump_config()
    section = text.split("\nfalse_sharing:\n", 1)[1].split("\n\n", 1)[0]
    assert "  # HITM samples a CPU (or process) needs on a line in a window" in section
    for key in ("min_hits: 4", "min_sharers: 2", "min_window_ns: 0", "max_findings: 100"):
        assert f"\n  {key}\n" in f"\n{section}\n", key
    section = text.split("\nremote_dram:\n", 1)[1].split("\n\n", 1)[0]
    assert "  min_samples: 1" in section and "# remote-DRAM samples a (flow" in section
    cfg = parse_config("false_sharing:\n  min_hits: 7\nremote_dram:\n  max_keys: 99\n")
    assert parse_config(dump_config(cfg)) == cfg


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "false_sharing:\n  min_sharers: 1\n",
            "false_sharing.min_sharers: must be 2 or more, got 1",
        ),
        ("false_sharing:\n  min_hits: 0\n", "false_sharing.min_hits: must be 1 or more, got 0"),
        ("false_sharing:\n  min_hits: two\n", "false_sharing.min_hits: expected an integer"),
        ("remote_dram:\n  max_findings: 0\n", "remote_dram.max_findings: must be from 1 to 10000"),
        (
            "remote_dram:\n  max_keys: 99999999\n",
            "remote_dram.max_keys: must be from 1 to 16777216",
        ),
        ("remote_dram:\n  min_window_ns: -1\n", "remote_dram.min_window_ns: must be from 0"),
        ("false_sharing:\n  min_hit: 3\n", "did you mean false_sharing.min_hits?"),
        ("remote_dram:\n  min_hits: 3\n", "did you mean false_sharing.min_hits?"),
    ],
)
def test_thresholds_are_validated(text: str, message: str) -> None:
    with pytest.raises(UsageError) as exc:
        parse_config(text, "config x.yaml")
    assert message in str(exc.value)


def test_a_threshold_assigned_later_is_checked_too() -> None:
    cfg = SentinelConfig()
    with pytest.raises(UsageError, match=r"false_sharing\.min_sharers: must be 2 or more"):
        cfg.false_sharing.min_sharers = 1
    assert cfg.false_sharing.min_sharers == 2


def test_defaults_match_the_detectors_created_without_config() -> None:
    ctx = detector_context(SentinelConfig(), None)
    made = {d.name: d for d in Findings(ctx, lambda flow_id: None).detectors}
    fs, rd = made["false_sharing"], made["remote_dram"]
    assert isinstance(fs, FalseSharing) and isinstance(rd, RemoteDram)
    assert (fs.min_hits, fs.min_sharers, fs.max_findings) == (4, 2, 100)
    assert (fs.counts.max_keys, fs.counts.min_window_ns) == (1 << 16, 0)
    assert (rd.min_samples, rd.max_findings, rd.counts.max_keys) == (1, 100, 1 << 16)
