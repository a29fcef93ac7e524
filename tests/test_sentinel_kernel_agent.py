"""`meridian sentinel` as a person runs it, on the real kernel, with real traffic: an
iperf3 stream between two network namespaces goes through the kernel program, the
runtime and the outputs, and shows in /metrics (its flows by 5-tuple, both
directions), in the --json windows and in the summary (the same counts), with the
kernel functions and stacks it was paid in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from children import patience, reap, wait_until
from clickhouse_server import free_port
from netns import netns_pair

pytestmark = pytest.mark.kernel


def metrics(port: int) -> dict[str, Any]:
    """/metrics as OpenMetrics families by name ({} while it does not answer)."""
    from prometheus_client.openmetrics import parser

    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    req.add_header("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    parse: Any = parser.text_string_to_metric_families  # untyped
    return {f.name: f for f in parse(text)}


def kernel_symbols() -> set[str]:
    with open("/proc/kallsyms") as f:
        return {line.split()[2] for line in f}


def test_a_stream_through_the_agent_to_metrics_json_and_summary(tmp_path: Path) -> None:
    port, cport = free_port(), 40000 + os.getpid() % 20000
    err = tmp_path / "stderr"
    with netns_pair("r") as pair, open(err, "w") as err_file:
        agent = subprocess.Popen(
            [
                sys.executable, "-m", "meridian", "sentinel", "--events", "cpu-clock",
                "-F", "999", "--samples-per-sec", "20000", "--json",
                "--metrics-port", str(port), "-v",
            ],
            stdout=subprocess.PIPE, stderr=err_file, text=True,
        )  # fmt: skip
        try:
            wait_until(lambda: "strategy:" in err.read_text(), 60, "the agent attached")
            pair.iperf3(round(patience(2)), cport=cport)
            data = {"src": pair.addr_a, "dst": pair.addr_b, "sport": str(cport), "dport": "5201"}

            def stream_series() -> list[Any]:
                fams = metrics(port)
                norm = fams["ms_flow_event_norm"].samples if "ms_flow_event_norm" in fams else []
                return [s for s in norm if data.items() <= s.labels.items()]

            wait_until(lambda: len(stream_series()) >= 2, 30, "the stream's series in /metrics")
            series = stream_series()
            agent.send_signal(signal.SIGTERM)
            out, _ = agent.communicate(timeout=patience(30))
            assert agent.returncode == 0, err.read_text()
        finally:
            reap(agent)
    # /metrics: the data flow, by its 5-tuple, leaving a (tx) and arriving at b (rx)
    assert {(s.labels["direction"], s.labels["proto"], s.labels["event"]) for s in series} == {
        ("tx", "tcp", "cpu-clock"),
        ("rx", "tcp", "cpu-clock"),
    }
    assert all(s.value > 0 for s in series)
    objects = [json.loads(line) for line in out.splitlines()]
    windows = [o for o in objects if o["type"] == "window"]
    (summary,) = [o for o in objects if o["type"] == "summary"]
    label = f"{pair.addr_a}:{cport} -> {pair.addr_b}:5201 tcp"
    # --json: the windows' rows of the data flow add up to the summary's, per direction
    for direction in ("tx", "rx"):
        in_windows = sum(
            row["samples"]
            for w in windows
            for row in w["flows"]
            if row.get("label") == label and row["direction"] == direction
        )
        (total,) = [
            row for row in summary["flows"]
            if row.get("label") == label and row["direction"] == direction
        ]  # fmt: skip
        assert in_windows == total["samples"] > 0, direction
    assert sum(w["samples"] for w in windows) == summary["samples"]
    # where the stream was paid: kernel functions by name, and stacks through TCP
    rows = [row for row in summary["flows"] if row.get("label") == label]
    symbols = kernel_symbols()
    names = {f["function"] for row in rows for f in row["functions"]}
    assert names & symbols, names
    frames = [frame for row in rows for stack in row["stacks"] for frame in stack["frames"]]
    assert any(frame.startswith("tcp_") and "([kernel])" in frame for frame in frames), frames
