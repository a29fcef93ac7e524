"""The agent of `meridian sentinel`: who owns which thread, and the order of things.

Threads, each with one job:
- `sentinel-consumer` (consumer.py) owns the sample source: it alone polls it and
  changes it (events, budget, pid filter: other threads post requests that it applies
  at once, between two polls). Each batch: skew adjustment (the source's packet
  contexts, when it has them), flow names (asked of the source only for flows not
  named yet), the target filter, kernel time to wall time (the per-CPU clock model,
  recalibrated every second), the aggregator, and `on_samples` observers.
- `sentinel-flush` (flush.py) every `aggregator.flush_interval`: takes the window's
  rollups, has the plan (plan.py) decide the mode and the safety level and so the
  rotator's group and the budget, fills the metrics snapshot, and hands a `Window` to
  every observer (the live table, --json, the sinks and detectors).
- `sentinel-symbols` (with the Symbolizer): the slow reads the consumer skips (a
  binary's symbols and line table, a perf map), at most a quarter of a core on
  average, so that the consumer keeps up with the ring; then it resolves the
  provisional ids the consumer keyed those addresses by (see resolver.py and
  symbols/provisional.py). kallsyms is read before the source opens (about 50 ms):
  kernel frames never wait, and the idle functions are known from the first sample.

Around the runtime, started and stopped by services.py: /metrics, the control plane
(calling `control`, control.py) and the anomaly monitor.

`stop()` (Ctrl-C, SIGTERM, --duration) stops and joins the threads in that order: the
consumer drains the source and the skew queue, the source is closed (everything
detached); the reads the symbols thread had not done yet are done then, at full speed
(for at most SETTLE_S), so that the last window, storage and the summary name every
address whose symbols exist; then the last window is flushed to every observer and
the metrics, and the observers are closed.

Sinks and detectors plug in as `Observer`s (`on_samples`, `on_window`, `close`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ....bpf.perf import online_cpus
from ..config.load import SentinelConfig
from ..model.flows import FlowNames
from ..model.records import SampleSource
from ..model.services import ServiceTotals
from ..model.window import Totals, WindowInfo
from ..outputs.metrics import SentinelMetrics
from ..pipeline.aggregator import Aggregator
from ..pipeline.clock import ClockCalibrator
from ..pipeline.resolver import RuntimeNames, SymbolResolver
from ..pipeline.targets import TargetFilter
from .consumer import Consumer
from .control import RuntimeControl
from .flush import Flusher
from .plan import Plan
from .state import Observer, RuntimeState

if TYPE_CHECKING:
    from ..symbols.symbolizer import Symbolizer

__all__ = ["JOIN_S", "Runtime"]

JOIN_S = 5.0  # stop() waits this long for the symbols and the flush thread
# ... and this long for the consumer: its drain puts the ring's last samples in the
# last window. A drain abandoned after JOIN_S leaves the summary short of samples the
# windows counted as delivered (the likely cause of one such summary in a loaded TCG
# guest); it takes well under a second on a host.
DRAIN_JOIN_S = 30.0
SYMBOLS_SHARE = 0.25  # of one core, at most, on average: the symbols thread's slow reads
SYMBOLS_S = 0.1  # its period while addresses wait for a slow read
SWEEP_S = 1.0  # its longest sleep, and how often it looks for exited processes
SETTLE_S = 10.0  # at stop, the symbols' pending reads get this long at most
SETTLE_STEP_S = 0.5


class Runtime:
    """The agent: `start()`, then `wait(duration)` or your own loop, then `stop()`.

    `source` is a SampleSource, or a function that makes one at `start()` (after the
    services have bound their ports: nothing is loaded into the kernel before)."""

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
        self.cpus = list(cpus) if cpus is not None else online_cpus()
        if symbolizer is None:
            from ..symbols.symbolizer import Symbolizer as _Symbolizer

            symbolizer = _Symbolizer(proc_root=proc_root)
        self.symbolizer = symbolizer
        self.state = RuntimeState(cfg, log or _stderr, clock, observers)
        self.names = RuntimeNames(FlowNames(), threading.Lock(), symbolizer, proc_root)
        self.metrics = SentinelMetrics(cfg.metrics.top_flows, cfg.metrics.top_services)
        self.totals = Totals()
        self.services = ServiceTotals(self.names.service)
        self.plan = Plan(self.state, len(self.cpus))
        self.targets = TargetFilter(cfg.targets.as_targets())
        self.calibrator = ClockCalibrator()
        self.control = RuntimeControl(self.state, self.plan, self.targets, symbolizer)
        self._flusher: Flusher | None = None  # once the source is open
        self.started_ns = 0
        self.stopped_ns = 0
        self._threads: dict[str, threading.Thread] = {}
        self._error: BaseException | None = None
        self._abandoned: set[str] = set()  # threads stop() did not wait for any longer
        self._stopped = False

    def add_observer(self, obs: Observer) -> None:
        """Plug in a sink or detector (before or while running)."""
        self.state.observers.add(obs)

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Open the source and start the threads; on an error the source is closed again."""
        consumer, flusher = self.open()
        self._spawn("sentinel-consumer", consumer.run)
        self._spawn("sentinel-flush", flusher.run)
        if getattr(self.symbolizer, "warm", None) is not None:
            self._spawn("sentinel-symbols", self._warm_symbols)

    def open(self) -> tuple[Consumer, Flusher]:
        """What start() does before its threads: the source opened, its consumer, and
        the flusher. start() runs them on their threads; a test may step them itself
        (`consumer.step()`, then `flusher.flush(now)`) on a clock of its own, and
        stop() as after start()."""
        state = self.state
        state.started = True
        try:
            src = self._source_or_factory
            self.source = cast("SampleSource", src) if hasattr(src, "poll") else _make(src)
            consumer = self._open(self.source)
            self.started_ns = state.clock()  # the first window: from the source's start
            load_kernel = getattr(self.symbolizer, "load_kernel", None)
            if load_kernel is not None:  # before the consumer runs, after the source's
                load_kernel()  # BPF programs are loaded: samples in them are named
        except BaseException:
            self._close_source()
            raise
        self._flusher = Flusher(
            state,
            self.plan,
            consumer.aggregator,
            calibrator=self.calibrator,
            names=self.names,
            metrics=self.metrics,
            totals=self.totals,
            services=self.services,
            catch_up=consumer.catch_up,
            started_ns=self.started_ns,
        )
        return consumer, self._flusher

    def _open(self, src: SampleSource) -> Consumer:
        """The consumer of `src`, which has opened its first group."""
        symbols = getattr(src, "symbols", None)
        if symbols is not None:  # the mock's functions, as JIT regions
            for pid, start, end, name in symbols():
                self.symbolizer.register_jit(pid, start, end, name)
        aggregator = Aggregator(
            self.cfg.aggregator.time_window_ns, SymbolResolver(self.symbolizer, src.stack_ips)
        )
        consumer = Consumer(
            self.state,
            self.plan,
            src,
            aggregator,
            targets=self.targets,
            calibrator=self.calibrator,
            names=self.names,
            cpus=self.cpus,
        )
        consumer.open()
        return consumer

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        def main() -> None:
            try:
                target()
            except BaseException as exc:  # handed to the main thread by wait()/stop()
                if name not in self._abandoned:  # else stop() went on without it
                    self.fail(exc)

        t = threading.Thread(target=main, name=name, daemon=True)
        self._threads[name] = t
        t.start()

    def fail(self, exc: BaseException) -> None:
        """End the run with `exc`, from a thread of the runtime or of its services:
        `wait()` returns and raises it in the calling thread."""
        if self._error is None:
            self._error = exc
        self.state.stopping.set()

    def wait(self, duration: float | None = None) -> None:
        """Block until `duration` seconds have passed (None: until stop() or a thread
        fails). Ctrl-C arrives here as KeyboardInterrupt."""
        stopping = self.state.stopping
        end = None if duration is None else time.monotonic() + duration
        while not stopping.is_set():
            left = 1.0 if end is None else min(1.0, end - time.monotonic())
            if left <= 0:
                break
            stopping.wait(left)
        self.raise_error()

    def raise_error(self) -> None:
        """Re-raise, in the calling thread, what ended a runtime thread."""
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def stop(self) -> None:
        """Stop the threads, detach everything, flush the last window, close the
        observers. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        state = self.state
        state.stopping.set()
        state.wakeup.set()
        self.symbolizer.missed.set()  # the symbols thread sleeps on it
        wake = getattr(self.source, "wake", None)
        if wake is not None:
            with contextlib.suppress(Exception):
                wake()
        self._join()
        try:
            if self.source is not None and self._flusher is not None:
                with contextlib.suppress(Exception):
                    state.dropped = dict(self.source.dropped())
        finally:
            self._close_source()
        self.stopped_ns = state.clock()
        self._finish_symbols()
        try:
            if self._flusher is not None:
                self._flusher.flush(self.stopped_ns, final=True)
        finally:
            state.observers.close()

    def _join(self) -> None:
        for name, wait in (
            ("sentinel-symbols", JOIN_S),
            ("sentinel-flush", JOIN_S),
            ("sentinel-consumer", DRAIN_JOIN_S),
        ):
            t = self._threads.get(name)
            if t is not None:
                t.join(wait)
                if t.is_alive():
                    self._abandoned.add(name)
                    self.state.log(f"thread {name} did not stop within {wait:g}s")

    def _close_source(self) -> None:
        src, self.source = self.source, None
        if src is not None:
            src.close()

    # ---- the symbols thread ------------------------------------------------------------

    def _warm_symbols(self) -> None:
        """The slow reads the consumer skipped (symbol and line tables, kallsyms), at
        most SYMBOLS_SHARE of a core on average: one read may take a second, and
        the wait after it is as long as it must be. Processes gone past their grace
        period (or replaced by an exec) leave the caches here too, once a SWEEP_S.
        With nothing waiting it sleeps until an address misses (symbolizer.missed):
        an idle agent wakes once a second, not ten times."""
        sym, stopping = self.symbolizer, self.state.stopping
        swept = time.monotonic()
        while not stopping.is_set():
            sym.missed.wait(SWEEP_S)
            if stopping.is_set():
                break
            began = time.perf_counter()
            if time.monotonic() - swept >= SWEEP_S:
                sym.sweep()
                swept = time.monotonic()
            sym.warm(SYMBOLS_S * SYMBOLS_SHARE)
            spent = time.perf_counter() - began
            stopping.wait(max(SYMBOLS_S * (1 - SYMBOLS_SHARE), spent * (1 / SYMBOLS_SHARE - 1)))

    def _finish_symbols(self) -> None:
        """At stop: the reads the symbols thread had not done yet, and the provisional
        ids they held back, at full speed (the source is closed), until none waits,
        nothing moves for three rounds, or SETTLE_S have passed."""
        warm = getattr(self.symbolizer, "warm", None)
        if warm is None or "sentinel-symbols" in self._abandoned:
            return
        deadline = time.monotonic() + SETTLE_S
        last, still, waiting = -1, 0, 0
        while (left := deadline - time.monotonic()) > 0:
            waiting = warm(min(left, SETTLE_STEP_S))
            if not waiting:
                return
            still = still + 1 if waiting >= last >= 0 else 0
            if still >= 3:
                break
            last = waiting
        self.state.log(f"symbols: {waiting} reads or names not done at stop: labelled unresolved")

    # ---- for the command line ----------------------------------------------------------

    @property
    def info(self) -> WindowInfo:
        """The state of the last window (or of the start)."""
        st = self.state
        if st.last_info is not None:
            return st.last_info
        return WindowInfo(
            1.0,
            self.plan.mode.label,
            st.source_name,
            scales=dict(st.scales),
            dropped=dict(st.dropped),
        )

    @property
    def seconds(self) -> float:
        end = self.stopped_ns or self.state.clock()
        return max(0.0, (end - self.started_ns) / 1e9) if self.started_ns else 0.0


def _stderr(line: str) -> None:
    print(f"meridian sentinel: {line}", file=sys.stderr)


def _make(factory: Any) -> SampleSource:
    source: SampleSource = factory()
    return source
