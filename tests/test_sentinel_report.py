"""The report of `meridian sentinel` as a person reads it (issue 25): every address
whose symbols exist is named in the summary, also when its samples came before the
read (provisional ids, resolved by the symbols thread or at stop); idle is charged to
no flow; no internal id is printed. The runtime runs in process on a scripted mock
source, over a symbolizer on a fake /proc and kallsyms."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from children import wait_until
from symbolizer_fakes import PID, Binary, Clock, FakeProc, IpResolver, maps_lines, symbolizer

from meridian.tools.sentinel.agent.runtime import Runtime
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.records import IDLE, RX, Event
from meridian.tools.sentinel.model.rollup import (
    GONE_STACK,
    PROVISIONAL_BASE,
    SKIPPED_STACK,
    UNRESOLVED,
    UNRESOLVED_LABEL,
)
from meridian.tools.sentinel.model.window import FlowStat, Totals, WindowInfo
from meridian.tools.sentinel.outputs.live import render_live, render_summary, summary_json
from meridian.tools.sentinel.pipeline.aggregator import Aggregator
from meridian.tools.sentinel.sources.mock import MockSource, make_samples
from meridian.tools.sentinel.storage.writer import StoreWriter
from meridian.tools.sentinel.symbols.kallsyms import KernelSymbols, is_idle_function

FLOW = FlowKey("10.0.0.2", "10.0.0.1", 43012, 5201, "tcp")
LABEL = str(FLOW)
BASE = 0x5500_0000_0000
KALLSYMS = """\
ffffffff81000000 T _text
ffffffff81000100 T tcp_v4_rcv
ffffffff81000200 T net_rx_action
ffffffff81000300 t pv_native_safe_halt
ffffffff81000380 T __cpuidle_text_start
ffffffff81000380 T default_idle
ffffffff810003c0 t io_idle
ffffffff81000400 T __cpuidle_text_end
ffffffff81000400 T schedule
"""
K = {"tcp_v4_rcv": 0x100, "net_rx_action": 0x200, "pv_native_safe_halt": 0x300}
K |= {"default_idle": 0x380, "io_idle": 0x3C0, "schedule": 0x400}


def kernel_ip(name: str) -> int:
    return 0xFFFFFFFF81000000 + K[name] + 4


def config() -> SentinelConfig:
    cfg = SentinelConfig()
    cfg.metrics.enabled = False
    cfg.anomaly.enabled = False
    cfg.mode.auto = False
    cfg.aggregator.flush_interval = 0.2
    return cfg


def samples(n: int, ip: int, pid: int = PID, flow: int = FLOW.flow_id) -> Any:
    return make_samples(
        n, pid=pid, ip=ip, flow_id=flow, direction=RX, cpu=0,
        event=int(Event.CPU_CLOCK), time_ns=time.monotonic_ns(),
    )  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.windows: list[Any] = []

    def on_window(self, window: Any) -> None:
        self.windows.append(window)

    def close(self) -> None:
        pass

    def rows(self) -> int:
        return sum(len(w.rows) for w in self.windows)


class Sink:
    """What StoreWriter hands a sink, kept."""

    def __init__(self) -> None:
        self.rollups: list[Any] = []
        self.functions: dict[int, tuple[str, str]] = {}
        self.stacks: dict[int, Any] = {}

    def write_rollups(self, rows: Any) -> None:
        self.rollups.append(rows)

    def write_functions(self, functions: Any) -> None:
        self.functions.update({fid: (b, f) for fid, b, f in functions})

    def write_stacks(self, stacks: Any) -> None:
        self.stacks.update(dict(stacks))

    def write_flows(self, flows: Any) -> None:
        pass

    def write_data_objects(self, objects: Any) -> None:
        pass

    def commit(self) -> bool:
        return True

    def close(self) -> None:
        pass


def summary(rt: Runtime) -> tuple[str, dict[str, Any]]:
    """The exit summary: text and JSON (dumped and read again, as --json prints it)."""
    out = io.StringIO()
    render_summary(rt.totals, rt.seconds, rt.info, rt.names, out)
    obj = json.loads(json.dumps(summary_json(rt.totals, rt.seconds, rt.info, rt.names)))
    return out.getvalue(), obj


def row(obj: dict[str, Any], label: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [r for r in obj["flows"] if r.get("label") == label]
    assert len(found) == 1, found
    return found[0]


# ---- unresolved: provisional ids ---------------------------------------------------


def test_a_function_read_after_its_first_samples_is_named_in_the_summary(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path
) -> None:
    """The first batch falls in a binary whose symbols are not read yet (the consumer
    keys it provisionally), the second after the symbols thread read them: the
    summary names one function with all the samples, text and JSON, and storage
    gets a name row for every function id of its rollups."""
    b = binaries["pie"]
    fake.add(PID, maps_lines(b, BASE))
    sym = symbolizer(fake, clock, tmp_path)
    alpha = BASE + b.symbols["alpha"] + 1
    src = MockSource.from_samples([], flows=[FLOW], sleep=lambda s: time.sleep(min(s, 0.01)))
    rec, sink = Recorder(), Sink()
    writer = StoreWriter(sink, sym, lambda fid: None)  # type: ignore[arg-type]
    rt = Runtime(config(), src, symbolizer=sym, observers=[rec, writer], cpus=[0])
    rt.start()
    try:
        src.feed(samples(40, alpha))
        wait_until(lambda: rec.rows() > 0, 10, "the first window")
        wait_until(lambda: sym.waiting() == 0, 10, "the symbols thread's read")
        src.feed(samples(60, alpha))
        seen = rec.rows()
        wait_until(lambda: rec.rows() > seen, 10, "the second window")
    finally:
        rt.stop()
    text, obj = summary(rt)
    assert "[unresolved" not in text + json.dumps(obj)
    (first,) = next(w.rows for w in rec.windows if len(w.rows))["function_id"].tolist()
    assert first >= PROVISIONAL_BASE  # the case tested: keyed before the read
    mine = row(obj, LABEL)
    assert mine["samples"] == 100
    assert [f["function"] for f in mine["functions"]] == ["alpha"]
    assert [s["frames"][0].split("+")[0] for s in mine["stacks"]] == ["alpha"]
    assert "100.0%  alpha" in text
    ids = {i for rows in sink.rollups for i in rows["function_id"].tolist()}
    assert ids <= set(sink.functions) and len(ids) == 2
    assert {sink.functions[i][1] for i in ids} == {"alpha"}
    stack_ids = {i for rows in sink.rollups for i in rows["callstack_id"].tolist()}
    assert stack_ids <= set(sink.stacks)


def test_stop_finishes_the_reads_before_the_summary(
    binaries: dict[str, Binary], fake: FakeProc, clock: Clock, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The symbols thread does no read during the run (as when the run ends before
    it catches up): stop() does them before the last window, so the summary and
    storage name the function all the same."""
    b = binaries["pie"]
    fake.add(PID, maps_lines(b, BASE))
    sym = symbolizer(fake, clock, tmp_path)
    warm = sym.warm

    def only_at_stop(budget_s: float) -> int:
        if threading.current_thread().name == "sentinel-symbols":
            return sym.waiting()
        return warm(budget_s)

    monkeypatch.setattr(sym, "warm", only_at_stop)
    beta = BASE + b.symbols["beta"] + 1
    src = MockSource.from_samples([samples(30, beta)], flows=[FLOW])
    rec, sink = Recorder(), Sink()
    writer = StoreWriter(sink, sym, lambda fid: None)  # type: ignore[arg-type]
    rt = Runtime(config(), src, symbolizer=sym, observers=[rec, writer], cpus=[0])
    rt.start()
    try:
        wait_until(lambda: rec.rows() > 0, 10, "the first window")
        assert sym.waiting() > 0
    finally:
        rt.stop()
    text, obj = summary(rt)
    assert "[unresolved" not in text + json.dumps(obj)
    assert [f["function"] for f in row(obj, LABEL)["functions"]] == ["beta"]
    ids = {i for rows in sink.rollups for i in rows["function_id"].tolist()}
    assert {sink.functions[i][1] for i in ids} == {"beta"}


