"""deploy/grafana, run: on the real kernel, Debian's Prometheus scraping io, biolat,
memlat, runqlat and sentinel while a workload runs answers every dashboard panel's
query, and every variable's, with data. The same Prometheus loads every rules file of
deploy/prometheus: each rule evaluates without error, each recording rule has data, and
the series the rules' unit tests feed carry labels the tools really export. Its
Prometheus, workload and queries serve tests/deploy too. test_deploy_dashboards.py has
the rest: the dashboards' JSON model and queries, read."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import pytest
import yaml
from children import patience, reap, wait_until
from conftest import LoopDevice
from netns import IPERF3, netns_pair
from test_deploy_dashboards import LABEL_VALUES, TOOLS, queries, substitute, variables
from test_export_kernel import free_ports
from test_prometheus_rules_tools import LOSSES, RULES_DIR, metrics_in

from meridian.report_loop import stop_child

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
# io's scrape reads every per-process map: 0.3 to 0.8 s on the 2-CPU test VM while it
# is busy, past a 1 s scrape's timeout at times
SCRAPE = "2s"
# Series that need PMU events the test's agent does not sample (it runs on cpu-clock,
# as a VM without a PMU does): their panels' queries must parse, and may be empty.
PMU_ONLY = {
    "ms_flow_micromiss_rate",
    "ms_branch_mispred_rate",
    "ms_false_sharing_score",
    "ms_remote_dram_hotspot",
}


class Prometheus:
    """Debian's prometheus on a loopback port with this configuration, its config and
    data in a temporary directory; `api()` answers one /api/v1 call. (Also
    tests/deploy/promstack.py's, with the shipped deploy/prometheus/prometheus.yml.)"""

    def __init__(self, port: int, root: Path, config: dict[str, Any]):
        self.port = port
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.args = [
            PROMETHEUS,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:  # 400 and 422: a query it refused, and why
            body = json.load(exc)
        assert body["status"] == "success", (params, body.get("error"))
        return body["data"]

    def series(self, query: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=query)["result"]
        return result

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False


def scraping(ports: dict[str, int], rule_files: list[Path]) -> dict[str, Any]:
    """A configuration scraping each tool on its loopback port as the job the rules
    expect (meridian-TOOL), quickly (SCRAPE, rules evaluated every second)."""
    return {
        "global": {
            "scrape_interval": SCRAPE,
            "scrape_timeout": SCRAPE,
            "evaluation_interval": "1s",
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": f"meridian-{tool}",
                "static_configs": [{"targets": [f"127.0.0.1:{p}"]}],
            }
            for tool, p in ports.items()
        ],
    }


@contextlib.contextmanager
def started(args: list[str], log: TextIO) -> Iterator[subprocess.Popen[bytes]]:
    """A child writing to `log`, ended (SIGTERM, then SIGKILL) and reaped at the end."""
    child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield child
    finally:
        stop_child(child, patience(10))


def tails(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logs.glob("*.log")))


def scrapes_since(prom: Prometheus, jobs: set[str], since: float, n: int) -> None:
    """Wait until every job's target is up and has been scraped `n` times after `since`
    (Unix time), watching /api/v1/targets."""
    seen: dict[str, set[str]] = {job: set() for job in jobs}

    def done() -> bool:
        for t in prom.api("targets", state="active")["activeTargets"]:
            job = t["labels"]["job"]
            if job in seen and t["health"] == "up" and unix(t["lastScrape"]) > since:
                seen[job].add(t["lastScrape"])
        return all(len(s) >= n for s in seen.values())

    try:
        wait_until(done, 60, f"{n} scrapes of every target", step=0.2)
    except AssertionError:
        targets = prom.api("targets", state="active")["activeTargets"]
        state = {
            t["labels"]["job"]: (t["health"], t["lastError"], t["lastScrapeDuration"])
            for t in targets
        }
        counts = {job: len(s) for job, s in seen.items()}
        raise AssertionError(f"targets {state}; scrapes seen {counts}") from None


def unix(rfc3339: str) -> float:
    """Prometheus' RFC 3339 time (nanoseconds, Z) as Unix time."""
    m = re.fullmatch(r"(.+?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert m, rfc3339
    whole = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3]))
    return whole.timestamp() + float(f"0.{m[2] or 0}")


def label_names(prom: Prometheus, metric: str) -> set[str]:
    found = prom.api("series", **{"match[]": metric})
    return {k for labels in found for k in labels} - {"__name__", "job", "instance", "le"}


