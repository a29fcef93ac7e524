"""What the source must sample, decided by the flush (hysteresis on the rate, the
safety level), the anomaly monitor and the control plane, all under the state's lock.
The consumer alone changes the source: what it must change is posted to it."""

from __future__ import annotations

from typing import Any

from ..config.load import parse_groups
from ..pipeline.modes import Mode, ModeController, SafetyGovernor, SafetyLevel, shed_rank
from ..pipeline.rotator import PmuRotator
from .state import RuntimeState

__all__ = ["Plan"]


class Plan:
    """The mode and its budget, each mode's event groups taking turns on the PMU, and
    the events per group the safety level allows (those shed_rank puts first). `cpus`
    scales the per-CPU budgets to the rates the flush measures (all CPUs)."""

    def __init__(self, state: RuntimeState, cpus: int) -> None:
        cfg = state.cfg
        self.state = state
        self.cpus = cpus
        self.modes = ModeController(cfg, state.clock, cpus=cpus)
        self.governor = SafetyGovernor(cfg)
        self.groups = {
            m: parse_groups(cfg.groups(m), f"perf.{m}_groups") for m in ("sentinel", "diagnostic")
        }
        self.mode = self.modes.mode
        self.budget = (cfg.budget(self.mode.label), cfg.perf.hard_drop_ns)
        self.rotator: PmuRotator[Any] = PmuRotator(
            self.groups[self.mode.label],
            round(cfg.perf.rotation_window * 1e9),
            state.clock,
            self.governor.max_events_per_group,
            rank=shed_rank,
        )

    def tick(self, now: int) -> list[Any] | None:
        """The next group when the current one has had its rotation window."""
        with self.state.lock:
            return self.rotator.tick(now)

    def current_mode(self) -> Mode:
        with self.state.lock:
            return self.mode

    def decide(self, busy_per_sec: float, offered_per_sec: float, now: int) -> None:
        """A window's decisions: the mode (hysteresis on the busy rate, anomaly hold)
        and the safety level (on the offered rate)."""
        cfg = self.state.cfg
        with self.state.lock:
            before = self.mode
            freq, events = self.state.frequency, len(self.state.events)
            self.modes.set_limit(freq * events if freq and events else None)
            mode = self.modes.update(busy_per_sec, now)
            level_before = self.governor.level
            level = self.governor.update(offered_per_sec, cfg.budget(mode.label) * self.cpus)
            group = self._switch(mode, now) if mode != before else None
            if level != level_before:
                changed = self.rotator.set_max_events(self.governor.max_events_per_group)
                group = changed if changed is not None else group
            if group is not None:
                self.state.post("events", group)
            reason = self.modes.reason
        if mode != before and cfg.run.verbose:
            self.state.log(f"mode {mode.label}: {reason}")
        if level != level_before and cfg.run.verbose:
            what = "shedding events" if level == SafetyLevel.SHED_HEAVY else "back to normal"
            self.state.log(f"safety level {level.name.lower()}: {what}")

    def force(self, mode: str | Mode | None) -> Mode:
        """Pin a mode (None: back to automatic)."""
        with self.state.lock:
            new = self.modes.force(mode)
            if new != self.mode:
                self.state.post("events", self._switch(new))
            return new

    def trigger(self, now: int, why: str) -> bool:
        """An anomaly: diagnostic mode for the refractory period (the plan follows at
        the next window); False while an earlier one holds it."""
        with self.state.lock:
            return self.modes.trigger(now, why=why)

    def set_budgets(
        self, sentinel: int | None, diagnostic: int | None, hard_drop_ns: int | None
    ) -> None:
        """New per-CPU budgets, kept in the config; the current mode's takes effect."""
        with self.state.lock:
            p = self.state.cfg.perf
            if sentinel is not None:
                p.sentinel_samples_per_sec = sentinel
            if diagnostic is not None:
                p.diagnostic_samples_per_sec = diagnostic
            if hard_drop_ns is not None:
                p.hard_drop_ns = hard_drop_ns
            self.budget = (self.state.cfg.budget(self.mode.label), p.hard_drop_ns)
            self.state.post("budget", self.budget)

    def set_groups(self, parsed: dict[str, list[Any]]) -> None:
        """New event groups for the modes named; the current mode's start at once."""
        with self.state.lock:
            self.groups.update(parsed)
            if self.mode.label in parsed:
                self.state.post("events", self.rotator.set_groups(self.groups[self.mode.label]))

    def _switch(self, mode: Mode, now: int | None = None) -> list[Any]:
        """Under the lock: `mode`'s groups from the first, and its budget (posted);
        returns the group to open."""
        self.mode = mode
        group = self.rotator.set_groups(self.groups[mode.label], now)
        self.budget = (self.state.cfg.budget(mode.label), self.state.cfg.perf.hard_drop_ns)
        self.state.post("budget", self.budget)
        return group
