"""meridian sentinel: PMU samples attributed to network flows (seed 003, MicroSentinel).

One module per concept: records, events, flows, kernel (the kernel session),
stackmaps (its two stack maps in turn) and mock (the synthetic source); clock, skew,
targets, interference, aggregator (the pipeline); symbolizer, with frames, symcache
(bounded caches, interning), procview (process views) and dataobjects; config,
modes, rotator, anomaly, metrics (control and export); agent (the threads' start and
stop), state (what they share), consumer, flush, control (the control methods) and
resolver (ids and names at a bounded cost); api_server, api and api_models (the HTTP
control plane on those methods); runtime (the command's run and summary), view
(what people see) and cli (the command line); storage (ClickHouse), query, query_cli
and flamegraph (`meridian sentinel query`).
"""

from __future__ import annotations

from .cli import add_parser, run
from .sources.kernel import STRATEGIES

__all__ = ["STRATEGIES", "add_parser", "run"]
