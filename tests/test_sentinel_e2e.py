"""`meridian sentinel` end to end, as a subprocess: the mock source drives the whole
user-space pipeline (no kernel, no root); /metrics parses as OpenMetrics and names
the flows; --json windows carry them; SIGTERM and Ctrl-C print the summary and exit
0 quickly. (The real kernel's runs: test_sentinel_kernel_stop.py.)"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from children import patience, wait_until

STOP_BOUND_S = 5.0  # SIGTERM to exit, with the summary
MOCK = ["--perf-mock", "--mock-period-ms=25"]
# the mock's 1,000 samples/s stay far below this budget on any number of CPUs, so the
# mode controller keeps sentinel mode
CALM = "--samples-per-sec=20000"
# the mock's RX TCP flow, as a person reads it, and its service (the summary's default)
RX_FLOW = "10.0.0.2:43012 -> 10.0.0.1:5201 tcp"
RX_SERVICE = "10.0.0.1:5201 tcp (1 flow)"


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


def scrape(port: int, openmetrics: bool = True) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if openmetrics:
        req.add_header("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
    with urllib.request.urlopen(req, timeout=5) as r:
        body: bytes = r.read()
        if openmetrics:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
    return body.decode()


def scrape_until(
    p: subprocess.Popen[str],
    port: int,
    needle: str,
    timeout: float = 20,
    value: Callable[[float], bool] | None = None,
) -> str:
    """Scrape until `needle` shows (the first flush window has happened), or, with
    `value`, until the unlabelled metric `needle` has a value it accepts."""
    end = time.monotonic() + patience(timeout)
    text = ""
    while time.monotonic() < end:
        assert p.poll() is None, p.communicate()
        try:
            text = scrape(port)
        except OSError:
            text = ""
        if value is None and needle in text:
            return text
        if value is not None and needle in text:
            (sample,) = families(text)[needle].samples
            if value(float(sample.value)):
                return text
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not in /metrics after {patience(timeout)}s:\n{text}")


def stop(p: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[str, str, float]:
    t0 = time.monotonic()
    p.send_signal(sig)
    out, err = p.communicate(timeout=STOP_BOUND_S + 10)
    return out, err, time.monotonic() - t0


def families(text: str) -> dict[str, Any]:
    from prometheus_client.openmetrics import parser

    parse: Any = parser.text_string_to_metric_families  # untyped
    return {f.name: f for f in parse(text)}


MOCK_RATE = 2000  # samples/s the mock source makes in the /metrics test
METRICS_GROUPS = [["cycles", "llc-misses"], ["branch-misses"], ["instructions"]]


def test_metrics_parse_as_openmetrics(procs: list[subprocess.Popen[str]], tmp_path: Path) -> None:
    """/metrics of a mock run with three event groups that do not rotate within the
    test: each event's scale is 3 (each is in one of the three groups, and the mock
    runs its events all the time they are enabled), the delivered rate is the mock's,
    nothing is dropped, and the flows carry the first group's events only."""
    cfg = tmp_path / "sentinel.yaml"
    period_ms = 25
    cfg.write_text(
        yaml.safe_dump(
            {
                "perf": {"sentinel_groups": METRICS_GROUPS, "rotation_window": 3600},
                "mock": {"rate": MOCK_RATE},
            }
        )
    )
    port = free_port()
    p = start(
        "--config", str(cfg), "--perf-mock", f"--mock-period-ms={period_ms}", CALM,
        f"--prometheus=127.0.0.1:{port}",
    )  # fmt: skip
    procs.append(p)
    text = scrape_until(p, port, 'src="10.0.0.2"')
    fams = families(text)  # raises on anything that is not OpenMetrics
    assert text.rstrip().endswith("# EOF")

    def value(name: str) -> float:
        (sample,) = fams[name].samples
        return float(sample.value)

    assert value("ms_agent_mode") == 0  # sentinel
    scales = {s.labels["event"]: s.value for s in fams["ms_pmu_scale"].samples}
    assert scales == {e: 3.0 for g in METRICS_GROUPS for e in g}
    # The mock delivers MOCK_RATE x its clock, one batch per period: a window of about
    # a second (the first one: its source opened a little before it) holds the
    # batches due in it, give or take one at either end.
    tolerance = MOCK_RATE * 2 * period_ms / 1000
    assert abs(value("ms_samples_per_sec") - MOCK_RATE) <= tolerance, value("ms_samples_per_sec")
    assert value("ms_sampling_throttled") == 0
    dropped = {s.labels["reason"]: s.value for s in fams["ms_dropped_samples"].samples}
    assert dropped == {"token_bucket": 0, "hard_drop": 0, "ring_full": 0, "target_filtered": 0}
    labelled = {s.labels["label"] for s in fams["ms_labelled_samples"].samples}
    assert labelled == {"function_unresolved", "stack_unresolved", "stack_gone", "stack_skipped"}
    norm = fams["ms_flow_event_norm"].samples
    rx = [s for s in norm if s.labels.get("src") == "10.0.0.2" and s.labels.get("sport") == "43012"]
    assert rx, norm
    assert {s.labels["dst"] for s in rx} == {"10.0.0.1"}
    assert {s.labels["dport"] for s in rx} == {"5201"}
    assert {s.labels["proto"] for s in rx} == {"tcp"}
    assert {s.labels["direction"] for s in rx} == {"rx"}
    assert all(len(s.labels["flow"]) == 16 for s in rx)
    assert {s.labels["event"] for s in norm} == set(METRICS_GROUPS[0])
    assert any(s.labels.get("src") == "fd00::2" for s in norm)  # IPv6 flows too
    assert "ms_flow_micromiss_rate" in fams
    assert "ms_tsc_slope" in fams and "ms_tsc_offset_ns" in fams
    _, _, took = stop(p)
    assert p.returncode == 0
    assert took < STOP_BOUND_S


