"""Small output helpers every tool shares: JSON lines, tables, sizes, times."""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["JsonWriter", "dumps", "fmt_bytes", "iso_now", "print_table"]

try:
    import orjson

    def dumps(obj: Any) -> str:
        return str(orjson.dumps(obj).decode())

except ImportError:  # the json extra is optional

    def dumps(obj: Any) -> str:
        return json.dumps(obj, separators=(",", ":"))


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


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Left-aligned first column, right-aligned numbers, like bcc's tables."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [cells[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)
        ]
        return "  ".join(parts).rstrip()

    print(line(header), file=out)
    for r in rows:
        print(line(r), file=out)
