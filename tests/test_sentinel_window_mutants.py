"""Tests written against the survivors of mutation testing of sentinel's services and
windows (`tools/sentinel/model/services.py`, `window.py`) (issue 36; docs/testing.md):
each pins an exact value that a changed comparison, bound, default or order would
change."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

from meridian.tools.sentinel.model import records
from meridian.tools.sentinel.model.flows import (
    FlowKey,
)
from meridian.tools.sentinel.model.records import (
    IDLE,
    load_dtypes,
)
from meridian.tools.sentinel.model.rollup import (
    ROLLUP_DTYPE,
    Rollup,
    as_rows,
)
from meridian.tools.sentinel.model.services import (
    Listening,
    ServiceKey,
    ServiceStat,
    ServiceTotals,
    server_side,
    service_lookup,
    service_stats,
)
from meridian.tools.sentinel.model.window import (
    IDLE_LABEL,
    NO_FLOW,
    FlowStat,
    Totals,
    Window,
    WindowInfo,
    direction_name,
    event_name,
    flow_label,
    flow_stats,
    row_direction,
    row_label,
)

# ---- model/services.py -----------------------------------------------------------------


def test_service_keys_print_with_brackets_for_ipv6_and_no_port_for_none() -> None:
    """str(ServiceKey): host:port proto, IPv6 in brackets, no port when it is 0."""
    assert str(ServiceKey("10.0.0.1", 8080, "tcp")) == "10.0.0.1:8080 tcp"
    assert str(ServiceKey("::1", 53, "udp")) == "[::1]:53 udp"
    assert str(ServiceKey("10.0.0.1", 0, "icmp")) == "10.0.0.1 icmp"
    assert str(ServiceKey("fe80::1", 0, "icmpv6")) == "[fe80::1] icmpv6"
    assert ServiceKey("10.0.0.1", 1, "tcp") < ServiceKey("10.0.0.1", 2, "tcp")


def test_listening_matches_protocol_port_and_address_or_a_wildcard() -> None:
    """has(): the exact socket, a wildcard address of either family, an IPv4-mapped
    address as its IPv4 one; another protocol or port is not listening."""
    assert not Listening().has("tcp", "10.0.0.1", 80)
    exact = Listening(frozenset({("tcp", "10.0.0.1", 80), ("tcp", "::2", 81)}))
    assert exact.has("tcp", "10.0.0.1", 80) and exact.has("tcp", "::ffff:10.0.0.1", 80)
    assert exact.has("tcp", "::2", 81)
    assert not exact.has("udp", "10.0.0.1", 80) and not exact.has("tcp", "10.0.0.1", 81)
    assert not exact.has("tcp", "10.0.0.2", 80)
    v4_any = Listening(frozenset({("udp", "0.0.0.0", 53)}))
    v6_any = Listening(frozenset({("udp", "::", 53)}))
    assert v4_any.has("udp", "10.9.9.9", 53) and v6_any.has("udp", "fe80::9", 53)
    assert not v4_any.has("udp", "10.9.9.9", 54)


def flow(src: str, sport: int, dst: str, dport: int, proto: str = "tcp") -> FlowKey:
    return FlowKey(src, dst, sport, dport, proto)


def test_server_side_rules_in_order_at_their_bounds() -> None:
    """Rule 2 at 1023/1024, rule 3 at both ends of the ephemeral range (inclusive),
    rule 4 by port then by address as text; a listening side first, both
    listening falls through."""
    x, y = "10.0.0.1", "10.0.0.2"
    assert server_side(flow(x, 1023, y, 1024)) == ServiceKey(x, 1023, "tcp")
    assert server_side(flow(x, 2000, y, 32768)) == ServiceKey(x, 2000, "tcp")
    assert server_side(flow(x, 60999, y, 61000)) == ServiceKey(y, 61000, "tcp")
    assert server_side(flow(x, 32767, y, 32768)) == ServiceKey(x, 32767, "tcp")
    assert server_side(flow(x, 40000, y, 40001)) == ServiceKey(x, 40000, "tcp")
    assert server_side(flow(x, 40001, y, 40000)) == ServiceKey(y, 40000, "tcp")
    assert server_side(flow("10.0.0.10", 7, "10.0.0.9", 7)) == ServiceKey("10.0.0.10", 7, "tcp")
    assert server_side(flow("10.0.0.9", 7, "10.0.0.10", 7)) == ServiceKey("10.0.0.10", 7, "tcp")
    assert server_side(flow(x, 7, x, 7)) == ServiceKey(x, 7, "tcp")
    assert server_side(flow(x, 2000, y, 3000), ephemeral=(1500, 2500)) == ServiceKey(y, 3000, "tcp")
    both = Listening(frozenset({("tcp", x, 50000), ("tcp", y, 80)}))
    assert server_side(flow(x, 50000, y, 80), both) == ServiceKey(y, 80, "tcp")
    one = Listening(frozenset({("tcp", x, 50000)}))
    assert server_side(flow(y, 80, x, 50000), one) == ServiceKey(x, 50000, "tcp")


class Names:
    """window.Names over a dict of flows, without `service`."""

    def __init__(self, keys: list[FlowKey]) -> None:
        self.keys = {k.flow_id: k for k in keys}
        self.asked: list[int] = []

    def flow(self, flow_id: int) -> FlowKey | None:
        self.asked.append(flow_id)
        return self.keys.get(flow_id)

    def function(self, function_id: int) -> str:
        return f"fn{function_id}"

    def stack(self, stack_id: int) -> list[str]:
        return [f"fn{stack_id}"]


def test_service_lookup_uses_the_names_own_service_else_the_rules() -> None:
    """The names' `service` when they have one; else the rules on the 5-tuple, None
    for an unknown flow, and flow 0 never looked up."""
    key = flow("10.0.0.2", 50000, "10.0.0.1", 80)
    names = Names([key])
    of = service_lookup(names)
    assert of(key.flow_id) == ServiceKey("10.0.0.1", 80, "tcp")
    assert of(0) is None and of(12345) is None and names.asked == [key.flow_id, 12345]

    class WithService(Names):
        def service(self, flow_id: int) -> ServiceKey | None:
            return ServiceKey("own", flow_id, "tcp")

    assert service_lookup(WithService([]))(5) == ServiceKey("own", 5, "tcp")


def fstat(
    flow_id: int, samples: int, cost: float, function: int = 1, direction: int = 0
) -> FlowStat:
    s = FlowStat(flow_id, direction, 0)
    s.add(Rollup(flow_id, function, function + 100, 0, 0, 0, direction, 0, 0, samples, cost, 1))
    return s


def test_service_stat_says_its_flows() -> None:
    """flows_text: 1 flow, n flows (0 too), n+ flows past the ids kept."""
    s = ServiceStat(0, 0, 0)
    assert (s.flows, s.flows_text()) == (0, "0 flows")
    s.flow_ids = {1}
    assert s.flows_text() == "1 flow"
    s.flow_ids = {1, 2}
    assert s.flows_text() == "2 flows"
    s.more_flows = True
    assert s.flows_text() == "2+ flows"
    assert (ServiceStat(0, 0, 0).service, ServiceStat(0, 0, 0).more_flows) == (None, False)


def test_service_stats_order_and_rows_of_no_service() -> None:
    """Rows by cost, then service text, flow, direction, event; a flow without a
    service its own row with its id; flow 0 one row, counting no flow."""
    svc = {1: ServiceKey("10.0.0.2", 80, "tcp"), 2: ServiceKey("10.0.0.1", 80, "tcp")}
    stats = [
        fstat(1, 1, 2.0),
        fstat(2, 1, 2.0),
        fstat(0, 3, 1.0),
        fstat(9, 1, 1.0),
        fstat(2, 1, 1.0, direction=1),
    ]
    got = service_stats(stats, svc.get)
    assert [(str(s.service), s.flow_id, s.direction, s.samples, s.flows) for s in got] == [
        ("10.0.0.1:80 tcp", 0, 0, 1, 1),
        ("10.0.0.2:80 tcp", 0, 0, 1, 1),
        ("None", 0, 0, 3, 0),
        ("None", 9, 0, 1, 1),
        ("10.0.0.1:80 tcp", 0, 1, 1, 1),
    ]


def test_service_totals_bound_rows_ids_and_functions() -> None:
    """Rows past 2 x max_rows cut to the max_rows costliest (the ids recounted);
    flow ids past max_ids not kept and the row marked; functions past
    2 x max_per_row cut to the max_per_row costliest."""
    totals = ServiceTotals(lambda f: ServiceKey("s", f, "tcp"), max_rows=2, max_ids=10)
    totals.add([fstat(f, 1, float(f)) for f in range(1, 5)])  # 4 rows: 2 x max_rows
    assert len(totals.rows) == 4
    totals.add([fstat(5, 1, 5.0)])
    assert [s.service.port for s in totals.top(9) if s.service] == [5, 4]
    assert totals._ids == 2
    ids = ServiceTotals(lambda f: ServiceKey("s", 1, "tcp"), max_ids=3)
    ids.add([fstat(f, 1, 1.0) for f in (5, 4, 3)])
    [row] = ids.top(1)
    assert (row.flow_ids, row.more_flows) == ({3, 4, 5}, False)
    ids.add([fstat(2, 1, 1.0), fstat(1, 1, 1.0)])
    [row] = ids.top(1)
    assert (row.flow_ids, row.more_flows, row.samples) == ({3, 4, 5}, True, 5)
    fns = ServiceTotals(lambda f: ServiceKey("s", 1, "tcp"), max_per_row=1)
    fns.add([fstat(1, 1, 1.0, function=10), fstat(2, 1, 3.0, function=20)])
    [row] = fns.top(1)
    assert row.functions == {10: 1.0, 20: 3.0} and row.stacks == {110: 1.0, 120: 3.0}
    fns.add([fstat(3, 1, 2.0, function=30)])
    [row] = fns.top(1)
    assert row.functions == {20: 3.0} and row.stacks == {120: 3.0}
    assert ServiceTotals(lambda f: None).max_ids == 1 << 18


def test_service_totals_name_a_flow_once_its_service_is_known() -> None:
    """A row of a flow not named yet moves into its service at the next add or top,
    its flows and samples with it; flow 0 stays its own row."""
    known: dict[int, ServiceKey] = {}
    totals = ServiceTotals(known.get, max_ids=2)
    totals.add([fstat(7, 2, 1.0), fstat(0, 1, 0.5), fstat(8, 1, 0.25)])
    assert sorted((s.service is None, s.flow_id) for s in totals.top(5)) == [
        (True, 0),
        (True, 7),
        (True, 8),
    ]
    known[7] = known[8] = ServiceKey("10.0.0.1", 80, "tcp")
    top = totals.top(5)
    assert [(str(s.service), s.flow_id, s.samples, s.flows) for s in top] == [
        ("10.0.0.1:80 tcp", 0, 3, 2),
        ("None", 0, 1, 0),
    ]
    assert totals._ids == 2


# ---- model/window.py -------------------------------------------------------------------


def test_event_and_direction_names_out_of_range() -> None:
    """Known ids by name; an event past the names (or negative) as its number, a
    direction past them as "?"."""
    assert [event_name(e) for e in (0, 7, 8, -1)] == ["cycles", "raw", "8", "-1"]
    assert [direction_name(d) for d in (0, 1, 2, 3, -1)] == ["rx", "tx", "idle", "?", "?"]


def test_flow_stat_adds_rollups_and_merges_stats() -> None:
    """add(): samples, cost, and cost per function and per stack; merge() adds
    another's sums into them."""
    s = FlowStat(5, 0, 0)
    s.add(Rollup(5, 1, 11, 0, 0, 0, 0, 0, 0, 2, 0.5, 1))
    s.add(Rollup(5, 1, 12, 0, 0, 0, 0, 0, 0, 3, 0.25, 1))
    assert (s.samples, s.norm_cost, s.functions, s.stacks) == (
        5,
        0.75,
        {1: 0.75},
        {11: 0.5, 12: 0.25},
    )
    other = FlowStat(5, 0, 0, 1, 2.0, {1: 1.0, 2: 1.0}, {12: 2.0})
    s.merge(other)
    assert (s.samples, s.norm_cost) == (6, 2.75)
    assert s.functions == {1: 1.75, 2: 1.0} and s.stacks == {11: 0.5, 12: 2.25}
    assert (FlowStat(1, 0, 0).samples, FlowStat(1, 0, 0).norm_cost) == (0, 0.0)


