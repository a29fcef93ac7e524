"""What the runtime's parts share: the batch handed to observers, the observers
themselves, and `RuntimeState`, the few things that the consumer, the flush and the
control plane all read or write. Everything else a part needs is given to its
constructor, so that its dependencies show there."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..config.load import SentinelConfig
from ..model.window import Window, WindowInfo
from ..pipeline.anomaly import AnomalyGauges

__all__ = ["Array", "Observer", "Observers", "RuntimeState", "SampleBatch"]

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class SampleBatch:
    """What the consumer kept of one poll: after skew adjustment and the target
    filter, with the wall-clock time of each sample and the scale of its cost (its
    event's: pipeline/scales.py). The arrays are shared with the aggregator's batch:
    read them, copy what you keep."""

    samples: Array  # sample_dtype
    wall_ns: Array  # int64, one per sample
    lbr: Array  # lbr_dtype, joined to samples by (cpu, time_ns)
    scale: Array  # float64, one per sample

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


class Observers:
    """The sinks and detectors, each hook called on its own thread. One that raises is
    said once and dropped, so that a broken sink cannot end the agent; a reader gone
    away (`| head`) ends it."""

    def __init__(
        self, observers: Iterable[Observer], log: Callable[[str], None], stopping: threading.Event
    ) -> None:
        self._list: list[Observer] = list(observers)
        self._log = log
        self._stopping = stopping
        self._failed: set[int] = set()

    def add(self, obs: Observer) -> None:
        self._list.append(obs)

    def samples(self, batch: SampleBatch) -> None:
        """`on_samples` of those that have it (the consumer thread)."""
        for obs in list(self._list):
            hook = getattr(obs, "on_samples", None)
            if hook is not None:
                self._call(obs, hook, batch)

    def window(self, window: Window) -> None:
        """`on_window` of every observer (the flush thread, then stop())."""
        for obs in list(self._list):
            hook = getattr(obs, "on_window", None)
            if hook is not None:
                self._call(obs, hook, window)

    def close(self) -> None:
        for obs in self._list:
            close = getattr(obs, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:  # one sink must not keep the others open
                    self._log(f"closing {type(obs).__name__}: {exc}")

    def sink(self) -> Any:
        """The first observer's sink (storage's StoreWriter), None when nothing is stored."""
        for obs in list(self._list):
            sink = getattr(obs, "sink", None)
            if callable(getattr(sink, "stats", None)):
                return sink
        return None

    def _call(self, obs: Observer, hook: Callable[[Any], None], arg: Any) -> None:
        try:
            hook(arg)
        except BrokenPipeError:
            self._stopping.set()  # the reader went away (| head)
        except Exception as exc:
            if id(obs) not in self._failed:
                self._failed.add(id(obs))
                self._log(f"{type(obs).__name__} failed and is dropped: {exc}")
            with contextlib.suppress(ValueError):
                self._list.remove(obs)


class RuntimeState:
    """What the runtime's parts share. `lock` guards `requests` and the plan
    (plan.py); each counter has one writer and is read as it is."""

    def __init__(
        self,
        cfg: SentinelConfig,
        log: Callable[[str], None],
        clock: Callable[[], int],
        observers: Iterable[Observer] = (),
    ) -> None:
        self.cfg = cfg
        self.log = log
        self.clock = clock
        self.lock = threading.Lock()
        self.stopping = threading.Event()  # stop() or a failed thread: every loop ends
        self.wakeup = threading.Event()  # a request (or stop) for the consumer, now
        self.requests: dict[str, Any] = {}  # for the consumer: events, budget, pids
        self.observers = Observers(observers, log, self.stopping)
        self.started = False
        # the consumer's: what the source delivered and what was kept
        self.source_name = "-"
        self.events: list[str] = []  # what the source really samples (after a fallback)
        # samples/s per event and CPU of a source that samples at a fixed frequency
        # (the kernel's -F), None for one without (the mock)
        self.frequency: float | None = None
        self.scales: dict[str, float] = {}  # each event's sample scale, by name (replaced)
        self.delivered = 0  # samples polled, cumulative
        self.kept = 0  # after the target filter
        self.dropped: dict[str, int] = {}
        # the flush's: samples kept under a label instead of a symbol or frames
        # (cumulative), and the last window
        self.labelled = {
            "function_unresolved": 0,
            "stack_unresolved": 0,
            "stack_gone": 0,
            "stack_skipped": 0,
        }
        self.last_info: WindowInfo | None = None
        self.anomaly = AnomalyGauges()  # the anomaly monitor's latest readings

    @property
    def running(self) -> bool:
        return self.started and not self.stopping.is_set()

    def post(self, what: str, value: Any) -> None:
        """A request for the consumer, which applies it between two polls. Under `lock`."""
        self.requests[what] = value
        self.wakeup.set()

    def take_requests(self) -> dict[str, Any]:
        with self.lock:
            req, self.requests = self.requests, {}
        return req
