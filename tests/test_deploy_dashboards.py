"""deploy/grafana, read: the Grafana dashboards, one per tool: their JSON model (the
datasource input and variables, panel layout, heat maps over the histogram buckets),
every panel query reads only metrics its tool exports (from the code's own families),
filters by $instance and parses (promtool). test_deploy_dashboards_run.py has the rest:
on the real kernel, Debian's Prometheus scraping the running tools answers every
panel's query, and every variable's, with data, and loads every rules file."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_prometheus_rules_tools import LOSSES, exported, metrics_in

ROOT = Path(__file__).resolve().parents[1]
BOARDS = ROOT / "deploy" / "grafana"
TOOLS = ("io", "biolat", "memlat", "runqlat", "sentinel")
DS = {"type": "prometheus", "uid": "${datasource}"}
INSTANCE = 'instance=~"$instance"'
# Grafana's own variables as a panel on a short time range has them with the scrapes of
# test_deploy_dashboards_run.py ($__rate_interval: 4 scrape intervals at least)
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}
# what issue 27 asks each dashboard to show, by the metrics that show it
REQUIRED = {
    "io": {
        "process_disk_io_bytes_total",  # throughput by process, and writeback by writer
        "process_disk_operations_total",  # page-cache hit ratio
        "process_disk_operation_duration_seconds_bucket",  # latency heat maps
    },
    "biolat": {
        "system_disk_operation_duration_seconds_bucket",  # per-disk heat map
        "system_disk_operations_total",  # IOPS
        "system_disk_operation_time_seconds_total",  # queue depth (Little's law)
    },
    "memlat": {"system_paging_fault_duration_seconds_bucket"},
    "runqlat": {"system_runqueue_duration_seconds_bucket"},
    "sentinel": {
        "ms_flow_event_norm",  # top flows by cost
        "ms_agent_mode",
        "ms_sampling_throttled",
        "ms_clickhouse_spooled_rows",
    },
}
LABEL_VALUES = re.compile(r"label_values\((.+),\s*(\w+)\)")  # a variable's query


def board(tool: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((BOARDS / f"meridian-{tool}.json").read_text())
    return data


def panels(tool: str) -> list[dict[str, Any]]:
    return [p for p in board(tool)["panels"] if p["type"] != "row"]


def variables(tool: str) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board(tool)["templating"]["list"]}


def queries(tool: str) -> list[tuple[str, str]]:
    """(panel title and refId, expr) of every target of every panel."""
    return [(f"{p['title']} {t['refId']}", t["expr"]) for p in panels(tool) for t in p["targets"]]


def substitute(expr: str, values: dict[str, str]) -> str:
    """The expression as Grafana sends it, with these variable values."""
    for name, value in GRAFANA_VARS.items():
        expr = expr.replace(name, value)
    for name, value in values.items():
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in expr, expr
    return expr


def test_one_dashboard_per_tool() -> None:
    assert {p.name for p in BOARDS.glob("*.json")} == {f"meridian-{t}.json" for t in TOOLS}


@pytest.mark.parametrize("tool", TOOLS)
def test_dashboard_model(tool: str) -> None:
    b = board(tool)
    assert b["uid"] == f"meridian-{tool}" and b["schemaVersion"] == 39 and b["id"] is None
    assert b["title"].startswith(f"Meridian / {tool}:")
    [ds_input] = b["__inputs"]
    assert (ds_input["name"], ds_input["type"], ds_input["pluginId"]) == (
        "DS_PROMETHEUS",
        "datasource",
        "prometheus",
    )
    v = variables(tool)
    assert (v["datasource"]["type"], v["datasource"]["query"]) == ("datasource", "prometheus")
    assert v["datasource"]["current"]["value"] == "${DS_PROMETHEUS}"
    for var in v.values():
        if var["type"] == "query":
            assert var["datasource"] == DS and var["definition"] == var["query"]["query"]
            assert LABEL_VALUES.fullmatch(var["definition"]), var["definition"]
    instance = LABEL_VALUES.fullmatch(v["instance"]["definition"])
    assert instance is not None and instance[2] == "instance"
    assert instance[1] in exported(tool)
    assert v["instance"]["multi"] and v["instance"]["includeAll"]
    ids = [p["id"] for p in b["panels"]]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in panels(tool)]
    assert len(titles) == len(set(titles)), titles
    for p in panels(tool):
        assert p["datasource"] == DS, p["title"]
        assert p["description"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["datasource"] == DS and t["expr"] for t in p["targets"]), p["title"]
        assert p.get("repeat") in (None, *v)


@pytest.mark.parametrize("tool", TOOLS)
def test_panels_tile_the_grid_without_overlap(tool: str) -> None:
    taken: set[tuple[int, int]] = set()
    for p in board(tool)["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, p["title"]
        taken |= cells


@pytest.mark.parametrize("tool", TOOLS)
def test_panels_read_only_what_the_tool_exports_by_instance(tool: str) -> None:
    names = exported(tool)
    read: set[str] = set()
    for where, expr in queries(tool):
        used = metrics_in(expr)
        assert used and used <= names, (where, used - names)
        read |= used
        for name in used:  # every selector is narrowed to the chosen instances
            for m in re.finditer(rf"(?<![\w:]){name}(?![\w:])(\{{[^}}]*\}})?", expr):
                assert m[1] and INSTANCE in m[1], (where, m[0])
    for var in variables(tool).values():
        if var["type"] == "query":
            selector = LABEL_VALUES.fullmatch(var["definition"])
            assert selector is not None and metrics_in(selector[1]) <= names
    assert REQUIRED[tool] <= read, REQUIRED[tool] - read
    assert LOSSES[tool] <= read, LOSSES[tool] - read  # the tool's drop counters are shown


@pytest.mark.parametrize("tool", TOOLS[:4])  # sentinel exports no histogram
def test_heat_maps_are_histogram_buckets_per_second(tool: str) -> None:
    maps = [p for p in panels(tool) if p["type"] == "heatmap"]
    assert maps
    bucket = re.compile(r"sum by \(le\) \(rate\((\w+_bucket)\{[^}]*\}\[\$__rate_interval\]\)\)")
    for p in maps:
        [t] = p["targets"]
        m = bucket.fullmatch(t["expr"])
        assert m and m[1] in exported(tool), t["expr"]
        assert (t["format"], t["legendFormat"]) == ("heatmap", "{{le}}")
        unit = "s" if m[1].endswith("_seconds_bucket") else "short"  # biolat's depth: counts
        assert p["options"]["calculate"] is False and p["options"]["yAxis"]["unit"] == unit


def test_promtool_parses_every_panel_query(promtool: str, tmp_path: Path) -> None:
    values = {"instance": "127.0.0.1:9435", "device": "sda", "event": "cycles"}
    exprs = [substitute(e, values) for tool in TOOLS for _, e in queries(tool)]
    recorded = [{"record": f"dashboard:query_{i}:check", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboards.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": recorded}]}))
    got = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in got.stdout
