"""meridian biolat: block I/O latency histograms per device and operation, request
sizes, queue depth and slow requests (docs/requirements/biolat.md, exercises 1-4 too).

The kernel counts everything in one hash map keyed by (device, op, kind, size slot);
every view here is a sum over it.

  model.py     options, snapshots (of hist.Cell), the sums over them (rows per disk, op)
  kernel.py    the session: strategies, extra hooks, the map and ring buffer reads
  views.py     text and JSON reports
  records.py   the slow-request records (--slow)
  metrics.py   the exported series
  cli.py       the command line
"""

from .cli import add_parser, run
from .kernel import STRATEGIES, Biolat
from .model import Options

__all__ = ["STRATEGIES", "Biolat", "Options", "add_parser", "run"]
