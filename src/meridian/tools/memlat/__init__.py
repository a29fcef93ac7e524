"""meridian memlat: page-fault handling latency (docs/requirements/memlat-runqlat.md),
t_exit - t_entry matched per thread, as log2 histograms per minor/major fault and, with
-P, per process.

The kernel counts into a per-CPU hash map keyed by (pid, kind, comm); every view here
is a sum over it. Intervals are differences of two snapshots, so no sample is lost to
a read-then-clear race. `meridian memlat validate` runs the on/off experiment
(docs/requirements/memlat-runqlat.md, "Validation").
A latency tool: what it shares with runqlat is in `meridian.latency`.

  model.py     options, the (pid, kind, comm) key, snapshots, summaries with the tail
  kernel.py    the session: strategies, perf-event exits, the map reads
  views.py     text and JSON reports
  metrics.py   the exported series
  validate.py  the on/off experiment with the page-touch workload
  cli.py       the command line
"""

from .cli import add_parser, run
from .kernel import FROM_EXCEPTION, FROM_HANDLE_MM_FAULT, STRATEGIES, Memlat
from .model import Options

__all__ = [
    "FROM_EXCEPTION",
    "FROM_HANDLE_MM_FAULT",
    "STRATEGIES",
    "Memlat",
    "Options",
    "add_parser",
    "run",
]
