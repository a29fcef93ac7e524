"""biolat's kernel session: block requests from issue (or insert, with -Q) to
completion, by the request pointer (tp_btf) or by device and sector (tracepoints);
with --slow, each slow request through the ring buffer."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ...bpf import BpfObject, RingBuffer, Strategy, choose, hook_exists
from ...export import Family
from ...hist import Cell
from ...session import Session
from .metrics import series
from .model import Options, Snapshot

__all__ = ["STRATEGIES", "Biolat"]

STRATEGIES = (
    Strategy("tp_btf", ("btf_rq_issue", "btf_rq_complete", "btf_rq_requeue"), ("tp_btf",)),
    Strategy("tracepoint", ("tp_rq_issue", "tp_rq_complete", "tp_rq_requeue"), ("tracepoint",)),
)
# Extra programs per strategy: request insert (-Q) and request start (who queued it).
_INSERT = {"tp_btf": "btf_rq_insert", "tracepoint": "tp_rq_insert"}
_START = {"tp_btf": "btf_io_start", "tracepoint": "tp_io_start"}


class Biolat(Session):
    """The loaded programs; `snapshot()` reads the maps, `events()` the slow requests,
    `metrics()` the maps again, for export."""

    name = "biolat"
    OBJECT = "biolat"  # bpfobj/biolat.bpf.o
    BAD_RECORDS = "events_bad"

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.strategy = choose(STRATEGIES, opts.strategy)
        self.selected: list[str] = []

    def programs(self, obj: BpfObject) -> list[str]:
        """The strategy's programs, plus insert (-Q) and start (who queued a request,
        for --slow) where this kernel has those hooks."""
        s = self.strategy.name
        extra = []
        if self.opts.queued or self.opts.slow_ms is not None:
            extra.append(_INSERT[s])
        if self.opts.slow_ms is not None:
            extra.append(_START[s])
        return list(self.strategy.programs) + [
            p for p in extra if hook_exists(obj.programs[p].section)
        ]

    def setup(self, obj: BpfObject) -> None:
        o = self.opts
        obj.set_rodata(
            {
                "targ_queued": o.queued,
                "latency_unit_ns": o.unit_ns,
                "filter_dev_on": o.disk is not None,
                "filter_dev": o.disk or 0,
                "track_depth": o.depth,
                "slow_on": o.slow_ms is not None,
                "slow_ns": int((o.slow_ms or 0) * 1_000_000),
                "wakeup_bytes": o.ring_bytes // 4,
            }
        )
        obj.resize("events", o.ring_bytes)
        self.selected = self.programs(obj)
        start = _START[self.strategy.name]
        obj.set_rodata({"submitter_at_issue": o.slow_ms is not None and start not in self.selected})
        obj.select(self.selected)
        obj.load()
        obj.attach()
        if o.slow_ms is not None:
            assert obj.btf is not None
            self.ring = RingBuffer.of_map(obj.maps["events"], obj.btf.struct_dtype("biolat_event"))

    def snapshot(self) -> Snapshot:
        assert self.obj is not None
        keys, vals = self.obj.maps["hists"].items()
        cells = {
            (int(k["dev"]), int(k["op"]), int(k["kind"]), int(k["slot"])): Cell(
                v["buckets"].astype(np.uint64),
                sum_ns=int(v["sum"]),
                max_ns=int(v["max"]),
                min_ns=int(v["min"]),
                bytes=int(v["bytes"]),
            )
            for k, v in zip(keys, vals, strict=True)
        }
        # right after the histograms: a request completed between the two reads is in
        # one and not in the other
        dkeys, dvals = self.obj.maps["depth"].items()
        now_ns = time.monotonic_ns()  # bpf_ktime_get_ns()'s clock
        inflight, busy = {}, {}
        for k, v in zip(dkeys, dvals, strict=True):
            inflight[int(k)] = n = int(v["inflight"])
            since = int(v["busy_since_ns"])
            # the busy period going on counts up to now
            busy[int(k)] = int(v["busy_ns"]) + (now_ns - since if n > 0 and now_ns > since else 0)
        sizes: dict[tuple[int, int], dict[int, int]] = {}
        skeys, svals = self.obj.maps["sizes"].items()
        for k, n in zip(skeys, svals, strict=True):
            sizes.setdefault((int(k["dev"]), int(k["op"])), {})[int(k["bytes"])] = int(n)
        return Snapshot(
            now_ns / 1e9, cells, inflight, self.counters(), sizes=sizes,
            unit_ns=self.opts.unit_ns, busy_ns=busy,
        )  # fmt: skip

    def events(self, timeout: float) -> np.ndarray[Any, Any]:
        if self.ring is None:
            time.sleep(max(timeout, 0))
            return np.empty(0)
        return self.ring.poll(timeout)

    def metrics(self) -> list[Family]:
        return series(self.snapshot(), self.opts)
