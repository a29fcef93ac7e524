"""`meridian sentinel query` on an embedded store an agent is writing: chDB opens it in
one process only, so the query goes through that agent's API; without an API it is
one line that says what to do."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from children import reap

pytest.importorskip("chdb", reason="chDB is not installed (pip install chdb)")
pytest.importorskip("fastapi", reason="the api extra is not installed")

API_FILE = ".meridian-sentinel.api"
MERIDIAN = [sys.executable, "-m", "meridian", "sentinel"]


def query(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MERIDIAN, "query", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def agent(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, list[str]]]:
    """An agent in mock mode writing tmp_path/store, with the flags the test names."""
    store = tmp_path / "store"
    flags: list[str] = getattr(request, "param", [])
    mock = ["--perf-mock", "--mock-period-ms", "20", "--duration", "60", "--json"]
    p = subprocess.Popen(
        [*MERIDIAN, *mock, "--prometheus", "127.0.0.1:0", "--data-dir", str(store), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield store, flags
    finally:
        p.send_signal(signal.SIGTERM)  # the agent's own end, then reaped whatever happened
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(30)
        reap(p)
    assert not (store / API_FILE).exists()  # the agent takes its announcement back


def wait_flows(store: Path, timeout: float = 30) -> list[dict[str, Any]]:
    """top-flows through the agent, once it has stored some."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (store / API_FILE).exists():
            r = query("top-flows", "--data-dir", str(store), "--json")
            assert r.returncode == 0, r.stderr
            rows = [json.loads(line) for line in r.stdout.splitlines()]
            if rows:
                return rows
        time.sleep(0.5)
    raise AssertionError("no flows through the agent's API")


@pytest.mark.parametrize("agent", [["--api-port", "0"]], indirect=True)
def test_queries_go_through_the_agent_that_holds_the_store(
    agent: tuple[Path, list[str]], tmp_path: Path
) -> None:
    store, _ = agent
    rows = wait_flows(store)
    named = {(r["src"], r["sport"], r["dst"], r["dport"], r["proto"]) for r in rows}
    assert ("10.0.0.1", 5201, "10.0.0.2", 43012, "tcp") in named  # the mock's flows
    assert all(r["samples"] > 0 for r in rows)
    top = str(rows[0]["flow"])
    svg = tmp_path / "flow.svg"
    r = query("flow", top, "--data-dir", str(store), "--json", "--flamegraph", str(svg))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    functions = [x for x in lines if x.get("type") == "function"]
    assert functions and all(str(f["function"]).startswith("mock_") for f in functions)
    assert "</svg>" in svg.read_text()
    # top-services through the agent: the mock's flows by their listening side
    r = query("top-services", "--data-dir", str(store), "--json", "--since", "1h")
    assert r.returncode == 0, r.stderr
    services = {(x["service"], x["direction"]) for x in map(json.loads, r.stdout.splitlines())}
    assert ("10.0.0.1:5201 tcp", "rx") in services


def test_without_an_api_the_held_store_is_one_line(agent: tuple[Path, list[str]]) -> None:
    store, _ = agent
    end = time.monotonic() + 30
    while not (store / ".meridian-sentinel.lock").exists() and time.monotonic() < end:
        time.sleep(0.2)
    time.sleep(1.0)  # the writer thread has opened the store
    r = query("top-flows", "--data-dir", str(store))
    assert r.returncode == 2
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "held by a running agent" in err
    assert "--api-port" in err
