"""The store through an outage and a crash, as a person runs the agent: a ClickHouse
server (Debian's, a child of the test) goes down, the agent is SIGKILLed while it is
down, the server comes back, and a second agent on the same spool delivers what the
first one left. The store then holds the samples the first agent printed in its
windows (at least 99 % of them, never more), and the second agent's own, exactly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from children import reap, wait_until
from clickhouse_server import PASSWORD, ClickHouseServer, free_port, running_server

from meridian.tools.sentinel.storage import HttpBackend


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ClickHouseServer]:
    yield from running_server(tmp_path / "clickhouse")


class Agent:
    """`meridian sentinel --perf-mock --json` storing to `url`; its windows read as
    they come."""

    def __init__(self, tmp_path: Path, url: str, *more: str) -> None:
        pw = tmp_path / "password"
        pw.write_text(PASSWORD + "\n")
        argv = [
            sys.executable, "-m", "meridian", "sentinel", "--perf-mock", "--json",
            "--prometheus", "127.0.0.1:0", "--clickhouse-url", url, "--clickhouse-user", "writer",
            "--clickhouse-password-file", str(pw), "--spool-dir", str(tmp_path / "spool"),
            *more,
        ]  # fmt: skip
        self.err = tmp_path / f"stderr-{time.monotonic_ns()}"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
        self.objects: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.objects.append(json.loads(line))

    def windows(self) -> list[dict[str, Any]]:
        return [o for o in list(self.objects) if o["type"] == "window"]

    def printed(self) -> int:
        return sum(w["samples"] for w in self.windows())

    def summary(self, timeout: float = 60) -> dict[str, Any]:
        """The summary object, once the agent ended by itself (--duration) with 0."""
        self.proc.wait(timeout)
        self.reader.join(10)
        assert self.proc.returncode == 0, self.err.read_text()
        (summary,) = [o for o in self.objects if o["type"] == "summary"]
        return summary


def samples_by_run(backend: HttpBackend) -> list[int]:
    rows = backend.query(
        "SELECT run_id, sum(samples) AS n FROM ms_flow_rollup GROUP BY run_id ORDER BY run_id"
    )
    return [int(r["n"]) for r in rows]


def test_an_outage_and_a_sigkill_lose_at_most_the_window_being_built(
    server: ClickHouseServer, tmp_path: Path
) -> None:
    first = Agent(tmp_path, server.url)
    try:
        wait_until(lambda: len(first.windows()) >= 3, 60, "3 windows stored")
        server.stop(signal.SIGKILL)  # the outage
        down = len(first.windows())
        wait_until(lambda: len(first.windows()) >= down + 4, 60, "4 windows during the outage")
        first.proc.kill()  # SIGKILL, while the server is down
        first.proc.wait(10)
        first.reader.join(10)
        printed = first.printed()
    finally:
        reap(first.proc)
    assert printed > 0
    server.start()  # same data directory
    second = Agent(tmp_path, server.url, "--duration", "3")
    try:
        summary = second.summary()
    finally:
        reap(second.proc)
    backend = HttpBackend(server.url, "writer", str(tmp_path / "password"))
    killed, ended = samples_by_run(backend)
    assert 0.99 * printed <= killed <= printed, (killed, printed)
    assert ended == second.printed() == summary["samples"]  # an agent that ends loses nothing
    storage = summary["storage"]
    assert storage["inherited_rows"] > 0  # the first agent's spool, sent first
    assert storage["unsent_rows"] == 0 and storage["dropped_rows"] == 0


def test_a_run_against_a_store_that_is_down_says_what_is_left_unsent(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    agent = Agent(tmp_path, url, "--duration", "2")
    try:
        storage = agent.summary()["storage"]
    finally:
        reap(agent.proc)
    assert storage["stored_rows"] == 0 and storage["dropped_rows"] == 0
    assert storage["unsent_rows"] > 0 and storage["spool_dir"] == str(tmp_path / "spool")
    text = subprocess.run(
        [sys.executable, "-m", "meridian", "sentinel", "--perf-mock", "--prometheus", "127.0.0.1:0",
         "--clickhouse-url", url, "--spool-dir", str(tmp_path / "spool"), "--duration", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    (left,) = [line for line in text.stdout.splitlines() if "unsent rows wait in" in line]
    assert str(tmp_path / "spool") in left and "sends them first" in left
    (line,) = [line for line in text.stdout.splitlines() if "rows stored in" in line]
    assert f"0 rows stored in {url}" in line
    assert f"({storage['unsent_rows']} left by an earlier run)" in line


def test_a_second_agent_on_one_spool_is_told_a_fix_that_works(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    first = Agent(tmp_path, url)
    try:
        wait_until(lambda: first.windows(), 60, "a window of the first agent")
        argv = [
            sys.executable, "-m", "meridian", "sentinel", "--perf-mock",
            "--prometheus", "127.0.0.1:0",
            "--clickhouse-url", url, "--duration", "1",
        ]  # fmt: skip
        spool = ["--spool-dir", str(tmp_path / "spool")]
        second = subprocess.run([*argv, *spool], capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        (line,) = second.stderr.splitlines()
        assert "is in use by another agent" in line and "--spool-dir DIR" in line
        own = ["--spool-dir", str(tmp_path / "spool2")]
        fixed = subprocess.run([*argv, *own], capture_output=True, text=True, timeout=60)
        assert fixed.returncode == 0, fixed.stderr
        assert "unsent rows wait in " + str(tmp_path / "spool2") in fixed.stdout
    finally:
        reap(first.proc)