# ---- idle ------------------------------------------------------------------------


def test_kernel_idle_code_by_section_and_name(tmp_path: Path) -> None:
    ks = KernelSymbols(tmp_path / "k")
    ks.parse(KALLSYMS.encode())
    assert ks.idle(kernel_ip("pv_native_safe_halt"))  # by name: outside the section
    assert ks.idle(kernel_ip("default_idle")) and ks.idle(kernel_ip("io_idle"))  # section
    assert not ks.idle(kernel_ip("tcp_v4_rcv")) and not ks.idle(kernel_ip("schedule"))
    assert is_idle_function("intel_idle_irq") and is_idle_function("cpu_idle_poll.isra.0")
    assert is_idle_function("xen_safe_halt") and not is_idle_function("cpuidle_poll_time")
    ks.parse(KALLSYMS.replace("__cpuidle", "__other").encode())  # no section
    assert not ks.idle(kernel_ip("io_idle")) and ks.idle(kernel_ip("default_idle"))


def test_idle_is_charged_to_no_flow(fake: FakeProc, clock: Clock, tmp_path: Path) -> None:
    """Samples of a flow's packet on a CPU that then halted: those in the kernel's
    idle code go to the (idle) row, the softirq's (pid 0, not idle code) stay the
    flow's cost. The rows of no flow show no direction."""
    (tmp_path / "kallsyms").write_text(KALLSYMS)
    sym = symbolizer(fake, clock, tmp_path)
    batch = np.concatenate(
        [
            samples(30, kernel_ip("pv_native_safe_halt"), pid=0),
            samples(5, kernel_ip("default_idle"), pid=0),
            samples(20, kernel_ip("tcp_v4_rcv")),
            samples(10, kernel_ip("net_rx_action"), pid=0),
            samples(7, kernel_ip("schedule"), flow=0),
        ]
    )
    src = MockSource.from_samples([batch], flows=[FLOW])
    rec = Recorder()
    rt = Runtime(config(), src, symbolizer=sym, observers=[rec], cpus=[0])
    rt.start()
    try:
        wait_until(lambda: rec.rows() > 0, 10, "a window")
    finally:
        rt.stop()
    text, obj = summary(rt)
    mine = row(obj, LABEL)
    assert mine["samples"] == 30 and mine["direction"] == "rx"
    assert {f["function"] for f in mine["functions"]} == {"tcp_v4_rcv", "net_rx_action"}
    idle = row(obj, "(idle)")
    assert idle["samples"] == 35 and idle["flow"] is None and idle["direction"] is None
    assert {f["function"] for f in idle["functions"]} == {"pv_native_safe_halt", "default_idle"}
    none = row(obj, "(no flow)")
    assert none["samples"] == 7 and none["direction"] is None
    lines = text.splitlines()
    assert any(line.split()[:2] == ["(idle)", "cpu-clock"] for line in lines), text
    assert any(line.split()[:3] == ["(no", "flow)", "cpu-clock"] for line in lines), text
    assert "\n(idle) cpu-clock: 35 samples" in text
    flow_lines = [line for line in lines if line.startswith(LABEL)]
    assert flow_lines and not any("halt" in line or "idle" in line for line in flow_lines)