def test_seed_check_as_written(procs: list[subprocess.Popen[str]]) -> None:
    """The check of docs/requirements/sentinel.md §7.2: `--perf-mock --mock-period-ms=25
    --metrics-port=9102`, the old flag still read, with a line that names the new one."""
    with socket.socket() as s:
        # as the agent's server binds: a connection of an earlier run in TIME_WAIT on
        # the port does not make it "in use"
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
    assert RX_SERVICE in out
    assert "--metrics-port is deprecated: use --prometheus [HOST]:PORT" in err


def test_json_windows_carry_flows(procs: list[subprocess.Popen[str]]) -> None:
    p = start(*MOCK, CALM, "--prometheus=127.0.0.1:0", "--json", "--duration", "3.5")
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
    # by service (the default): `services` beside `flows`, the same samples
    for o in [*busy, summary]:
        services = {(r["service"], r["direction"], r["event"]): r for r in o["services"]}
        for r in o["flows"]:
            if r.get("label") == RX_FLOW:
                svc = services[("10.0.0.1:5201 tcp", r["direction"], r["event"])]
                assert (svc["samples"], svc["flows"], svc["port"]) == (r["samples"], 1, 5201)
    assert summary["services"][0]["stacks"]


def test_by_flow_lists_the_5_tuples(procs: list[subprocess.Popen[str]]) -> None:
    """--by flow: the summary's rows are 5-tuples, the --json objects have no
    `services` (by service, the default, the summary says how to get them:
    test_signal_prints_summary_and_exits_0)."""
    # the two runs side by side: each waits for its own duration
    text = start(*MOCK, CALM, "--prometheus=127.0.0.1:0", "--duration", "1.5", "--by", "flow")
    procs.append(text)
    p = start(*MOCK, CALM, "--prometheus=127.0.0.1:0", "--duration", "1.5", "--by=flow", "--json")
    procs.append(p)
    out, err = text.communicate(timeout=30)
    assert text.returncode == 0, err
    assert RX_FLOW in out and RX_SERVICE not in out and "--by flow" not in out
    assert "\nFLOW " in out
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert not [line for line in out.splitlines() if "services" in json.loads(line)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_prints_summary_and_exits_0(procs: list[subprocess.Popen[str]], sig: int) -> None:
    port = free_port()
    p = start(*MOCK, f"--prometheus=127.0.0.1:{port}")
    procs.append(p)
    scrape_until(p, port, 'src="10.0.0.2"')
    out, err, took = stop(p, sig)
    assert p.returncode == 0, err
    assert took < STOP_BOUND_S, took
    assert "Traceback" not in err
    assert "samples in" in out  # the summary's first line
    assert RX_SERVICE in out and "\nSERVICE " in out and "(--by flow: 5-tuples)" in out
    assert "HOTTEST FUNCTION" in out
    assert "mock_" in out  # functions and stacks are named


def test_duration_stops_by_itself(procs: list[subprocess.Popen[str]]) -> None:
    p = start(*MOCK, "--prometheus=127.0.0.1:0", "--duration", "2")
    procs.append(p)
    t0 = time.monotonic()
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert time.monotonic() - t0 < 2 + 10  # start-up included
    assert "samples in" in out


def test_verbose_names_the_strategy_and_source(procs: list[subprocess.Popen[str]]) -> None:
    p = start(*MOCK, "--prometheus=127.0.0.1:0", "--duration", "1", "-v")
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


def wait_for(cond: Any, timeout: float = 10, what: str = "condition") -> None:
    wait_until(cond, timeout, what, step=0.05)


def test_runtime_observers_control_and_stop() -> None:
    from meridian.tools.sentinel.agent.run import Runtime
    from meridian.tools.sentinel.model.records import Event
    from meridian.tools.sentinel.sources.mock import PIDS, MockSource

    src = MockSource(period_ms=10, rng_seed=3, rate=2000)
    rec = Recorder()
    logged: list[str] = []
    cfg = mock_config()
    cfg.perf.rotation_window = 0.3
    first, second = cfg.groups("diagnostic")  # ["cycles", ...], ["remote-dram", "hitm"]
    rt = Runtime(cfg, src, observers=[rec, Broken()], log=logged.append)
    rt.start()
    ctl = rt.control
    try:
        wait_for(lambda: len(rec.windows) >= 2)
        assert rec.batches and all(len(b.wall_ns) == len(b.samples) for b in rec.batches)
        assert all(len(b.norm_cost) == len(b.samples) for b in rec.batches)
        assert all(0 < c <= 1 for b in rec.batches for c in b.norm_cost.tolist())
        w = rec.windows[-1]
        assert w.stats and w.info.mode == "sentinel" and not w.final
        assert sum(1 for line in logged if "Broken failed" in line) == 1  # said once, dropped

        assert ctl.set_mode("diagnostic").label == "diagnostic"
        windows, batches = len(rec.windows), len(rec.batches)  # from here: diagnostic
        st = ctl.status()
        assert st["mode"] == "diagnostic"
        # each event is in one of the two groups: sampled half the time
        halves = {e: 2.0 for g in (first, second) for e in g}
        wait_for(lambda: ctl.status()["scales"] == halves, what="the diagnostic scales")
        assert st["samples_per_sec_budget"] == rt.cfg.perf.diagnostic_samples_per_sec
        # The rotator turns to the second group, and back: windows say so, and the
        # samples the source delivers carry the group's events.
        wait_for(
            lambda: any(w.info.events == second for w in rec.windows[windows:]),
            what="window of the second diagnostic group",
        )
        turned = next(
            i for i, w in enumerate(rec.windows) if i >= windows and w.info.events == second
        )
        wait_for(lambda: any(w.info.events == first for w in rec.windows[turned:]))
        # (the window flushing at the mode change may have been computed before it)
        assert all(w.info.scales == halves for w in rec.windows[windows + 1 :])
        seen = {int(e) for b in rec.batches[batches:] for e in np.unique(b.samples["event"])}
        assert {int(Event.REMOTE_DRAM), int(Event.XSNP_HITM)} <= seen
        assert {int(Event.CYCLES), int(Event.BRANCH_MISS)} <= seen

        ctl.set_budgets(diagnostic=5, hard_drop_ns=0)
        wait_for(lambda: src._budget == 5)
        ctl.set_targets([{"pid": PIDS[1]}])
        wait_for(lambda: list(src._targets) == [PIDS[1]])
        n = len(rec.windows)
        # Window n may have been cut before the targets reached the source, and n + 1
        # then holds samples from before; from n + 2 on, every window is cut after.
        wait_for(
            lambda: sum(len(w.rows) for w in rec.windows[n + 2 :]) > 0,
            what="rows of the targeted pid",
        )
        pids = {int(p) for w in rec.windows[n + 2 :] for p in w.rows["pid"]}
        assert pids == {PIDS[1]}
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