def test_hottest_functions_and_stacks_ties_and_merged_ids() -> None:
    """The n costliest, ties to the lower id; `merge` sums ids counted as one."""
    s = FlowStat(1, 0, 0, functions={3: 1.0, 2: 1.0, 9: 0.5, 7: 2.0}, stacks={4: 1.0, 5: 3.0})
    assert s.hottest() == [(7, 2.0)]
    assert s.hottest(3) == [(7, 2.0), (2, 1.0), (3, 1.0)]
    assert s.hottest(2, merge=lambda i: 3 if i == 9 else i) == [(7, 2.0), (3, 1.5)]
    assert s.hottest_stacks() == [(5, 3.0)]
    assert s.hottest_stacks(2, merge=lambda i: 4) == [(4, 4.0)]


def test_totals_sum_windows_and_stay_bounded() -> None:
    """Totals: windows counted, samples and cost summed; past 2 x max_rows rows the
    max_rows costliest kept; a row's functions and stacks past 2 x max_per_row cut
    to the max_per_row costliest."""
    t = Totals(max_rows=1, max_per_row=1)
    assert (Totals().max_rows, Totals().max_per_row) == (4096, 64)
    t.add([fstat(1, 1, 1.0, function=1), fstat(2, 2, 3.0, function=2)])
    assert (t.windows, t.samples, t.norm_cost, len(t.rows)) == (1, 3, 4.0, 2)
    t.add([fstat(1, 1, 1.0, function=3), fstat(3, 4, 0.5)])
    assert (t.windows, t.samples, t.norm_cost) == (2, 8, 5.5)
    assert [(s.flow_id, s.norm_cost) for s in t.top(5)] == [(2, 3.0)]
    t2 = Totals(max_per_row=1)
    t2.add([fstat(1, 1, 1.0, function=1), fstat(1, 1, 2.0, function=2)])
    [row] = t2.top(1)
    assert row.functions == {1: 1.0, 2: 2.0} and row.samples == 2
    t2.add([fstat(1, 1, 0.5, function=3)])
    [row] = t2.top(1)
    assert row.functions == {2: 2.0} and row.stacks == {102: 2.0}
    assert [s.flow_id for s in Totals().top(3)] == []


