"""The control plane's resources, one router each, in the order of the document."""

from __future__ import annotations

from . import mode, pmu_config, query, status, symbols, targets, token_bucket

__all__ = ["ROUTERS"]

ROUTERS = (
    mode.router,
    token_bucket.router,
    pmu_config.router,
    symbols.router,
    targets.router,
    query.router,
    status.router,
)
