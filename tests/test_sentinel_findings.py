"""The detectors inside the running agent (mock source): their findings are the gauges
of /metrics, every point of a family with the same labels, flows with their 5-tuple."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
from children import wait_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meridian.tools.sentinel.agent.findings import Findings, detector_context
from meridian.tools.sentinel.agent.run import Runtime
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.detectors import DetectorContext, detector_types
from meridian.tools.sentinel.detectors.false_sharing import MIN_HITS, MIN_SHARERS
from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.records import Event
from meridian.tools.sentinel.sources.mock import SHARED_LINES, MockSource, make_samples


class Seen:
    """Every batch the runtime kept, and the number of windows flushed."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []
        self.windows = 0

    def on_samples(self, batch: object) -> None:
        self.batches.append(batch.samples.copy())  # type: ignore[attr-defined]

    def on_window(self, window: object) -> None:
        self.windows += 1

    def close(self) -> None:
        pass


def shared_lines(samples: np.ndarray[Any, Any]) -> dict[int, int]:
    """{line: HITM samples} of the lines FalseSharing must report for these samples
    (one window): at least MIN_SHARERS CPUs, or processes, with MIN_HITS each."""
    hitm = samples[(samples["event"] == Event.XSNP_HITM) & (samples["data_addr"] != 0)]
    lines = (hitm["data_addr"] >> 6).tolist()
    per_cpu = Counter(zip(lines, hitm["cpu"].tolist(), strict=True))
    per_pid = Counter(zip(lines, hitm["pid"].tolist(), strict=True))
    out: dict[int, int] = {}
    for line, hits in Counter(lines).items():
        cpus = sum(1 for (ln, _), n in per_cpu.items() if ln == line and n >= MIN_HITS)
        pids = sum(1 for (ln, _), n in per_pid.items() if ln == line and n >= MIN_HITS)
        if cpus >= MIN_SHARERS or pids >= MIN_SHARERS:
            out[line] = hits
    return out


# the mock's HITM samples fall on these four cache lines
MOCK_LINES = {(SHARED_LINES >> 6) + i for i in range(4)}


def test_findings_are_the_detector_gauges() -> None:
    cfg = SentinelConfig()
    cfg.mock.enabled, cfg.metrics.enabled, cfg.anomaly.enabled = True, False, False
    cfg.mode.auto = False
    cfg.perf.sentinel_groups = cfg.perf.diagnostic_groups = [["hitm", "remote-dram"]]
    cfg.aggregator.flush_interval = 3600.0  # no flush of its own: the test stops it
    rt = Runtime(cfg, MockSource(period_ms=10, rng_seed=7))
    findings = Findings(DetectorContext(objects=rt.symbolizer), rt.names.flow)
    seen = Seen()
    for obs in (seen, findings):
        rt.add_observer(obs)
    rt.metrics.add_source(findings.families)
    rt.start()
    try:
        # until every shared line of the mock is over the detector's bar
        wait_until(
            lambda: (
                set(shared_lines(np.concatenate([*seen.batches, make_samples(0)]))) == MOCK_LINES
            ),
            20,
            "HITM samples over the bar on each of the mock's shared lines",
        )
    finally:
        rt.stop()  # the last window closes the detectors' windows
    samples = np.concatenate(seen.batches)
    remote = samples[samples["event"] == Event.REMOTE_DRAM]
    cols = (remote[c].tolist() for c in ("flow_id", "numa_node", "ifindex"))
    want = Counter(zip(*cols, strict=True))
    assert len(remote) > 0 and seen.windows == 1

    registry = CollectorRegistry(auto_describe=False)
    registry.register(rt.metrics)
    text = generate_latest(registry).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    points = fams["ms_remote_dram_hotspot"].samples
    got = {
        (int(p.labels["flow"], 16), int(p.labels["numa"]), int(p.labels["ifindex"])): p.value
        for p in points
    }
    assert got == want  # one window: every remote-DRAM sample counted once
    named = [p for p in points if p.labels["src"]]
    assert named and all(p.labels["proto"] in ("tcp", "udp") for p in named)
    assert {frozenset(p.labels) for p in points} == {
        frozenset({"flow", "numa", "ifindex", "src", "dst", "sport", "dport", "proto"})
    }
    expected = shared_lines(samples)  # every HITM sample of the run, one window
    assert set(expected) == MOCK_LINES
    fs = fams["ms_false_sharing_score"].samples
    scores = {int(p.labels["line"], 16) >> 6: p.value for p in fs}
    assert scores == expected  # each line reported, once, with all its samples
    drops = {p.labels["detector"]: p.value for p in fams["ms_detector_dropped_samples"].samples}
    assert drops == {"false_sharing": 0, "remote_dram": 0}  # every sample counted


