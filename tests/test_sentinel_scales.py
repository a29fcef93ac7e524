"""Each event's sample scale (pipeline/scales.py): its share of the rotation's turns as
the groups really open (after the cpu-clock fallback), times the kernel's
multiplexing (time_enabled / time_running, read from the perf events), applied
sample by sample in the rollups and the raw rows."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from test_sentinel_aggregator import CountingResolver
from test_sentinel_modes import Clock

from meridian.bpf.perf import read_times
from meridian.tools.sentinel.model.records import Event, event_key
from meridian.tools.sentinel.model.window import WindowInfo
from meridian.tools.sentinel.outputs.live import render_live, window_json
from meridian.tools.sentinel.pipeline.aggregator import Aggregator
from meridian.tools.sentinel.pipeline.rotator import PmuRotator, rotation_shares
from meridian.tools.sentinel.pipeline.scales import (
    EventScales,
    multiplexing,
    opened_keys,
    sample_keys,
    spec_key,
)
from meridian.tools.sentinel.sources.mock import MockSource, make_samples
from meridian.tools.sentinel.sources.perf_open import SETTLED_NS, EventOpener, _disabled
from meridian.tools.sentinel.sources.pmu_events import LOGICAL, EventSpec, parse_event
from meridian.tools.sentinel.storage.rows import raw_lines

SEC = 1_000_000_000
NAMES = ("cycles", "llc-misses", "branch-misses", "cpu-clock")
CYCLES, LLC, BRANCH, CLOCK = (spec_key(LOGICAL[n]) for n in NAMES)


def no_pmu(spec: EventSpec) -> EventSpec:
    """What the kernel source opens on a host without a PMU."""
    return LOGICAL["cpu-clock"] if spec.hardware else spec


def scales_of(
    groups: list[list[str]], resolve: Any = None, max_events: int | None = None
) -> EventScales:
    """The scales of a rotation of these groups, as the consumer computes them."""
    r = PmuRotator([[parse_event(e) for e in g] for g in groups], SEC, Clock(), max_events)
    names: dict[int, str] = {}
    out = EventScales()
    out.set_rotation(rotation_shares([opened_keys(g, resolve, names) for g in r.schedule()]), names)
    return out


def test_an_event_in_one_of_three_groups_is_scaled_by_3() -> None:
    s = scales_of([["cycles", "llc-misses"], ["cycles"], ["branch-misses"]])
    assert (s.scale(LLC), s.scale(BRANCH), s.scale(CYCLES)) == (3.0, 3.0, 1.5)
    assert s.by_name() == {"cycles": 1.5, "llc-misses": 3.0, "branch-misses": 3.0}


def test_an_event_in_two_of_two_groups_is_scaled_by_1() -> None:
    s = scales_of([["cycles", "llc-misses"], ["cycles", "branch-misses"]])
    assert (s.scale(CYCLES), s.scale(LLC), s.scale(BRANCH)) == (1.0, 2.0, 2.0)


def test_every_group_falling_back_to_cpu_clock_is_scaled_by_1() -> None:
    """Diagnostic mode's default groups where the CPU has no PMU: both turns sample
    cpu-clock, all the time (the number of groups said 2)."""
    s = scales_of(
        [["cycles", "instructions", "llc-misses", "branch-misses"], ["remote-dram", "hitm"]],
        no_pmu,
    )
    assert s.by_name() == {"cpu-clock": 1.0}
    assert s.scale(CLOCK) == 1.0
    # a group the source cannot open at all samples nothing in its turn
    s = scales_of([["cpu-clock"], ["raw:0x1cd"]], lambda spec: None if spec.raw_code else spec)
    assert s.by_name() == {"cpu-clock": 2.0}


def test_the_safety_level_trims_what_each_turn_samples() -> None:
    s = scales_of([["cycles", "llc-misses"], ["cycles"]], max_events=1)
    assert s.by_name() == {"cycles": 1.0}


def test_kernel_multiplexing_enabled_twice_running_doubles_the_scale() -> None:
    s = scales_of([["cycles", "llc-misses"], ["branch-misses"]])
    s.set_times({LLC: (2 * SEC, SEC), CYCLES: (SEC, SEC)})
    assert s.by_name() == {"cycles": 2.0, "llc-misses": 4.0, "branch-misses": 2.0}
    s.set_times({LLC: (3 * SEC, 3 * SEC)})  # a later reading: running all the time
    assert s.scale(LLC) == 2.0
    one = scales_of([["cycles"]])
    one.set_times({CYCLES: (2 * SEC, SEC)})
    assert one.scale(CYCLES) == 2.0
    assert multiplexing(2.0, 1.0) == 2.0
    assert multiplexing(5.0, 0.0) == 1.0  # never ran: no samples to scale
    assert multiplexing(5.0, 5.0) == 1.0


def test_each_sample_gets_its_events_scale() -> None:
    s = scales_of([["cycles", "llc-misses"], ["cycles"], ["raw:0x1cd"]])
    raw = event_key(Event.RAW, 0x1CD)
    assert s.scale(raw) == 3.0
    samples = make_samples(5, event=[Event.CYCLES, Event.LLC_MISS, Event.RAW, Event.RAW, 9])
    samples["raw_code"] = [0, 0, 0x1CD, 0x2CD, 0]
    assert sample_keys(samples).tolist() == [CYCLES, LLC, raw, event_key(Event.RAW, 0x2CD), 9]
    # unknown events (another raw code, an id no group has) are not scaled
    assert s.per_sample(samples).tolist() == [1.5, 3.0, 3.0, 1.0, 1.0]
    assert s.per_sample(samples[:2]).tolist() == [1.5, 3.0]  # no raw code: the id table
    assert s.per_sample(samples[:0]).tolist() == []
    # an event that left the rotation (a mode change) keeps its scale for late samples
    names: dict[int, str] = {}
    s.set_rotation(rotation_shares([opened_keys([LOGICAL["cpu-clock"]], None, names)]), names)
    assert s.per_sample(samples[:2]).tolist() == [1.5, 3.0]
    assert s.by_name() == {"cpu-clock": 1.0}


def test_rollups_and_raw_rows_cost_each_sample_its_scale() -> None:
    """Two events at once in a batch: each row's norm cost is its samples times its
    event's scale over their segments, in the rollups and the raw rows alike."""
    s = scales_of([["cycles", "llc-misses"], ["cycles"], ["branch-misses"]])
    s.set_times({LLC: (2 * SEC, SEC)})
    samples = make_samples(
        6, event=[Event.CYCLES] * 3 + [Event.LLC_MISS] * 3, gso_segs=[1, 1, 2, 1, 4, 1]
    )
    scale = s.per_sample(samples)
    assert scale.tolist() == [1.5] * 3 + [6.0] * 3
    agg = Aggregator(SEC, CountingResolver())
    agg.add(samples, scale)
    rows = {int(r.event): r for r in agg.flush()}
    assert rows[Event.CYCLES].norm_cost == pytest.approx(1.5 * (1 + 1 + 1 / 2))
    assert rows[Event.LLC_MISS].norm_cost == pytest.approx(6.0 * (1 + 1 / 4 + 1))
    ((_, lines),) = raw_lines(samples, 1, "h", scale=scale)
    got = [json.loads("{" + line)["norm_cost"] for line in lines]
    assert got == pytest.approx([1.5, 1.5, 0.75, 6.0, 1.5, 6.0])


