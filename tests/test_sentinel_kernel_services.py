"""The service view on the real kernel (issue 25, "one row per connection"): 100 short
TCP connections to one server between two network namespaces, and 100 more to a
server of this host on loopback that listens on an ephemeral port (which only the
host's listening sockets tell from its clients' ports), while `meridian sentinel
--json --data-dir` runs (SIGTERM once the clients are done). Each server is one
service row per direction in the summary, whose samples and flows are the sums over
every flow of the windows, and `query top-services` on the store it wrote gives the
same numbers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from children import patience, reap, wait_until
from netns import netns_pair

pytestmark = pytest.mark.kernel

PORT = 8000
CONNECTIONS = 100
SPREAD_S = 6.0  # the connections are spread over this long: over several windows
SERVER = """\
import socket, sys
with socket.create_server((sys.argv[1], int(sys.argv[2])), backlog=128) as srv:
    print(srv.getsockname()[1], flush=True)
    data = b"y" * 1_000_000
    while True:
        c, _ = srv.accept()
        with c:
            c.recv(16)
            c.sendall(data)
"""
CLIENT = """\
import socket, sys, time
addr, port, n, spread = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
for i in range(n):
    with socket.create_connection((addr, port)) as s:
        s.sendall(b"x" * 16)
        while s.recv(1 << 16):
            pass
    time.sleep(spread / n)
"""


def agent(tmp_path: Path) -> subprocess.Popen[str]:
    config = tmp_path / "sentinel.yaml"
    config.write_text("metrics:\n  top_flows: 1000000\n")  # --json windows list every flow
    with open(tmp_path / "out", "w") as o, open(tmp_path / "err", "w") as e:
        return subprocess.Popen(
            [sys.executable, "-m", "meridian", "sentinel", "--config", str(config),
             "--events", "cpu-clock", "-F", "999",
             "--prometheus", "127.0.0.1:0", "--json", "--data-dir", str(tmp_path / "store"), "-v"],
            stdout=o, stderr=e, text=True,
        )  # fmt: skip


def attached(run: subprocess.Popen[str], err: Path) -> None:
    def ready() -> bool:
        assert run.poll() is None, err.read_text()
        return "strategy:" in err.read_text()

    wait_until(ready, 60, "the agent attached")


def of(row: dict[str, Any], addr: str, port: int) -> bool:
    """A flow row of the service addr:port (either direction)."""
    return (row.get("dst"), row.get("dport")) == (addr, port) or (
        row.get("src"),
        row.get("sport"),
    ) == (addr, port)


def check_service(
    summary: dict[str, Any], windows: list[dict[str, Any]], addr: str, port: int
) -> list[dict[str, Any]]:
    """One summary row per direction for addr:port, with the sums of its flows over
    every window; no row of one of its flows left apart. Returns the rows."""
    service = f"{addr}:{port} tcp"
    rows = [r for r in summary["services"] if r["service"] == service]
    assert rows, (service, summary["services"])
    assert len({r["direction"] for r in rows}) == len(rows)  # one event: cpu-clock
    flows = [f for w in windows for f in w["flows"] if of(f, addr, port)]
    for r in rows:
        mine = [f for f in flows if f["direction"] == r["direction"]]
        assert r["samples"] == sum(f["samples"] for f in mine), (r, mine)
        assert r["flows"] == len({f["flow"] for f in mine})
        # each row's cost is rounded to 1e-6 in the JSON: so is their sum, row by row
        total = sum(f["norm_cost"] for f in mine)
        assert r["norm_cost"] == pytest.approx(total, abs=1e-6 * (len(mine) + 1))
    assert max(r["flows"] for r in rows) > 1, rows  # many connections, one row
    apart = [r for r in summary["services"] if r["service"] is None and of(r, addr, port)]
    assert not apart, apart
    # every flow of the windows was named when its window was flushed
    assert not [f for w in windows for f in w["flows"] if f["flow"] and "src" not in f]
    return rows


def test_a_hundred_connections_are_one_service(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with netns_pair("sv") as pair:
        far = pair.popen(pair.b, sys.executable, "-c", SERVER, pair.addr_b, str(PORT),
                         stdout=subprocess.PIPE)  # fmt: skip
        near = subprocess.Popen(
            [sys.executable, "-c", SERVER, "127.0.0.1", "0"], stdout=subprocess.PIPE, text=True
        )
        clients: list[subprocess.Popen[Any]] = []
        run = None
        try:
            run = agent(tmp_path)
            assert far.stdout is not None and near.stdout is not None
            assert int(far.stdout.readline()) == PORT
            near_port = int(near.stdout.readline())  # an ephemeral port: bound to 0
            attached(run, tmp_path / "err")
            clients += [
                pair.popen(pair.a, sys.executable, "-c", CLIENT, pair.addr_b, str(PORT),
                           str(CONNECTIONS), str(SPREAD_S)),
                subprocess.Popen([sys.executable, "-c", CLIENT, "127.0.0.1", str(near_port),
                                  str(CONNECTIONS), str(SPREAD_S)]),
            ]  # fmt: skip
            for c in clients:
                assert c.wait(timeout=patience(SPREAD_S + 30)) == 0
            run.send_signal(signal.SIGTERM)  # the summary, the last window flushed and stored
            run.wait(timeout=patience(40))
        finally:
            for child in [*clients, *([run] if run is not None else [])]:
                reap(child)
            reap(near)
            reap(far)
    assert run.returncode == 0, (tmp_path / "err").read_text()
    objects = [json.loads(line) for line in (tmp_path / "out").read_text().splitlines()]
    (summary,) = [o for o in objects if o["type"] == "summary"]
    windows = [o for o in objects if o["type"] == "window"]
    far_rows = check_service(summary, windows, pair.addr_b, PORT)
    near_rows = check_service(summary, windows, "127.0.0.1", near_port)
    # the loopback clients' ephemeral ports are no service of their own
    apart = [
        r for r in summary["services"]
        if r["service"] and r["addr"] == "127.0.0.1" and r["port"] != near_port
        and any(of(f, "127.0.0.1", near_port) and r["port"] in (f["sport"], f["dport"])
                for w in windows for f in w["flows"])
    ]  # fmt: skip
    assert not apart, apart

    # the store: query top-services, the same rows (for the server in the namespace:
    # the store knows no listening socket, so the loopback server on an ephemeral port
    # is told apart by the agent alone; query/services.py)
    query = subprocess.run(
        [sys.executable, "-m", "meridian", "sentinel", "query", "top-services", "--json",
         "--since", "10m", "--limit", "1000", "--data-dir", str(tmp_path / "store")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert query.returncode == 0, query.stderr
    stored = {(o["service"], o["direction"]): o for o in map(json.loads, query.stdout.splitlines())}
    for r in far_rows:
        s = stored[(r["service"], r["direction"])]
        assert (s["samples"], s["flows"]) == (r["samples"], r["flows"]), (s, r)
        assert s["norm_cost"] == pytest.approx(r["norm_cost"])
    print(
        f"\n{len(windows)} windows in {time.monotonic() - t0:.1f}s; "
        + "; ".join(f"{r['service']} {r['direction']}: {r['flows']} flows, {r['samples']} samples"
                    for r in far_rows + near_rows)
    )  # fmt: skip