class FakeFinding:
    def __init__(self, metric: str, value: float, **labels: str) -> None:
        self.metric, self.value, self._labels = metric, value, labels

    def labels(self) -> dict[str, str]:
        return dict(self._labels)


class FakeDetector:
    """Emits its findings at each window's end; every call kept."""

    def __init__(self, name: str, findings: list[FakeFinding], dropped: int) -> None:
        self.name, self.findings, self.drops = name, findings, dropped
        self.seen: list[Any] = []
        self.ends: list[int] = []

    def observe(self, samples: Any) -> None:
        self.seen.append(samples)

    def flush(self, end_ns: int, emit: Any) -> None:
        self.ends.append(end_ns)
        for f in self.findings:
            emit(f)

    def dropped(self) -> int:
        return self.drops


def test_findings_families_exact_with_the_flows_5_tuples() -> None:
    """Each detector type's gauge with the last window's findings (a flow's 5-tuple, or
    empty labels while it has no name; no flow, no 5-tuple), and every detector's drops;
    nothing before the first window. The detectors given are the ones used."""
    first, second = (cls.metric for cls in detector_types().values())
    docs = {cls.metric: cls.doc for cls in detector_types().values()}
    named = {10: FlowKey("10.0.0.1", "10.0.0.2", 1, 2, "tcp")}
    a = FakeDetector("a", [FakeFinding(first, 0.5, flow="000000000000000a", line="x")], 3)
    b = FakeDetector(
        "b", [FakeFinding(first, 1.0, flow="b"), FakeFinding(second, 2.0, node="1")], 0
    )
    f = Findings(DetectorContext(), named.get, detectors=[a, b])  # type: ignore[list-item]
    assert [id(d) for d in f.detectors] == [id(a), id(b)]
    before = [(x.name, x.points) for x in f.families()]
    assert before == [(first, []), (second, []), ("ms_detector_dropped_samples", before[2][1])]
    f.on_samples(SimpleNamespace(samples="batch"))
    f.on_window(SimpleNamespace(end_ns=7))
    assert (a.seen, b.seen, a.ends, b.ends) == (["batch"], ["batch"], [7], [7])
    got = [
        (x.name, x.kind, x.unit, x.description, [(p.attrs, p.value) for p in x.points])  # type: ignore[union-attr]
        for x in f.families()
    ]
    flow_a = {"flow": "000000000000000a", "line": "x", "src": "10.0.0.1", "dst": "10.0.0.2",
              "sport": 1, "dport": 2, "proto": "tcp"}  # fmt: skip
    flow_b = {"flow": "b", "src": "", "dst": "", "sport": "", "dport": "", "proto": ""}
    assert got == [
        (first, "gauge", "", docs[first], [(flow_a, 0.5), (flow_b, 1.0)]),
        (second, "gauge", "", docs[second], [({"node": "1"}, 2.0)]),
        ("ms_detector_dropped_samples", "counter", "",
         "samples a detector observed but could not count (its table was full)",
         [({"detector": "a"}, 3), ({"detector": "b"}, 0)]),
    ]  # fmt: skip
    lookup = object()
    ctx = detector_context(SentinelConfig(), lookup)  # type: ignore[arg-type]
    assert ctx.objects is lookup and set(ctx.settings) <= set(detector_types())
