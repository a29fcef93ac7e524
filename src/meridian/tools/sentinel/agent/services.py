"""What runs around the runtime: /metrics, the control plane and the anomaly monitor,
started by `meridian sentinel` (run.py) before the runtime and stopped with it.

They bind their ports and check their interfaces before the runtime opens the source,
so that a port in use or a missing interface is a one-line error before anything is
loaded into the kernel. At stop they go first (the API's announcement, the anomaly
monitor, the API, /metrics): nothing changes or queries the runtime while it stops.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.load import SentinelConfig
from .control import RuntimeControl
from .runtime import JOIN_S, Runtime

if TYPE_CHECKING:
    from ....export.prometheus import PrometheusServer
    from ..api.server import ApiServer
    from ..pipeline.anomaly import AnomalyMonitor

__all__ = ["AnomalyWatch", "Services"]


@dataclass(eq=False)
class AnomalyWatch:
    """The `sentinel-anomaly` thread: every `anomaly.poll_interval`, the monitor's
    readings to the runtime's control (its triggers force diagnostic mode). An error
    ends the run through `fail`."""

    monitor: AnomalyMonitor
    control: RuntimeControl
    fail: Callable[[BaseException], None]
    log: Callable[[str], None]
    _stop: threading.Event = field(init=False, default_factory=threading.Event)
    _thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sentinel-anomaly", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(JOIN_S)
        if self._thread.is_alive():
            self.log(f"thread {self._thread.name} did not stop within {JOIN_S:g}s")

    def _run(self) -> None:
        mon = self.monitor
        try:
            while not self._stop.wait(mon.interval_s):
                signals = mon.poll()
                self.control.anomaly(mon.gauges(), signals)
        except BaseException as exc:
            self.fail(exc)


@dataclass(eq=False)
class Services:
    """`start()` serves and starts everything configured, then the runtime; `stop()`
    stops it all (idempotent). `metrics_server` and `api`, once started, tell their
    ports."""

    cfg: SentinelConfig
    runtime: Runtime
    log: Callable[[str], None]
    _: KW_ONLY
    proc_root: str = "/proc"
    clock: Callable[[], int] = time.monotonic_ns
    metrics_server: PrometheusServer | None = field(init=False, default=None)
    api: ApiServer | None = field(init=False, default=None)
    _running: contextlib.ExitStack = field(init=False, default_factory=contextlib.ExitStack)

    def start(self) -> None:
        """On an error, what was started is stopped again (the runtime too)."""
        cfg, rt = self.cfg, self.runtime
        with contextlib.ExitStack() as stack:
            stack.callback(rt.stop)  # the observers are closed even if nothing started
            self._serve(stack)
            monitor = None
            if cfg.anomaly.enabled:
                from ..pipeline.anomaly import AnomalyMonitor

                monitor = AnomalyMonitor(cfg, self.proc_root, self.clock)
            rt.start()
            if monitor is not None:
                watch = AnomalyWatch(monitor, rt.control, rt.fail, self.log)
                stack.callback(watch.close)
                watch.start()
            announced = self._announce()
            if announced is not None:
                stack.callback(announced.unlink, missing_ok=True)
            self._running = stack.pop_all()

    def stop(self) -> None:
        running, self._running = self._running, contextlib.ExitStack()
        running.close()

    def _serve(self, stack: contextlib.ExitStack) -> None:
        """/metrics and the control plane, as configured, each closed by `stack`."""
        cfg = self.cfg
        if cfg.metrics.enabled:
            from ..outputs.metrics import serve

            self.metrics_server = serve(cfg, self.runtime.metrics)
            stack.callback(self.metrics_server.close)
        if cfg.control_plane.enabled:
            from ..api.server import serve_api

            self.api = serve_api(cfg.control_plane, self.runtime.control, self.log)
            stack.callback(self.api.close)
            if cfg.run.verbose:
                host = cfg.control_plane.listen_address
                host = f"[{host}]" if ":" in host else host
                self.log(f"control plane: http://{host}:{self.api.port}/api/v1")

    def _announce(self) -> Path | None:
        """With an API and an embedded store: the API's URL in the store, so that
        queries (which cannot open the store while this agent holds it) ask this
        agent. Returns the file to remove at stop."""
        store = getattr(self.runtime.control.store_backend(), "path", None)
        if self.api is None or store is None:
            return None
        from ..storage.announce import announce

        return announce(Path(store), self.cfg.control_plane.listen_address, self.api.port)