# memlat's process (-p): a round of faults per line of stdin, minor ones on fresh
# memory and major ones on the file the line names (its pages in no cache)
FAULTER = (
    "import mmap, sys\n"
    "for path in sys.stdin:\n"
    "    anon = mmap.mmap(-1, 4 << 20)\n"
    "    for i in range(0, len(anon), mmap.PAGESIZE):\n"
    "        anon[i] = 1\n"
    "    anon.close()\n"
    "    with open(path.strip(), 'rb') as f:\n"
    "        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
    "        print(sum(m[i] for i in range(0, len(m), mmap.PAGESIZE)), flush=True)\n"
    "        m.close()\n"
)


@contextlib.contextmanager
def panel_workload(
    ext4: Path, log: TextIO, netns: str
) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[str]]]:
    """What the panels show, running until the block ends: an iperf3 stream between two
    network namespaces (sentinel's flows), the file workload on `ext4` (io's files:
    buffered writes, cached reads, fsyncs; its waits for runqlat), and the FAULTER
    (memlat's process, driven by burst())."""
    with contextlib.ExitStack() as stack:
        pair = stack.enter_context(netns_pair(netns))
        pair.iperf3_start(300, bitrate="20M")
        file_io = ["meridian.workloads", "file-io", "--dir", str(ext4), "--seconds", "300"]
        workload = stack.enter_context(started([sys.executable, "-m", *file_io], log))
        faulter = subprocess.Popen(
            [sys.executable, "-c", FAULTER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        stack.callback(reap, faulter)
        yield workload, faulter


def burst(mnt: Path, faulter: subprocess.Popen[str]) -> None:
    """O_DIRECT writes and reads on the loop device's file system (block requests for
    biolat, disk operations for io), page faults of the faulter, major ones on the
    file written with O_DIRECT (no cache holds its pages), and pages dd dirtied that
    sync writes back (charged to dd as writeback)."""
    direct, dirty = mnt / "direct.bin", mnt / "dirty.bin"
    for args in (
        ("if=/dev/zero", f"of={direct}", "bs=64k", "count=64", "oflag=direct"),
        (f"if={direct}", "of=/dev/null", "bs=4k", "count=256", "iflag=direct"),
        ("if=/dev/zero", f"of={dirty}", "bs=64k", "count=16"),
    ):
        subprocess.run(["dd", *args, "status=none"], check=True, timeout=60)
    subprocess.run(["sync", "-f", str(dirty)], check=True, timeout=60)
    assert faulter.stdin is not None and faulter.stdout is not None
    faulter.stdin.write(f"{direct}\n")
    faulter.stdin.flush()
    assert faulter.stdout.readline().strip() == "0"  # the zeros dd wrote, read back


@pytest.mark.kernel
def test_every_panel_query_has_data_from_the_running_tools(
    ext4: Path, loop_device: LoopDevice, tmp_path: Path
) -> None:
    for binary, package in ((PROMETHEUS, "prometheus"), (IPERF3, "iperf3")):
        if not Path(binary).exists():
            pytest.skip(f"{binary} is not installed (Debian package {package}; make deps)")
    logs = tmp_path / "logs"
    logs.mkdir()
    *tool_ports, prom_port = free_ports(len(TOOLS) + 1)
    ports = dict(zip(TOOLS, tool_ports, strict=True))
    at = {tool: f"127.0.0.1:{port}" for tool, port in ports.items()}
    rule_files = sorted(RULES_DIR.glob("*-rules.yml"))
    prom = Prometheus(prom_port, tmp_path, scraping(ports, rule_files))
    with contextlib.ExitStack() as stack:

        def log(name: str) -> TextIO:
            return stack.enter_context(open(logs / f"{name}.log", "w"))

        workload, faulter = stack.enter_context(panel_workload(ext4, log("workload"), "g"))
        # memlat and runqlat per process (-P) for one process each (-p): the labels the
        # per-process panels and rules read, at a scrape of a few kB
        commands = {
            "io": ["io", "--no-events", "--grace", "300", "--prometheus", at["io"]],
            "biolat": [
                "biolat", "-Q", "--depth", "-d", loop_device.name, "--prometheus", at["biolat"]
            ],
            "memlat": ["memlat", "-P", "-p", str(faulter.pid), "--prometheus", at["memlat"]],
            "runqlat": ["runqlat", "-P", "-p", str(workload.pid), "--prometheus", at["runqlat"]],
            "sentinel": [
                "sentinel", "--events", "cpu-clock", "-F", "199",
                "--data-dir", str(tmp_path / "store"),
                "--prometheus", f"127.0.0.1:{ports['sentinel']}",
            ],
        }  # fmt: skip
        for tool, args in commands.items():
            stack.enter_context(started([sys.executable, "-m", "meridian", *args], log(tool)))
        stack.enter_context(started(prom.args, log("prometheus")))
        try:
            wait_until(prom.ready, 30, "Prometheus ready", step=0.1)
            jobs = {f"meridian-{t}" for t in TOOLS}
            scrapes_since(prom, jobs, 0, 1)  # every tool attached and serving
            t0 = time.time()
            burst(ext4, faulter)
            scrapes_since(prom, jobs, t0, 3)
            check_with_data(prom, ports, loop_device)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{tails(logs)}") from None


def panel_queries(
    prom: Prometheus, instances: dict[str, str], wanted: dict[str, str]
) -> dict[str, str]:
    """Every panel target's query ("TOOL: title refId" -> query) as Grafana sends it,
    with $instance the tool's instance (the only value its variable may offer) and each
    other variable the value in `wanted` (which its values must hold). Each query runs
    (parses); those reading only PMU-only series are left out (they may be empty)."""
    pending: dict[str, str] = {}
    for tool in TOOLS:
        values = {"instance": instances[tool]}
        for name, var in variables(tool).items():
            if var["type"] != "query":
                continue
            m = LABEL_VALUES.fullmatch(var["definition"])
            assert m is not None
            got = prom.api(f"label/{m[2]}/values", **{"match[]": substitute(m[1], values)})
            if name == "instance":  # each tool's own metric: its target alone
                assert got == [values["instance"]], (tool, got)
            else:
                assert wanted[name] in got, (tool, name, got)
                values[name] = wanted[name]
        for where, expr in queries(tool):
            query = substitute(expr, values)
            prom.series(query)  # parses and runs (status success), empty or not
            if not metrics_in(expr) <= PMU_ONLY:
                pending[f"{tool}: {where}"] = query
    return pending


def recording_rules(prom: Prometheus) -> dict[str, str]:
    """Each loaded recording rule ("recording rule NAME" -> NAME) but PMU-only ones."""
    return {
        f"recording rule {r['name']}": r["name"]
        for group in prom.api("rules")["groups"]
        for r in group["rules"]
        if r["type"] == "recording" and not metrics_in(r["query"]) <= PMU_ONLY
    }


def wait_for_data(prom: Prometheus, pending: dict[str, str], seconds: float) -> None:
    """Wait until every query of `pending` (what -> query) answers with a series; the
    failure lists those that did not, one a line."""
    left = dict(pending)

    def answered() -> bool:
        for what in [w for w, q in left.items() if prom.series(q)]:
            del left[what]
        return not left

    try:
        wait_until(answered, seconds, "data for every query", step=0.5)
    except AssertionError:
        lines = "\n".join(f"  {what}: {query}" for what, query in left.items())
        raise AssertionError(f"{len(left)} of {len(pending)} with no data:\n{lines}") from None


def check_with_data(prom: Prometheus, ports: dict[str, int], loop: LoopDevice) -> None:
    # the agent samples cpu-clock only: the PMU-only series cannot have data
    assert {s["metric"]["event"] for s in prom.series("ms_pmu_scale")} == {"cpu-clock"}
    instances = {tool: f"127.0.0.1:{ports[tool]}" for tool in TOOLS}
    pending = panel_queries(prom, instances, {"device": loop.name, "event": "cpu-clock"})
    # the sentinel flows of the iperf3 stream come with the agent's sampling
    wait_for_data(prom, pending | recording_rules(prom), 30)

    groups = prom.api("rules")["groups"]
    assert {g["file"] for g in groups} == {str(p) for p in sorted(RULES_DIR.glob("*-rules.yml"))}
    bad = [(r["name"], r["health"], r.get("lastError")) for g in groups for r in g["rules"]]
    assert all(health == "ok" for _, health, _ in bad), [b for b in bad if b[1] != "ok"]

    # the rules' unit tests feed series with the labels the tools export
    checked = set()
    for tests in sorted(RULES_DIR.glob("*-rules.test.yml")):
        for case in yaml.safe_load(tests.read_text())["tests"]:
            for s in case["input_series"]:
                name, _, labels = s["series"].partition("{")
                real = label_names(prom, name)
                if not real and name != "up":
                    continue  # not in this run (PMU findings, events not seen)
                given = set(re.findall(r"(\w+)=", labels)) - {"job", "instance", "le"}
                assert given <= real, (tests.name, s["series"], real)
                checked.add(name)
    for tool, losses in LOSSES.items():
        assert losses & checked, tool