@pytest.fixture
def pipes() -> Iterator[list[tuple[int, int]]]:
    made: list[tuple[int, int]] = []
    yield made
    for r, w in made:
        os.close(r)
        os.close(w)


def fake_event(pipes: list[tuple[int, int]], enabled: int, running: int) -> int:
    """A pipe that reads as a perf event with these times, once (then EAGAIN)."""
    r, w = os.pipe()
    pipes.append((r, w))
    os.write(w, struct.pack("<QQQ", 7, enabled, running))
    os.set_blocking(r, False)
    return r


def test_read_times_of_a_perf_event(pipes: list[tuple[int, int]]) -> None:
    fd = fake_event(pipes, 2 * SEC, SEC)
    assert read_times(fd) == (7, 2 * SEC, SEC)


def test_the_kernel_sources_times_sum_the_cpus(pipes: list[tuple[int, int]]) -> None:
    """The kernel source's reader: enabled and running summed over the CPUs of each
    event; a reading of an event just opened (not SETTLED_NS per CPU) is not taken."""
    opener = EventOpener(99, False, lambda _: None)
    cycles, llc = LOGICAL["cycles"], LOGICAL["llc-misses"]
    opener.track(
        [
            (cycles, [fake_event(pipes, SEC, SEC // 2), fake_event(pipes, SEC, SEC // 2)]),
            (llc, [fake_event(pipes, SETTLED_NS, SETTLED_NS), fake_event(pipes, 1, 1)]),
        ]
    )
    assert opener.times() == {CYCLES: (2 * SEC, SEC)}
    s = scales_of([["cycles"]])
    s.set_times(opener.times())  # the last reading stays (the pipes are empty now)
    assert s.scale(CYCLES) == 2.0


def test_a_probe_opens_its_event_disabled() -> None:
    """`resolve` tries an event on one CPU without ever counting it."""
    attr = LOGICAL["cycles"].attr(freq=99)
    flags = struct.unpack_from("<Q", _disabled(attr, True), 40)[0]
    assert flags == struct.unpack_from("<Q", attr, 40)[0] | 1
    assert _disabled(attr, False) == attr and len(_disabled(attr, True)) == len(attr)


def test_the_mock_reports_its_multiplexing() -> None:
    clock = Clock()
    src = MockSource(clock=clock, multiplex={"llc-misses": 2.0})
    src.set_events([LOGICAL["cycles"], LOGICAL["llc-misses"]])
    clock.now += SEC
    assert src.event_times() == {CYCLES: (SEC, SEC), LLC: (SEC, SEC / 2)}


def test_the_live_header_and_json_show_each_events_scale() -> None:
    info = WindowInfo(1.0, "diagnostic", "mock", scales={"cycles": 1.5, "llc-misses": 3.0})
    assert info.scales_text() == "cycles x1.5 llc-misses x3"
    assert WindowInfo(1.0, "sentinel", "mock", scales={"cpu-clock": 1.0}).scales_text() == "1"
    assert "scale cycles x1.5 llc-misses x3  flows 0" in render_live([], info, NoNames())
    assert window_json(0, [], info, NoNames())["scales"] == {"cycles": 1.5, "llc-misses": 3.0}


class NoNames:
    """Names for a window without flows."""

    def flow(self, flow_id: int) -> None:
        return None

    def function(self, function_id: int) -> str:
        return ""

    def stack(self, stack_id: int) -> list[str]:
        return []


def test_an_event_the_source_cannot_open_is_left_out_and_the_rest_kept() -> None:
    """A resolver that cannot open the first event of a group: the others still count;
    an event the rotation has no name for is shown by its key."""
    names: dict[int, str] = {}
    cycles, llc = LOGICAL["cycles"], LOGICAL["llc-misses"]
    keys = opened_keys([cycles, llc], lambda e: None if e is cycles else e, names)
    assert keys == [spec_key(llc)] and names == {spec_key(llc): "llc-misses"}
    s = EventScales()
    s.set_rotation({77: 2.0}, {})
    assert s.by_name() == {"77": 2.0}
