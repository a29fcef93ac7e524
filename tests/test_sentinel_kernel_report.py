"""The report of `meridian sentinel --duration 10`, tried as a new user would (issue
25), on the real kernel with mixed traffic between two network namespaces: an iperf3
stream, and short TCP connections (a new curl process each) to an HTTP server. The
final report, as text and as --json, names every frame (none left "[unresolved"),
puts no idle function on a flow's row, and prints no internal id (2**64-1)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from children import patience, reap, wait_until
from netns import netns_pair

pytestmark = pytest.mark.kernel

DURATION = 10
HTTP_PORT = 8000
NO_ID = str(2**64 - 1)
UNRESOLVED = "[unresolved"
# Where a CPU halts or spins idle (x86 and arm64), whatever the kernel's build; the
# kernel's .cpuidle.text section is added from /proc/kallsyms.
IDLE = {
    "pv_native_safe_halt", "native_safe_halt", "xen_safe_halt", "tdx_safe_halt",
    "acpi_safe_halt", "native_halt", "default_idle", "default_idle_call", "arch_cpu_idle",
    "cpu_idle_poll", "poll_idle", "mwait_idle", "intel_idle", "acpi_idle_do_entry",
    "acpi_idle_enter", "default_enter_idle", "cpu_do_idle", "do_idle", "cpuidle_idle_call",
}  # fmt: skip


def idle_functions() -> set[str]:
    """IDLE and the text symbols of the kernel's .cpuidle.text section."""
    rows = []
    with open("/proc/kallsyms") as f:
        for line in f:
            p = line.split()
            rows.append((int(p[0], 16), p[1], p[2]))
    marks = {name: addr for addr, _, name in rows if name.startswith("__cpuidle_text_")}
    lo, hi = marks.get("__cpuidle_text_start", 0), marks.get("__cpuidle_text_end", 0)
    section = {name for addr, kind, name in rows if lo <= addr < hi and kind in "tT"}
    return IDLE | {n.split(".")[0] for n in section if not n.startswith("__")}


def agent(*args: str, out: Path, err: Path) -> subprocess.Popen[str]:
    with open(out, "w") as o, open(err, "w") as e:
        return subprocess.Popen(
            [sys.executable, "-m", "meridian", "sentinel", "--events", "cpu-clock",
             "--duration", str(DURATION), "--prometheus", "127.0.0.1:0", "-v", *args],
            stdout=o, stderr=e, text=True,
        )  # fmt: skip


def http_clients(pair: Any, url: str, seconds: float) -> None:
    """Short connections from namespace a for `seconds`: a new curl each (a process
    whose symbols are read after it exited), else Python's urllib in one process."""
    if shutil.which("curl"):
        loop = f"end=$(( $(date +%s) + {int(seconds)} )); "
        loop += f'while [ "$(date +%s)" -lt "$end" ]; do curl -s -o /dev/null {url}; done'
        pair.popen(pair.a, "sh", "-c", loop)
        return
    code = (
        "import time, urllib.request\n"
        f"end = time.time() + {seconds}\n"
        f"while time.time() < end: urllib.request.urlopen({url!r}).read()\n"
    )
    pair.popen(pair.a, sys.executable, "-c", code)


def attached(run: subprocess.Popen[str], err: Path) -> None:
    """-v names the strategy once the programs are attached."""

    def ready() -> bool:
        assert run.poll() is None, err.read_text()
        return "strategy:" in err.read_text()

    wait_until(ready, 60, f"the agent attached ({err.name})")


def table(text: str) -> list[str]:
    """The rows of the text summary's table (below SERVICE ..., the default, up to a
    blank line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("SERVICE "))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start + 1 : end]


def flow_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in summary["flows"] if r["flow"] is not None]


def test_the_report_after_ten_seconds_of_mixed_traffic(tmp_path: Path) -> None:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "file").write_bytes(os.urandom(200_000))
    text_out, json_out = tmp_path / "text", tmp_path / "json"
    with netns_pair("rp") as pair:
        server = pair.popen(
            pair.b, sys.executable, "-m", "http.server", str(HTTP_PORT), "--bind", pair.addr_b,
            "--directory", str(tmp_path / "www"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        listening = f"sport = :{HTTP_PORT}"
        wait_until(lambda: pair.run(pair.b, "ss", "-Hltn", listening).stdout.strip(), 10, "http")
        runs = [
            agent(out=text_out, err=tmp_path / "text.err"),
            agent("--json", out=json_out, err=tmp_path / "json.err"),
        ]
        try:
            for run, err in zip(runs, ("text.err", "json.err"), strict=True):
                attached(run, tmp_path / err)
            t0 = time.monotonic()
            client = pair.iperf3_start(DURATION - 3)
            http_clients(pair, f"http://{pair.addr_b}:{HTTP_PORT}/file", DURATION - 3)
            pair.iperf3_result(client, DURATION + 30)
            for run in runs:
                run.wait(timeout=patience(DURATION + 40))
            took = time.monotonic() - t0
        finally:
            for run in runs:
                reap(run)
            reap(server)
    for run, err in zip(runs, ("text.err", "json.err"), strict=True):
        assert run.returncode == 0, (tmp_path / err).read_text()
    text = text_out.read_text()
    objects = [json.loads(line) for line in json_out.read_text().splitlines()]
    (summary,) = [o for o in objects if o["type"] == "summary"]
    report = text + json.dumps(summary)
    # every frame named, no internal id printed (the windows' --json included)
    assert UNRESOLVED not in report, report
    assert NO_ID not in text + json_out.read_text()
    # the traffic is there, by flow: the stream in both summaries, the short
    # connections (a sample or two each, below the summary's top 20 on a busy host)
    # in the windows
    windows = [o for o in objects if o["type"] == "window"]
    stream = f"{pair.addr_a}:"
    assert any(r.get("label", "").startswith(stream) for r in flow_rows(summary)), summary
    # by service (the default): iperf3's control and data connections are one row
    assert re.search(rf"\n{re.escape(pair.addr_b)}:5201 tcp \(\d flows?\) ", text), text
    http = f"{pair.addr_b}:{HTTP_PORT} "
    assert any(http in r.get("label", "") for w in windows for r in flow_rows(w)), windows
    # idle is no flow's cost: not among a flow's functions, nor as its stacks' leaf
    idle = idle_functions()
    for r in flow_rows(summary) + [r for w in windows for r in flow_rows(w)]:
        names = {f["function"].split(".")[0] for f in r["functions"]}
        leaves = {s["frames"][0].split("+")[0].split(".")[0] for s in r.get("stacks", [])}
        assert not (names | leaves) & idle, r
        assert r["direction"] in ("rx", "tx")
    for r in summary["flows"]:
        if r["flow"] is None:
            assert r["label"] in ("(no flow)", "(idle)") and r["direction"] is None, r
            for s in r["stacks"]:
                assert s["stack_id"] is None or 0 < s["stack_id"] < 2**62, s
    for line in table(text):
        label = line.split(" cpu-clock ")[0].strip()
        if label.startswith("("):
            assert label in ("(no flow)", "(idle)"), line  # and no direction
        else:
            assert line.split()[-1].split(".")[0] not in idle, line
    assert took < DURATION + 25, took  # the reads finished at stop are bounded
