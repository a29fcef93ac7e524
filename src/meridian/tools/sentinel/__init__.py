"""meridian sentinel: PMU samples attributed to network flows (MicroSentinel,
docs/requirements/sentinel.md).

Sub-packages in layers, each importing only those before it (tests/test_imports.py):
model (plain data), symbols and sources, config, pipeline (samples to rollups),
detectors and storage (plug-ins on rollups), outputs and query, control (what the
control plane asks of a running agent, a Protocol), then api (the control plane,
typed against control) and agent (the runtime and what runs around it, the API
too); cli is the command.
"""

from __future__ import annotations

from .cli import add_parser, run
from .sources.kernel import STRATEGIES

__all__ = ["STRATEGIES", "add_parser", "run"]
