"""The runtime's control methods, part 2's API (set_mode, set_budgets, set_groups,
set_targets, register_jit, register_data_object, status): callable from any thread,
they change shared state under the lock and post what the source must do to the
consumer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config.load import parse_groups
from ..model.window import WindowInfo
from ..pipeline.modes import Mode
from .state import RuntimeState

__all__ = ["RuntimeControl"]


class RuntimeControl(RuntimeState):
    """Control and status of a running agent."""

    # ---- control (part 2's API; any thread) ----------------------------------------------

    def set_mode(self, mode: str | Mode | None) -> Mode:
        """Pin a mode (None: back to automatic); the source follows within a poll."""
        with self._ctl:
            before = self._mode
            new = self.mode_controller.force(mode)
            if new != before:
                self._mode = new
                self._post("events", self.rotator.set_groups(self._groups[new.label]))
                self._budget = (self.cfg.budget(new.label), self.cfg.perf.hard_drop_ns)
                self._post("budget", self._budget)
            return new

    def set_budgets(
        self,
        sentinel: int | None = None,
        diagnostic: int | None = None,
        hard_drop_ns: int | None = None,
    ) -> None:
        """New per-CPU budgets (validated by the caller); the current mode's takes effect."""
        with self._ctl:
            p = self.cfg.perf
            if sentinel is not None:
                p.sentinel_samples_per_sec = sentinel
            if diagnostic is not None:
                p.diagnostic_samples_per_sec = diagnostic
            if hard_drop_ns is not None:
                p.hard_drop_ns = hard_drop_ns
            self._budget = (self.cfg.budget(self._mode.label), p.hard_drop_ns)
            self._post("budget", self._budget)

    def set_groups(
        self,
        sentinel: Sequence[Sequence[str]] | None = None,
        diagnostic: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """New event groups per mode (names or raw codes); UsageError on a bad name."""
        parsed = {}
        if sentinel is not None:
            parsed["sentinel"] = parse_groups([list(g) for g in sentinel], "sentinel_groups")
        if diagnostic is not None:
            parsed["diagnostic"] = parse_groups([list(g) for g in diagnostic], "diagnostic_groups")
        with self._ctl:
            self._groups.update(parsed)
            if self._mode.label in parsed:
                self._post("events", self.rotator.set_groups(self._groups[self._mode.label]))

    def set_targets(self, targets: Sequence[Mapping[str, object]]) -> None:
        """The monitoring targets ({"pid": 1}, {"flow_id": ...}, ...; [] = everything)."""
        self.targets.set(targets)
        with self._ctl:
            self._post("pids", self.targets.pids())

    def register_jit(
        self, pid: int, start: int, end: int, path: str, build_id: str | None = None
    ) -> None:
        self.symbolizer.register_jit(pid, start, end, path, build_id)

    def register_data_object(
        self, pid: int, address: int, name: str, type: str | None = None, size: int | None = None
    ) -> int:
        return self.symbolizer.register_data_object(pid, address, name, type, size)

    def status(self) -> dict[str, Any]:
        """What `GET /api/v1/status` shows."""
        with self._ctl:
            mode, budget = self._mode, self._budget
            pinned = self.mode_controller.pinned is not None
            groups = {m: [[str(e.name) for e in g] for g in gs] for m, gs in self._groups.items()}
        info = self._last_info
        return {
            "mode": mode.label,
            "pinned": pinned,
            "source": self._source_name,
            "events": list(self._event_names),
            "groups": groups,
            "samples_per_sec_budget": budget[0],
            "hard_drop_ns": budget[1],
            "samples_per_sec": info.samples_per_sec if info else 0.0,
            "scale": self.rotator.scale,
            "safety_level": self.governor.level.name.lower(),
            "throttled": self.governor.throttled,
            "dropped": dict(self._dropped),
            "samples_delivered": self._delivered,
            "samples_kept": self._kept,
            "labelled": dict(self.labelled),
            "targets": self.targets.targets,
            "running": self.running,
            "storage": self._storage_status(),
        }

    def _sink(self) -> Any:
        """The first observer's sink (storage's StoreWriter), None when nothing is stored."""
        for obs in list(self.observers):
            sink = getattr(obs, "sink", None)
            if callable(getattr(sink, "stats", None)):
                return sink
        return None

    def store_backend(self) -> Any:
        """The store this agent writes to, for queries (thread-safe backends), or None."""
        sink = self._sink()
        return None if sink is None else sink.backend

    def _storage_status(self) -> dict[str, Any] | None:
        """The store's backlog; None when nothing is stored."""
        sink = self._sink()
        if sink is None:
            return None
        s = sink.stats()
        return {
            "backend": str(s.backend),
            "connected": bool(s.connected),
            "backlog_rows": int(s.backlog_rows),
            "spool_bytes": int(s.spool_bytes),
            "dropped_rows": int(s.dropped_rows),
            "flush_errors": int(s.flush_errors),
        }

    # ---- for the command line ----------------------------------------------------------

    @property
    def info(self) -> WindowInfo:
        """The state of the last window (or of the start)."""
        if self._last_info is not None:
            return self._last_info
        return WindowInfo(1.0, self._mode.label, self._source_name, dropped=dict(self._dropped))

    @property
    def seconds(self) -> float:
        end = self.stopped_ns or self.clock()
        return max(0.0, (end - self.started_ns) / 1e9) if self.started_ns else 0.0
