"""Control and status of a running agent, for the control plane (api/app.py) and the
anomaly monitor: callable from any thread, they change the plan and the targets under
the lock, and the consumer applies what the source must do between two polls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..config.load import parse_groups
from ..pipeline.anomaly import AnomalyGauges, AnomalySignal
from ..pipeline.modes import Mode
from ..pipeline.targets import TargetFilter
from .plan import Plan
from .state import RuntimeState

if TYPE_CHECKING:
    from ..symbols.symbolizer import Symbolizer

__all__ = ["RuntimeControl"]


class RuntimeControl:
    """What the API calls: control.Control, which the API is typed against (plus the
    anomaly monitor's `anomaly`). `cfg` holds the budgets as set, `symbolizer` the
    registered JIT regions and data objects, `targets` the monitoring targets."""

    def __init__(
        self, state: RuntimeState, plan: Plan, targets: TargetFilter, symbolizer: Symbolizer
    ) -> None:
        self.state = state
        self.cfg = state.cfg
        self.plan = plan
        self.targets = targets
        self.symbolizer = symbolizer

    def set_mode(self, mode: str | Mode | None) -> Mode:
        """Pin a mode (None: back to automatic); the source follows within a poll."""
        return self.plan.force(mode)

    def set_budgets(
        self,
        sentinel: int | None = None,
        diagnostic: int | None = None,
        hard_drop_ns: int | None = None,
    ) -> None:
        """New per-CPU budgets (validated by the caller); the current mode's takes effect."""
        self.plan.set_budgets(sentinel, diagnostic, hard_drop_ns)

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
        self.plan.set_groups(parsed)

    def set_targets(self, targets: Sequence[Mapping[str, object]]) -> None:
        """The monitoring targets ({"pid": 1}, {"flow_id": ...}, ...; [] = everything)."""
        self.targets.set(targets)
        with self.state.lock:
            self.state.post("pids", self.targets.pids())

    def register_jit(
        self, pid: int, start: int, end: int, path: str, build_id: str | None = None
    ) -> None:
        self.symbolizer.register_jit(pid, start, end, path, build_id)

    def register_data_object(
        self, pid: int, address: int, name: str, type: str | None = None, size: int | None = None
    ) -> int:
        return self.symbolizer.register_data_object(pid, address, name, type, size)

    def anomaly(self, gauges: AnomalyGauges, signals: Sequence[AnomalySignal]) -> None:
        """The anomaly monitor's readings: its gauges go in the next window's metrics,
        and each trigger holds diagnostic mode for the refractory period."""
        self.state.anomaly = gauges
        for s in signals:
            if self.plan.trigger(s.time_ns, str(s)) and self.cfg.run.verbose:
                self.state.log(f"anomaly: {s}: diagnostic mode")

    def status(self) -> dict[str, Any]:
        """What `GET /api/v1/status` shows."""
        plan, state = self.plan, self.state
        with state.lock:
            mode, budget = plan.mode, plan.budget
            pinned = plan.modes.pinned is not None
            groups = {m: [[str(e.name) for e in g] for g in gs] for m, gs in plan.groups.items()}
        info = state.last_info
        return {
            "mode": mode.label,
            "pinned": pinned,
            "source": state.source_name,
            "events": list(state.events),
            "groups": groups,
            "samples_per_sec_budget": budget[0],
            "hard_drop_ns": budget[1],
            "samples_per_sec": info.samples_per_sec if info else 0.0,
            "scales": dict(state.scales),
            "safety_level": plan.governor.level.name.lower(),
            "throttled": plan.governor.throttled,
            "dropped": dict(state.dropped),
            "samples_delivered": state.delivered,
            "samples_kept": state.kept,
            "labelled": dict(state.labelled),
            "targets": self.targets.targets,
            "running": state.running,
            "storage": self._storage_status(),
        }

    def store_backend(self) -> Any:
        """The store this agent writes to, for queries (thread-safe backends), or None."""
        sink = self.state.observers.sink()
        return None if sink is None else sink.backend

    def _storage_status(self) -> dict[str, Any] | None:
        """The store's backlog; None when nothing is stored."""
        sink = self.state.observers.sink()
        if sink is None:
            return None
        s = sink.stats()
        return {
            "backend": str(s.backend),
            "connected": bool(s.connected),
            "stored_rows": int(s.rows_written),
            "backlog_rows": int(s.backlog_rows),
            "spooled_rows": int(s.spooled_rows),
            "spool_bytes": int(s.spool_bytes),
            "dropped_rows": int(s.dropped_rows),
            "flush_errors": int(s.flush_errors),
        }
