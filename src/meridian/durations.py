"""Durations as people write them (`250ms`, `2s`, `10m`, `1h`, or plain seconds), read
the same way by every config key and flag that takes one."""

from __future__ import annotations

import re

__all__ = ["DURATION_HINT", "parse_duration"]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*([-+]?[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ns|us|µs|ms|s|m|h)?\s*$")
DURATION_HINT = "expected seconds or a duration such as 250ms, 2s, 1m"


def parse_duration(value: object) -> float:
    """Seconds from a number or a string with a unit; ValueError(DURATION_HINT) else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and (m := _DURATION_RE.match(value)):
        return float(m.group(1)) * _UNITS[m.group(2) or "s"]
    raise ValueError(DURATION_HINT)
