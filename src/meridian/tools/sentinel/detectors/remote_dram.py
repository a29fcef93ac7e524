"""Remote DRAM (docs/requirements/sentinel.md §5.3, RemoteDramAnalyzer): loads served
from another NUMA node's memory, counted per (flow, NUMA node, interface) with when they
were last seen. A flow whose packets are handled on one node while its buffers live on
another shows here: the fix is pinning (IRQ affinity, the process, or its memory).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from ..model.records import Event
from .base import Detector, Emit, register
from .window import Array, WindowCounts

__all__ = ["RemoteDram", "RemoteDramFinding"]

MIN_SAMPLES = 1  # remote-DRAM samples a (flow, node, interface) needs in a window
MAX_KEYS = 1 << 16  # (flow, node, interface) counts kept per window
MAX_FINDINGS = 100  # entries reported per window at most, the most samples first


@dataclass(frozen=True)
class RemoteDramFinding:
    """One (flow, NUMA node, interface) with remote-DRAM samples in a window."""

    metric: ClassVar[str] = "ms_remote_dram_hotspot"
    flow_id: int  # 0: samples the kernel found no flow for
    numa_node: int  # the node of the CPU that took the sample
    ifindex: int  # the flow's interface, 0 without a flow
    samples: int
    first_ns: int
    last_ns: int  # the last sample of the entry
    window_start_ns: int
    window_end_ns: int

    @property
    def value(self) -> float:
        return float(self.samples)

    def labels(self) -> dict[str, str]:
        """`flow` (16 hex digits, as the per-flow series), `numa`, `ifindex`."""
        return {
            "flow": f"{self.flow_id:016x}",
            "numa": str(self.numa_node),
            "ifindex": str(self.ifindex),
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@register
class RemoteDram(Detector):
    """Remote-DRAM samples per (flow_id, numa_node, ifindex); every entry with at
    least `min_samples` in the window is reported, the most samples first."""

    name = "remote_dram"
    metric = RemoteDramFinding.metric
    doc = "remote-DRAM samples per flow, NUMA node and interface, per window"

    def __init__(
        self,
        *,
        min_samples: int = MIN_SAMPLES,
        min_window_ns: int = 0,
        max_keys: int = MAX_KEYS,
        max_findings: int = MAX_FINDINGS,
    ) -> None:
        self.min_samples = max(1, min_samples)
        self.max_findings = max_findings
        self.counts = WindowCounts(
            [("flow_id", "<u8"), ("numa_node", "<u4"), ("ifindex", "<u4")], max_keys, min_window_ns
        )

    def observe(self, samples: Array) -> None:
        hit = np.flatnonzero(samples["event"] == Event.REMOTE_DRAM)
        if not len(hit):
            return
        cols = {k: samples[k][hit] for k in ("flow_id", "numa_node", "ifindex")}
        self.counts.add(cols, samples["time_ns"][hit], samples["data_addr"][hit])

    def dropped(self) -> int:
        return self.counts.dropped

    def flush(self, now_ns: int, emit: Emit) -> None:
        closed = self.counts.close(now_ns)
        if closed is None:
            return
        rows = closed.rows[closed.rows["hits"] >= np.uint64(self.min_samples)]
        most = -rows["hits"].astype(np.int64)
        order = np.lexsort((rows["ifindex"], rows["numa_node"], rows["flow_id"], most))
        for r in rows[order[: self.max_findings]].tolist():
            flow_id, node, ifindex, hits, first_ns, last_ns, _addr = r
            emit(
                RemoteDramFinding(
                    flow_id, node, ifindex, hits, first_ns, last_ns, closed.start_ns, now_ns
                )
            )
