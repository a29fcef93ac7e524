"""The kernel source's perf events: opened on every CPU, `cpu-clock` in place of an
event the host cannot count (said once), what each event opens as (`resolve`), and
how long each open event held a counter of the time it was enabled (`times`): the
runtime scales each event's samples by what was really sampled (pipeline/scales.py).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from ....bpf.perf import FLAG_DISABLED, online_cpus, open_attr_per_cpu, read_times
from ....errors import MeridianError, NotSupported
from ..model.records import event_key
from .pmu_events import LOGICAL, EventSpec

__all__ = ["INTEL_CODED", "EventOpener"]

# logical events whose codes are Intel's (events.py): other vendors take raw codes
INTEL_CODED = ("remote-dram", "hitm")
# An event's times are taken once it was enabled this long per CPU: the kernel turns
# multiplexed events every few ms (perf_event_mux_interval_ms), so a fresh event's
# ratio says nothing yet (until then it keeps the last one it had, or none).
SETTLED_NS = 20_000_000


@functools.cache
def _cpu_vendor(path: str = "/proc/cpuinfo") -> str:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _disabled(attr: bytes, disabled: bool) -> bytes:
    """`attr` with its `disabled` flag set (opened, never counting), or as it is."""
    if not disabled:
        return attr
    flags = int.from_bytes(attr[40:48], "little") | FLAG_DISABLED
    return attr[:40] + flags.to_bytes(8, "little") + attr[48:]


class EventOpener:
    """Opens sampled events at `frequency` per CPU; hardware events with a branch
    stack when `branch_stack` (both LBR modes need one: the sample's own records, or
    an LBR kept recording for the snapshot); one that refuses it is sampled without,
    said once."""

    def __init__(self, frequency: int, branch_stack: bool, warn: Callable[[str], None]) -> None:
        self.frequency = frequency
        self.branch_stack = branch_stack
        self.warn = warn
        self._warned = False
        self._no_branches: set[str] = set()  # events opened without them (said once)
        self._resolved: dict[EventSpec, EventSpec | None] = {}  # what each event opens as
        # per event open now: its key and its fds (owned by their links: read, not closed)
        self._readers: list[tuple[int, list[int]]] = []
        self._times: dict[int, tuple[int, int]] = {}  # event key -> (enabled, running) ns

    def open(
        self, spec: EventSpec, cpus: list[int] | None = None, probe: bool = False
    ) -> tuple[list[int], EventSpec]:
        """One fd per CPU (default: every online CPU) and the event they count: `spec`,
        or cpu-clock where the host has no PMU event for it (said once). A `probe`
        opens them disabled and says nothing."""
        cpus = online_cpus() if cpus is None else cpus
        try:
            if spec.name in INTEL_CODED and _cpu_vendor() != "GenuineIntel":
                # The same raw code means another event elsewhere: never count it.
                raise NotSupported(
                    spec.name, f"its code is Intel's and this CPU is {_cpu_vendor() or 'unknown'}"
                )
            fds, used = self._open_branches(spec, cpus, probe), spec
        except NotSupported as exc:
            if not spec.hardware:
                raise
            if not probe and not self._warned:
                self.warn(
                    f"{spec.name} cannot be sampled here ({exc.reason}): no hardware PMU "
                    "event for it; sampling cpu-clock instead (raw:0xCODE names any other)"
                )
                self._warned = True
            used = LOGICAL["cpu-clock"]
            fds = open_attr_per_cpu(_disabled(used.attr(freq=self.frequency), probe), cpus=cpus)
        self._resolved[spec] = used
        return fds, used

    def _open_branches(self, spec: EventSpec, cpus: list[int], probe: bool) -> list[int]:
        if not (self.branch_stack and spec.hardware):
            return open_attr_per_cpu(_disabled(spec.attr(freq=self.frequency), probe), cpus=cpus)
        try:
            attr = spec.attr(freq=self.frequency, lbr=True)
            return open_attr_per_cpu(_disabled(attr, probe), cpus=cpus)
        except NotSupported as exc:
            fds = open_attr_per_cpu(_disabled(spec.attr(freq=self.frequency), probe), cpus=cpus)
            if not probe and spec.name not in self._no_branches:
                self._no_branches.add(spec.name)
                self.warn(f"{spec.name} takes no branch stack ({exc.reason}): sampled without")
            return fds

    def resolve(self, spec: EventSpec) -> EventSpec | None:
        """The event `open` gives for `spec`: itself, cpu-clock where the host cannot
        count it, None where it cannot be opened at all (a raw code the PMU refuses).
        Known once it was opened; else it is opened on one CPU and closed."""
        if spec not in self._resolved:
            try:
                fds, _ = self.open(spec, online_cpus()[:1], probe=True)
            except MeridianError:
                self._resolved[spec] = None
            else:
                for fd in fds:
                    os.close(fd)
        return self._resolved[spec]

    def track(self, opened: list[tuple[EventSpec, list[int]]]) -> None:
        """The events open from now on, with their fds (before their links own them)."""
        self._readers = [(event_key(s.event, s.raw_code), list(fds)) for s, fds in opened]

    def untrack(self) -> None:
        """Before the open events' links (and so their fds) go: their last times."""
        self.read()
        self._readers = []

    def times(self) -> dict[int, tuple[int, int]]:
        """(time_enabled, time_running) ns of each event open now, summed over the
        CPUs since it was opened, and the last of each open before, by event key."""
        self.read()
        return dict(self._times)

    def read(self) -> None:
        for key, fds in self._readers:
            enabled = running = 0
            for fd in fds:
                try:
                    _, e, r = read_times(fd)
                except OSError:
                    continue
                enabled, running = enabled + e, running + r
            if fds and enabled >= SETTLED_NS * len(fds):
                self._times[key] = (enabled, running)
