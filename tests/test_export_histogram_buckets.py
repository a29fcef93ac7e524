"""Histograms that aggregate: every series of a histogram family shows the same `le`
bounds (the family's range), so `histogram_quantile(q, sum by (le) (...))` over
several processes is the quantile of their merged histograms. Checked on the
renderer's text, on OTLP, with Debian's promtool (PromQL's own histogram_quantile),
and against the disk latency alert's unit test in deploy/prometheus/io-rules.test.yml."""

from __future__ import annotations

import re
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from otlp_receiver import grpc_receiver
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meridian.export.exposition import render
from meridian.export.otlp import OtlpMetrics
from meridian.export.prometheus import SeriesCollector
from meridian.export.series import Family, HistPoint, Point
from meridian.hist import Hist, Layout, quantile
from meridian.tools.io.metrics import Group, series_of
from meridian.tools.io.model import NBUCKETS, OpStats, PidSummary

RULES_TESTS = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "io-rules.test.yml"
LATENCY_NAME = "process_disk_operation_duration_seconds"
IO_SLOTS = len(Hist.of_buckets(np.zeros(NBUCKETS, np.uint64), "nsecs").slots)
# io's latency bounds: 2**10 ns (1.024 us) .. 2**33 ns (8.59 s), the kernel's last
# slot bound (its slot 33 holds everything from 2**33 ns up)
IO_LE = [repr(float(1 << k) * 1e-9) for k in range(10, 34)]


def reader(pid: int, comm: str, latencies: dict[int, int]) -> Group:
    """A process's disk reads, {latency ns: count}, as the kernel's log-linear buckets
    count them."""
    layout = Layout(NBUCKETS)
    buckets = np.zeros(NBUCKETS, np.uint64)
    for ns, n in latencies.items():
        buckets[layout.bucket_of(ns)] += np.uint64(n)
    ops = sum(latencies.values())
    stats = OpStats(
        ops=ops,
        bytes=4096 * ops,
        disk_bytes=4096 * ops,
        latency_sum_ns=sum(ns * n for ns, n in latencies.items()),
        latency_max_ns=max(latencies),
        first_ns=1,
        last_ns=2,
        hist=Hist.of_buckets(buckets, "nsecs", min(latencies), max(latencies)),
    )
    attrs: dict[str, str | int | bool] = {"process.pid": pid, "process.executable.name": comm}
    return attrs, PidSummary(pid, comm, {("read", False, "syscall"): stats})


# A fast reader, a mostly fast one with a few very slow reads, and one with reads below
# the range (300 ns), between, and one past the kernel's last slot bound (20 s).
READERS = [
    reader(42, "db", {700_000: 3000}),
    reader(43, "backup", {200_000: 2997, 150_000_000: 3}),
    reader(44, "cron", {300: 40, 5_000: 10, 5_000_000: 9, 20_000_000_000: 1}),
]


def latency_family(groups: list[Group]) -> Family:
    [fam] = [f for f in series_of(groups, {}, 0) if f.name == "process.disk.operation.duration"]
    return fam


def buckets_by_series(text: str, name: str) -> dict[tuple[tuple[str, str], ...], dict[str, float]]:
    """{labels without le: {le: cumulative count}} of a histogram in exposition text."""
    out: dict[tuple[tuple[str, str], ...], dict[str, float]] = defaultdict(dict)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name + "_bucket":
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                out[key][s.labels["le"]] = s.value
    return out


def test_every_series_of_a_family_has_the_same_le_bounds() -> None:
    text = render([latency_family(READERS)])
    series = buckets_by_series(text, LATENCY_NAME)
    assert len(series) == 3
    for buckets in series.values():
        assert list(buckets) == [*IO_LE, "+Inf"]
        counts = list(buckets.values())
        assert counts == sorted(counts)  # cumulative


