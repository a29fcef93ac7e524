"""Detectors over the sampled stream (docs/requirements/sentinel.md §5.3, §6.3): base
(the interface, findings, the registry), window (counts per key and window, in numpy),
false_sharing (HITM samples per cache line) and remote_dram (remote-DRAM samples per
flow, NUMA node and interface).

Every module of this package is imported by `detector_types()`, and each registers
its detector (`@register`): a new detector is one new module, and for its thresholds
to be configurable a section of the config named as it (config/schema.py), whose keys
are its constructor's keyword arguments.
A detector module imports only this package, `..records` and `..dataobjects` (the
runtime imports it, so anything else risks a cycle the import test cannot see here).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, Detector, DetectorContext, Emit, Finding

__all__ = ["Detector", "DetectorContext", "Emit", "Finding", "create_all", "detector_types"]


def detector_types() -> dict[str, type[Detector]]:
    """Every registered detector by name, after importing each module of the package."""
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{mod}")
    return dict(sorted(REGISTRY.items()))


def create_all(ctx: DetectorContext) -> list[Detector]:
    """One of each registered detector, with the thresholds `ctx` sets for it."""
    return [cls.create(ctx) for cls in detector_types().values()]
