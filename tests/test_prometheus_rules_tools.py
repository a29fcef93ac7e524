"""deploy/prometheus/{io,biolat,memlat,runqlat}-rules.yml, the recording and alert rules
of the tools beside sentinel's (test_prometheus_rules.py): promtool accepts every rules
file, its unit tests (NAME-rules.test.yml) pass and fire every alert on a series that
should fire it and not on one that should not, and every metric the rules read or the
tests feed is one the tool exports, from the code's own metric families.

`exported()` and `metrics_in()` are shared with test_deploy_dashboards.py, which holds
the dashboards to the same rule (`metrics_in()` with test_deploy_dashboards_run.py too)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import test_prometheus_rules
import yaml

from meridian.export.exposition import prom_name
from meridian.export.series import Family

ROOT = Path(__file__).resolve().parents[1]
RULES_DIR = ROOT / "deploy" / "prometheus"
TOOLS = ("io", "biolat", "memlat", "runqlat")  # sentinel's: test_prometheus_rules.py
# the drop and loss counters of each tool: each must be alerted on and on its dashboard
LOSSES = {
    "io": {"meridian_io_lost_total"},
    "biolat": {"meridian_biolat_lost_total"},
    "memlat": {"meridian_memlat_lost_total"},
    "runqlat": {"meridian_runqlat_lost_total"},
    "sentinel": {
        "ms_dropped_samples_total",
        "ms_detector_dropped_samples_total",
        "ms_clickhouse_dropped_rows_total",
        "ms_clickhouse_flush_errors_total",
    },
}
# PromQL words that are not metric names once strings, label sets, ranges and the
# label lists of by/without/on/ignoring/group_* are taken out
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def families(tool: str) -> list[Family]:
    """The families a tool exports, empty (names, kinds and units are what count)."""
    if tool == "io":
        from meridian.tools.io.metrics import block_series, series_of

        return series_of([], {}, 0) + block_series([])
    if tool == "biolat":
        from meridian.tools.biolat.metrics import series as biolat_series
        from meridian.tools.biolat.model import Options as BiolatOptions
        from meridian.tools.biolat.model import Snapshot as BiolatSnapshot

        return biolat_series(BiolatSnapshot(0.0, {}), BiolatOptions(depth=True))
    if tool == "memlat":
        from meridian.tools.memlat.metrics import series as memlat_series
        from meridian.tools.memlat.model import Options as MemlatOptions
        from meridian.tools.memlat.model import Snapshot as MemlatSnapshot

        return memlat_series(MemlatSnapshot(0.0, {}), MemlatOptions())
    assert tool == "runqlat", tool
    from meridian.tools.runqlat.metrics import series as runqlat_series
    from meridian.tools.runqlat.model import Options as RunqlatOptions
    from meridian.tools.runqlat.model import Snapshot as RunqlatSnapshot

    return runqlat_series(RunqlatSnapshot(0.0, {}), RunqlatOptions())


def exported(tool: str) -> set[str]:
    """Every series name the tool's /metrics has: counters with `_total`, histograms as
    their `_bucket`, `_count` and `_sum`."""
    if tool == "sentinel":
        return test_prometheus_rules.exported()
    out: set[str] = set()
    for f in families(tool):
        name = prom_name(f.name, f.unit, f.kind)
        if f.kind == "counter":
            out.add(name + "_total")
        elif f.kind == "histogram":
            out |= {name + "_bucket", name + "_count", name + "_sum"}
        else:
            out.add(name)
    return out


def metrics_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (recording rules' names, with colons,
    are left out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, regexes)
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = re.findall(r"(?<![\w:.])([a-zA-Z_]\w*)(?![\w:])(?!\s*\()", e)
    return {n for n in names if n.lower() not in KEYWORDS}


def rules_file(tool: str) -> Path:
    return RULES_DIR / f"{tool}-rules.yml"


def unit_tests_file(tool: str) -> Path:
    return RULES_DIR / f"{tool}-rules.test.yml"


def rules(tool: str) -> list[dict[str, Any]]:
    data = yaml.safe_load(rules_file(tool).read_text())
    return [r for g in data["groups"] for r in g["rules"]]


def alerts(tool: str) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in rules(tool) if "alert" in r}


def fed(tool: str) -> list[str]:
    """The series (name and labels, as written) that the tool's unit tests feed."""
    cases = yaml.safe_load(unit_tests_file(tool).read_text())["tests"]
    return [str(s["series"]) for case in cases for s in case["input_series"]]


