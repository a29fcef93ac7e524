"""Each event's sample scale: how many samples one sample of that event stands for, the
inverse of the share of the time its event was really being sampled. Two factors:

- the rotation (rotator.rotation_shares): groups over the groups whose turn samples
  the event, as opened: the kernel opens cpu-clock for an event the CPU lacks, so
  two groups that both fall back sample cpu-clock all the time (1, not 2);
- the kernel's multiplexing within a group (more events than counters): the perf
  event's time_enabled / time_running, summed over the CPUs (the source's
  `event_times()`: the kernel source reads its perf events; the mock's run all the
  time they are enabled unless told otherwise).

A sample's event is its (event, raw_code) pair, records.event_key: raw codes share
one `event` id. `norm_cost = scale of the sample's event / gso_segs`, sample by sample,
in the rollups and the raw rows alike. The consumer thread owns an `EventScales`
(it owns the source too); the others read the `by_name()` snapshot it publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from ..model.records import event_key

__all__ = ["EventScales", "Spec", "multiplexing", "opened_keys", "sample_keys", "spec_key"]

Array = np.ndarray[Any, Any]
RAW_SHIFT = 16  # event ids are u16 (records.event_key)


class Spec(Protocol):
    """An event as sources open it (sources.pmu_events.EventSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def event(self) -> int: ...
    @property
    def raw_code(self) -> int: ...


def spec_key(spec: Spec) -> int:
    return event_key(spec.event, spec.raw_code)


def sample_keys(samples: Array) -> Array:
    """`event_key` of each sample (sample_dtype), as uint64."""
    keys = samples["event"].astype(np.uint64)
    if "raw_code" in (samples.dtype.names or ()):
        keys |= samples["raw_code"].astype(np.uint64) << np.uint64(RAW_SHIFT)
    return keys


def multiplexing(enabled: float, running: float) -> float:
    """time_enabled / time_running of a perf event: 2 when it held a counter half the
    time it was enabled. 1 when it never ran (it has no sample to scale) or ran all
    the time."""
    if running <= 0 or enabled <= running:
        return 1.0
    return enabled / running


def opened_keys(
    group: Iterable[Any], resolve: Callable[[Any], Spec | None] | None, names: dict[int, str]
) -> list[int]:
    """The keys of what a group really samples: each event as `resolve` says the
    source opens it (None: it cannot be opened), or as it is without a resolver.
    Their names go into `names`."""
    keys = []
    for spec in group:
        used = resolve(spec) if resolve is not None else spec
        if used is None:
            continue
        k = spec_key(used)
        names[k] = str(used.name)
        keys.append(k)
    return keys


class EventScales:
    """The scale of each event: its rotation factor times its multiplexing. An event
    that left the rotation (a mode change) keeps its last scale for its late samples;
    one never seen is 1."""

    def __init__(self) -> None:
        self._rotation: dict[int, float] = {}
        self._mux: dict[int, float] = {}
        self._names: dict[int, str] = {}
        self._known: dict[int, float] = {}

    def set_rotation(self, shares: Mapping[int, float], names: Mapping[int, str]) -> None:
        """The rotation factors of the events the current rotation samples."""
        self._rotation = dict(shares)
        self._names.update(names)
        self._refresh()

    def set_times(self, times: Mapping[int, tuple[float, float]]) -> None:
        """(time_enabled, time_running) by event, as the source's `event_times()`
        gives them; events not given keep their last multiplexing."""
        self._mux.update({k: multiplexing(e, r) for k, (e, r) in times.items()})
        self._refresh()

    def scale(self, key: int) -> float:
        return self._known.get(key, 1.0)

    def per_sample(self, samples: Array) -> Array:
        """The scale of each sample's event (float64)."""
        keys = sample_keys(samples)
        if not len(keys):
            return np.ones(0, dtype=np.float64)
        top = int(keys.max())
        if top < 1 << RAW_SHIFT:  # logical events only: a table indexed by id
            table = np.ones(top + 1, dtype=np.float64)
            for k, v in self._known.items():
                if k <= top:
                    table[k] = v
            out: Array = table[keys]
            return out
        uniq, inv = np.unique(keys, return_inverse=True)
        vals = np.array([self.scale(k) for k in uniq.tolist()], dtype=np.float64)
        out = vals[inv.reshape(-1)]
        return out

    def by_name(self) -> dict[str, float]:
        """The scale of each event of the rotation, by name (`ms_pmu_scale{event}`)."""
        return {self._names.get(k, str(k)): self._known[k] for k in sorted(self._rotation)}

    def _refresh(self) -> None:
        for k, share in self._rotation.items():
            self._known[k] = share * self._mux.get(k, 1.0)
