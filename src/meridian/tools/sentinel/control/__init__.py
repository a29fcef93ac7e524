"""What the control plane (api/) asks of a running agent, as a Protocol: the API is
typed against it and never imports the agent, whose RuntimeControl (agent/control.py)
implements it and whose services start the API on it. It sits above the layers whose
types it names (config, symbols, pipeline, storage) and below both agent and api."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config.load import SentinelConfig
    from ..pipeline.modes import Mode
    from ..pipeline.targets import TargetFilter
    from ..storage.backend import Backend
    from ..symbols.symbolizer import Symbolizer

__all__ = ["Control"]


class Control(Protocol):
    """Callable from any thread. `cfg` holds the budgets as set, `symbolizer` the
    registered JIT regions and data objects, `targets` the monitoring targets."""

    @property
    def cfg(self) -> SentinelConfig: ...

    @property
    def symbolizer(self) -> Symbolizer: ...

    @property
    def targets(self) -> TargetFilter: ...

    def status(self) -> dict[str, Any]:
        """What `GET /api/v1/status` shows."""
        ...

    def set_mode(self, mode: str | Mode | None) -> Mode:
        """Pin a mode (None: back to automatic)."""
        ...

    def set_budgets(
        self,
        sentinel: int | None = None,
        diagnostic: int | None = None,
        hard_drop_ns: int | None = None,
    ) -> None:
        """New per-CPU budgets (validated by the caller)."""
        ...

    def set_groups(
        self,
        sentinel: Sequence[Sequence[str]] | None = None,
        diagnostic: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """New event groups per mode (names or raw codes); UsageError on a bad name."""
        ...

    def set_targets(self, targets: Sequence[Mapping[str, object]]) -> None:
        """The monitoring targets ({"pid": 1}, {"flow_id": ...}, ...; [] = everything)."""
        ...

    def register_jit(
        self, pid: int, start: int, end: int, path: str, build_id: str | None = None
    ) -> None: ...

    def register_data_object(
        self, pid: int, address: int, name: str, type: str | None = None, size: int | None = None
    ) -> int: ...

    def store_backend(self) -> Backend | None:
        """The store this agent writes to, for queries, or None."""
        ...
