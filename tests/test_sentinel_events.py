"""Event names to EventSpecs, and the perf_event_attr bytes each opens, checked field
by field against the kernel's layout (include/uapi/linux/perf_event.h, VER7)."""

from __future__ import annotations

import struct

import pytest

from meridian.bpf import perf as P
from meridian.errors import UsageError
from meridian.tools.sentinel.model.records import Event
from meridian.tools.sentinel.sources.pmu_events import LOGICAL, EventSpec, parse_event, parse_events

# (name, offset, struct format) of struct perf_event_attr, PERF_ATTR_SIZE_VER7
LAYOUT = [
    ("type", 0, "I"),
    ("size", 4, "I"),
    ("config", 8, "Q"),
    ("sample_period", 16, "Q"),
    ("sample_type", 24, "Q"),
    ("read_format", 32, "Q"),
    ("flags", 40, "Q"),
    ("wakeup_events", 48, "I"),
    ("bp_type", 52, "I"),
    ("config1", 56, "Q"),
    ("config2", 64, "Q"),
    ("branch_sample_type", 72, "Q"),
    ("sample_regs_user", 80, "Q"),
    ("sample_stack_user", 88, "I"),
    ("clockid", 92, "i"),
    ("sample_regs_intr", 96, "Q"),
    ("aux_watermark", 104, "I"),
    ("sample_max_stack", 108, "H"),
    ("reserved_2", 110, "H"),
    ("aux_sample_size", 112, "I"),
    ("reserved_3", 116, "I"),
    ("sig_data", 120, "Q"),
]


def fields(attr: bytes) -> dict[str, int]:
    assert len(attr) == 128
    return {n: struct.unpack_from("<" + f, attr, off)[0] for n, off, f in LAYOUT}


def bits(flags: int) -> dict[str, int]:
    return {
        "disabled": flags & 1,
        "exclude_user": (flags >> 4) & 1,
        "exclude_kernel": (flags >> 5) & 1,
        "freq": (flags >> 10) & 1,
        "precise_ip": (flags >> 15) & 3,
        "rest": flags & ~((1 << 0) | (1 << 10) | (3 << 15)),
    }


BASE_SAMPLE = 0x1 | 0x2 | 0x4 | 0x80  # IP | TID | TIME | CPU
ADDR_SAMPLE = 0x8 | 0x8000 | 0x4000  # ADDR | DATA_SRC | WEIGHT


@pytest.mark.parametrize(
    ("name", "event", "ptype", "config", "precise", "sample_type"),
    [
        ("cycles", Event.CYCLES, 0, 0, 0, BASE_SAMPLE),
        ("instructions", Event.INSTRUCTIONS, 0, 1, 0, BASE_SAMPLE),
        ("llc-misses", Event.LLC_MISS, 0, 3, 0, BASE_SAMPLE),
        ("branch-misses", Event.BRANCH_MISS, 0, 5, 0, BASE_SAMPLE),
        ("remote-dram", Event.REMOTE_DRAM, 4, 0x02D3, 2, BASE_SAMPLE | ADDR_SAMPLE),
        ("hitm", Event.XSNP_HITM, 4, 0x04D2, 2, BASE_SAMPLE | ADDR_SAMPLE),
        ("cpu-clock", Event.CPU_CLOCK, 1, 0, 0, BASE_SAMPLE),
    ],
)
def test_logical_events_attr(
    name: str, event: Event, ptype: int, config: int, precise: int, sample_type: int
) -> None:
    spec = parse_event(name)
    assert (spec.name, spec.event, spec.perf_type, spec.config) == (name, event, ptype, config)
    assert spec.precise == precise and spec.raw_code == 0 and spec.config1 == 0
    f = fields(spec.attr(freq=99))
    assert f["type"] == ptype and f["size"] == 128 and f["config"] == config
    assert f["sample_period"] == 99  # the sample_freq member of the union
    assert f["sample_type"] == sample_type
    b = bits(f["flags"])
    assert b == {
        "disabled": 0,
        "exclude_user": 0,
        "exclude_kernel": 0,
        "freq": 1,
        "precise_ip": precise,
        "rest": 0,
    }
    # read() gives the enabled and running times: the kernel's multiplexing
    assert f["read_format"] == P.FORMAT_TOTAL_TIME_ENABLED | P.FORMAT_TOTAL_TIME_RUNNING == 3
    others = {
        k: v
        for k, v in f.items()
        if k
        not in ("type", "size", "config", "sample_period", "sample_type", "flags", "read_format")
    }
    assert set(others.values()) == {0}


