"""`meridian sentinel` end to end, as a subprocess: the mock source drives the whole
user-space pipeline (no kernel, no root); /metrics parses as OpenMetrics and names
the flows; --json windows carry them; SIGTERM and Ctrl-C print the summary and exit
0 quickly. The kernel test checks that a real run leaves nothing attached."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

STOP_BOUND_S = 5.0  # SIGTERM to exit, with the summary
MOCK = ["--perf-mock", "--mock-period-ms=25"]
# the mock's 1,000 samples/s stay far below this budget on any number of CPUs, so the
# mode controller keeps sentinel mode
CALM = "--samples-per-sec=20000"
# the mock's RX TCP flow, as a person reads it
RX_FLOW = "10.0.0.2:43012 -> 10.0.0.1:5201 tcp"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "meridian", "sentinel", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test started, killed if the test left them running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)


def scrape(port: int, openmetrics: bool = True) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if openmetrics:
        req.add_header("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
    with urllib.request.urlopen(req, timeout=5) as r:
        body: bytes = r.read()
        if openmetrics:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
    return body.decode()


def scrape_until(p: subprocess.Popen[str], port: int, needle: str, timeout: float = 20) -> str:
    """Scrape until `needle` shows (the first flush window has happened)."""
    end = time.monotonic() + timeout
    text = ""
    while time.monotonic() < end:
        assert p.poll() is None, p.communicate()
        try:
            text = scrape(port)
        except OSError:
            text = ""
        if needle in text:
            return text
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not in /metrics after {timeout}s:\n{text}")


def stop(p: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[str, str, float]:
    t0 = time.monotonic()
    p.send_signal(sig)
    out, err = p.communicate(timeout=STOP_BOUND_S + 10)
    return out, err, time.monotonic() - t0


def families(text: str) -> dict[str, Any]:
    from prometheus_client.openmetrics import parser

    parse: Any = parser.text_string_to_metric_families  # untyped
    return {f.name: f for f in parse(text)}


def test_metrics_parse_as_openmetrics(procs: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    p = start(*MOCK, CALM, f"--metrics-port={port}")
    procs.append(p)
    text = scrape_until(p, port, 'src="10.0.0.2"')
    fams = families(text)  # raises on anything that is not OpenMetrics
    assert text.rstrip().endswith("# EOF")

    def value(name: str) -> float:
        (sample,) = fams[name].samples
        return float(sample.value)

    assert value("ms_agent_mode") == 0  # sentinel
    assert value("ms_samples_per_sec") > 0
    assert value("ms_pmu_scale") >= 1
    assert value("ms_sampling_throttled") == 0
    norm = fams["ms_flow_event_norm"].samples
    rx = [s for s in norm if s.labels.get("src") == "10.0.0.2" and s.labels.get("sport") == "43012"]
    assert rx, norm
    assert {s.labels["dst"] for s in rx} == {"10.0.0.1"}
    assert {s.labels["dport"] for s in rx} == {"5201"}
    assert {s.labels["proto"] for s in rx} == {"tcp"}
    assert {s.labels["direction"] for s in rx} == {"rx"}
    assert all(len(s.labels["flow"]) == 16 for s in rx)
    assert {s.labels["event"] for s in norm} >= {"cycles", "llc-misses"}
    assert any(s.labels.get("src") == "fd00::2" for s in norm)  # IPv6 flows too
    assert "ms_flow_micromiss_rate" in fams
    assert "ms_dropped_samples" in fams  # the counter ms_dropped_samples_total
    assert "ms_tsc_slope" in fams and "ms_tsc_offset_ns" in fams
    _, _, took = stop(p)
    assert p.returncode == 0
    assert took < STOP_BOUND_S


def test_seed_check_as_written(procs: list[subprocess.Popen[str]]) -> None:
    """The seed's own check: `--perf-mock --mock-period-ms=25 --metrics-port=9102`."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 9102))
        except OSError:
            pytest.skip("port 9102 is in use here")
    p = start("--perf-mock", "--mock-period-ms=25", "--metrics-port=9102")
    procs.append(p)
    text = scrape_until(p, 9102, "ms_flow_event_norm{")
    assert "ms_agent_mode" in families(text)
    out, err, took = stop(p)
    assert p.returncode == 0, err
    assert took < STOP_BOUND_S
    assert RX_FLOW in out


