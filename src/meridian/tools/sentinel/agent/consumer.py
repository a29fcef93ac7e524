"""The consumer thread: the only one that polls and changes the sample source. Each
batch goes through the pipeline (skew, flow names, target filter, wall clock, each
sample's scale, aggregator, on_samples observers); requests posted by other threads
(events, budget, pids) are applied between two polls."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any

import numpy as np

from ....errors import MeridianError
from ..model.records import SampleSource, concat
from ..pipeline.aggregator import Aggregator
from ..pipeline.branches import BranchJoin
from ..pipeline.clock import ClockCalibrator
from ..pipeline.resolver import RuntimeNames
from ..pipeline.rotator import rotation_shares
from ..pipeline.scales import EventScales, opened_keys
from ..pipeline.skew import SkewAdjuster
from ..pipeline.targets import TargetFilter
from .plan import Plan
from .state import Array, RuntimeState, SampleBatch

__all__ = ["Consumer"]

POLL_S = 0.05  # the consumer's longest wait in poll
BATCH_S = 0.5  # small batches at most this often: the source buffers (the ring, the mock)
SMALL_BATCH = 4096  # samples: a batch this big or bigger is followed by the next at once
# A poll's samples go through the stages this many at a time (SkewAdjuster.push_parts):
# a consumer behind empties the ring at once (sources/kernel.py), up to 760,000
# samples, and each stage copying all of them at once made the agent's peak memory
# (375-435 MB at 100,000 samples/s, 65 MB a copy).
CHUNK = 1 << 16
NAMES_S = 0.5  # at most this often, the source's new flow names (a whole-map read)
CALIBRATE_S = 1.0
DROPPED_S = 0.25  # how often the consumer reads the kernel's drop counters
SCALES_S = 0.25  # how often it reads the events' enabled and running times


class FlowNamer:
    """The source's flow names, asked for only when samples carry a flow it has not
    named yet, and at most every NAMES_S (the kernel's reads its whole LRU map); and
    when a window is about to end (`force`) while such a flow waits, so that the
    window's rows have their 5-tuples, and their services."""

    def __init__(self, names: RuntimeNames) -> None:
        self.names = names
        self._named = np.zeros(0, dtype=np.uint64)  # flow ids the source named, sorted
        self._next = 0.0  # when the source may be asked again
        self._waiting = False  # samples carried a flow not named since the last ask

    def update(self, src: SampleSource, flow_ids: Array, force: bool = False) -> None:
        ids = np.unique(flow_ids)
        ids = ids[(ids != 0) & ~np.isin(ids, self._named, assume_unique=True)]
        self._waiting |= bool(len(ids))
        if not self._waiting:
            return
        now = time.monotonic()
        if now < self._next and not force:
            return
        self._next = now + NAMES_S
        self._waiting = False
        new = src.new_flows()
        if not new:
            return
        flows = self.names.flows
        with self.names.lock:
            flows.add(new)
            named = np.union1d(self._named, np.array(list(new), dtype=np.uint64))
            if len(named) > 2 * flows.max_flows:  # those FlowNames forgot
                named = np.array(sorted(flows.ids()), dtype=np.uint64)
        self._named = named


@dataclass(eq=False)
class Consumer:
    """The `sentinel-consumer` thread's work (`run`): small batches come at most every
    BATCH_S (the source buffers: what costs is the batch, not the sample), big ones
    back to back, and one whenever the flush asks (`catch_up`)."""

    state: RuntimeState
    plan: Plan
    source: SampleSource
    aggregator: Aggregator
    _: KW_ONLY
    targets: TargetFilter
    calibrator: ClockCalibrator
    names: InitVar[RuntimeNames]
    cpus: Sequence[int]
    skew: SkewAdjuster = field(init=False)
    flows: FlowNamer = field(init=False)
    branches: BranchJoin = field(init=False, default_factory=BranchJoin)  # LBR records
    scales: EventScales = field(init=False, default_factory=EventScales)
    _contexts: Any = field(init=False)  # packet contexts for the skew
    # event groups the source could not open (said once)
    _refused: set[str] = field(init=False, default_factory=set)
    _taken: threading.Event = field(init=False, default_factory=threading.Event)  # a batch taken
    # catch_up calls asked, and the last of them an iteration of the loop began after
    _asked: int = field(init=False, default=0)
    _served: int = field(init=False, default=0)
    _polling: bool = field(init=False, default=False)
    # when the clock model, the drop counters and the scales are read next (state.clock)
    _next_cal: int = field(init=False, default=0)
    _next_drop: int = field(init=False, default=0)
    _next_scales: int = field(init=False, default=0)

    def __post_init__(self, names: RuntimeNames) -> None:
        self.cpus = list(self.cpus)
        self.skew = SkewAdjuster(self.state.cfg.aggregator.skew_window_ns)
        self.flows = FlowNamer(names)
        self._contexts = getattr(self.source, "contexts", None)

    def open(self) -> None:
        """Before the first poll: the plan's budget and first group, the targets, the
        clock model. A group the source cannot open here ends the start."""
        src = self.source
        src.set_budget(*self.plan.budget)
        src.set_targets(self.targets.pids())
        self._set_events(self.plan.rotator.current())
        self.calibrator.calibrate(self.cpus)

    def run(self) -> None:
        """Poll until the runtime stops, then drain the source."""
        self._polling = True
        try:
            self._poll_loop()
            self._drain()
        finally:
            self._polling = False

    def catch_up(self, timeout: float) -> None:
        """Have the thread take what the source holds now (it waits between small
        batches), and its drop counters, so that a window ends with the samples and
        drops of its last moment: an iteration that began after this call."""
        if not self._polling:
            return
        self._asked += 1
        mine, deadline = self._asked, time.monotonic() + timeout
        self.state.wakeup.set()
        while self._served < mine and self._polling:
            self._taken.clear()
            left = deadline - time.monotonic()
            if self._served >= mine or left <= 0:
                return
            self._taken.wait(left)

    def _poll_loop(self) -> None:
        state = self.state
        while not state.stopping.is_set():
            began = time.monotonic()
            small = self.step()
            # A batch costs per batch (polls of the maps, numpy calls in each stage): after
            # a small one the source keeps what comes for a while (big ones come at once);
            # a request, the flush (catch_up) or stop() cuts the wait short.
            left = began + BATCH_S - time.monotonic()
            if small and left > 0:
                state.wakeup.wait(left)
                state.wakeup.clear()

    def step(self, timeout: float = POLL_S) -> bool:
        """One turn of the thread's loop: the requests posted, the rotation, one poll
        and its batch, then the clock model and the drop counters when due (or when a
        window ends: catch_up). True when the batch was small. A test may run it
        alone, the source's and the state's clocks its own, between its flushes."""
        state, src = self.state, self.source
        asked = self._asked
        self._apply_requests()
        turned = self.plan.tick(state.clock())
        if turned is not None:
            self._switch_events(turned)
        if state.clock() >= self._next_scales:
            self._rescale()
            self._next_scales = state.clock() + int(SCALES_S * 1e9)
        samples, lbr = src.poll(timeout)
        small = len(samples) < SMALL_BATCH
        self._take(samples, lbr)
        if asked > self._served:  # a window ends: the names of its flows
            self.flows.update(src, samples["flow_id"][:0], force=True)
        now = state.clock()
        if now >= self._next_cal:
            self.calibrator.calibrate(self.cpus)
            self._next_cal = now + int(CALIBRATE_S * 1e9)
        if now >= self._next_drop or asked > self._served:
            state.dropped = dict(src.dropped())
            self._next_drop = now + int(DROPPED_S * 1e9)
        self._served = asked
        self._taken.set()
        return small

    def _drain(self) -> None:
        """Stop the kernel sampling first (else what it emits between this poll and
        close() is lost, uncounted), then take what the source still holds, then every
        sample waiting for its packet."""
        halt = getattr(self.source, "stop_sampling", None)  # the kernel source's
        if halt is not None:
            halt()
        limit = getattr(self.source, "batch_limit", None)  # the kernel source's
        while True:
            samples, lbr = self.source.poll(0)
            self._take(samples, lbr)
            if limit is None or len(samples) < limit:
                break
        rest = self.skew.flush()
        self.flows.update(self.source, rest["flow_id"], force=True)
        if len(rest):
            kept = self.targets.apply(rest)
            self._add(kept, self.branches.take(kept))

    def _take(self, samples: Array, lbr: Array) -> None:
        ctx = self._contexts() if self._contexts is not None else None
        if not len(samples) and (ctx is None or not len(ctx)) and not self.skew.pending:
            return
        self.state.delivered += len(samples)
        self.branches.add(lbr, samples)
        for ready, rest in self.skew.push_parts(samples, ctx, self.state.clock(), CHUNK):
            self.flows.update(self.source, ready["flow_id"])
            kept = self.targets.apply(ready)
            # each batch with the branch records of its own samples (some were held back,
            # and those of the samples still to come wait for them)
            waiting = self.skew.waiting()
            if self.branches.held and len(rest):
                waiting = rest if waiting is None else concat([waiting, rest])
            self._add(kept, self.branches.take(kept, waiting))

    def _add(self, samples: Array, lbr: Array) -> None:
        if not len(samples):
            return
        wall = self.calibrator.to_wall(samples["cpu"].astype(np.int64), samples["time_ns"])
        scale = self.scales.per_sample(samples)
        self.aggregator.add(samples, scale, time_ns=wall)
        self.state.kept += len(samples)
        self.state.observers.samples(SampleBatch(samples, wall, lbr, scale))

    def _set_events(self, group: Sequence[Any]) -> None:
        """Open a group; remember what the source really samples (after a fallback)."""
        src = self.source
        src.set_events(group)
        opened = getattr(src, "opened", None)
        self.state.events = [str(e.name) for e in (opened if opened is not None else group)]
        self.state.source_name = src.name
        self.state.frequency = getattr(src, "frequency", None)
        self._rescale()

    def _rescale(self) -> None:
        """Each event's scale (pipeline/scales.py): its share of the rotation's turns,
        as each group really opens (the source's `resolve`: cpu-clock for an event the
        host lacks), times its multiplexing (the source's `event_times`). Read after
        every change of events and every SCALES_S (the safety level trims groups
        that are not open yet)."""
        with self.state.lock:
            schedule = self.plan.rotator.schedule()
        resolve = getattr(self.source, "resolve", None)
        names: dict[int, str] = {}
        shares = rotation_shares([opened_keys(g, resolve, names) for g in schedule])
        self.scales.set_rotation(shares, names)
        times = getattr(self.source, "event_times", None)
        if times is not None:
            self.scales.set_times(times())
        self.state.scales = self.scales.by_name()

    def _switch_events(self, group: Sequence[Any]) -> None:
        """A group asked for while running (rotation, mode, the API): one the source
        cannot open (a raw code the PMU refuses) is said once, and the events running
        stay, rather than ending the agent. At start, the same error ends it."""
        try:
            self._set_events(group)
        except MeridianError as exc:
            names = ", ".join(str(getattr(e, "name", e)) for e in group)
            if names not in self._refused:
                self._refused.add(names)
                running = ", ".join(self.state.events) or "-"
                self.state.log(f"cannot sample {names}: {exc}; still sampling {running}")

    def _apply_requests(self) -> None:
        req = self.state.take_requests()
        if "budget" in req:
            self.source.set_budget(*req["budget"])
        if "pids" in req:
            self.source.set_targets(req["pids"])
        if "events" in req:
            self._switch_events(req["events"])
