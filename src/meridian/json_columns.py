"""JSON lines built column by column instead of through a dict per event: a number
column is printed in one call, and the lines of a batch are laid out from pieces (a
constant text, or one text per event) and joined once. What every tool that writes a
million lines a second needs (io's event stream, syscalls' recordings)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Piece", "gather", "join_lines", "number_texts", "numbers"]

Piece = str | list[str]  # constant text, or one string per event

try:
    import orjson

    _NUMPY = orjson.OPT_SERIALIZE_NUMPY

    def number_texts(col: np.ndarray[Any, Any]) -> list[str]:
        """The decimal text of each number of an integer column."""
        text: bytes = orjson.dumps(np.ascontiguousarray(col), option=_NUMPY)
        return text[1:-1].decode().split(",")

except ImportError:  # the json extra is optional: the same output, slower

    def number_texts(col: np.ndarray[Any, Any]) -> list[str]:
        """The decimal text of each number of an integer column."""
        return list(map(str, col.tolist()))


def numbers(col: np.ndarray[Any, Any]) -> Piece:
    """An integer column as a piece: one text when it holds one value (folded into
    the constant text around it), else one text per event."""
    lo, hi = col.min(), col.max()
    return str(int(lo)) if lo == hi else number_texts(col)


def gather(texts: list[str], ids: np.ndarray[Any, Any]) -> Piece:
    """Per event, the text of its group (`ids`: each event's index into `texts`, the
    texts made once per distinct content); one text when there is one group."""
    if len(texts) == 1:
        return texts[0]
    table = np.empty(len(texts), dtype=object)
    table[:] = texts
    out: list[str] = table[ids].tolist()
    return out


def join_lines(pieces: list[Piece], n: int) -> str:
    """Lines of `n` events from pieces in order; adjacent constants are merged, laid
    out by list multiplication, and per-event pieces dropped in by slice assignment."""
    merged: list[Piece] = []
    for p in pieces:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    k = len(merged)
    if k == 1:
        return str(merged[0]) * n
    out: list[str] = [p if isinstance(p, str) else "" for p in merged] * n
    for i, p in enumerate(merged):
        if not isinstance(p, str):
            out[i::k] = p
    return "".join(out)
