"""meridian runqlat: run-queue latency histograms (docs/requirements/memlat-runqlat.md,
"Next steps"), like bcc's runqlat: the time from a wake-up or a preemption until the
task runs on a CPU.

The kernel counts into a per-CPU hash map keyed by (pid, comm) (pid 0 unless -P);
intervals are differences of two snapshots. `meridian runqlat validate` runs an on/off
experiment: one busy process, then more busy processes than cores. A latency tool:
what it shares with memlat is in `meridian.latency`.

  model.py     options (-m) and the (pid, comm) key
  kernel.py    the session: strategies and the map reads
  views.py     text and JSON reports
  metrics.py   the exported series
  validate.py  the on/off experiment with the spin workload
  cli.py       the command line
"""

from .cli import add_parser, run
from .kernel import STRATEGIES, Runqlat
from .model import Options

__all__ = ["STRATEGIES", "Options", "Runqlat", "add_parser", "run"]
