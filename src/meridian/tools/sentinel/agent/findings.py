"""The detectors (detectors/) as one runtime observer: every kept batch is observed on
the consumer thread, every flush window closes their windows, and the findings of the
last window are the gauges each detector names (ms_false_sharing_score,
ms_remote_dram_hotspot, ...), with the flow's 5-tuple where a finding names a flow.
Each detector's thresholds are its config section's (`detector_context`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ....export.series import Family, HistPoint, Point
from ..detectors import Detector, DetectorContext, Finding, create_all, detector_types
from ..detectors.base import DataObjectLookup

if TYPE_CHECKING:
    from ..config.load import SentinelConfig
    from ..model.flows import FlowKey

__all__ = ["Findings", "detector_context"]


def detector_context(cfg: SentinelConfig, objects: DataObjectLookup | None) -> DetectorContext:
    """What the detectors are created with: the registered data objects, and each
    detector's config section (named as the detector) as its thresholds."""
    sections = type(cfg).model_fields
    settings = {
        name: getattr(cfg, name).model_dump() for name in detector_types() if name in sections
    }
    return DetectorContext(objects=objects, settings=settings)


class Findings:
    """Detectors over the runtime's samples; `families` for SentinelMetrics.add_source."""

    def __init__(
        self,
        ctx: DetectorContext,
        flow_name: Callable[[int], FlowKey | None],
        detectors: list[Detector] | None = None,
    ) -> None:
        self.detectors = create_all(ctx) if detectors is None else detectors
        self.flow_name = flow_name
        self.last: list[Finding] = []
        self._lock = threading.Lock()

    def on_samples(self, batch: Any) -> None:
        for d in self.detectors:
            d.observe(batch.samples)

    def on_window(self, window: Any) -> None:
        found: list[Finding] = []
        for d in self.detectors:
            d.flush(window.end_ns, found.append)
        with self._lock:
            self.last = found

    def close(self) -> None:
        pass

    def families(self) -> list[Family]:
        with self._lock:
            found = list(self.last)
        out = []
        for cls in detector_types().values():
            points = [Point(self._labels(f), f.value) for f in found if f.metric == cls.metric]
            out.append(Family(cls.metric, "gauge", "", cls.doc, list[Point | HistPoint](points)))
        drops = [Point({"detector": d.name}, d.dropped()) for d in self.detectors]
        doc = "samples a detector observed but could not count (its table was full)"
        out.append(Family("ms_detector_dropped_samples", "counter", "", doc, list(drops)))
        return out

    def _labels(self, f: Finding) -> dict[str, str | int | bool]:
        """The finding's labels; one that names a flow gets its 5-tuple too ("" while
        the flow has no name), so that every point of a family has the same labels."""
        labels: dict[str, str | int | bool] = dict(f.labels())
        flow = labels.get("flow")
        if flow is None:
            return labels
        key = self.flow_name(int(str(flow), 16))
        if key is None:
            labels.update(src="", dst="", sport="", dport="", proto="")
        else:
            labels.update(
                src=key.src, dst=key.dst, sport=key.sport, dport=key.dport, proto=str(key.proto)
            )
        return labels
