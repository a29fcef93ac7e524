"""The sentinel's records as numpy dtypes, read from the compiled object's BTF (the
layouts of bpf/sentinel.h, never typed twice), the logical event ids, and the
`SampleSource` protocol that the kernel session and the mock source both implement.

Decoding is `np.frombuffer(raw, sample_dtype())`: one call per batch, none per sample.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Sequence
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ....bpf import BpfObject, object_path

if TYPE_CHECKING:
    from .flows import FlowKey

# events.EventSpec: not imported, as events.py imports this module (no cycle, even
# for the type checker's imports).
EventSpecT = Any

__all__ = [
    "CONTEXT_DTYPE",
    "DIRECTION_NAMES",
    "EVENT_NAMES",
    "FLOW_HISTORY_NS",
    "FLOW_SKID_NS",
    "HISTORY_LEN",
    "IDLE",
    "MAX_SLOTS",
    "OBJECT",
    "RACED_STACK_ID",
    "RX",
    "TX",
    "Event",
    "FlowSource",
    "SampleSource",
    "concat",
    "copy_records",
    "decode_lbr",
    "decode_samples",
    "empty_lbr",
    "empty_samples",
    "event_key",
    "lbr_dtype",
    "load_dtypes",
    "sample_dtype",
    "take",
]

OBJECT = "sentinel"  # bpfobj/sentinel.bpf.o
FLOW_SKID_NS = 200_000  # MS_FLOW_SKID_NS: a sample may land this long after its packet
HISTORY_LEN = 16  # MS_HISTORY_LEN: packet contexts kept per CPU
MAX_SLOTS = 16  # MS_MAX_EVENTS: cookie slots, so events open at once
# A sample's stack ids when the source found they name another stack's frames (the
# kernel's lookup race: sources/stackmaps.py); the program's own errors are -EFAULT,
# -EEXIST, -ENOMEM and -ENOENT, never -ESTALE.
RACED_STACK_ID = -errno.ESTALE
# Past the skid window, a sample takes the newest packet of its CPU's history within
# this (docs/requirements/sentinel.md §5.1): MS_HISTORY_LEN x MS_FLOW_SKID_NS.
FLOW_HISTORY_NS = HISTORY_LEN * FLOW_SKID_NS
RX, TX = 0, 1  # enum ms_direction
# Not the kernel's: the aggregator's direction for a sample whose instruction was the
# kernel's idle code (symbols/kallsyms.py), charged to no flow (flow 0). Flow 0 has no
# direction otherwise (the kernel writes 0): this value is what tells idle apart.
IDLE = 2
DIRECTION_NAMES = ("rx", "tx", "idle")

# A packet context: the kernel's `struct ms_flow_ctx` plus its cpu (pipeline.skew).
CONTEXT_DTYPE = np.dtype(
    [
        ("time_ns", "<u8"),
        ("flow_id", "<u8"),
        ("cpu", "<u4"),
        ("ifindex", "<u4"),
        ("gso_segs", "<u2"),
        ("direction", "u1"),
    ]
)


class Event(IntEnum):
    """enum ms_event: the logical event a sample counts (its perf event's cookie)."""

    CYCLES = 0
    INSTRUCTIONS = 1
    LLC_MISS = 2
    BRANCH_MISS = 3
    REMOTE_DRAM = 4
    XSNP_HITM = 5
    CPU_CLOCK = 6
    RAW = 7


def event_key(event: int, raw_code: int = 0) -> int:
    """One int per event a sample can count: its raw code (0 but for Event.RAW, whose
    samples share one id) over its id (`event` is a u16)."""
    return (int(raw_code) << 16) | int(event)


EVENT_NAMES = (
    "cycles",
    "instructions",
    "llc-misses",
    "branch-misses",
    "remote-dram",
    "hitm",
    "cpu-clock",
    "raw",
)


class FlowSource(IntEnum):
    """enum ms_flow_source: how the kernel found a sample's flow."""

    CURRENT = 0
    HISTORY = 1
    FALLBACK = 2


def load_dtypes(path: Path | str) -> tuple[np.dtype[np.void], np.dtype[np.void]]:
    """(struct ms_sample, struct ms_lbr) from the BTF of the object at `path`."""
    obj = BpfObject(path)
    try:
        if obj.btf is None:
            raise ValueError(f"{path} has no BTF: build it with clang -g")
        return obj.btf.struct_dtype("ms_sample"), obj.btf.struct_dtype("ms_lbr")
    finally:
        obj.close()


@functools.cache
def _dtypes() -> tuple[np.dtype[np.void], np.dtype[np.void]]:
    return load_dtypes(object_path(OBJECT))


def sample_dtype() -> np.dtype[np.void]:
    """struct ms_sample (ObjectMissing until `make bpf`)."""
    return _dtypes()[0]


def lbr_dtype() -> np.dtype[np.void]:
    """struct ms_lbr: one branch stack, joined to its sample by (cpu, time_ns)."""
    return _dtypes()[1]


def decode_samples(raw: bytes | bytearray | memoryview) -> np.ndarray[Any, np.dtype[np.void]]:
    """Records laid end to end -> one structured array (a view, no copy)."""
    return np.frombuffer(raw, dtype=sample_dtype())


def decode_lbr(raw: bytes | bytearray | memoryview) -> np.ndarray[Any, np.dtype[np.void]]:
    return np.frombuffer(raw, dtype=lbr_dtype())


def _raw(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return a.view(np.dtype((np.void, a.dtype.itemsize)))


def take(a: np.ndarray[Any, Any], index: Any) -> np.ndarray[Any, Any]:
    """`a[index]` (a mask or indices) for an array of records, as whole records: numpy
    copies a structured array field by field (~90 ns a record for ms_sample)."""
    out: np.ndarray[Any, Any] = _raw(a)[index].view(a.dtype)
    return out


def copy_records(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """`a.copy()` for an array of records, whole records at a time."""
    out: np.ndarray[Any, Any] = _raw(a).copy().view(a.dtype)
    return out


def concat(parts: Sequence[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """`np.concatenate(parts)` for arrays of records, whole records at a time (a new
    array, even of one part)."""
    dtype = parts[0].dtype
    if any(p.dtype != dtype for p in parts):
        return np.concatenate(parts)
    out: np.ndarray[Any, Any] = np.concatenate([_raw(p) for p in parts]).view(dtype)
    return out


def empty_samples(n: int = 0) -> np.ndarray[Any, np.dtype[np.void]]:
    """n zeroed samples: gso_segs set to 1 (never 0) so norm_cost stays finite."""
    out = np.zeros(n, dtype=sample_dtype())
    out["gso_segs"] = 1
    return out


def empty_lbr(n: int = 0) -> np.ndarray[Any, np.dtype[np.void]]:
    return np.zeros(n, dtype=lbr_dtype())


class SampleSource(Protocol):
    """Where samples come from: the kernel session (kernel.py) or the mock (mock.py)."""

    name: str  # "cpu-clock (software fallback)", "mock", ...

    def poll(
        self, timeout_s: float
    ) -> tuple[np.ndarray[Any, np.dtype[np.void]], np.ndarray[Any, np.dtype[np.void]]]:
        """Samples (sample_dtype) and LBR records (lbr_dtype) since the last call."""
        ...

    def new_flows(self) -> dict[int, FlowKey]:
        """flow_id -> 5-tuple, for the flows first seen since the last call."""
        ...

    def stack_ips(self, stack_id: int) -> tuple[int, ...]:
        """Frames of a stack id, () if gone."""
        ...

    def dropped(self) -> dict[str, int]:
        """Cumulative drop counts by reason: token_bucket, hard_drop, ring_full, ..."""
        ...

    def set_budget(self, samples_per_sec: int, hard_drop_ns: int) -> None: ...

    def set_events(self, events: Sequence[EventSpecT]) -> float:
        """Sample these events now (a group); returns the number of events opened.
        (A source may also have `opened`, what it really samples after fallbacks,
        `resolve(spec)`, what it would open for `spec` (None: nothing), and
        `event_times()`, each event's enabled and running ns by `event_key`: the
        kernel's multiplexing. The runtime scales each event's samples by them.)"""
        ...

    def set_targets(self, pids: Sequence[int]) -> None:
        """Kernel-side pid filter, [] = all."""
        ...

    def close(self) -> None: ...