def test_period_instead_of_freq() -> None:
    f = fields(LOGICAL["cycles"].attr(period=100_003))
    assert f["sample_period"] == 100_003 and bits(f["flags"])["freq"] == 0


def test_lbr_sets_branch_stack() -> None:
    f = fields(LOGICAL["branch-misses"].attr(freq=1000, lbr=True))
    assert f["sample_type"] == BASE_SAMPLE | (1 << 11)  # PERF_SAMPLE_BRANCH_STACK
    assert f["branch_sample_type"] == (1 << 3) | (1 << 0) | (1 << 1)  # ANY | USER | KERNEL


@pytest.mark.parametrize(
    ("text", "code", "config1", "precise"),
    [
        ("raw:0x1cd", 0x1CD, 0, 0),
        ("r1cd", 0x1CD, 0, 0),
        ("RAW:1CD", 0x1CD, 0, 0),
        ("raw:0x1cd:0x1e", 0x1CD, 0x1E, 0),
        ("r1cd:pp", 0x1CD, 0, 2),
        ("raw:0x4d2:ppp", 0x4D2, 0, 3),
    ],
)
def test_raw_codes(text: str, code: int, config1: int, precise: int) -> None:
    spec = parse_event(text)
    assert spec.event == Event.RAW and spec.perf_type == P.PERF_TYPE_RAW == 4
    assert (spec.config, spec.config1, spec.precise, spec.raw_code) == (
        code,
        config1,
        precise,
        code,
    )
    f = fields(spec.attr(freq=1000))
    assert (f["type"], f["config"], f["config1"]) == (4, code, config1)
    assert bits(f["flags"])["precise_ip"] == precise
    has_addr = f["sample_type"] & 0x8
    assert bool(has_addr) == (precise > 0)


def test_precise_suffix_on_logical() -> None:
    spec = parse_event("cycles:pp")
    assert spec.precise == 2 and spec.event == Event.CYCLES
    assert bits(fields(spec.attr(freq=10))["flags"])["precise_ip"] == 2


def test_parse_list_keeps_order_and_drops_duplicates() -> None:
    specs = parse_events("cycles, llc-misses,raw:0x1cd,cycles,")
    assert [s.name for s in specs] == ["cycles", "llc-misses", "raw:0x1cd"]
    assert all(isinstance(s, EventSpec) for s in specs)


@pytest.mark.parametrize("bad", ["cycels", "raw:zz", "r", "cpu-clock:pp", "foo:p"])
def test_unknown_names_name_themselves(bad: str) -> None:
    with pytest.raises(UsageError, match=bad.split(":")[0]):
        parse_events(f"cycles,{bad}")


def test_empty_list() -> None:
    with pytest.raises(UsageError):
        parse_events(" , ")


def test_existing_attr_callers_unchanged() -> None:
    # perf_event_attr's old positional form still gives the old bytes
    old = P.perf_event_attr(1, 0, 1_000_000_000)
    f = fields(old)
    assert (f["type"], f["config"], f["sample_period"], f["sample_type"], f["flags"]) == (
        1,
        0,
        1_000_000_000,
        0,
        0,
    )
    assert fields(P.perf_event_attr(1, 5, 0, 49, disabled=True))["flags"] == 1 | (1 << 10)


def test_precise_range() -> None:
    with pytest.raises(ValueError):
        P.perf_event_attr(0, 0, 1, precise_ip=4)
