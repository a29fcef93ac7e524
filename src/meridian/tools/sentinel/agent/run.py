"""`meridian sentinel` itself: the source it opens (the mock or the kernel's, with a
ring sized for the rate), -v's description of it, the run with its views until
--duration, Ctrl-C or SIGTERM, and the summary. The agent it runs is runtime.Runtime,
with its services around it (services.py: /metrics, the control plane, the anomaly
monitor); the names part 2 imports are here too."""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from ....bpf.perf import online_cpus
from ....errors import MeridianError
from ....signals import signals_held
from ..config.load import SentinelConfig, parse_groups
from ..model.records import SampleSource
from ..model.rollup import UNRESOLVED
from ..model.window import Window
from ..outputs.live import JsonView, LiveView, render_summary, summary_json
from ..pipeline.modes import shed_rank
from ..pipeline.resolver import GONE_STACK, RuntimeNames, SymbolResolver
from ..pipeline.rotator import keep
from .findings import Findings, detector_context
from .runtime import Runtime
from .services import Services
from .state import Observer, SampleBatch

__all__ = [
    "GONE_STACK",
    "UNRESOLVED",
    "Observer",
    "Runtime",
    "RuntimeNames",
    "SampleBatch",
    "SymbolResolver",
    "Window",
    "run_cli",
]


# ---- meridian sentinel -------------------------------------------------------------------


def make_source(cfg: SentinelConfig, warn: Callable[[str], None]) -> SampleSource:
    """The mock source (--perf-mock) or the kernel's, loaded and attached."""
    if cfg.mock.enabled:
        from ..sources.mock import MockSource

        return MockSource(
            period_ms=cfg.mock.period_ms,
            rng_seed=cfg.mock.rng_seed,
            rate=cfg.mock.rate,
            lbr=cfg.perf.lbr != "off",
        )
    from ..sources.kernel import KernelSource
    from ..sources.lbr import MODES

    mode = cfg.mode.initial
    first = parse_groups(cfg.groups(mode), f"perf.{mode}_groups")[0]
    events = keep(first, cfg.perf.max_events_per_group, shed_rank)
    src = KernelSource(
        events,
        ring_bytes=ring_bytes(cfg.perf.frequency * len(events) * len(online_cpus())),
        frequency=cfg.perf.frequency,
        samples_per_sec=cfg.budget(mode),
        hard_drop_ns=cfg.perf.hard_drop_ns,
        xdp=cfg.perf.xdp_interfaces,
        pids=cfg.targets.pids,
        lbr=MODES[cfg.perf.lbr],
        warn=warn,
    )
    return src.open()


RING_S = 3.0  # the sample ring holds this long of samples at the offered rate
# A sample in the ring: struct ms_sample (80 bytes) and the ring's 8-byte header. At
# 100,000 samples/s that is a 32 MiB ring (3.8 s). It was rounded up to 128 bytes (a
# 64 MiB ring) while the consumer took 55-65 % of a core and, starved on a host whose
# CPUs were all busy, overflowed a 32 MiB ring once in three runs; at 25-35 % it did
# not in any (benchmarks/RESULTS.md). The reader maps the ring once (bpf/ringbuf.py):
# it counts once in the agent's RSS.
RECORD_BYTES = 88
RING_MIN, RING_MAX = 1 << 22, 1 << 26


def ring_bytes(offered_per_sec: int) -> int:
    """The sample ring's size for a rate (a power of two, 4-64 MiB): three seconds of
    samples, so that a slow batch (a binary's symbols read for the first time, or a
    consumer given a third of a core by a busy host) does not overflow it. At 100,000
    samples/s with both CPUs of a 2-core host busy, one second lost ~0.3-3 %."""
    want = max(RING_MIN, min(RING_MAX, int(offered_per_sec * RECORD_BYTES * RING_S)))
    return 1 << (want - 1).bit_length()


def describe(src: SampleSource, lbr: str = "off") -> list[str]:
    """-v: the strategy, the event source and the branch records (perf.lbr)."""
    strategy = getattr(src, "strategy", None)
    hooks = getattr(src, "hooks", None)
    if strategy is None:
        lines = [f"strategy: {src.name} (synthetic samples, nothing loaded in the kernel)"]
    else:
        lines = [f"strategy: {strategy.name} ({', '.join(hooks or [])})"]
    opened = getattr(src, "opened", None)
    name = src.name
    if opened is not None and "fallback" in name:
        name = name.replace("(software fallback)", "(software: no PMU here)")
    lines.append(f"events: {name}")
    if lbr != "off":
        how = "synthetic" if strategy is None else lbr
        lines.append(f"branch records: {how} (ms_raw_samples.lbr_from/lbr_to, --raw-samples)")
    return lines