def test_the_aggregator_keys_idle_samples_to_no_flow() -> None:
    agg = Aggregator(10**9, IpResolver(frozenset({7})))
    agg.add(np.concatenate([samples(3, 7 << 8, pid=0), samples(2, 9 << 8, pid=0)]))
    got = {(r.flow_id, r.direction, r.function_id): r.samples for r in agg.flush()}
    assert got == {(0, IDLE, 7): 3, (FLOW.flow_id, RX, 9): 2}


# ---- what is printed -----------------------------------------------------------------


class Names:
    def flow(self, flow_id: int) -> FlowKey | None:
        return FLOW if flow_id == FLOW.flow_id else None

    def function(self, function_id: int) -> str:
        return "[unresolved: symbols not read yet]" if function_id == UNRESOLVED else "fn"

    def stack(self, stack_id: int) -> list[str]:
        return ["[unresolved: symbols not read yet]"] if stack_id == UNRESOLVED else ["fn+0x1"]

    def canonical_function(self, function_id: int) -> int:
        return 5 if function_id == PROVISIONAL_BASE else function_id

    def canonical_stack(self, stack_id: int) -> int:
        return 9 if stack_id == PROVISIONAL_BASE else stack_id


def test_no_internal_id_is_printed() -> None:
    """The summary of a flow of one sample and a row of no flow whose costliest stack
    is unresolved: no 2**64-1 (text or JSON), the real stack ranked before the label
    (which lumps many stacks), singular and plural right, no direction for no flow; a
    provisional id ranks with the function it resolved to."""
    totals = Totals()
    one = FlowStat(FLOW.flow_id, RX, int(Event.CPU_CLOCK), 1, 1.0, {5: 1.0}, {9: 1.0})
    nothing = FlowStat(0, RX, int(Event.CPU_CLOCK), 3, 3.0)
    nothing.functions = {UNRESOLVED: 2.0, PROVISIONAL_BASE: 0.5, 5: 0.5}
    nothing.stacks = {UNRESOLVED: 2.0, PROVISIONAL_BASE: 0.5, 9: 0.5}
    totals.add([one, nothing])
    info = WindowInfo(1.0, "sentinel", "mock")
    out = io.StringIO()
    render_summary(totals, 1.0, info, Names(), out)
    text = out.getvalue()
    obj = summary_json(totals, 1.0, info, Names())
    dumped = json.dumps(obj)
    assert str(UNRESOLVED) not in text + dumped and str(PROVISIONAL_BASE) not in text + dumped
    assert "4 samples in 1.0s (1 window)" in text
    assert f"\n{LABEL} rx cpu-clock: 1 sample, norm cost" in text
    assert "\n(no flow) cpu-clock: 3 samples, norm cost" in text
    assert "  stack #1 (33.3%):" in text and "  stack #2 (66.7%):" in text
    assert " 33.3%  fn" in text  # 0.5 + 0.5: one row
    table = [line.split() for line in text.splitlines() if line.startswith("(no flow)")]
    assert table[0][2] == "cpu-clock"  # no direction column value
    none = row(obj, "(no flow)")
    assert none["flow"] is None and none["direction"] is None
    assert [(s["rank"], s["stack_id"]) for s in none["stacks"]] == [(1, 9), (2, None)]
    assert none["stacks"][1]["frames"] == [UNRESOLVED_LABEL]
    assert [f["norm_cost"] for f in none["functions"]] == [2.0, 1.0]
    live = render_live([nothing, one], info, Names(), size=(120, 10))
    assert "flows 1" in live
    (line,) = [x for x in live.splitlines() if x.startswith("(no flow)")]
    assert line.split()[2] == "cpu-clock"