def test_json_windows_carry_flows(procs: list[subprocess.Popen[str]]) -> None:
    p = start(*MOCK, CALM, "--metrics-port=0", "--json", "--duration", "3.5")
    procs.append(p)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    objs = [json.loads(line) for line in out.splitlines()]
    windows = [o for o in objs if o["type"] == "window"]
    assert len(windows) >= 2, out
    assert objs[-1]["type"] == "summary"
    busy = [w for w in windows if w["samples"] > 0]
    assert busy
    for w in busy:
        assert w["mode"] == "sentinel"
        assert w["source"] == "mock"
        assert w["samples_per_sec"] > 0
        assert w["flows"], w
        row = w["flows"][0]
        for key in ("flow", "direction", "event", "samples", "norm_cost", "functions"):
            assert key in row
    labels = {r.get("label") for w in busy for r in w["flows"]}
    assert RX_FLOW in labels
    rx = next(r for w in busy for r in w["flows"] if r.get("label") == RX_FLOW)
    assert (rx["src"], rx["sport"], rx["dst"], rx["dport"], rx["proto"]) == (
        "10.0.0.2",
        43012,
        "10.0.0.1",
        5201,
        "tcp",
    )
    assert rx["functions"][0]["function"].startswith("mock_")
    summary = objs[-1]
    assert summary["samples"] > 0
    top = summary["flows"][0]
    assert top["stacks"] and top["stacks"][0]["frames"][0].startswith("mock_")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_prints_summary_and_exits_0(procs: list[subprocess.Popen[str]], sig: int) -> None:
    port = free_port()
    p = start(*MOCK, f"--metrics-port={port}")
    procs.append(p)
    scrape_until(p, port, 'src="10.0.0.2"')
    out, err, took = stop(p, sig)
    assert p.returncode == 0, err
    assert took < STOP_BOUND_S, took
    assert "Traceback" not in err
    assert "samples in" in out  # the summary's first line
    assert RX_FLOW in out
    assert "HOTTEST FUNCTION" in out
    assert "mock_" in out  # functions and stacks are named


def test_duration_stops_by_itself(procs: list[subprocess.Popen[str]]) -> None:
    p = start(*MOCK, "--metrics-port=0", "--duration", "2")
    procs.append(p)
    t0 = time.monotonic()
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert time.monotonic() - t0 < 2 + 10  # start-up included
    assert "samples in" in out


def test_verbose_names_the_strategy_and_source(procs: list[subprocess.Popen[str]]) -> None:
    p = start(*MOCK, "--metrics-port=0", "--duration", "1", "-v")
    procs.append(p)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "strategy: mock" in err
    assert "events: " in err


# ---- the runtime in process: observers (part 2's sinks plug in here) and control ----


def mock_config(**flush: float) -> Any:
    from meridian.tools.sentinel.config.load import SentinelConfig

    cfg = SentinelConfig()
    cfg.metrics.enabled = False
    cfg.anomaly.enabled = False
    cfg.mode.auto = False
    cfg.aggregator.flush_interval = flush.get("interval", 0.2)
    cfg.mock.enabled = True
    return cfg


class Recorder:
    """An observer that keeps what it is given."""

    def __init__(self) -> None:
        self.windows: list[Any] = []
        self.batches: list[Any] = []
        self.closed = 0

    def on_samples(self, batch: Any) -> None:
        self.batches.append(batch)

    def on_window(self, window: Any) -> None:
        self.windows.append(window)

    def close(self) -> None:
        self.closed += 1


class Broken:
    def on_window(self, window: Any) -> None:
        raise RuntimeError("sink down")

    def close(self) -> None:
        pass


