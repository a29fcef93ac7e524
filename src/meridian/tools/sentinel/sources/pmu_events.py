"""Event names a person types (`cycles,llc-misses,raw:0x1cd`) to the perf events the
kernel samples: one `EventSpec` per name, and the `perf_event_attr` bytes it opens.

Logical events are the generic perf ones (PERF_TYPE_HARDWARE), the software
`cpu-clock`, and two precise memory events with a data address (PEBS):

- remote-dram: MEM_LOAD_L3_MISS_RETIRED.REMOTE_DRAM, event 0xD3 umask 0x02
- hitm:        MEM_LOAD_L3_HIT_RETIRED.XSNP_HITM,    event 0xD2 umask 0x04

Those two codes are Intel's, for the Xeon server cores Skylake-SP, Cascade Lake and
Ice Lake-SP (Intel SDM vol. 3B, "Performance Monitoring Events"; perfmon JSON
SKX/CLX/ICX; Sapphire Rapids names the second XSNP_FWD with the same code). Other
CPUs (AMD, Arm, other Intel families) take raw codes: `raw:0xCODE` or perf's `rCODE`,
with an optional `:0xCONFIG1` (e.g. MEM_TRANS_RETIRED.LOAD_LATENCY `raw:0x1cd:0x1e`,
the latency threshold in config1) and perf's `:p`/`:pp`/`:ppp` precision suffix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ....bpf import perf as P
from ....errors import UsageError
from ..model.records import Event

__all__ = ["LOGICAL", "EventSpec", "parse_event", "parse_events"]

# Data-address sampling asks the PMU for precise (PEBS) records: precise_ip 2 is
# perf's `:pp` ("requested to have 0 skid", PEBS with the +1 fix-up on Intel).
MEM_PRECISE = 2


@dataclass(frozen=True)
class EventSpec:
    """One event to sample: its logical id (the sample's `event`) and its perf code."""

    name: str
    event: Event
    perf_type: int
    config: int
    config1: int = 0
    precise: int = 0
    raw_code: int = 0

    @property
    def hardware(self) -> bool:
        """Needs a PMU (a VM without one cannot open it)."""
        return self.perf_type != P.PERF_TYPE_SOFTWARE

    @property
    def data_address(self) -> bool:
        """Samples carry the data address (PERF_SAMPLE_ADDR): the memory events and
        precise raw codes."""
        return self.event in (Event.REMOTE_DRAM, Event.XSNP_HITM) or (
            self.event == Event.RAW and self.precise > 0
        )

    def attr(self, freq: int = 0, period: int = 0, lbr: bool = False) -> bytes:
        """The `struct perf_event_attr` for sampling `freq` times a second (or every
        `period` events); `lbr` adds the branch stack of each sample. read() gives
        its enabled and running times (perf.read_times: the kernel's multiplexing)."""
        sample_type = P.SAMPLE_IP | P.SAMPLE_TID | P.SAMPLE_TIME | P.SAMPLE_CPU
        if self.data_address:
            sample_type |= P.SAMPLE_ADDR | P.SAMPLE_DATA_SRC | P.SAMPLE_WEIGHT
        branches = P.BRANCH_ANY | P.BRANCH_USER | P.BRANCH_KERNEL if lbr else 0
        return P.perf_event_attr(
            self.perf_type,
            self.config,
            sample_period=period,
            freq=freq,
            sample_type=sample_type,
            precise_ip=self.precise,
            config1=self.config1,
            branch_sample_type=branches,
            read_format=P.FORMAT_TIMES,
        )


LOGICAL: dict[str, EventSpec] = {
    "cycles": EventSpec("cycles", Event.CYCLES, P.PERF_TYPE_HARDWARE, 0),
    "instructions": EventSpec("instructions", Event.INSTRUCTIONS, P.PERF_TYPE_HARDWARE, 1),
    "llc-misses": EventSpec("llc-misses", Event.LLC_MISS, P.PERF_TYPE_HARDWARE, 3),
    "branch-misses": EventSpec("branch-misses", Event.BRANCH_MISS, P.PERF_TYPE_HARDWARE, 5),
    "remote-dram": EventSpec(
        "remote-dram", Event.REMOTE_DRAM, P.PERF_TYPE_RAW, 0x02D3, precise=MEM_PRECISE
    ),
    "hitm": EventSpec("hitm", Event.XSNP_HITM, P.PERF_TYPE_RAW, 0x04D2, precise=MEM_PRECISE),
    "cpu-clock": EventSpec("cpu-clock", Event.CPU_CLOCK, P.PERF_TYPE_SOFTWARE, 0),
}
_ALIASES = {
    "cpu-cycles": "cycles",
    "cache-misses": "llc-misses",
    "llc-miss": "llc-misses",
    "branch-miss": "branch-misses",
    "xsnp-hitm": "hitm",
    "remote_dram": "remote-dram",
}
_RAW = re.compile(r"^(?:raw:(?:0x)?|r)([0-9a-f]+)(?::(?:0x)?([0-9a-f]+))?$")
_PRECISE = re.compile(r"^(.*?)(?::(p{1,3}))?$")


def parse_event(text: str) -> EventSpec:
    """One name (case-insensitive): a logical event or a raw code, with an optional
    perf-style `:p`/`:pp`/`:ppp`."""
    original = text
    m = _PRECISE.match(text.strip().lower())
    assert m is not None  # the pattern matches every string
    base, pp = m.group(1), m.group(2)
    name = _ALIASES.get(base, base)
    if name in LOGICAL:
        spec = LOGICAL[name]
        if pp:
            if not spec.hardware:
                raise UsageError(f"event {original!r}: a software event has no precise mode")
            spec = EventSpec(
                spec.name, spec.event, spec.perf_type, spec.config, spec.config1, len(pp)
            )
        return spec
    r = _RAW.match(name)
    if r is None:
        known = ", ".join([*LOGICAL, "raw:0xCODE", "rCODE"])
        raise UsageError(f"unknown event {original.strip()!r}: use one of {known}")
    code = int(r.group(1), 16)
    config1 = int(r.group(2), 16) if r.group(2) else 0
    if code >= 1 << 64 or config1 >= 1 << 64:
        raise UsageError(f"event {original!r}: raw code does not fit 64 bits")
    label = f"raw:{code:#x}" + (f":{config1:#x}" if config1 else "") + (f":{pp}" if pp else "")
    return EventSpec(
        label,
        Event.RAW,
        P.PERF_TYPE_RAW,
        code,
        config1,
        len(pp) if pp else 0,
        code & 0xFFFFFFFF,  # the sample's raw_code (u32): event select + umask + cmask
    )


def parse_events(text: str) -> list[EventSpec]:
    """A comma-separated list, in order, duplicates dropped; empty -> UsageError."""
    specs: list[EventSpec] = []
    for part in text.split(","):
        if not part.strip():
            continue
        spec = parse_event(part)
        if spec not in specs:
            specs.append(spec)
    if not specs:
        raise UsageError(f"no event in {text!r}: name at least one, e.g. cycles")
    return specs
