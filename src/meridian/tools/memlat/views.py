"""memlat's reports: a histogram per kind (minor, major), per process with -P, each
with its tail line; in JSON also the total and the faults lost."""

from __future__ import annotations

from typing import Any, TextIO

from ...latency import Group, print_groups, print_lost, report_head
from .model import KINDS, Options, Snapshot, Summary

__all__ = ["report_json", "report_text"]


def _groups(snap: Snapshot, opts: Options) -> list[Group[Summary]]:
    """Each histogram shown: per kind, and per process with -P, busiest process first."""
    out: list[Group[Summary]] = []
    if opts.per_process:
        procs = sorted(
            {(p, c) for (p, _, c) in snap.cells},
            key=lambda pc: (
                -sum(cell.count for (p, _, c), cell in snap.cells.items() if (p, c) == pc)
            ),
        )
        for pid, comm in procs:
            for kind, name in enumerate(KINDS):
                cells = [
                    c for (p, k, cm), c in snap.cells.items() if (p, k, cm) == (pid, kind, comm)
                ]
                if cells:
                    out.append(
                        Group(
                            f"pid = {pid}, comm = {comm}, kind = {name}",
                            Summary.of(cells, opts.unit),
                            {"pid": pid, "comm": comm, "kind": name},
                        )
                    )
    else:
        for kind, name in enumerate(KINDS):
            s = snap.total(opts.unit, kind=kind)
            if s.count:
                out.append(Group(f"kind = {name}", s, {"kind": name}))
    return out


def report_json(snap: Snapshot, opts: Options, strategy: str = "") -> dict[str, Any]:
    return {
        **report_head(snap, opts, strategy, _groups(snap, opts), lambda s: s.as_dict(opts)),
        "from": opts.start,
        "total": snap.total(opts.unit).as_dict(opts),
        "lost": snap.lost(),
    }


def report_text(snap: Snapshot, opts: Options, out: TextIO) -> None:
    groups = _groups(snap, opts)
    print_groups(groups, opts, out, "no page faults in this interval", lambda s: s.tail_line(opts))
    if len(groups) > 1:
        print(f"\nall faults: {snap.total(opts.unit).tail_line(opts)}", file=out)
    print_lost(snap.lost(), out)
