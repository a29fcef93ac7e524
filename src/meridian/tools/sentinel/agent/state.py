"""What the runtime's threads share: the batch handed to observers, the observer
protocol, and `RuntimeState`, the attributes every part of the runtime (agent,
consumer, flush, control) reads and writes, declared once so that each part is a
module of its own with the helpers they all call."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..config.load import SentinelConfig
from ..model.flows import FlowNames
from ..model.records import SampleSource
from ..model.window import Totals, Window, WindowInfo
from ..outputs.metrics import SentinelMetrics
from ..pipeline.aggregator import Aggregator
from ..pipeline.clock import ClockCalibrator
from ..pipeline.modes import Mode, ModeController, SafetyGovernor
from ..pipeline.resolver import RuntimeNames
from ..pipeline.rotator import PmuRotator
from ..pipeline.skew import SkewAdjuster
from ..pipeline.targets import TargetFilter

if TYPE_CHECKING:
    from ..symbols.symbolizer import Symbolizer

__all__ = ["Array", "Observer", "RuntimeState", "SampleBatch"]

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class SampleBatch:
    """What the consumer kept of one poll: after skew adjustment and the target
    filter, with the wall-clock time of each sample and the scale of its cost. The
    arrays are shared with the aggregator's batch: read them, copy what you keep."""

    samples: Array  # sample_dtype
    wall_ns: Array  # int64, one per sample
    lbr: Array  # lbr_dtype, joined to samples by (cpu, time_ns)
    scale: float

    @property
    def norm_cost(self) -> Array:
        """Each sample's `scale / gso_segs`, as the aggregator sums it (raw tables)."""
        gso = np.maximum(self.samples["gso_segs"], 1).astype(np.float64)
        out: Array = self.scale / gso
        return out


class Observer(Protocol):
    """A sink or detector. `on_window` runs on the flush thread, `close` at stop after
    the last window. One that also defines `on_samples(batch: SampleBatch)` gets every
    batch on the consumer thread (keep it short: queue work elsewhere). An observer
    that raises is reported once and dropped."""

    def on_window(self, window: Window) -> None: ...
    def close(self) -> None: ...


class RuntimeState:
    """The runtime's attributes (set by Runtime.__init__) and the helpers every
    thread uses. Shared state changes under `_ctl`."""

    cfg: SentinelConfig
    source: SampleSource | None
    log: Callable[[str], None]
    clock: Callable[[], int]
    cpus: list[int]
    symbolizer: Symbolizer
    observers: list[Observer]
    flow_names: FlowNames
    names: RuntimeNames
    metrics: SentinelMetrics
    totals: Totals
    mode_controller: ModeController
    governor: SafetyGovernor
    rotator: PmuRotator[Any]
    targets: TargetFilter
    skew: SkewAdjuster
    calibrator: ClockCalibrator
    aggregator: Aggregator | None
    anomaly: Any
    labelled: dict[str, int]
    started_ns: int
    stopped_ns: int
    _names_lock: threading.Lock
    _groups: dict[str, Any]
    _anomaly_gauges: Any
    _ctl: threading.Lock
    _requests: dict[str, Any]
    _wakeup: threading.Event
    _taken: threading.Event
    _mode: Mode
    _budget: tuple[int, int]
    _events_open: float
    _source_name: str
    _event_names: list[str]
    _refused: set[str]
    _delivered: int
    _kept: int
    _named: Array
    _names_at: float
    _dropped: dict[str, int]
    _last_flush: int
    _last_delivered: int
    _last_offered_drops: int
    _window_index: int
    _last_info: WindowInfo | None
    _stop: threading.Event
    _threads: dict[str, threading.Thread]
    _failed_observers: set[int]
    _started: bool

    @property
    def running(self) -> bool:
        return self._started and not self._stop.is_set()

    def _post(self, what: str, value: Any) -> None:
        """A request for the consumer (under _ctl), which it applies at once."""
        self._requests[what] = value
        self._wakeup.set()

    # ---- observers ----------------------------------------------------------------------

    def add_observer(self, obs: Observer) -> None:
        """Plug in a sink or detector (before or while running)."""
        self.observers.append(obs)

    def _call(self, obs: Observer, hook: Callable[[Any], None], arg: Any) -> None:
        try:
            hook(arg)
        except BrokenPipeError:
            self._stop.set()  # the reader went away (| head)
        except Exception as exc:
            if id(obs) not in self._failed_observers:
                self._failed_observers.add(id(obs))
                self.log(f"{type(obs).__name__} failed and is dropped: {exc}")
            with contextlib.suppress(ValueError):
                self.observers.remove(obs)