def test_totals_top_orders_by_cost_then_flow_direction_event() -> None:
    """Equal costs: lower flow, then direction, then event first; n cuts it."""
    t = Totals()
    t.add([FlowStat(2, 0, 0, 1, 1.0), FlowStat(1, 1, 0, 1, 1.0), FlowStat(1, 0, 3, 1, 1.0),
           FlowStat(1, 0, 2, 1, 1.0), FlowStat(9, 0, 0, 1, 2.0)])  # fmt: skip
    assert [(s.flow_id, s.direction, s.event) for s in t.top(4)] == [
        (9, 0, 0), (1, 0, 2), (1, 0, 3), (1, 1, 0)
    ]  # fmt: skip


def test_window_info_texts() -> None:
    """dropped_text: the non-zero drops by reason, sorted; scales_text: "1" when no
    event is scaled (or none is listed), else each event's scale to 3 digits."""
    info = WindowInfo(1.0, "sentinel", "mock", dropped={"ring_full": 2, "hard_drop": 0, "a": 1})
    assert (
        info.dropped_text() == "a=1, ring_full=2" and WindowInfo(1.0, "m", "s").dropped_text() == ""
    )
    assert info.scales_text() == "1"
    assert WindowInfo(1.0, "m", "s", scales={"cycles": 1.0, "llc": 1}).scales_text() == "1"
    scaled = WindowInfo(1.0, "m", "s", scales={"cycles": 1.5, "llc-misses": 3.0, "x": 1.0})
    assert scaled.scales_text() == "cycles x1.5 llc-misses x3 x x1"
    assert WindowInfo(1.0, "m", "s", scales={"c": 2.34567}).scales_text() == "c x2.35"
    assert (info.events, info.samples, info.samples_per_sec, info.throttled, info.wall_ns) == (
        (),
        0,
        0.0,
        False,
        0,
    )


