"""What kind of interference an event measures: the class every aggregated row and
per-flow series carries (a cache miss is cache pressure, a HITM is false sharing).

A table indexed by event id, so a batch is classified with one numpy take.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, overload

import numpy as np

from .records import Event

__all__ = ["CLASS_NAMES", "InterferenceClass", "classify"]


class InterferenceClass(IntEnum):
    NONE = 0
    CACHE = 1
    BRANCH = 2
    MEMORY_REMOTE = 3
    FALSE_SHARING = 4
    CPU = 5


CLASS_NAMES = ("none", "cache", "branch", "memory-remote", "false-sharing", "cpu")

_BY_EVENT = {
    Event.CYCLES: InterferenceClass.CPU,
    Event.INSTRUCTIONS: InterferenceClass.CPU,
    Event.LLC_MISS: InterferenceClass.CACHE,
    Event.BRANCH_MISS: InterferenceClass.BRANCH,
    Event.REMOTE_DRAM: InterferenceClass.MEMORY_REMOTE,
    Event.XSNP_HITM: InterferenceClass.FALSE_SHARING,
    Event.CPU_CLOCK: InterferenceClass.CPU,
    Event.RAW: InterferenceClass.NONE,  # a raw code means nothing we can name
}
_TABLE = np.zeros(65536, dtype=np.uint8)  # every u16 event id; unknown ones: NONE
for _event, _cls in _BY_EVENT.items():
    _TABLE[_event] = _cls


@overload
def classify(event: int) -> InterferenceClass: ...
@overload
def classify(event: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.uint8]]: ...
def classify(
    event: int | np.ndarray[Any, Any],
) -> InterferenceClass | np.ndarray[Any, np.dtype[np.uint8]]:
    """The class of one event id, or of an array of them (uint8, vectorised)."""
    if isinstance(event, np.ndarray):
        out: np.ndarray[Any, np.dtype[np.uint8]] = _TABLE[event.astype(np.uint16, copy=False)]
        return out
    return InterferenceClass(int(_TABLE[int(event) & 0xFFFF]))