def test_inf_is_the_count_and_values_outside_the_range_are_kept() -> None:
    text = render([latency_family(READERS)])
    samples = {
        (s.name, s.labels.get("process_executable_name"), s.labels.get("le")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    for comm, count in (("db", 3000), ("backup", 3000), ("cron", 60)):
        assert samples[LATENCY_NAME + "_bucket", comm, "+Inf"] == count
        assert samples[LATENCY_NAME + "_count", comm, None] == count
    first, top = IO_LE[0], IO_LE[-1]
    assert samples[LATENCY_NAME + "_bucket", "cron", first] == 40  # 300 ns: in the first
    assert samples[LATENCY_NAME + "_bucket", "cron", top] == 59  # 20 s: only in +Inf


def test_slots_above_a_narrower_range_count_only_in_inf() -> None:
    """A kernel histogram that runs past the range on both sides (40 ns slots, up to
    2**39 ns): the bounds are the range's, 2**10 .. 2**36 ns, whatever the slots."""
    slots = np.zeros(40, np.uint64)
    slots[[2, 15, 37, 39]] = [5, 7, 11, 13]  # 4 ns, 32 us, 137 s, the overflow slot
    fam = Family("x.duration", "histogram", "s", "", [HistPoint({}, slots, 1e-9, 0.0)])
    [got] = buckets_by_series(render([fam]), "x_duration_seconds").values()
    assert list(got) == [*(repr(float(1 << k) * 1e-9) for k in range(10, 37)), "+Inf"]
    assert got["1.024e-06"] == 5 and got["3.2768e-05"] == 5 and got["6.5536e-05"] == 12
    assert got["68.719476736"] == 12 and got["+Inf"] == 36
    bounds = fam.bounds.of(40, 1e-9)
    assert bounds.counts(slots) == [5, *([0] * 5), 7, *([0] * 20), 24]  # OTLP's buckets


def test_large_counts_are_written_as_prometheus_client_writes_them() -> None:
    """The bucket lines come from a format string, whole counts below a million
    written as "12.0" directly, larger ones as Go floats: both as prometheus_client."""
    slots = np.zeros(IO_SLOTS, np.uint64)
    slots[[12, 20, 33]] = [999_999, 12_345_678, 1]
    small = slots.copy()
    small[[20, 33]] = 0
    points: list[Point | HistPoint] = [
        HistPoint({"n": "large"}, slots, 1e-9, 1e6 / 3),
        HistPoint({"n": "small"}, small, 1e-9, 0.5),
    ]
    fams = [Family("x.duration", "histogram", "s", "", points)]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SeriesCollector(lambda: fams))
    text = render(fams)
    assert text == generate_latest(registry).decode()
    assert 'x_duration_seconds_bucket{le="+Inf",n="large"} 1.3345678e+07' in text
    assert 'x_duration_seconds_bucket{le="+Inf",n="small"} 999999.0' in text


@pytest.mark.parametrize(
    ("unit", "nslots", "scale", "first", "last", "n"),
    [
        ("s", IO_SLOTS, 1e-9, 1.024e-06, 8.589934592, 24),  # io: ns, the kernel's top
        ("s", 32, 1e-6, 2e-06, 67.108864, 26),  # biolat, memlat, runqlat: usecs
        ("s", 32, 1e-3, 0.002, 65.536, 16),  # biolat -m, runqlat -m: msecs
        ("s", 32, 1e-9, 1.024e-06, 2.147483648, 22),  # memlat --ns
        ("{request}", 32, 1.0, 2.0, 1024.0, 10),  # biolat --depth: queue depth
    ],
)
def test_each_unit_has_the_range_the_readme_gives(
    unit: str, nslots: int, scale: float, first: float, last: float, n: int
) -> None:
    b = Family("x", "histogram", unit, "").bounds.of(nslots, scale)
    assert (b.bounds[0], b.bounds[-1], len(b.bounds)) == (first, last, n)


def _wait(pred: Callable[[], bool], seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not pred() and time.monotonic() < end:
        time.sleep(0.05)


def test_otlp_points_have_the_family_bounds_and_prometheus_counts() -> None:
    fam = latency_family(READERS)
    prom = buckets_by_series(render([fam]), LATENCY_NAME)
    with grpc_receiver() as (port, got):
        exp = OtlpMetrics(lambda: [fam], "io", f"http://127.0.0.1:{port}", interval=0.2)
        try:
            _wait(lambda: bool(got.latest_points(fam.name)))
        finally:
            exp.close()
        points = got.latest_points(fam.name)
    assert len(points) == 3
    for attrs, dp in points:
        assert [repr(b) for b in dp.explicit_bounds] == IO_LE
        assert sum(dp.bucket_counts) == dp.count
        key = (
            ("disk_io_direction", "read"),
            ("meridian_io_cached", "false"),
            ("meridian_io_interface", "syscall"),
            ("process_executable_name", attrs["process.executable.name"]),
            ("process_pid", str(attrs["process.pid"])),
        )
        assert list(np.cumsum(dp.bucket_counts)) == list(prom[key].values())


def promtool_case(text: str, labels: str) -> list[dict[str, str]]:
    """promtool input series of a scrape: each sample line a series with `labels`
    added, growing by the sample's value every minute."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, rest = series.partition("{")
        v = float(value)
        step = repr(int(v)) if v.is_integer() else repr(v)
        out.append(
            {"series": f"{name}{{{labels}{',' + rest if rest else '}'}", "values": f"0+{step}x30"}
        )
    return out


def run_promtool(promtool: str, path: Path, tests: list[dict[str, object]]) -> str:
    """`promtool test rules` of these test groups, no rules: PromQL checks only."""
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    args = [promtool, "test", "rules", path.name]
    got = subprocess.run(args, capture_output=True, text=True, cwd=path.parent, timeout=120)
    assert got.returncode == 0, got.stdout + got.stderr
    return got.stdout


def test_histogram_quantile_of_summed_series_is_the_merged_quantile(
    promtool: str, tmp_path: Path
) -> None:
    """The shipped rules' form, `histogram_quantile(q, sum by (le) (rate(X[5m])))`, over
    the three readers' series as rendered, against the quantile (same interpolation
    rule) of their merged kernel slots: it lies in the same bucket."""
    fam = latency_family(READERS)
    series = promtool_case(render([fam]), 'job="meridian-io",instance="a:9435"')
    merged = np.sum([p.slots for p in fam.points if isinstance(p, HistPoint)], axis=0)
    log2 = Layout(IO_SLOTS, None)
    edges = [0.0, *(float(le) for le in IO_LE), float("inf")]
    checks: list[dict[str, object]] = []
    for q in (0.25, 0.5, 0.9, 0.999, 0.9995, 0.99999):
        want = quantile(log2.lows * 1e-9, log2.highs * 1e-9, merged, q)
        k = int(np.searchsorted(edges, want, side="left"))
        low, high = edges[k - 1], edges[k]
        got = f"histogram_quantile({q}, sum by (le) (rate({LATENCY_NAME}_bucket[5m])))"
        one: dict[str, object] = {"labels": "{}", "value": 1}
        checks.append({"expr": f"count({got})", "eval_time": "10m", "exp_samples": [one]})
        # the quantile if it is outside the bucket [low, high] of the merged one
        outside = f"{got} < {low!r} or {got} > {high!r}"
        checks.append({"expr": outside, "eval_time": "10m", "exp_samples": []})
    case: dict[str, object] = {"interval": "1m", "input_series": series, "promql_expr_test": checks}
    out = run_promtool(promtool, tmp_path / "quantiles.test.yml", [case])
    assert "SUCCESS" in out


# The disk latency alert's case of two readers (io-rules.test.yml): a fast one and one
# whose few slow reads make the combined p99 ~1 ms, under the alert's 100 ms.
RULE_CASE = "disk latency: a fast and a slow reader together"
RULE_READERS = READERS[:2]


def _series_key(series: str) -> tuple[str, frozenset[tuple[str, str]]]:
    name, _, labels = series.partition("{")
    return name, frozenset(re.findall(r'(\w+)="([^"]*)"', labels))


def test_rule_test_feeds_the_series_as_the_renderer_lays_them_out() -> None:
    """The alert's unit test (run by test_prometheus_rules_tools.py) is fed what the
    exporter serves for RULE_READERS, every bound of every series: so it checks the
    alert on the real layout (on the sparse one, the same case fired at 268.4 ms)."""
    cases = {c["name"]: c for c in yaml.safe_load(RULES_TESTS.read_text())["tests"] if "name" in c}
    fed = {_series_key(s["series"]): s["values"] for s in cases[RULE_CASE]["input_series"]}
    want = promtool_case(
        render([latency_family(RULE_READERS)]), 'job="meridian-io",instance="d:9435"'
    )
    assert fed == {_series_key(s["series"]): s["values"] for s in want}
