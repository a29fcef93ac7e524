"""Completing the flow of samples that came before their packet was seen.

The kernel attributes a sample to the CPU's current packet or one of its recent
packets; a sample taken just before the packet's context was written (skid, or the
context hook firing late in the stack) has no flow yet (flow 0). Here such samples
wait, per CPU, until a packet context of that CPU within `window_ns` after them
arrives (they take its flow, ifindex, gso_segs and direction) or until the CPU's time
is past the window (they stay flow 0). Per CPU and vectorised: one searchsorted per
CPU and batch, no Python work per sample.

Contexts are `CONTEXT_DTYPE` rows (the kernel's `struct ms_flow_ctx` plus its cpu),
e.g. from the per-CPU history ring `ms_hist` read at each poll.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..model.records import (
    CONTEXT_DTYPE,
    FLOW_SKID_NS,
    FlowSource,
    concat,
    empty_samples,
    take,
)

__all__ = ["SkewAdjuster"]

Array = np.ndarray[Any, Any]


def _first_at_or_after(ccpu: Array, ctime: Array, cpu: Array, time: Array) -> Array:
    """For each (cpu, time), the index of the first context of that CPU at or after
    that time in contexts sorted by (cpu, time), where one is (else the index of a
    context of another CPU, or len). One search over (cpu, time) packed in 64 bits
    while the times span less than 2**40 ns; else one search per CPU."""
    base = min(int(ctime.min()), int(time.min()))
    span = max(int(ctime.max()), int(time.max())) - base
    top = max(int(ccpu.max()), int(cpu.max()))
    if span < 1 << 40 and top < 1 << 23:
        b, shift = np.uint64(base), np.uint64(40)
        keys = (ccpu.astype(np.uint64) << shift) | (ctime - b)
        out: Array = np.searchsorted(keys, (cpu.astype(np.uint64) << shift) | (time - b), "left")
        return out
    out = np.full(len(cpu), len(ccpu), dtype=np.int64)
    for c in np.unique(cpu):
        lo, hi = np.searchsorted(ccpu, c, "left"), np.searchsorted(ccpu, c, "right")
        idx = np.flatnonzero(cpu == c)
        out[idx] = lo + np.searchsorted(ctime[lo:hi], time[idx], "left")
    return out


class SkewAdjuster:
    """`push` returns the samples that are final; flow-0 samples wait at most until
    their CPU's time passes them by `window_ns` (or `max_pending` is exceeded)."""

    def __init__(self, window_ns: int = FLOW_SKID_NS, max_pending: int = 1 << 20) -> None:
        self.window_ns = int(window_ns)
        self.max_pending = max_pending
        self._pending: Array | None = None  # flow-0 samples waiting, sample dtype
        self._contexts = np.empty(0, dtype=CONTEXT_DTYPE)  # sorted by (cpu, time)
        self._watermark = np.zeros(0, dtype=np.uint64)  # per CPU: latest time seen
        self.completed = 0  # samples that got a flow here
        self.expired = 0  # samples released with flow 0

    def _advance(self, cpu: Array, t: Array) -> None:
        if not len(cpu):
            return
        n = int(cpu.max()) + 1
        if n > len(self._watermark):
            self._watermark = np.concatenate(
                [self._watermark, np.zeros(n - len(self._watermark), np.uint64)]
            )
        np.maximum.at(self._watermark, cpu.astype(np.int64), t.astype(np.uint64))

    def push_parts(
        self, samples: Array, contexts: Array | None, now_ns: int | None, size: int
    ) -> Iterator[tuple[Array, Array]]:
        """push() a poll `size` samples at a time, for stages after this one that copy
        what they are given (a poll of 760,000 samples at once made the agent's peak
        memory): yields each part's final samples and the poll's samples still to
        come. The contexts go in with the first part and are pruned after the last
        only, so the answers are push()'s for the whole poll (pruned between parts,
        the first part's newest contexts would drop those a later part's samples
        need)."""
        for at in range(0, max(len(samples), 1), size):
            part = samples[at : at + size]
            last = at + size >= len(samples)
            ready = self.push(part, contexts if at == 0 else None, now_ns, prune=last)
            yield ready, samples[at + size :]

    def push(
        self,
        samples: Array,
        contexts: Array | None = None,
        now_ns: int | None = None,
        prune: bool = True,
    ) -> Array:
        """Take a batch of samples and packet contexts; return the samples that are
        final now. `now_ns` (kernel clock) releases waiting samples of idle CPUs;
        `prune`: drop the contexts no sample can use any more (push_parts)."""
        if contexts is not None and len(contexts):
            ctx = contexts
            if ctx.dtype != CONTEXT_DTYPE:
                ctx = np.zeros(len(contexts), dtype=CONTEXT_DTYPE)
                for name in CONTEXT_DTYPE.names or ():
                    ctx[name] = contexts[name]
            self._advance(ctx["cpu"], ctx["time_ns"])
            if len(self._contexts):
                ctx = concat([self._contexts, ctx])
            self._contexts = take(ctx, np.lexsort((ctx["time_ns"], ctx["cpu"])))  # a copy
        self._advance(samples["cpu"], samples["time_ns"])
        pending = self._pending
        if pending is None or not len(pending):
            if not (samples["flow_id"] == 0).any():
                if prune:
                    self._prune()
                return samples  # the common case with traffic: nothing to do, no copy
            rows = samples
        else:
            rows = concat([pending, samples])  # the waiting first: arrival order kept
        out, self._pending = self._settle(rows, now_ns)
        if prune:
            self._prune()
        return out

    def _settle(self, rows: Array, now_ns: int | None) -> tuple[Array, Array | None]:
        """(the rows that are final, in their order, flows written into the matched;
        the flow-0 rows that still wait). One copy of each: a batch of 100,000 samples
        is ~10 MB, and copying it once per step was most of the consumer's time."""
        no_flow = rows["flow_id"] == 0
        wait_idx = np.flatnonzero(no_flow)
        waiting = take(rows, wait_idx)
        matched = np.zeros(len(waiting), dtype=bool)
        ctx = self._contexts
        src: Array | None = None
        if len(ctx):
            pos = _first_at_or_after(ctx["cpu"], ctx["time_ns"], waiting["cpu"], waiting["time_ns"])
            pos_ok = np.minimum(pos, len(ctx) - 1)
            matched = (pos < len(ctx)) & (ctx["cpu"][pos_ok] == waiting["cpu"])
            matched &= ctx["time_ns"][pos_ok] - waiting["time_ns"] <= np.uint64(self.window_ns)
            src = take(ctx, pos_ok[matched])
        wm = self._watermark[waiting["cpu"].astype(np.int64)]
        if now_ns is not None:
            wm = np.maximum(wm, np.uint64(now_ns))
        expired = ~matched & (waiting["time_ns"] + np.uint64(self.window_ns) < wm)
        keep = ~matched & ~expired
        if int(keep.sum()) > self.max_pending:  # bounded: the oldest go out as flow 0
            over = int(keep.sum()) - self.max_pending
            oldest = np.flatnonzero(keep)[np.argsort(waiting["time_ns"][keep], kind="stable")]
            expired[oldest[:over]] = True
            keep[oldest[:over]] = False
        self.completed += int(matched.sum())
        self.expired += int(expired.sum())
        final = np.ones(len(rows), dtype=bool)
        final[wait_idx[keep]] = False
        out = take(rows, final)  # a copy: the batch itself may be the ring's read-only bytes
        if src is not None and len(src):
            at = (np.cumsum(final) - 1)[wait_idx[matched]]  # their places in `out`
            for name in ("flow_id", "ifindex", "gso_segs", "direction"):
                out[name][at] = src[name]
            out["flow_source"][at] = FlowSource.HISTORY
        return out, (take(waiting, keep) if keep.any() else None)

    def _prune(self) -> None:
        """Drop contexts no waiting or future sample can use: older than the oldest
        waiting sample and older than their CPU's time minus twice the window."""
        ctx = self._contexts
        if not len(ctx):
            return
        horizon = self._watermark[ctx["cpu"].astype(np.int64)].astype(np.int64) - 2 * self.window_ns
        if self._pending is not None and len(self._pending):
            horizon = np.minimum(horizon, int(self._pending["time_ns"].min()))
        self._contexts = take(ctx, ctx["time_ns"].astype(np.int64) >= horizon)

    @property
    def pending(self) -> int:
        return 0 if self._pending is None else len(self._pending)

    def waiting(self) -> Array | None:
        """The samples held now (read only), None when none."""
        return self._pending if self._pending is not None and len(self._pending) else None

    def flush(self) -> Array:
        """Everything still waiting, as flow 0 (at stop)."""
        out = self._pending
        self._pending = None
        if out is None:
            return empty_samples(0)
        self.expired += len(out)
        return out
