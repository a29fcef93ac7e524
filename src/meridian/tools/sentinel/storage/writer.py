"""The runtime's storage observer: what each flush window (and, with raw samples on,
each batch) puts in the store, and the store's counters as metrics.

A window writes, in this order, the names its rollups refer to for the first time
(flows as 5-tuples, functions as binary and symbol), the call stacks and data objects
interned since the last window, then the rollups: a query that finds a rollup finds
its names. A flow not named yet (its name comes from the kernel a poll later) is
written by a later window. So is a function keyed by a provisional id (its symbols
waited for a read: symbols/provisional.py): its name row is written by the first
window after it is resolved, whether or not that window's rollups name it again (its
stack row comes with the symbolizer's new stacks likewise). Until then a query finds
its rollups unnamed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from ....export.series import Family, HistPoint, Point
from ..model.rollup import UNRESOLVED
from .sink import Sink

if TYPE_CHECKING:  # types only
    from ..model.flows import FlowKey

__all__ = ["StoreWriter"]

MAX_NAMED = 1 << 20  # ids remembered as written; past it they are forgotten (written again)
MAX_UNNAMED = 1 << 16  # function ids without a name yet, asked again each window


class _Symbols(Protocol):
    def consume_stacks(self) -> Any: ...
    def consume_data_objects(self) -> Any: ...
    def function_key(self, function_id: int) -> tuple[str, str] | None: ...


@dataclass
class StoreWriter:
    """An agent observer over a Sink (see agent.py's Observer)."""

    sink: Sink
    symbols: _Symbols
    flow_name: Callable[[int], FlowKey | None]
    raw_samples: bool = False
    _flows: set[int] = field(default_factory=set, init=False)  # ids named in the store
    _functions: set[int] = field(default_factory=set, init=False)
    _unnamed: set[int] = field(default_factory=set, init=False)  # asked again each window

    def on_samples(self, batch: Any) -> None:
        """Raw samples (the consumer thread): only turned into lines and queued here."""
        if self.raw_samples:
            self.sink.write_raw(
                batch.samples, lbr=batch.lbr, scale=batch.scale, wall_ns=batch.wall_ns
            )

    def on_window(self, window: Any) -> None:
        rows = window.rows
        self._write_names(rows)
        self.sink.write_stacks(self.symbols.consume_stacks())
        self.sink.write_data_objects(self.symbols.consume_data_objects())
        self.sink.write_rollups(rows)
        self.sink.commit()  # to disk now: a killed agent loses only the window being built

    def _write_names(self, rows: Any) -> None:
        flows = []
        for fid in _new(rows["flow_id"], self._flows):
            key = self.flow_name(fid) if fid else None
            if key is not None:
                flows.append((fid, key.src, key.dst, key.sport, key.dport, str(key.proto)))
                self._flows.add(fid)
        functions = []
        for fid in sorted(self._unnamed.union(_new(rows["function_id"], self._functions))):
            found = self.symbols.function_key(fid) if fid != UNRESOLVED else None
            if found is not None:
                functions.append((fid, *found))
                self._functions.add(fid)
                self._unnamed.discard(fid)
            elif fid != UNRESOLVED and len(self._unnamed) < MAX_UNNAMED:
                self._unnamed.add(fid)
        for seen in (self._flows, self._functions):
            if len(seen) > MAX_NAMED:
                seen.clear()
        if flows:
            self.sink.write_flows(flows)
        if functions:
            self.sink.write_functions(functions)

    def close(self) -> None:
        """Send what waits (the last window included); what cannot be stays spooled."""
        self.sink.close()

    def families(self) -> list[Family]:
        """The store's counters, as `SentinelMetrics.add_source` takes them."""
        s = self.sink.stats()

        def one(name: str, kind: Literal["counter", "gauge"], doc: str, value: float) -> Family:
            return Family(name, kind, "", doc, list[Point | HistPoint]([Point({}, value)]))

        by_table = [Point({"table": t}, n) for t, n in sorted(s.rows_by_table.items())]
        return [
            one(
                "ms_clickhouse_flush_errors",
                "counter",
                "inserts that failed (each retried or spooled)",
                s.flush_errors,
            ),
            one(
                "ms_clickhouse_dropped_rows",
                "counter",
                "rows lost: past the spool limit, or not convertible",
                s.dropped_rows,
            ),
            Family(
                "ms_clickhouse_rows_written",
                "counter",
                "",
                "rows stored, by table",
                list[Point | HistPoint](by_table),
            ),
            one(
                "ms_clickhouse_backlog_rows",
                "gauge",
                "rows not stored yet (memory and spool)",
                s.backlog_rows,
            ),
            one(
                "ms_clickhouse_spooled_rows",
                "gauge",
                "rows on disk in the spool, not stored yet",
                s.spooled_rows,
            ),
            one("ms_clickhouse_connected", "gauge", "1 while the store answers", int(s.connected)),
        ]


def _new(ids: Any, written: set[int]) -> list[int]:
    """The distinct ids of a column not written yet."""
    return [i for i in np.unique(ids).tolist() if i not in written]
