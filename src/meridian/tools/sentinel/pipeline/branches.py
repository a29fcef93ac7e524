"""Branch records (LBR) kept with their sample through the consumer's stages.

A poll returns samples and the branch records of some of them (struct ms_lbr, one
per sample that has branches), joined by (cpu, time_ns). The skew adjuster holds a
flow-0 sample back until its packet comes, a poll or more later, and the target
filter drops some: so each batch handed on carries the records of its own samples,
and the records of samples still held wait here for them. A record may also come a
poll before its sample: the kernel program writes it while its sample is reserved in
the other ring, not yet committed, and the sample ring is read first. So a record
newer than every sample its CPU has delivered waits too; an older one whose sample
is neither handed on nor held (filtered) is dropped. Vectorised: a lexsort per batch
with records, nothing when there are none (no --lbr).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model.records import concat, empty_lbr, take

__all__ = ["BranchJoin", "member"]

Array = np.ndarray[Any, Any]


def member(records: Array, samples: Array) -> Array:
    """For each record, whether a sample has its (cpu, time_ns); the records' keys
    are distinct (a CPU takes one sample a nanosecond at most)."""
    n = len(records)
    if not n or not len(samples):
        return np.zeros(n, dtype=bool)
    cpu = np.concatenate([records["cpu"], samples["cpu"]]).astype(np.uint64)
    t = np.concatenate([records["time_ns"], samples["time_ns"]]).astype(np.uint64)
    is_sample = np.arange(len(cpu)) >= n
    order = np.lexsort((is_sample, t, cpu))  # by key; a record before a sample
    cpu, t, is_sample = cpu[order], t[order], is_sample[order]
    hit = (cpu[1:] == cpu[:-1]) & (t[1:] == t[:-1]) & ~is_sample[:-1] & is_sample[1:]
    out = np.zeros(n, dtype=bool)
    out[order[:-1][hit]] = True
    return out


class BranchJoin:
    """`add` each poll, then `take` each batch handed on; `held` wait for theirs."""

    def __init__(self) -> None:
        self._held: Array | None = None
        self._newest = np.zeros(0, dtype=np.uint64)  # per CPU: its newest sample's time
        self._none: Array | None = None  # no records, of the source's record type

    @property
    def held(self) -> int:
        return 0 if self._held is None else len(self._held)

    def add(self, lbr: Array, polled: Array) -> None:
        """A poll's records, and its samples (all of them, before any stage): their
        times only matter while records wait (none without --lbr: no cost then)."""
        self._none = lbr[:0]
        if len(polled) and (len(lbr) or self._held is not None):
            cpu = polled["cpu"].astype(np.int64)
            top = int(cpu.max()) + 1
            if top > len(self._newest):
                grow = np.zeros(top - len(self._newest), dtype=np.uint64)
                self._newest = np.concatenate([self._newest, grow])
            np.maximum.at(self._newest, cpu, polled["time_ns"].astype(np.uint64))
        if len(lbr):
            self._held = lbr if self._held is None else concat([self._held, lbr])

    def take(self, samples: Array, waiting: Array | None = None) -> Array:
        """The records of `samples`, the batch handed on; those of `waiting` (the
        samples the skew adjuster still holds) and those newer than their CPU's
        newest sample stay for a later batch, the rest go."""
        pool = self._held
        if pool is None:
            return self._none if self._none is not None else empty_lbr(0)
        mine = member(pool, samples)
        cpu = pool["cpu"].astype(np.int64)
        seen = np.zeros(len(pool), dtype=np.uint64)
        known = cpu < len(self._newest)
        seen[known] = self._newest[cpu[known]]
        later = pool["time_ns"].astype(np.uint64) > seen
        keep = ~mine & (later | member(pool, waiting if waiting is not None else pool[:0]))
        self._held = take(pool, keep) if keep.any() else None
        return take(pool, mine)
