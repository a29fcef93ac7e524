"""`meridian sentinel --data-dir`: the agent writes every window to the embedded store;
what is stored adds up to what the agent counted, and names every flow and function
its rollups refer to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meridian.tools.sentinel.model.rollup import UNRESOLVED
from meridian.tools.sentinel.storage import TABLES, ChdbBackend

pytest.importorskip("chdb", reason="chDB is not installed (pip install chdb)")


# any free port for /metrics: the default 9102 may be taken (another agent, a test before)
AGENT = [sys.executable, "-m", "meridian", "sentinel", "--perf-mock", "--mock-period-ms", "20"]
AGENT += ["--prometheus", "127.0.0.1:0"]


def run_agent(*args: str) -> dict[str, Any]:
    """The agent in mock mode for 3 s; its JSON summary."""
    p = subprocess.run(
        [*AGENT, "--duration", "3", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    summary: dict[str, Any] = json.loads(p.stdout.splitlines()[-1])
    assert summary["type"] == "summary"
    return summary


def test_windows_stored_exactly_with_names(tmp_path: Path) -> None:
    store = tmp_path / "store"
    summary = run_agent("--data-dir", str(store), "--raw-samples")
    db = ChdbBackend(store)
    db.open()
    try:
        (total,) = db.query("SELECT sum(samples) AS s, count() AS n FROM ms_flow_rollup")
        (raw,) = db.query("SELECT count() AS n FROM ms_raw_samples")
        # every sample the agent kept, once, in the rollups and in the raw table
        assert int(total["s"]) == int(raw["n"]) == summary["samples"] > 0
        every = sum(int(db.query(f"SELECT count() AS n FROM {t}")[0]["n"]) for t in TABLES)
        storage = summary["storage"]  # what the summary says it stored is what is there
        assert storage["stored_rows"] == every and storage["inherited_rows"] == 0
        assert storage["unsent_rows"] == storage["dropped_rows"] == 0
        unnamed_flows = db.query(
            "SELECT DISTINCT flow_id FROM ms_flow_rollup WHERE flow_id != 0 AND flow_id NOT IN "
            "(SELECT flow_id FROM ms_flows)"
        )
        assert unnamed_flows == []
        unnamed_functions = db.query(
            f"SELECT DISTINCT function_id FROM ms_flow_rollup WHERE function_id != {UNRESOLVED} "
            "AND function_id NOT IN (SELECT function_id FROM ms_functions)"
        )
        assert unnamed_functions == []
        flows = db.query(
            "SELECT src, dst, sport, dport, proto, count() AS n FROM ms_flows "
            "GROUP BY src, dst, sport, dport, proto"
        )
        # each flow named once per run; the mock's IPv4 TCP flow among them
        assert {int(f["n"]) for f in flows} == {1}
        assert {"src": "10.0.0.1", "dst": "10.0.0.2", "sport": 5201, "dport": 43012} in [
            {k: f[k] for k in ("src", "dst", "sport", "dport")} for f in flows
        ]
        stacks = db.query(
            "SELECT count() AS n FROM ms_flow_rollup WHERE callstack_id NOT IN "
            "(SELECT stack_id FROM ms_callstacks) AND callstack_id != 0"
        )
        assert int(stacks[0]["n"]) == 0
    finally:
        db.close()


def test_a_second_run_adds_to_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = run_agent("--data-dir", str(store))
    second = run_agent("--data-dir", str(store))
    db = ChdbBackend(store)
    db.open()
    try:
        runs = db.query(
            "SELECT run_id, sum(samples) AS s FROM ms_flow_rollup GROUP BY run_id ORDER BY s"
        )
    finally:
        db.close()
    assert sorted(int(r["s"]) for r in runs) == sorted([first["samples"], second["samples"]])
