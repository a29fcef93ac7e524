"""meridian syscalls: the Mortadelo file-system syscall viewer
(docs/requirements/syscalls.md).

The kernel program sends each traced call as two events, a start (arguments, paths,
the path of an fd argument) and an end (the result); the model pairs them
(Aggregator), merges them (CompactLog) and filters them (FilteredLog). Views:
strace-like plain lines, the full log, JSON lines, a terminal UI, a recording (-w)
that replays (-r) through the same model.

One concept per module; the imports go down this list, never up:
    cli             the command line: parser, checks, `run` picking the view
    capture         the live loops: plain (`capture`) and the TUI's feed (`CaptureFeed`)
    tui             the terminal UI (Textual, the `tui` extra); tui_table its call table
    plain_view      the plain views (compact, full, JSON lines), the summary, replay
    summary         -c: calls, errors and time per syscall, counted as strace -c counts
    view_backlog    raw records drained but not shown yet, when recording
    launcher        `-- COMMAND`: the child held stopped until the kernel traces it, run
                    in the environment the tool started with
    kernel          the Session (`Capture`), the strategies and the per-syscall table
    jsonl_spool     -w FILE.jsonl: raw records spooled, converted when the capture ends
    options         what the user asked (Options) and the filters built from it
    recording_file  record (-w) and replay (-r): JSON lines or raw kernel records
    ring_records    the ring buffer's records: their framing, decoded to Syscall events
    filtered        the FilteredLog over a full or compact log
    filters         filters and their GetMatches() spans
    render          an event as text: timestamps, durations, fields, lines, JSON objects
    compact         the CompactLog: start+end merged with result and duration
    full_log        the full Log and the Aggregator that pairs starts with ends
    decode          raw arguments and results to text (O_RDONLY|O_CLOEXEC, 0644, -2 ENOENT)
    out_params      out-parameters (fd pairs, stat buffers) as strace prints them
    numbers         x86_64 syscall numbers (_x86_64), the file-system set, name lookup
    signatures      argument kinds per syscall (which are paths, fds, flags, modes)
    event           the Syscall event (one start or end, or a merged compact row)
"""

from __future__ import annotations

from .cli import add_parser, run
from .kernel import STRATEGIES

__all__ = ["STRATEGIES", "add_parser", "run"]