def run_cli(cfg: SentinelConfig, out: TextIO, err: TextIO) -> int:
    """`meridian sentinel` after the flags: the runtime with its services and views
    until --duration, Ctrl-C or SIGTERM; then the summary."""

    def log(line: str) -> None:
        print(f"meridian sentinel: {line}", file=err)
        err.flush()

    rt = Runtime(cfg, lambda: make_source(cfg, log), log=log)
    live = _add_observers(rt, cfg, out, err)
    services = Services(cfg, rt, log)
    failed: BaseException | None = None
    try:
        with signals_held():  # a KeyboardInterrupt inside a libbpf callback is lost
            services.start()
        if cfg.run.verbose and rt.source is not None:
            for line in describe(rt.source, cfg.perf.lbr):
                log(line)
        if services.metrics_server is not None and cfg.run.verbose:
            port = services.metrics_server.port
            log(f"metrics: http://{cfg.metrics.listen_address}:{port}/metrics")
        if live is not None:
            live.start()
        elif not cfg.run.json:
            print(f"meridian sentinel: sampling ({rt.info.source})... Ctrl-C to end.", file=out)
            out.flush()
        rt.wait(cfg.run.duration)
    except KeyboardInterrupt:
        pass
    except MeridianError as exc:
        failed = exc
    finally:
        with signals_held(ignore=True):
            services.stop()
            if failed is None and rt.started_ns:
                _summary(rt, cfg, out)
    if failed is not None:
        raise failed
    rt.raise_error()
    return 0


def _add_observers(rt: Runtime, cfg: SentinelConfig, out: TextIO, err: TextIO) -> LiveView | None:
    """The detectors, the store, and the view (--json, or the live table on a
    terminal); returns the live table, which starts with the run."""
    findings = Findings(detector_context(cfg, rt.symbolizer), rt.names.flow)
    rt.add_observer(findings)
    rt.metrics.add_source(findings.families)
    if cfg.clickhouse.enabled:
        _add_store(rt, cfg, err)
    elif cfg.clickhouse.url or cfg.clickhouse.data_dir:
        where = "url" if cfg.clickhouse.url else "data_dir"
        rt.state.log(
            f"clickhouse.{where} is set but clickhouse.enabled is false: nothing is stored "
            "(set clickhouse.enabled: true)"
        )
    if cfg.run.json:
        rt.add_observer(JsonView(out, rt.names, cfg.metrics.top_flows, cfg.run.group_by))
        return None
    if out.isatty():
        live = LiveView(out, rt.names, by=cfg.run.group_by)
        rt.add_observer(live)
        return live
    return None


def _add_store(rt: Runtime, cfg: SentinelConfig, err: TextIO) -> None:
    """The store as an observer, its counters in /metrics. The store is opened by the
    sink's own thread: one that is down or broken is said once a minute, and the agent
    samples on meanwhile, spooling up to the limit."""
    from ..storage import Reporter, open_sink
    from ..storage.writer import StoreWriter

    sink = open_sink(cfg.clickhouse, reporter=Reporter(err))
    writer = StoreWriter(sink, rt.symbolizer, rt.names.flow, cfg.clickhouse.raw_samples)
    rt.add_observer(writer)
    rt.metrics.add_source(writer.families)


def _summary(rt: Runtime, cfg: SentinelConfig, out: TextIO) -> None:
    """The run's top services or flows (--by), and what became of the rows handed to
    storage (the sink is closed by now: what it holds is what this run leaves unsent)."""
    sink = rt.state.observers.sink()
    stored = sink.stats() if sink is not None else None
    services = rt.services if cfg.run.group_by == "service" else None
    if cfg.run.json:
        from ....output import dumps

        obj = summary_json(rt.totals, rt.seconds, rt.info, rt.names, services=services)
        if stored is not None:
            obj["storage"] = stored.summary()
        out.write(dumps(obj) + "\n")
    else:
        render_summary(rt.totals, rt.seconds, rt.info, rt.names, out, services=services)
        for line in stored.summary_lines() if stored is not None else []:
            print(line, file=out)
    out.flush()
