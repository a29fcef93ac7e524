"""The consumer thread: the only one that polls and changes the sample source. Each
batch goes through the pipeline (skew, flow names, target filter, wall clock,
aggregator, on_samples observers); requests posted by other threads (events,
budget, pids) are applied between two polls."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ....errors import MeridianError
from ..model.records import SampleSource
from .state import Array, RuntimeState, SampleBatch

__all__ = ["Consumer"]

POLL_S = 0.05  # the consumer's longest wait in poll
BATCH_S = 0.5  # small batches at most this often: the source buffers (the ring, the mock)
SMALL_BATCH = 4096  # samples: a batch this big or bigger is followed by the next at once
NAMES_S = 0.5  # at most this often, the source's new flow names (a whole-map read)
CALIBRATE_S = 1.0
DROPPED_S = 0.25  # how often the consumer reads the kernel's drop counters


class Consumer(RuntimeState):
    """The runtime's consumer thread (`_consume`)."""

    # ---- the consumer thread --------------------------------------------------------------

    def _consume(self) -> None:
        src = self.source
        agg = self.aggregator
        assert src is not None and agg is not None
        contexts = getattr(src, "contexts", None)  # packet contexts for the skew adjuster
        next_cal = next_drop = 0
        while not self._stop.is_set():
            began = time.monotonic()
            self._apply_requests(src)
            now = self.clock()
            with self._ctl:
                turned = self.rotator.tick(now)
            if turned is not None:
                self._switch_events(src, turned)
            samples, lbr = src.poll(POLL_S)
            small = len(samples) < SMALL_BATCH
            self._take(src, samples, lbr, contexts() if contexts is not None else None)
            now = self.clock()
            if now >= next_cal:
                self.calibrator.calibrate(self.cpus)
                next_cal = now + int(CALIBRATE_S * 1e9)
            if now >= next_drop:
                self._dropped = dict(src.dropped())
                next_drop = now + int(DROPPED_S * 1e9)
            self._taken.set()
            # A batch costs per batch (polls of the maps, numpy calls in each stage): after
            # a small one the source keeps what comes for a while (big ones come at once);
            # a request, the flush (_catch_up) or stop() cuts the wait short.
            left = began + BATCH_S - time.monotonic()
            if small and left > 0:
                self._wakeup.wait(left)
                self._wakeup.clear()
        # drain: stop the kernel sampling first (else what it emits between this poll
        # and close() is lost, uncounted), then what the source still holds, then every
        # sample waiting for its packet
        halt = getattr(src, "stop_sampling", None)  # the kernel source's
        if halt is not None:
            halt()
        samples, lbr = src.poll(0)
        self._take(src, samples, lbr, contexts() if contexts is not None else None)
        rest = self.skew.flush()
        if len(rest):
            self._add(self.targets.apply(rest), lbr[:0])

    def _take(self, src: SampleSource, samples: Array, lbr: Array, ctx: Array | None) -> None:
        if not len(samples) and (ctx is None or not len(ctx)) and not self.skew.pending:
            return
        self._delivered += len(samples)
        ready = self.skew.push(samples, ctx, now_ns=self.clock())
        self._name_flows(src, ready["flow_id"])
        self._add(self.targets.apply(ready), lbr)

    def _name_flows(self, src: SampleSource, flow_ids: Array) -> None:
        """Ask the source for new flow names only when samples carry a flow it has not
        named yet, and at most every NAMES_S (the kernel's reads its whole LRU map)."""
        ids = np.unique(flow_ids)
        ids = ids[(ids != 0) & ~np.isin(ids, self._named, assume_unique=True)]
        if not len(ids):
            return
        now = time.monotonic()
        if now < self._names_at:
            return
        self._names_at = now + NAMES_S
        new = src.new_flows()
        if not new:
            return
        with self._names_lock:
            self.flow_names.add(new)
            named = np.union1d(self._named, np.array(list(new), dtype=np.uint64))
            if len(named) > 2 * self.flow_names.max_flows:  # those FlowNames forgot
                named = np.array(sorted(self.flow_names.ids()), dtype=np.uint64)
        self._named = named

    def _add(self, samples: Array, lbr: Array) -> None:
        if not len(samples):
            return
        assert self.aggregator is not None
        wall = self.calibrator.to_wall(samples["cpu"].astype(np.int64), samples["time_ns"])
        scale = self.rotator.scale
        self.aggregator.add(samples, scale, time_ns=wall)
        self._kept += len(samples)
        batch = SampleBatch(samples, wall, lbr, scale)
        for obs in list(self.observers):
            hook = getattr(obs, "on_samples", None)
            if hook is not None:
                self._call(obs, hook, batch)

    def _set_events(self, src: SampleSource, group: Sequence[Any]) -> None:
        """Open a group; remember what the source really samples (after a fallback)."""
        self._events_open = src.set_events(group)
        opened = getattr(src, "opened", None)
        self._event_names = [str(e.name) for e in (opened if opened is not None else group)]
        self._source_name = src.name

    def _switch_events(self, src: SampleSource, group: Sequence[Any]) -> None:
        """A group asked for while running (rotation, mode, the API): one the source
        cannot open (a raw code the PMU refuses) is said once, and the events running
        stay, rather than ending the agent. At start, the same error ends it."""
        try:
            self._set_events(src, group)
        except MeridianError as exc:
            names = ", ".join(str(getattr(e, "name", e)) for e in group)
            if names not in self._refused:
                self._refused.add(names)
                running = ", ".join(self._event_names) or "-"
                self.log(f"cannot sample {names}: {exc}; still sampling {running}")

    def _apply_requests(self, src: SampleSource) -> None:
        with self._ctl:
            req, self._requests = self._requests, {}
        if "budget" in req:
            src.set_budget(*req["budget"])
        if "pids" in req:
            src.set_targets(req["pids"])
        if "events" in req:
            self._switch_events(src, req["events"])