def test_labels_do_not_push_real_stacks_out_of_the_top() -> None:
    """A loaded host: the stacks not read, unresolved and gone outweigh each real stack;
    the row's three stacks are still its three costliest real ones."""
    totals = Totals()
    loaded = FlowStat(FLOW.flow_id, RX, int(Event.CPU_CLOCK), 10, 10.0, {5: 10.0})
    loaded.stacks = {UNRESOLVED: 3.0, GONE_STACK: 2.5, SKIPPED_STACK: 2.0, 9: 1.0, 7: 0.75}
    loaded.stacks |= {11: 0.5, 13: 0.25}
    totals.add([loaded])
    obj = summary_json(totals, 1.0, WindowInfo(1.0, "sentinel", "mock"), Names())
    assert [s["stack_id"] for s in row(obj, LABEL)["stacks"]] == [9, 7, 11]


# ---- the run's totals, bounded -------------------------------------------------------


def stat(flow: int, cost: float, fn: int = 1) -> FlowStat:
    return FlowStat(flow, RX, int(Event.CPU_CLOCK), 1, cost, {fn: cost}, {0: cost})


def test_totals_past_max_rows_keep_the_costliest_rows() -> None:
    """The exit summary's top flows on a host with more flows than Totals keeps: the
    rows kept are the costliest, not the first seen. Cheap flows come first, in a
    window of their own, then mixed with costly ones; a costly flow seen again adds
    to the row kept."""
    totals = Totals(max_rows=3, max_per_row=2)
    totals.add([stat(f, 1.0) for f in range(1, 8)])  # 7 > 2 x 3: pruned to 3
    totals.add([stat(100, 50.0), *(stat(f, 1.0) for f in range(10, 15)), stat(101, 40.0)])
    totals.add([*(stat(f, 2.0) for f in range(20, 26)), stat(102, 30.0), stat(101, 15.0)])
    assert [(s.flow_id, s.norm_cost) for s in totals.top(3)] == [
        (101, 55.0),
        (100, 50.0),
        (102, 30.0),
    ]
    assert len(totals.rows) <= 2 * totals.max_rows
    assert totals.samples == 7 + 7 + 8  # every row counts in the run's sums
