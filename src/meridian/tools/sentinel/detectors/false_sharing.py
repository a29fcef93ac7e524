"""False sharing (docs/requirements/sentinel.md §5.3, FalseSharingDetector): HITM
samples (a load served from a line modified in another core's cache) counted per cache
line, CPU and process. One CPU hitting a line is a hot line; several CPUs (or processes)
each hitting the same line in one window is the line bouncing between caches, i.e.
sharing, true or false. The finding names the registered data object the line falls in,
where there is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from ..model.records import Event
from .base import DataObjectLookup, Detector, DetectorContext, Emit, register
from .window import Array, WindowCounts

__all__ = ["FalseSharing", "FalseSharingFinding"]

LINE_SHIFT = 6  # 64-byte cache lines
MIN_HITS = 4  # HITM samples a CPU (or process) needs on a line in a window to count
MIN_SHARERS = 2  # CPUs (or processes) over MIN_HITS that make a line reported
MAX_KEYS = 1 << 16  # (line, cpu, pid) counts kept per window
MAX_FINDINGS = 100  # lines reported per window at most, the highest scores


@dataclass(frozen=True)
class FalseSharingFinding:
    """A line several CPUs or processes hit in one window."""

    metric: ClassVar[str] = "ms_false_sharing_score"
    line: int  # the line's address: the data address with the low 6 bits cleared
    score: float  # HITM samples on the line in the window
    cpus: tuple[tuple[int, int], ...]  # (cpu, samples), most first
    pids: tuple[tuple[int, int], ...]  # (pid, samples), most first
    window_start_ns: int
    window_end_ns: int
    last_ns: int  # the line's last sample
    data_object: str = ""  # the registered object the line falls in ("": none)
    data_object_id: int = 0
    data_object_pid: int = 0  # the process it was registered for

    @property
    def value(self) -> float:
        return self.score

    def labels(self) -> dict[str, str]:
        """`line` (hex address), `object` and `pid` (the process with most samples)."""
        return {"line": f"0x{self.line:x}", "object": self.data_object, "pid": str(self.pids[0][0])}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@register
class FalseSharing(Detector):
    """HITM samples per (line, cpu, pid); a line is reported when at least
    `min_sharers` CPUs, or `min_sharers` processes, each have `min_hits` samples on it
    in the window. Its score is every HITM sample on the line in the window."""

    name = "false_sharing"
    metric = FalseSharingFinding.metric
    doc = "HITM samples on a cache line several CPUs or processes hit, per window"

    def __init__(
        self,
        objects: DataObjectLookup | None = None,
        *,
        min_hits: int = MIN_HITS,
        min_sharers: int = MIN_SHARERS,
        min_window_ns: int = 0,
        max_keys: int = MAX_KEYS,
        max_findings: int = MAX_FINDINGS,
    ) -> None:
        self.objects = objects
        self.min_hits = max(1, min_hits)
        self.min_sharers = max(2, min_sharers)
        self.max_findings = max_findings
        self.counts = WindowCounts(
            [("line", "<u8"), ("cpu", "<u4"), ("pid", "<u4")], max_keys, min_window_ns
        )

    @classmethod
    def create(cls, ctx: DetectorContext) -> FalseSharing:
        return cls(ctx.objects, **ctx.settings_of(cls.name))

    def observe(self, samples: Array) -> None:
        addr = samples["data_addr"]
        hit = np.flatnonzero((samples["event"] == Event.XSNP_HITM) & (addr != 0))
        if not len(hit):
            return
        a = addr[hit]
        cols = {"line": a >> np.uint64(LINE_SHIFT), "cpu": samples["cpu"][hit]}
        cols["pid"] = samples["pid"][hit]
        self.counts.add(cols, samples["time_ns"][hit], a)

    def dropped(self) -> int:
        return self.counts.dropped

    def flush(self, now_ns: int, emit: Emit) -> None:
        closed = self.counts.close(now_ns)
        if closed is None or not len(closed.rows):
            return
        rows = closed.rows
        lines, line_of = np.unique(rows["line"], return_inverse=True)
        n, hits = len(lines), rows["hits"]
        by_cpu = _sharers(line_of, rows["cpu"], hits, self.min_hits, n)
        by_pid = _sharers(line_of, rows["pid"], hits, self.min_hits, n)
        shared = (by_cpu >= self.min_sharers) | (by_pid >= self.min_sharers)
        if not shared.any():
            return
        score = np.bincount(line_of, weights=hits, minlength=n)
        reported = np.flatnonzero(shared)
        reported = reported[np.argsort(-score[reported], kind="stable")][: self.max_findings]
        for i in reported.tolist():
            mine = rows[line_of == i]
            emit(self._finding(int(lines[i]) << LINE_SHIFT, mine, closed.start_ns, now_ns))

    def _finding(self, line: int, rows: Array, start_ns: int, end_ns: int) -> FalseSharingFinding:
        """One reported line from its (cpu, pid) rows, joined to its data object."""
        pids = _per(rows["pid"], rows["hits"])
        found = self._object(rows, [p for p, _ in pids])
        return FalseSharingFinding(
            line=line,
            score=float(rows["hits"].sum()),
            cpus=_per(rows["cpu"], rows["hits"]),
            pids=pids,
            window_start_ns=start_ns,
            window_end_ns=end_ns,
            last_ns=int(rows["last_ns"].max()),
            **found,
        )

    def _object(self, rows: Array, pids: Sequence[int]) -> dict[str, Any]:
        """The first registered object holding a sampled address of the line, asked
        for the processes with most samples first (objects are per process)."""
        if self.objects is None:
            return {}
        for pid in pids:
            for addr in np.unique(rows["addr"][rows["pid"] == pid]).tolist():
                object_id = self.objects.data_object_id(pid, addr)
                obj = self.objects.data_object(object_id) if object_id else None
                if obj is not None:
                    return {
                        "data_object": obj.name,
                        "data_object_id": obj.object_id,
                        "data_object_pid": obj.pid,
                    }
        return {}


def _sharers(line_of: Array, who: Array, hits: Array, min_hits: int, lines: int) -> Array:
    """Per line, how many distinct `who` (cpus or pids, 32 bits) have min_hits
    samples on it; (line, who) packed into one integer to group them."""
    pair = (line_of.astype(np.uint64) << np.uint64(32)) | who.astype(np.uint64)
    uniq, inv = np.unique(pair, return_inverse=True)
    per = np.bincount(inv, weights=hits, minlength=len(uniq))
    hot = (uniq[per >= min_hits] >> np.uint64(32)).astype(np.int64)
    out: Array = np.bincount(hot, minlength=lines)
    return out


def _per(who: Array, hits: Array) -> tuple[tuple[int, int], ...]:
    """(who, samples) summed per distinct value, most samples first, then by value."""
    ids, inv = np.unique(who, return_inverse=True)
    sums = np.rint(np.bincount(inv, weights=hits)).astype(np.int64)
    order = np.lexsort((ids, -sums))
    return tuple(zip(ids[order].tolist(), sums[order].tolist(), strict=True))
