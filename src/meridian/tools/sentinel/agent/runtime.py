"""The agent of `meridian sentinel`: who owns which thread, and the order of things.

Threads, each with one job:
- `sentinel-consumer` owns the sample source: it alone polls it and changes it
  (events, budget, pid filter: other threads post requests that it applies at once,
  between two polls). Small batches come at most every BATCH_S (the source buffers:
  what costs is the batch, not the sample), big ones back to back, and one whenever
  the flush loop asks, so that a window ends with its last samples. Each batch: skew
  adjustment (the source's packet contexts, when it has them), flow names (asked of
  the source only for flows not named yet), the target filter, kernel time to wall
  time (the per-CPU clock model, recalibrated every second), the aggregator, and
  `on_samples` observers.
- `sentinel-flush` every `aggregator.flush_interval`: takes the window's rollups,
  steps the mode controller, the safety governor and so the rotator's group and the
  budget, fills the metrics snapshot, and hands a `Window` to every observer (the
  live table, --json, and part 2's sinks and detectors).
- `sentinel-symbols` (with the Symbolizer): the slow reads the consumer skips (a
  binary's symbols and line table, kallsyms), at most a quarter of a core on
  average, so that the consumer keeps up with the ring (see resolver.py).
- `sentinel-anomaly` every `anomaly.poll_interval`: reads the anomaly monitor, whose
  triggers force diagnostic mode for the refractory period.
- the metrics server's own thread (prometheus_client), serving the latest snapshot.
- `sentinel-api` (api_server, with --api-port): the control plane's HTTP server,
  calling the control methods below; bound and started before the source opens.

`stop()` (Ctrl-C, SIGTERM, --duration) stops and joins them in that order: the
consumer drains the source and the skew queue, the source is closed (everything
detached), then the last window is flushed to every observer and the metrics.

Here: the threads' start and stop. consumer.py, flush.py and control.py hold the
threads' loops and the control methods, state.py the attributes they share.

Part 2 plugs in through `Observer` (sinks, detectors: `on_samples`, `on_window`,
`close`) and the control methods (`set_mode`, `set_budgets`, `set_groups`,
`set_targets`, `register_jit`, `register_data_object`, `status`), all thread-safe.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ....bpf.perf import online_cpus
from ..config.load import SentinelConfig, parse_groups
from ..model.flows import FlowNames
from ..model.records import SampleSource
from ..model.window import Totals, WindowInfo
from ..outputs.metrics import SentinelMetrics
from ..pipeline.aggregator import Aggregator
from ..pipeline.clock import ClockCalibrator
from ..pipeline.modes import ModeController, SafetyGovernor
from ..pipeline.resolver import RuntimeNames, SymbolResolver
from ..pipeline.rotator import PmuRotator
from ..pipeline.skew import SkewAdjuster
from ..pipeline.targets import TargetFilter
from .consumer import Consumer
from .control import RuntimeControl
from .flush import Flusher
from .state import Observer

if TYPE_CHECKING:
    from ..symbols.symbolizer import Symbolizer

__all__ = ["Runtime"]

JOIN_S = 5.0


class Runtime(Consumer, Flusher, RuntimeControl):
    """The agent: `start()`, then `wait(duration)` or your own loop, then `stop()`.

    `source` is a SampleSource, or a function that makes one: then `start()` binds
    the metrics port and checks the anomaly monitor's interfaces before loading
    anything into the kernel."""

    def __init__(
        self,
        cfg: SentinelConfig,
        source: SampleSource | Callable[[], SampleSource],
        *,
        symbolizer: Symbolizer | None = None,
        observers: Sequence[Observer] = (),
        log: Callable[[str], None] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        proc_root: str = "/proc",
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.cfg = cfg
        self._source_or_factory = source
        self.source: SampleSource | None = None
        self.log = log or (lambda line: print(f"meridian sentinel: {line}", file=sys.stderr))
        self.clock = clock
        self.proc_root = proc_root
        self.cpus = list(cpus) if cpus is not None else online_cpus()
        if symbolizer is None:
            from ..symbols.symbolizer import Symbolizer as _Symbolizer

            symbolizer = _Symbolizer(proc_root=proc_root)
        self.symbolizer = symbolizer
        self.observers: list[Observer] = list(observers)
        self.flow_names = FlowNames()
        self._names_lock = threading.Lock()
        self.names = RuntimeNames(self.flow_names, self._names_lock, symbolizer)
        self.metrics = SentinelMetrics(cfg.metrics.top_flows)
        self.totals = Totals()
        self.mode_controller = ModeController(cfg, clock, cpus=len(self.cpus))
        self.governor = SafetyGovernor(cfg)
        self._groups = {
            m: parse_groups(cfg.groups(m), f"perf.{m}_groups") for m in ("sentinel", "diagnostic")
        }
        mode = self.mode_controller.mode
        self.rotator: PmuRotator[Any] = PmuRotator(
            self._groups[mode.label],
            round(cfg.perf.rotation_window * 1e9),
            clock,
            self.governor.max_events_per_group,
        )
        self.targets = TargetFilter(cfg.targets.as_targets())
        self.skew = SkewAdjuster(cfg.aggregator.skew_window_ns)
        self.calibrator = ClockCalibrator()
        self.aggregator: Aggregator | None = None
        self.server: Any = None
        self.api: Any = None  # api_server.ApiServer
        self.anomaly: Any = None
        self._anomaly_gauges: Any = None
        # state shared by the threads, under _ctl
        self._ctl = threading.Lock()
        self._requests: dict[str, Any] = {}  # applied by the consumer: events, budget, pids
        self._wakeup = threading.Event()  # a request (or stop) for the consumer, now
        self._taken = threading.Event()  # the consumer took a batch (for the flush)
        self._mode = mode
        self._budget = (cfg.budget(mode.label), cfg.perf.hard_drop_ns)
        self._events_open = 0.0
        self._source_name = "-"
        self._event_names: list[str] = []
        self._refused: set[str] = set()  # event groups the source could not open (said once)
        self._delivered = 0  # samples polled, cumulative
        self._kept = 0  # after the target filter
        self._named = np.zeros(0, dtype=np.uint64)  # flow ids the source named, sorted
        self._names_at = 0.0  # when the consumer may ask the source for names again
        self._dropped: dict[str, int] = {}
        # samples kept under a label instead of a symbol or frames (cumulative)
        self.labelled = {"function_unresolved": 0, "stack_unresolved": 0, "stack_gone": 0}
        # flush bookkeeping (flush thread, then stop())
        self._last_flush = 0
        self._last_delivered = 0
        self._last_offered_drops = 0
        self._window_index = 0
        self._last_info: WindowInfo | None = None
        self.started_ns = 0
        self.stopped_ns = 0
        self._stop = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self._error: BaseException | None = None
        self._failed_observers: set[int] = set()
        self._abandoned: set[str] = set()  # threads stop() did not wait for any longer
        self._started = False
        self._stopped = False

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Serve /metrics, check the anomaly monitor, open the source, start the threads.
        On an error everything opened so far is closed again."""
        cfg = self.cfg
        self._started = True
        try:
            if cfg.metrics.enabled:
                from ..outputs.metrics import serve

                self.server = serve(cfg, self.metrics)
            if cfg.control_plane.enabled:
                from ..api.server import serve_api

                self.api = serve_api(cfg.control_plane, self, self.log)
                if cfg.run.verbose:
                    host = cfg.control_plane.listen_address
                    host = f"[{host}]" if ":" in host else host
                    self.log(f"control plane: http://{host}:{self.api.port}/api/v1")
            if cfg.anomaly.enabled:
                from ..pipeline.anomaly import AnomalyMonitor

                self.anomaly = AnomalyMonitor(cfg, self.proc_root, self.clock)
                self._anomaly_gauges = self.anomaly.gauges()
            src = self._source_or_factory
            self.source = cast("SampleSource", src) if hasattr(src, "poll") else _make(src)
            self._open_source()
        except BaseException:
            self._close_resources()
            raise
        self.started_ns = self._last_flush = self.clock()
        self._spawn("sentinel-consumer", self._consume)
        self._spawn("sentinel-flush", self._flush_loop)
        if self.anomaly is not None:
            self._spawn("sentinel-anomaly", self._anomaly_loop)
        if getattr(self.symbolizer, "warm", None) is not None:
            self._spawn("sentinel-symbols", self._symbols_loop)

    def _open_source(self) -> None:
        src = self.source
        assert src is not None
        symbols = getattr(src, "symbols", None)
        if symbols is not None:  # the mock's functions, as JIT regions
            for pid, start, end, name in symbols():
                self.symbolizer.register_jit(pid, start, end, name)
        src.set_budget(*self._budget)
        src.set_targets(self.targets.pids())
        self._set_events(src, self.rotator.current())
        self.aggregator = Aggregator(
            self.cfg.aggregator.time_window_ns, SymbolResolver(self.symbolizer, src.stack_ips)
        )
        self.calibrator.calibrate(self.cpus)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        def main() -> None:
            try:
                target()
            except BaseException as exc:  # handed to the main thread by wait()/stop()
                if name in self._abandoned:
                    return  # stop() went on without it (and said so): the source is closed
                if self._error is None:
                    self._error = exc
                self._stop.set()

        t = threading.Thread(target=main, name=name, daemon=True)
        self._threads[name] = t
        t.start()

    def wait(self, duration: float | None = None) -> None:
        """Block until `duration` seconds have passed (None: until stop() or a thread
        fails). Ctrl-C arrives here as KeyboardInterrupt."""
        end = None if duration is None else time.monotonic() + duration
        while not self._stop.is_set():
            left = 1.0 if end is None else min(1.0, end - time.monotonic())
            if left <= 0:
                break
            self._stop.wait(left)
        self.raise_error()

    def raise_error(self) -> None:
        """Re-raise, in the calling thread, what ended a runtime thread."""
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def stop(self) -> None:
        """Stop the threads, detach everything, flush the last window. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        self._wakeup.set()
        self.symbolizer.missed.set()  # the symbols thread sleeps on it
        wake = getattr(self.source, "wake", None)
        if wake is not None:
            with contextlib.suppress(Exception):
                wake()
        for name in ("sentinel-symbols", "sentinel-anomaly", "sentinel-flush", "sentinel-consumer"):
            t = self._threads.get(name)
            if t is not None:
                t.join(JOIN_S)
                if t.is_alive():
                    self._abandoned.add(name)
                    self.log(f"thread {name} did not stop within {JOIN_S:g}s")
        try:
            if self.source is not None and self.aggregator is not None:
                with contextlib.suppress(Exception):
                    self._dropped = dict(self.source.dropped())
        finally:
            self._close_source()
        self.stopped_ns = self.clock()
        try:
            if self.aggregator is not None:
                self._flush(final=True)
        finally:
            self._close_resources()

    def _close_source(self) -> None:
        src, self.source = self.source, None
        if src is not None:
            src.close()

    def _close_resources(self) -> None:
        """The source (if still open), the metrics and API servers, the observers."""
        try:
            self._close_source()
        finally:
            server, self.server = self.server, None
            if server is not None:
                server.close()
            api, self.api = self.api, None
            if api is not None:
                api.close()
            for obs in self.observers:
                close = getattr(obs, "close", None)
                if close is not None:
                    try:
                        close()
                    except Exception as exc:  # one sink must not keep the others open
                        self.log(f"closing {type(obs).__name__}: {exc}")


def _make(factory: Any) -> SampleSource:
    source: SampleSource = factory()
    return source
