"""Small output helpers every tool shares: JSON lines, tables, sizes, times."""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["JsonWriter", "dumps", "fmt_bytes", "iso_now", "print_table"]


def _std_dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


try:
    import orjson

    def dumps(obj: Any) -> str:
        try:
            return str(orjson.dumps(obj).decode())
        except orjson.JSONEncodeError:
            # A path that is not UTF-8 arrives with surrogate escapes, which orjson
            # refuses; the standard encoder writes them as \udcXX escapes.
            return _std_dumps(obj)

except ImportError:  # the json extra is optional
    dumps = _std_dumps


class JsonWriter:
    """One JSON object per line, flushed per write."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, obj: Any) -> None:
        self.out.write(dumps(obj) + "\n")
        self.out.flush()


def iso_now(ns: int | None = None) -> str:
    """ISO-8601 local time with microseconds, for people reading logs."""
    ns = time.time_ns() if ns is None else ns
    return _dt.datetime.fromtimestamp(ns / 1e9).astimezone().isoformat(timespec="microseconds")


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5K', 4096 -> '4K' (powers of 1024, as block sizes are)."""
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            text = f"{n:.1f}".rstrip("0").rstrip(".")
            return f"{text}{unit}"
        n /= 1024
    return str(n)


def fmt_scaled(x: float) -> str:
    """1234567 -> 1.23M, 12345 -> 12.3K, 12.3 -> 12.3."""
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}K"
    return f"{x:.1f}"


def print_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    out: TextIO,
    numeric: Sequence[int] | None = None,
) -> None:
    """Columns in `numeric` right-aligned (default: all but the first), the others
    left-aligned, like bcc's tables."""
    right = range(1, len(header)) if numeric is None else numeric
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(line(header), file=out)
    for r in rows:
        print(line(r), file=out)
