"""`meridian sentinel` as a person runs it, on the real kernel: an iperf3 stream
between two network namespaces goes through the kernel program, the runtime and the
outputs, and shows in /metrics (its flows by 5-tuple, both directions), in the --json
windows and in the summary (the same counts), with the kernel functions and stacks it
was paid in; and at the defaults, busy CPUs switch the agent to diagnostic mode and
idle ones back, in ms_agent_mode."""

from __future__ import annotations

import json
import os
import re
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


# the kernel's network path, from the socket calls to the device
# Code on a stream's packet path. Under TCG a stream's samples may lie mostly in the
# payload's copies (copy_user_*, from tcp_sendmsg and tcp_recvmsg) and in the agent's
# own per-packet programs, which run inside netif_receive_skb and the transmit path
# (a 6.1 guest: copy_user_enhanced_fast_string, bpf_prog_<tag>_ms_btf_rx).
NETWORK = re.compile(
    r"_*(tcp|ip6?|udp|sock|skb|netif|net|napi|veth|dev|sys_send|sys_recv|copy_user)_"
    r"|bpf_prog_[0-9a-f]+_ms_[a-z]+_(rx|tx)$"
)


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
                "-F", "199", "--samples-per-sec", "20000", "--json",
                "--prometheus", f"127.0.0.1:{port}", "-v",
            ],
            stdout=subprocess.PIPE, stderr=err_file, text=True,
        )  # fmt: skip
        try:
            wait_until(lambda: "strategy:" in err.read_text(), 60, "the agent attached")
            # /metrics has the last window's flows: read while the stream runs
            client = pair.iperf3_start(round(patience(4)), cport=cport)
            data = {"src": pair.addr_a, "dst": pair.addr_b, "sport": str(cport), "dport": "5201"}

            series: list[Any] = []  # the last read: after the stream a window may have none

            def stream_series() -> list[Any]:
                fams = metrics(port)
                norm = fams["ms_flow_event_norm"].samples if "ms_flow_event_norm" in fams else []
                series[:] = [s for s in norm if data.items() <= s.labels.items()]
                return series

            try:
                wait_until(lambda: len(stream_series()) >= 2, 20, "the stream's series in /metrics")
            except AssertionError:
                fams = metrics(port)
                norm = fams["ms_flow_event_norm"].samples if "ms_flow_event_norm" in fams else []
                seen = sorted({(s.labels.get("src"), s.labels.get("sport")) for s in norm})
                raise AssertionError(f"{data} not in {seen}; {err.read_text()[-1500:]}") from None
            pair.iperf3_result(client, patience(60))
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
    # --json: the windows' rows of the data flow add up to the summary's, per direction;
    # the rows found by the flow's id (a window's row of a flow not yet named has no
    # label); each window lists its top 50 rows, said with the windows if it fails
    for direction in ("tx", "rx"):
        (total,) = [
            row for row in summary["flows"]
            if row.get("label") == label and row["direction"] == direction
        ]  # fmt: skip
        per_window = [
            (w["window"], w["flows_total"], len(w["flows"]), [
                (row["samples"], row.get("label")) for row in w["flows"]
                if row["flow"] == total["flow"] and row["direction"] == direction
            ])
            for w in windows
        ]  # fmt: skip
        in_windows = sum(n for *_, rows in per_window for n, _ in rows)
        assert in_windows == total["samples"] > 0, (direction, total["samples"], per_window)
    assert sum(w["samples"] for w in windows) == summary["samples"], err.read_text()[-1500:]
    # where the stream was paid: kernel functions by name, and kernel stacks; the
    # network stack among the hottest three functions of a window or the summary's
    # hottest three stacks (in a guest under TCG, waits in the scheduler and futexes
    # right after a packet can outrank the TCP path for the whole run)
    rows = [row for row in summary["flows"] if row.get("label") == label]
    symbols = kernel_symbols()
    names = {f["function"] for row in rows for f in row["functions"]}
    assert names & symbols, names
    frames = [frame for row in rows for stack in row["stacks"] for frame in stack["frames"]]
    kernel = [f.split("+")[0] for f in frames if f.endswith("([kernel])")]
    assert kernel, (frames, err.read_text()[-1500:])
    window_functions = {
        f["function"]
        for w in windows
        for row in w["flows"]
        if row.get("label") == label
        for f in row["functions"]
    }
    stacks = [(st.get("samples"), st["frames"][:8]) for row in rows for st in row["stacks"]]
    assert any(NETWORK.match(name) for name in [*kernel, *names, *window_functions]), (
        window_functions,
        stacks,
        err.read_text()[-1500:],
    )


def mode(port: int) -> float | None:
    fams = metrics(port)
    if "ms_agent_mode" not in fams:
        return None
    (sample,) = fams["ms_agent_mode"].samples
    return float(sample.value)


def test_busy_cpus_switch_to_diagnostic_and_back_at_the_defaults(tmp_path: Path) -> None:
    """-F 99 and a budget of 1000/s: the busy samples/s (idle ones left out) reach 0.9
    of the 99/s per CPU the events deliver when every CPU is busy, and fall under 0.5
    of it when they idle again (the host must be otherwise quiet: CI)."""
    port = free_port()
    err = tmp_path / "stderr"
    loop = "import time\nt = time.monotonic() + 120\nwhile time.monotonic() < t: pass\n"
    with open(err, "w") as err_file:
        agent = subprocess.Popen(
            [
                sys.executable, "-m", "meridian", "sentinel",
                "--prometheus", f"127.0.0.1:{port}", "-v",
            ],
            stdout=subprocess.DEVNULL, stderr=err_file, text=True,
        )  # fmt: skip
        loops: list[subprocess.Popen[bytes]] = []
        try:
            wait_until(lambda: "strategy:" in err.read_text(), 60, "the agent attached")
            wait_until(lambda: mode(port) == 0, 30, "sentinel mode at the start")
            loops = [
                subprocess.Popen([sys.executable, "-c", loop]) for _ in range(os.cpu_count() or 1)
            ]
            wait_until(lambda: mode(port) == 1, 30, "diagnostic mode with every CPU busy")
            for child in loops:
                reap(child)
            wait_until(lambda: mode(port) == 0, 30, "sentinel mode once the CPUs idle")
            agent.send_signal(signal.SIGTERM)
            agent.wait(patience(30))
            assert agent.returncode == 0, err.read_text()
        finally:
            for child in loops:
                reap(child)
            reap(agent)
    said = err.read_text()
    assert "mode diagnostic: samples/s" in said and "mode sentinel: samples/s" in said, said
