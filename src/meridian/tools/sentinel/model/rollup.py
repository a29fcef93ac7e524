"""A rollup: the sums of one aggregation key over a flush window, as numpy rows
(`ROLLUP_DTYPE`, for bulk sinks) and as objects (for views, metrics and detectors)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

__all__ = [
    "GONE_STACK",
    "KEY_DTYPE",
    "PROVISIONAL_BASE",
    "PROVISIONAL_END",
    "ROLLUP_DTYPE",
    "SKIPPED_STACK",
    "STACK_LABELS",
    "UNRESOLVED",
    "UNRESOLVED_LABEL",
    "Rollup",
    "as_rows",
    "is_provisional",
    "rollups",
]

Array = np.ndarray[Any, Any]

# A function or call stack not symbolized (its read still pending when it was keyed,
# past the bound of provisional ids): its samples and cost are exact, its name a label.
UNRESOLVED = (1 << 64) - 1
# Call stack ids that name nothing but say why (the symbolizer's ids count up from 1).
# Its frames left the kernel's stack map before they were read, or the id named
# another's (RACED_STACK_ID: the kernel's lookup race, sources/stackmaps.py).
GONE_STACK = (1 << 64) - 2
SKIPPED_STACK = (1 << 64) - 3  # a stack not asked: over the window's budget (aggregator)
UNRESOLVED_LABEL = "[unresolved: symbols not read yet]"
# What the resolver, the outputs and the queries show for those ids (UNRESOLVED too).
STACK_LABELS = {
    UNRESOLVED: UNRESOLVED_LABEL,
    GONE_STACK: "[stack gone: recycled or overwritten before it was read]",
    SKIPPED_STACK: "[stacks not read: over the window's budget of new stacks]",
}
# Provisional function and stack ids (the symbolizer's, symbols/provisional.py) count
# up from here: an address or stack whose symbols wait for a slow read, named once
# read. Interned ids count up from 1; labels such as UNRESOLVED sit at the top.
PROVISIONAL_BASE = 1 << 62
PROVISIONAL_END = 1 << 63


def is_provisional(ident: int) -> bool:
    return PROVISIONAL_BASE <= ident < PROVISIONAL_END


# The key of a rollup, as stored between add() and flush().
KEY_DTYPE = np.dtype(
    [
        ("flow_id", "<u8"),
        ("function_id", "<u8"),
        ("callstack_id", "<u8"),
        ("data_object_id", "<u8"),
        ("time_bucket", "<u8"),
        ("numa_node", "<u4"),
        ("event", "<u2"),
        ("direction", "u1"),
        ("interference_class", "u1"),
    ]
)
ROLLUP_DTYPE = np.dtype(
    [
        *((n, KEY_DTYPE.fields[n][0]) for n in KEY_DTYPE.names or ()),  # type: ignore[index]
        ("samples", "<u8"),
        ("norm_cost", "<f8"),
        ("pid", "<u4"),
    ]
)


@dataclass(frozen=True)
class Rollup:
    flow_id: int
    function_id: int
    callstack_id: int
    data_object_id: int
    event: int
    numa_node: int
    direction: int
    interference_class: int
    time_bucket: int  # start of the bucket, ns (the clock of the samples' times)
    samples: int
    norm_cost: float
    pid: int  # of the first sample, for display

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_ROLLUP_FIELDS = tuple(f.name for f in fields(Rollup))


def rollups(rows: Array) -> list[Rollup]:
    """ROLLUP_DTYPE rows as Rollups: a window has hundreds, so each is made by filling
    its __dict__, not through the frozen dataclass's __init__ (a setattr per field)."""
    cols = [rows[name].tolist() for name in _ROLLUP_FIELDS]
    out: list[Rollup] = []
    new = object.__new__
    for vals in zip(*cols, strict=True):
        r = new(Rollup)
        r.__dict__.update(zip(_ROLLUP_FIELDS, vals, strict=True))
        out.append(r)
    return out


def as_rows(rows: Array | Iterable[Rollup]) -> Array:
    """Rollups as ROLLUP_DTYPE rows (an array as it is): what the flush's sums take,
    column-wise, and what callers with Rollup objects hand them."""
    if isinstance(rows, np.ndarray):
        return rows
    objs = list(rows)
    out = np.zeros(len(objs), dtype=ROLLUP_DTYPE)
    for name in _ROLLUP_FIELDS:
        out[name] = [getattr(r, name) for r in objs]
    return out