def test_every_rules_file_is_one_of_a_tool_and_tested() -> None:
    names = {p.name for p in RULES_DIR.glob("*-rules*.yml")}
    tools = {*TOOLS, "sentinel"}
    assert names == {f"{t}-rules.yml" for t in tools} | {f"{t}-rules.test.yml" for t in tools}


@pytest.mark.parametrize("tool", TOOLS)
def test_promtool_checks_the_rules(promtool: str, tool: str) -> None:
    got = test_prometheus_rules.run(promtool, "check", "rules", rules_file(tool).name)
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"SUCCESS: {len(rules(tool))} rules found" in got.stdout


@pytest.mark.parametrize("tool", TOOLS)
def test_promtool_unit_tests_pass(promtool: str, tool: str) -> None:
    got = test_prometheus_rules.run(promtool, "test", "rules", unit_tests_file(tool).name)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "SUCCESS" in got.stdout


@pytest.mark.parametrize("tool", TOOLS)
def test_every_alert_is_tested_firing_and_quiet(tool: str) -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(unit_tests_file(tool).read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    names = set(alerts(tool))
    assert fired == names and quiet == names


@pytest.mark.parametrize("tool", TOOLS)
def test_every_recording_rule_is_tested(tool: str) -> None:
    tested = {
        re.split(r"[{\s]", check["expr"])[0]
        for case in yaml.safe_load(unit_tests_file(tool).read_text())["tests"]
        for check in case.get("promql_expr_test", [])
    }
    assert tested == {r["record"] for r in rules(tool) if "record" in r}


@pytest.mark.parametrize("tool", TOOLS)
def test_rules_read_only_what_the_tool_exports(tool: str) -> None:
    names = exported(tool)
    used = set().union(*(metrics_in(r["expr"]) for r in rules(tool)))
    assert used, tool
    assert used - {"up"} <= names, used - names
    assert LOSSES[tool] <= used  # every drop counter is watched
    series = {s.split("{")[0] for s in fed(tool)}
    assert series - {"up"} <= names, series - names


def test_metrics_in_finds_names_not_labels_functions_or_keywords() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (job, le) (rate(a_bucket{x="y", le!="1"}[5m]))) > 0.1 '
        "and on (job) sum without (process_pid) (b_total offset 1m) / ignoring(z) c "
        "or vector(1) unless d:recorded:rate5m"
    )
    assert metrics_in(expr) == {"a_bucket", "b_total", "c"}


@pytest.mark.parametrize("tool", TOOLS)
def test_alerts_say_what_to_do(tool: str) -> None:
    prefix = f"Meridian{tool.capitalize()}"
    for name, rule in alerts(tool).items():
        assert name.startswith(prefix), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert set(rule["annotations"]) == {"summary", "description"}, name
        assert len(rule["annotations"]["description"]) > 80, name
    # only Down and Absent name the scrape job, and it is meridian-TOOL
    job = f'job="meridian-{tool}"'
    assert alerts(tool)[f"{prefix}Down"]["expr"] == f"up{{{job}}} == 0"
    assert alerts(tool)[f"{prefix}Absent"]["expr"] == f"absent(up{{{job}}})"
    named = {n for n, r in alerts(tool).items() if "job=" in r["expr"]}
    assert named == {f"{prefix}Down", f"{prefix}Absent"}
