"""The kernel session of a latency tool. Its object times an interval per thread, the
start kept in an array slot per thread ID (`starts`, sized here to the thread slots,
with `starts_mask`), and adds it to a per-CPU log2 histogram: per process with -P (the
`hists` hash map, keyed by the tool's key struct), else in `totals` (a per-CPU array
indexed by the tool's kind). The read-only globals `latency_unit_ns`, `per_process`
and `filter_pid` (-p: only the processes in the tool's `pids` set, which the tool
fills) carry the options; `counters` counts what is not in the histograms."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ..bpf import BpfObject, Strategy, choose
from ..hist import Cell
from ..proc import thread_slots
from ..session import Session
from .model import LatencyOptions

__all__ = ["LatencySession"]

Opts = TypeVar("Opts", bound=LatencyOptions)
K = TypeVar("K", bound=tuple[Any, ...])


class LatencySession(Session, Generic[Opts, K]):
    """A tool sets `name`, `OBJECT` and `STRATEGIES`, decodes its keys (`hist_key`,
    `total_key`) and writes `snapshot()` and `metrics()`; `choose_strategy()` picks
    among its strategies, `settings()` adds its own globals, `attach()` attaches what
    `obj.attach()` cannot."""

    name: str
    STRATEGIES: tuple[Strategy, ...]

    def __init__(self, opts: Opts) -> None:
        self.opts = opts
        self.strategy = self.choose_strategy()
        self.selected = list(self.strategy.programs)

    def choose_strategy(self) -> Strategy:
        """The one forced, else the first of STRATEGIES this kernel allows."""
        return choose(self.STRATEGIES, self.opts.strategy)

    def settings(self) -> dict[str, Any]:
        """The tool's own read-only globals."""
        return {}

    def attach(self, obj: BpfObject) -> None:
        obj.attach()

    def setup(self, obj: BpfObject) -> None:
        o = self.opts
        slots = thread_slots()
        obj.resize("starts", slots)
        obj.set_rodata(
            {
                "starts_mask": slots - 1,
                "latency_unit_ns": o.unit_ns,
                "per_process": o.per_process,
                "filter_pid": bool(o.pids),
                **self.settings(),
            }
        )
        obj.select(self.selected)
        obj.load()
        self.attach(obj)

    def hist_key(self, key: Any) -> K:
        """The key of a `hists` entry (a record of the tool's key struct)."""
        raise NotImplementedError

    def total_key(self, index: int) -> K:
        """The key of the `totals` entry at `index`."""
        raise NotImplementedError

    def cells(self) -> dict[K, Cell]:
        """Every histogram, summed over CPUs: per process with -P, else the totals."""
        assert self.obj is not None
        if self.opts.per_process:
            keys, vals = self.obj.maps["hists"].items()
            labels = [self.hist_key(k) for k in keys]
        else:
            keys, vals = self.obj.maps["totals"].items()
            labels = [self.total_key(int(k)) for k in keys]
        return {key: Cell.of_cpus(v) for key, v in zip(labels, vals, strict=True)}
