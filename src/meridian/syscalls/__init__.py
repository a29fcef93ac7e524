"""The Mortadelo model (seed 002) of `meridian syscalls`, pure Python, no kernel.

One concept per module:
    record      the Syscall record (one start or end event, or a merged compact row)
    numbers     x86_64 syscall numbers, the file-system set, close-match lookup
    signatures  argument kinds per syscall (which are paths, fds, flags, modes)
    decode      raw arguments and results to text (O_RDONLY|O_CLOEXEC, 0644, -2 ENOENT)
    log         the full Log and the Aggregator that pairs starts with ends
    compact     the CompactLog: start+end merged with result and duration
    filters     filters and their GetMatches() spans
    filtered    the FilteredLog over a full or compact log
    fmt         timestamps, durations and one-line renderings
    recording   record (-w) and replay (-r) of events as JSON lines
"""

from __future__ import annotations

from .compact import CompactLog
from .filtered import FilteredLog
from .filters import Filter, Match
from .log import Aggregator, Log
from .record import Syscall

__all__ = ["Aggregator", "CompactLog", "Filter", "FilteredLog", "Log", "Match", "Syscall"]
