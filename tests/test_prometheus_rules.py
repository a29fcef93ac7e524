"""deploy/prometheus/sentinel-rules.yml, the recording and alert rules of `meridian
sentinel` (docs/requirements/sentinel.md §4.2): promtool accepts the file, its unit
tests (sentinel-rules.test.yml) pass and fire every alert on a series that should fire
it and not on one that should not, every metric the rules read is one the agent
exports, and the runbook has a section for every alert and a line for every metric."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, cast

import yaml

from meridian.export.exposition import prom_name
from meridian.export.series import Family
from meridian.tools.sentinel.agent.findings import Findings
from meridian.tools.sentinel.detectors import DetectorContext
from meridian.tools.sentinel.outputs.metrics import SentinelMetrics
from meridian.tools.sentinel.storage import Sink
from meridian.tools.sentinel.storage.sender import SinkStats
from meridian.tools.sentinel.storage.writer import StoreWriter

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "sentinel-rules.yml"
TESTS = ROOT / "deploy" / "prometheus" / "sentinel-rules.test.yml"
RUNBOOK = ROOT / "docs" / "sentinel-runbook.md"
# a metric name in an expression, not a recording rule's (those have colons)
METRIC = re.compile(r"(?<![\w:])(ms_\w+|up)(?![\w:])")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=RULES.parent)


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [r for g in data["groups"] for r in g["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def exported() -> set[str]:
    """Every series name the agent's /metrics has (counters with `_total`), from the
    code's own families: the snapshot's, the detectors' and the store's."""

    class Stats:
        def stats(self) -> SinkStats:
            return SinkStats("chdb:/x", True, 0, 0, 0, 0, 0, 0, 0, "")

    writer = StoreWriter(cast(Sink, Stats()), cast(Any, None), lambda fid: None)
    findings = Findings(DetectorContext(), lambda fid: None)
    families: list[Family] = [
        *SentinelMetrics().source(),
        *findings.families(),
        *writer.families(),
    ]
    return {
        prom_name(f.name, f.unit, f.kind) + ("_total" if f.kind == "counter" else "")
        for f in families
    }


def test_promtool_checks_the_rules(promtool: str) -> None:
    got = run(promtool, "check", "rules", RULES.name)
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"SUCCESS: {len(rules())} rules found" in got.stdout


def test_promtool_unit_tests_pass(promtool: str) -> None:
    got = run(promtool, "test", "rules", TESTS.name)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "SUCCESS" in got.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for group in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            (fired if case["exp_alerts"] else quiet).add(case["alertname"])
    names = set(alerts())
    assert fired == names and quiet == names


def test_rules_read_only_what_the_agent_exports() -> None:
    names = exported()
    assert {"ms_dropped_samples_total", "ms_clickhouse_flush_errors_total"} <= names
    assert {"ms_false_sharing_score", "ms_clickhouse_backlog_rows"} <= names
    used = {m for r in rules() for m in METRIC.findall(r["expr"])}
    assert used - {"up"} <= names, used - names
    series = yaml.safe_load(TESTS.read_text())["tests"]
    fed = {s["series"].split("{")[0] for g in series for s in g["input_series"]}
    assert fed - {"up"} <= names, fed - names


def test_runbook_covers_every_alert_and_metric() -> None:
    text = RUNBOOK.read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^### (\w+)$", text, re.MULTILINE)}
    for name, rule in alerts().items():
        assert rule["annotations"]["runbook"] == f"docs/sentinel-runbook.md#{name.lower()}"
        assert name.lower() in anchors, name
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
    for name in exported():
        assert f"`{name}`" in text, name
