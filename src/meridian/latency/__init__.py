"""The latency-histogram tool base that memlat and runqlat share (never a tool itself,
and it imports none).

Both time an interval per thread in the kernel and add it to log2 histograms, per
process with -P; both report them the same way and check themselves with an on/off
`validate` experiment. What is the same lives here, each tool keeps what differs:
its probes, its key and its experiment.

  model.py    options, snapshots (of hist.Cell) and their differences, summaries
  kernel.py   the kernel session: set-up of the shared globals and maps, map reads
  views.py    the report frame: groups of histograms, JSON head, losses
  metrics.py  pieces of the exported series
  cli.py      the command line, with `validate`
"""

from ..hist import Cell
from .cli import LatencyCli
from .kernel import LatencySession
from .model import NSLOTS, LatencyOptions, Snapshot, Summary
from .views import Group, print_checks, print_groups, print_lost, report_head

__all__ = [
    "NSLOTS",
    "Cell",
    "Group",
    "LatencyCli",
    "LatencyOptions",
    "LatencySession",
    "Snapshot",
    "Summary",
    "print_checks",
    "print_groups",
    "print_lost",
    "report_head",
]
