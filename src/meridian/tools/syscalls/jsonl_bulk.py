"""Raw kernel records to the JSON lines of a recording in bulk, byte for byte what
`Recorder.write()` makes of each decoded row, without a row, a dict or a `dumps()` per
event. A line is `{"i":I` P1 `T` P2 `P` P3 `K` P4: the four per-event numbers (index,
wall time, pid, tid) and text between them that depends only on the rest of the
record, which a traced program repeats (the same few calls on the same paths). So the
text is made once per distinct content (`ByContent`) from the row's own line, the
numbers are printed a column at a time, and the lines of a batch are joined once
(`json_columns`). A batch whose text could not be cut that way (the JSON encoder
laid the line out otherwise) is written row by row, as before."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...json_columns import Piece, gather, join_lines, numbers
from .event import Syscall
from .recording_file import json_line
from .ring_records import ByContent, Frames, decode_frames

__all__ = ["JsonLines", "template"]

Template = tuple[str, ...]  # P1..P4; () when the line cannot be cut into them
_CUTS = ("t", "p", "k")  # the keys of the numbers after the index, in line order


def template(sc: Syscall) -> Template:
    """The text between the per-event numbers of `sc`'s own line, cut out of it: the
    line opens with its index, and each other number follows its key (`,"t":`),
    whose first occurrence is the key itself (inside a JSON string a quote is always
    escaped). () if the line is not laid out so."""
    line = json_line(sc)
    head = f'{{"i":{sc.index},'
    if not line.startswith(head):
        return ()
    pieces = []
    at = len(head) - 1
    for key, num in zip(_CUTS, (sc.timestamp_ns, sc.pid, sc.tid), strict=True):
        mark = f',"{key}":'
        cut = line.find(mark, at)
        text = str(num)
        end = cut + len(mark) + len(text)
        if cut < 0 or line[cut + len(mark) : end] != text or line[end : end + 1] != ",":
            return ()
        pieces.append(line[at : cut + len(mark)])
        at = end
    pieces.append(line[at:])
    return tuple(pieces)


class JsonLines:
    """The JSON lines of raw records, a batch at a time; the text between the numbers
    is remembered across batches (ByContent's bound)."""

    def __init__(self) -> None:
        self._contents: ByContent[Template] = ByContent(template)

    def lines(
        self,
        fr: Frames,
        dtype: np.dtype[Any],
        wall_offset_ns: int,
        start: int = 0,
        stop: int | None = None,
    ) -> bytes:
        """Records `start`..`stop` of `fr` as JSON lines."""
        b = self._contents.batch(fr, dtype, start, stop)
        n = len(b.ids)
        if not n:
            return b""
        if not all(b.made):  # not cut into pieces: row by row
            rows = decode_frames(fr, dtype, wall_offset_ns, start, stop)
            return "".join([json_line(sc) for sc in rows]).encode()
        h = b.heads
        cols = (h["index"], None, h["pid"], h["tid"])
        ids = np.asarray(b.ids, dtype=np.intp)
        texts = [[t[k] for t in b.made] for k in range(4)]  # P1..P4 per content
        cur = ['{"i":'] * len(b.made)  # the text before the next number, per content
        pieces: list[Piece] = []
        for k, col in enumerate(cols):
            num = _times(h["ts_ns"], wall_offset_ns) if col is None else numbers(col)
            if isinstance(num, str):  # one value in the batch: into the text around it
                cur = [c + num + t for c, t in zip(cur, texts[k], strict=True)]
            else:
                pieces += [gather(cur, ids), num]
                cur = texts[k]
        pieces.append(gather(cur, ids))
        return join_lines(pieces, n).encode()


def _times(ts: np.ndarray[Any, Any], offset: int) -> Piece:
    """CLOCK_MONOTONIC ns plus `offset` (to wall time), in int64 when that is exact."""
    lo, hi = int(ts.min()), int(ts.max())
    fits = -(1 << 63) <= offset < 1 << 63 and hi < 1 << 63
    if fits and lo + offset >= -(1 << 63) and hi + offset < 1 << 63:
        return numbers(ts.astype(np.int64) + np.int64(offset))
    return [str(t + offset) for t in ts.tolist()]
