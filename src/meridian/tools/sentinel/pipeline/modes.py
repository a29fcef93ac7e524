"""Which mode the agent samples in, and how hard it may sample.

`ModeController` switches between sentinel (cheap events, low budget) and diagnostic
(richer events, higher budget) with hysteresis on the busy samples/s (delivered, less
those in the kernel's idle code), so a rate near one threshold does not flap: sentinel
goes to diagnostic when the rate reaches `hysteresis_high` x what sentinel mode can
deliver (the cheap budget is nearly used up: something is happening) and comes back
when it falls below `hysteresis_low` x that. What it can deliver per CPU is its budget,
or less where the source samples each event at a fixed frequency: F x the events open
(`set_limit`; the kernel's -F 99 with one event delivers 99/s however busy the CPU,
far under a budget of 1000, so thresholds on the budget alone would never be reached). An
anomaly forces diagnostic mode for `refractory_period`; triggers inside that period
are ignored, so a long outage does not hold the mode forever. The control plane can
pin a mode (`force`), which wins over both until released.

`SafetyGovernor` is the safety level (docs/requirements/sentinel.md §3.5, §5.2): while
the offered rate (delivered plus dropped in the kernel) exceeds the budget, it limits
the events per group (SHED_HEAVY, exported as `ms_sampling_throttled`), with its own
hysteresis.

What a limited group keeps is `shed_rank`'s order, not the order written (which would
drop `hitm` of [cycles, instructions, llc-misses, hitm] first): the design samples
cycles as the base every flow's and function's cost is read against (cpu-clock stands in
for it without a PMU), and its two detectors (docs/requirements/sentinel.md §5.3) live
on one event each, hitm (false sharing) and remote-dram (NUMA); the generic events
(instructions, llc-misses, branch-misses, raw codes) only refine rates. So: the base
first, then the detectors' events, then the generic ones; within a rank, the order
written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import IntEnum
from typing import Protocol

from ....errors import UsageError
from ..config.load import SentinelConfig
from ..model.records import Event

__all__ = [
    "SHED_RANK",
    "Clock",
    "Mode",
    "ModeController",
    "SafetyGovernor",
    "SafetyLevel",
    "shed_rank",
]

Clock = Callable[[], int]  # nanoseconds, monotonic

# What a shed group keeps first, the lowest rank first (the module's docstring says
# why); an event not named here is generic, GENERIC_RANK.
SHED_RANK = {
    Event.CYCLES: 0,
    Event.CPU_CLOCK: 0,
    Event.XSNP_HITM: 1,
    Event.REMOTE_DRAM: 1,
}
GENERIC_RANK = 2


class Sampled(Protocol):
    """An event to sample (sources' EventSpec): its logical event."""

    @property
    def event(self) -> Event: ...


def shed_rank(spec: Sampled) -> int:
    """An event's rank when the safety level sheds."""
    return SHED_RANK.get(spec.event, GENERIC_RANK)


class Mode(IntEnum):
    """The value of `ms_agent_mode`."""

    SENTINEL = 0
    DIAGNOSTIC = 1

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, name: str | Mode) -> Mode:
        if isinstance(name, Mode):
            return name
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise UsageError(f"mode must be sentinel or diagnostic, got {name!r}") from None