def wait_for(cond: Any, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_runtime_observers_control_and_stop() -> None:
    from meridian.tools.sentinel.agent.run import Runtime
    from meridian.tools.sentinel.sources.mock import PIDS, MockSource

    src = MockSource(period_ms=10, rng_seed=3, rate=2000)
    rec = Recorder()
    logged: list[str] = []
    rt = Runtime(mock_config(), src, observers=[rec, Broken()], log=logged.append)
    rt.start()
    ctl = rt.control
    try:
        wait_for(lambda: len(rec.windows) >= 2)
        assert rec.batches and all(len(b.wall_ns) == len(b.samples) for b in rec.batches)
        assert all(len(b.norm_cost) == len(b.samples) for b in rec.batches)
        assert all(0 < c <= 1 for b in rec.batches for c in b.norm_cost.tolist())
        w = rec.windows[-1]
        assert w.stats and w.info.mode == "sentinel" and not w.final
        assert len(w.rows) == len(w.rollups)
        assert sum(1 for line in logged if "Broken failed" in line) == 1  # said once, dropped

        assert ctl.set_mode("diagnostic").label == "diagnostic"
        wait_for(lambda: set(src.events) >= {2, 3})  # the diagnostic group reached the source
        st = ctl.status()
        assert st["mode"] == "diagnostic" and st["scale"] == 2.0
        assert st["events"] == ["cycles", "instructions", "llc-misses", "branch-misses"]
        assert st["samples_per_sec_budget"] == rt.cfg.perf.diagnostic_samples_per_sec

        ctl.set_budgets(diagnostic=5, hard_drop_ns=0)
        wait_for(lambda: src._budget == 5)
        ctl.set_targets([{"pid": PIDS[1]}])
        wait_for(lambda: list(src._targets) == [PIDS[1]])
        n = len(rec.windows)
        wait_for(lambda: len(rec.windows) >= n + 2)
        late = rec.windows[-1]
        assert {int(p) for p in late.rows["pid"]} <= {PIDS[1]}
    finally:
        rt.stop()
    rt.stop()  # idempotent
    assert src._closed
    assert rec.closed == 1
    assert rec.windows[-1].final
    kept = sum(len(b.samples) for b in rec.batches)
    assert sum(w.info.samples for w in rec.windows) == ctl.status()["samples_delivered"]
    assert sum(int(w.rows["samples"].sum()) for w in rec.windows) == kept  # none left behind
    assert rt.totals.samples == kept


def test_runtime_start_failure_closes_what_it_opened() -> None:
    from meridian.errors import UsageError
    from meridian.tools.sentinel.agent.run import Runtime
    from meridian.tools.sentinel.agent.services import Services

    cfg = mock_config()
    cfg.metrics.enabled = True
    cfg.metrics.listen_port = free_port()

    def no_source() -> Any:
        raise UsageError("no source here")

    rec = Recorder()
    services = Services(cfg, Runtime(cfg, no_source, observers=[rec]), print)
    with pytest.raises(UsageError, match="no source here"):
        services.start()
    with socket.socket() as s:  # the metrics port is free again
        s.bind(("127.0.0.1", cfg.metrics.listen_port))
    assert rec.closed == 1
    services.stop()


# ---- the real kernel ---------------------------------------------------------------
# Other tests may load programs at the same time, so the checks follow the programs
# of this run by id (from the fdinfo of the agent's descriptors) rather than counting.


def loaded_ids() -> set[int]:
    progs = json.loads(subprocess.check_output(["bpftool", "-j", "prog", "list"]) or b"[]")
    return {int(p["id"]) for p in progs}


def held_by(pid: int) -> tuple[set[int], int]:
    """(ids of the BPF programs process `pid` holds, its perf event descriptors)."""
    ids: set[int] = set()
    perf = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target == "anon_inode:[perf_event]":
                perf += 1
            if target.startswith("anon_inode:bpf"):
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    for line in f:
                        if line.startswith("prog_id:"):
                            ids.add(int(line.split()[1]))
        except OSError:
            pass  # closed meanwhile
    return ids, perf


def gone(ids: set[int], timeout: float = 10) -> set[int]:
    """Those of `ids` still loaded after `timeout` (the kernel frees them after RCU)."""
    end = time.monotonic() + timeout
    left = ids & loaded_ids()
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = ids & loaded_ids()
    return left


@pytest.mark.kernel
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_kernel_stop_leaves_nothing_attached(procs: list[subprocess.Popen[str]], sig: int) -> None:
    port = free_port()
    p = start("--events", "cpu-clock", f"--metrics-port={port}", "-F", "99")
    procs.append(p)
    scrape_until(p, port, "ms_tsc_slope{", timeout=60)  # after a flush window
    ids, perf = held_by(p.pid)
    assert ids, "the agent holds no BPF program"
    assert ids <= loaded_ids()
    assert perf > 0, "no perf event open"
    out, err, took = stop(p, sig)
    assert p.returncode == 0, err
    assert took < STOP_BOUND_S + 5
    assert "samples in" in out
    assert gone(ids) == set()


@pytest.mark.kernel
@pytest.mark.parametrize("delay", [0.5, 1.0, 2.0])
def test_kernel_signal_while_loading(procs: list[subprocess.Popen[str]], delay: float) -> None:
    """SIGTERM at any point of the start (imports, load, attach): the run ends within
    the bound and nothing it had loaded stays."""
    p = start("--events", "cpu-clock", "--metrics-port=0", "-F", "99")
    procs.append(p)
    time.sleep(delay)
    ids, _ = held_by(p.pid)
    _, err, took = stop(p)
    assert took < STOP_BOUND_S + 5, err
    assert "Traceback" not in err
    assert gone(ids) == set()


def test_a_group_the_source_refuses_keeps_the_running_events() -> None:
    """A group the source cannot open while running (a raw code a real PMU refuses) is
    said once; the agent goes on sampling what it sampled."""
    from meridian.errors import BpfError
    from meridian.tools.sentinel.agent.run import Runtime
    from meridian.tools.sentinel.sources.mock import MockSource

    class Refusing(MockSource):
        def set_events(self, events: Any) -> float:
            if any(str(e.name).startswith("raw") for e in events):
                raise BpfError("perf_event_open(type=4, config=0x1cd, cpu=0)", 22)
            return super().set_events(events)

    src = Refusing(period_ms=10, rng_seed=3, rate=2000)
    rec = Recorder()
    logged: list[str] = []
    rt = Runtime(mock_config(), src, observers=[rec], log=logged.append)
    rt.start()
    ctl = rt.control
    try:
        wait_for(lambda: len(rec.windows) >= 1)
        before = ctl.status()["events"]
        ctl.set_groups([["raw:0x1cd"]], [["raw:0x1cd"]])
        wait_for(lambda: any("cannot sample" in line for line in logged))
        n = len(rec.windows)
        wait_for(lambda: len(rec.windows) >= n + 2)  # still flushing windows
        assert ctl.status()["running"] and ctl.status()["events"] == before
        assert rec.windows[-1].info.samples > 0  # and still sampling
        refused = [line for line in logged if "cannot sample" in line]
        assert len(refused) == 1 and "raw" in refused[0] and "still sampling" in refused[0]
    finally:
        rt.stop()
