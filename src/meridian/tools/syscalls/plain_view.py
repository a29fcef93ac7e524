"""The plain views of `meridian syscalls`: strace-like lines (compact), the full log
(starts and ends with their indices) or JSON lines, each row printed once when it is
complete, or (-c) those rows counted per syscall and the table printed at the end; the
summary line at the end; the replay of a recording (-r) through them."""

from __future__ import annotations

from typing import TextIO

from ...output import dumps
from .compact import CompactLog
from .event import Syscall
from .filtered import FilteredLog
from .full_log import Aggregator, Source
from .jsonl_spool import SpooledJsonRecorder
from .options import Options, build_filter
from .recording_file import Recorder, read_events
from .render import compact_line, full_line, to_json
from .summary import CallCounts, counts_json, counts_table, losses

__all__ = ["Pipeline", "replay", "summary"]


class Pipeline:
    """Events -> Aggregator -> (compact) -> filtered; prints each row once, when it is
    complete (a compact row when its end arrives, a full-log event when it arrives).
    Rows completed by one batch of events are printed at `flush()` in index order, so
    a start row that matches only once its end is in comes before that end. With -c
    each row is counted instead (`counts`), and `print_counts` prints the table."""

    def __init__(self, opts: Options, out: TextIO, replay: bool = False) -> None:
        self.opts = opts
        self.out = out
        self.filter = build_filter(opts, replay)
        self._printed: set[int] = set()
        self._ready: list[Syscall] = []
        self.events = 0
        self.unmatched_ends = 0
        self.counts = CallCounts() if opts.summary else None
        self._build()

    def _build(self) -> None:
        self.agg = Aggregator()
        self.compact: CompactLog | None = None if self.opts.full else CompactLog(self.agg.log)
        source: Source = self.compact if self.compact is not None else self.agg.log
        self.view = FilteredLog(source, self.filter)
        self.view.on_change(self._changed)

    def add(self, sc: Syscall) -> None:
        self.events += 1
        before = self.agg.unmatched_ends
        self.agg.add(sc)
        self.unmatched_ends += self.agg.unmatched_ends - before

    def trim(self) -> None:
        """Bound memory: once the log holds more than --max-rows rows (all printed but
        the open ones), start a fresh log holding only the calls still waiting for
        their end, so later ends still pair with them."""
        if self.opts.max_rows <= 0 or len(self.agg.log) <= self.opts.max_rows:
            return
        self.flush()
        pending = sorted(self.agg.open_calls(), key=lambda sc: sc.index)
        self._printed &= {sc.index for sc in pending}
        self._build()
        for sc in pending:
            self.agg.add(sc)

    def _done(self, sc: Syscall) -> bool:
        return self.opts.full or sc.is_end or sc.no_return

    def _changed(self, what: str, row: int) -> None:
        if what == "removed":
            return
        sc = self.view[row]
        if sc.index in self._printed or not self._done(sc):
            return
        self._printed.add(sc.index)
        self._ready.append(sc)

    def flush(self) -> None:
        self._ready.sort(key=lambda sc: sc.index)
        for sc in self._ready:
            self._print(sc)
        self._ready.clear()
        self.out.flush()

    def _print(self, sc: Syscall) -> None:
        if self.counts is not None:
            self.counts.add(sc)
        elif self.opts.json:
            self.out.write(dumps(to_json(sc)) + "\n")
        elif self.opts.full:
            self.out.write(full_line(sc) + "\n")
        else:
            self.out.write(compact_line(sc) + "\n")

    def finish(self) -> None:
        """Then the rows still open (no end seen), in order."""
        self.flush()
        for sc in self.view:
            if sc.index not in self._printed:
                self._printed.add(sc.index)
                self._ready.append(sc)
        self.flush()

    def print_counts(self, counters: dict[str, int] | None, not_shown: int = 0) -> None:
        """-c: the table of the calls counted, with what the capture lost."""
        if self.counts is None:
            return
        lost = losses(counters, not_shown)
        if self.opts.json:
            self.out.write(dumps(counts_json(self.counts, lost)) + "\n")
        else:
            self.out.write(counts_table(self.counts, lost))
        self.out.flush()


def summary(
    p: Pipeline,
    counters: dict[str, int] | None,
    err: TextIO,
    not_shown: int = 0,
    recorder: Recorder | None = None,
) -> None:
    """The line at the end, on `err`: events, what was recorded, what was lost."""
    parts = [f"{p.events} events", f"{p.unmatched_ends} ends without start"]
    if recorder is not None:
        size = recorder.bytes
        if isinstance(recorder, SpooledJsonRecorder) and recorder.final.exists():
            size = recorder.final.stat().st_size
        parts.insert(0, f"{recorder.count} events recorded ({size} bytes)")
        if p.opts.quiet:
            parts[1:3] = []  # nothing went through the view
    if counters is not None:
        parts.append(f"{counters.get('lost', 0)} lost (ring buffer full)")
        if counters.get("str_failed"):
            parts.append(
                f"{counters['str_failed']} paths unreadable at entry "
                f"({counters.get('str_retried', 0)} read at exit)"
            )
        if counters.get("retry_full"):
            parts.append(f"{counters['retry_full']} path retries not tracked (map full)")
        if counters.get("pids_full"):
            parts.append(f"{counters['pids_full']} child processes not followed (PID set full)")
        if counters.get("bad_records"):
            parts.append(f"{counters['bad_records']} bad records")
    if not_shown:
        parts.append(f"{not_shown} not shown live (view too slow; in the recording)")
    print("meridian syscalls: " + ", ".join(parts), file=err)


def replay(opts: Options, out: TextIO, err: TextIO) -> int:
    assert opts.read is not None
    p = Pipeline(opts, out, replay=True)
    try:
        for n, sc in enumerate(read_events(opts.read), 1):
            p.add(sc)
            if n % 4096 == 0:
                p.flush()
                p.trim()
    finally:
        p.finish()  # a damaged recording: everything before the damage, then the error
    p.print_counts(None)
    if opts.verbose:
        summary(p, None, err)
    return 0
