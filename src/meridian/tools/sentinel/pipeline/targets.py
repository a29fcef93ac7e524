"""Which samples the agent keeps: the monitoring targets of `-p PID` and the control
plane (`{"targets": [{"flow_id": ...}, {"pid": 42, "tid": 43}]}`).

A sample passes when it matches any target; a target matches when every key it names
matches (so `{"pid": 42, "tid": 43}` is one thread). No target: everything passes.
One numpy mask per batch: single-key targets become one `np.isin` per key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ....errors import UsageError
from ..model.records import take

__all__ = ["KEYS", "TargetFilter"]

# target key -> ms_sample field
KEYS = {
    "flow_id": "flow_id",
    "pid": "pid",
    "tid": "tid",
    "cgroup": "cgroup_id",
    "ifindex": "ifindex",
}


def _value(key: str, value: object) -> int:
    """An id: an int, or a decimal / 0x-hex string; flow ids also as 16 hex digits."""
    if isinstance(value, bool):
        raise UsageError(f"target {key}: {value!r} is not a number")
    if isinstance(value, int):
        out = value
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            if key == "flow_id" and len(text) == 16 and not text.startswith("0x"):
                out = int(text, 16)  # the flow label of /metrics
            else:
                out = int(text, 0)
        except ValueError:
            raise UsageError(f"target {key}: {value!r} is not a number") from None
    else:
        raise UsageError(f"target {key}: {value!r} is not a number")
    if not 0 <= out < 1 << 64:
        raise UsageError(f"target {key}: {value!r} is out of range")
    return out


class TargetFilter:
    """The current target set; `set` replaces it (the control plane may call it while
    the consumer thread calls `apply`: both see a whole set, old or new)."""

    def __init__(self, targets: Sequence[Mapping[str, object]] = ()) -> None:
        self._state: tuple[
            dict[str, np.ndarray[Any, np.dtype[np.uint64]]],
            list[dict[str, int]],
            list[dict[str, int]],
        ] = ({}, [], [])
        self.set(targets)

    def set(self, targets: Sequence[Mapping[str, object]]) -> None:
        parsed: list[dict[str, int]] = []
        for t in targets:
            unknown = sorted(set(t) - set(KEYS))
            if unknown:
                raise UsageError(f"unknown target key {unknown[0]!r}: use one of {', '.join(KEYS)}")
            if not t:
                raise UsageError("an empty target: name at least one of " + ", ".join(KEYS))
            parsed.append({k: _value(k, v) for k, v in t.items()})
        single: dict[str, list[int]] = {}
        multi: list[dict[str, int]] = []
        for t in parsed:
            if len(t) == 1:
                ((k, v),) = t.items()
                single.setdefault(k, []).append(v)
            else:
                multi.append(t)
        # one assignment each, so a concurrent apply sees either set whole
        self._state = (
            {k: np.unique(np.array(v, dtype=np.uint64)) for k, v in single.items()},
            multi,
            parsed,
        )

    @property
    def targets(self) -> list[dict[str, int]]:
        return list(self._state[2])

    def __bool__(self) -> bool:
        return bool(self._state[2])

    def mask(self, samples: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.bool_]]:
        single, multi, parsed = self._state
        if not parsed:
            return np.ones(len(samples), dtype=bool)
        keep = np.zeros(len(samples), dtype=bool)
        for key, values in single.items():
            col: np.ndarray[Any, Any] = samples[KEYS[key]].astype(np.uint64, copy=False)
            keep |= np.isin(col, values) if len(values) > 8 else _any_equal(col, values)
        for t in multi:
            m = np.ones(len(samples), dtype=bool)
            for key, value in t.items():
                m &= samples[KEYS[key]] == value
            keep |= m
        return keep

    def apply(self, samples: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The samples of the targets (all of them without targets, not a copy)."""
        if not self._state[2]:
            return samples
        return take(samples, self.mask(samples))

    def pids(self) -> list[int]:
        """Pids the kernel can filter by itself: all targets name a pid. Otherwise []
        (everything), and user space does the filtering."""
        parsed = self._state[2]
        if not parsed or any("pid" not in t for t in parsed):
            return []
        return sorted({t["pid"] for t in parsed})


def _any_equal(
    col: np.ndarray[Any, Any], values: np.ndarray[Any, Any]
) -> np.ndarray[Any, np.dtype[np.bool_]]:
    out: np.ndarray[Any, np.dtype[np.bool_]] = col == values[0]
    for v in values[1:]:
        out |= col == v
    return out