class ModeController:
    """Hysteresis on samples/s plus anomaly forcing; `update` once per flush window.

    `samples_per_sec` is the delivered rate summed over `cpus` CPUs (budgets are per
    CPU, so the thresholds scale by `cpus`)."""

    def __init__(self, cfg: SentinelConfig, clock: Clock = time.monotonic_ns, cpus: int = 1):
        self.clock = clock
        self.cpus = max(1, cpus)
        self.budget = cfg.perf.sentinel_samples_per_sec
        self.high_share, self.low_share = cfg.mode.hysteresis_high, cfg.mode.hysteresis_low
        self.high = self.low = 0.0
        self.set_limit(None)
        self.auto = cfg.mode.auto
        self.base = Mode.parse(cfg.mode.initial)
        self.refractory_ns = round(cfg.anomaly.refractory_period * 1e9)
        self.mode = self.base
        self.pinned: Mode | None = None
        self.forced_until = 0  # ns: diagnostic held by an anomaly until then
        self.reason = f"initial ({cfg.mode.initial})"

    def set_limit(self, per_cpu: float | None) -> None:
        """What the source can deliver per CPU at most (None: no limit but the
        budget); the thresholds are shares of the lower of the two."""
        capacity = self.budget if per_cpu is None else min(self.budget, per_cpu)
        self.high = self.high_share * capacity * self.cpus
        self.low = self.low_share * capacity * self.cpus

    def _set(self, mode: Mode, reason: str) -> Mode:
        if mode != self.mode:
            self.mode, self.reason = mode, reason
        return self.mode

    def update(self, samples_per_sec: float, now: int | None = None) -> Mode:
        """The mode for the next window, given the rate of the last one."""
        now = self.clock() if now is None else now
        if self.pinned is not None:
            return self._set(self.pinned, f"pinned to {self.pinned.label}")
        if now < self.forced_until:
            return self._set(Mode.DIAGNOSTIC, "anomaly")
        if not self.auto:
            return self._set(self.base, f"anomaly hold over, back to {self.base.label}")
        if self.mode == Mode.SENTINEL and samples_per_sec >= self.high:
            return self._set(Mode.DIAGNOSTIC, f"samples/s {samples_per_sec:.0f} >= {self.high:.0f}")
        if self.mode == Mode.DIAGNOSTIC and samples_per_sec < self.low:
            return self._set(Mode.SENTINEL, f"samples/s {samples_per_sec:.0f} < {self.low:.0f}")
        return self.mode

    def force(self, mode: Mode | str | None) -> Mode:
        """Pin a mode (the control plane's `POST /api/v1/mode`); None releases it, and
        the next `update` decides again."""
        if mode is None:
            self.pinned = None
            return self.mode
        self.pinned = Mode.parse(mode)
        return self._set(self.pinned, f"pinned to {self.pinned.label}")

    def force_diagnostic(self, until_ns: int, now: int | None = None, why: str = "anomaly") -> bool:
        """Hold diagnostic mode until `until_ns`; ignored (False) while an earlier hold
        (the refractory period) runs."""
        now = self.clock() if now is None else now
        if now < self.forced_until:
            return False
        self.forced_until = until_ns
        if self.pinned is None and now < until_ns:
            self._set(Mode.DIAGNOSTIC, why)
        return True

    def trigger(self, now: int | None = None, why: str = "anomaly") -> bool:
        """An anomaly signal: diagnostic mode for the refractory period from now."""
        now = self.clock() if now is None else now
        return self.force_diagnostic(now + self.refractory_ns, now, why)


class SafetyLevel(IntEnum):
    NORMAL = 0
    SHED_HEAVY = 1


class SafetyGovernor:
    """NORMAL or SHED_HEAVY from offered samples/s over the budget (same units both)."""

    def __init__(self, cfg: SentinelConfig) -> None:
        self.high = cfg.mode.shed_high
        self.low = cfg.mode.shed_low
        self.normal_max = cfg.perf.max_events_per_group
        self.shed_max = min(cfg.mode.shed_max_events_per_group, self.normal_max)
        self.level = SafetyLevel.NORMAL

    def update(self, samples_per_sec: float, budget: float) -> SafetyLevel:
        ratio = samples_per_sec / budget if budget > 0 else 0.0
        if self.level == SafetyLevel.NORMAL and ratio > self.high:
            self.level = SafetyLevel.SHED_HEAVY
        elif self.level == SafetyLevel.SHED_HEAVY and ratio < self.low:
            self.level = SafetyLevel.NORMAL
        return self.level

    @property
    def max_events_per_group(self) -> int:
        return self.shed_max if self.level == SafetyLevel.SHED_HEAVY else self.normal_max

    @property
    def throttled(self) -> bool:
        """`ms_sampling_throttled`."""
        return self.level == SafetyLevel.SHED_HEAVY