def test_flow_and_row_labels() -> None:
    """flow 0 is (no flow), or (idle) in the idle direction; a known flow its
    5-tuple; an unknown one 16 hex digits; a row of no flow has no direction."""
    key = FlowKey("10.0.0.1", "10.0.0.2", 1, 2)
    names = Names([key])
    assert flow_label(0, names) == NO_FLOW == "(no flow)" and names.asked == []
    assert flow_label(key.flow_id, names) == "10.0.0.1:1 -> 10.0.0.2:2 tcp"
    assert flow_label(0xAB, names) == "00000000000000ab"
    assert row_label(FlowStat(0, IDLE, 0), names) == IDLE_LABEL == "(idle)"
    assert row_label(FlowStat(0, 0, 0), names) == "(no flow)"
    assert row_label(FlowStat(0xAB, IDLE, 0), names) == "00000000000000ab"
    assert [row_direction(FlowStat(f, d, 0)) for f, d in ((1, 0), (1, 1), (0, 1), (0, IDLE))] == [
        "rx", "tx", "", ""
    ]  # fmt: skip


def test_flow_stats_of_nothing_and_of_rollup_objects() -> None:
    """flow_stats: no rows, no stats; Rollup objects summed per (flow, direction,
    event), costliest first, functions in the order they occur."""
    assert flow_stats([]) == [] and flow_stats(np.zeros(0, dtype=ROLLUP_DTYPE)) == []
    rows = [
        Rollup(1, 5, 50, 0, 0, 0, 0, 0, 0, 1, 1.0, 1),
        Rollup(2, 6, 60, 0, 0, 0, 0, 0, 0, 2, 3.0, 1),
        Rollup(1, 4, 50, 0, 0, 0, 0, 0, 0, 3, 1.5, 1),
    ]
    got = flow_stats(rows)
    assert [(s.flow_id, s.samples, s.norm_cost) for s in got] == [(2, 2, 3.0), (1, 4, 2.5)]
    assert list(got[1].functions.items()) == [(5, 1.0), (4, 1.5)] and got[1].stacks == {50: 2.5}
    w = Window(1, 0, 10, WindowInfo(1.0, "m", "s"), as_rows(rows), got)
    assert w.final is False


class FakeBtf:
    def struct_dtype(self, name: str) -> Any:
        return np.dtype([(name, "<u4")])


class FakeObject:
    """BpfObject's part load_dtypes uses: `btf` and `close`."""

    closed: ClassVar[list[str]] = []

    def __init__(self, path: Any) -> None:
        self.path = str(path)
        self.btf = FakeBtf() if "btf" in self.path else None

    def close(self) -> None:
        FakeObject.closed.append(self.path)


def test_load_dtypes_reads_both_structs_and_closes_the_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """load_dtypes: struct ms_sample then struct ms_lbr from the object's BTF; an
    object without BTF is refused with how to build it; closed either way."""
    monkeypatch.setattr(records, "BpfObject", FakeObject)
    FakeObject.closed = []
    sample, lbr = load_dtypes("with-btf.o")
    assert (sample.names, lbr.names) == (("ms_sample",), ("ms_lbr",))
    with pytest.raises(ValueError, match=r"^plain\.o has no BTF: build it with clang -g$"):
        load_dtypes("plain.o")
    assert FakeObject.closed == ["with-btf.o", "plain.o"]
    assert records.OBJECT == "sentinel"
