"""The terminal UI of `meridian syscalls` (Textual, the `tui` extra): a live table of
calls (compact) or events (full), a filter box with highlighted matches, jumps between
a start and its end, next error, pause, a details pane, the calls still in progress
and a status bar with the event rate and the drops. Keyboard only; the footer shows
the bindings.

The app reads events from a `Feed` (the kernel capture, or a recording) and pushes
them through the same model as the plain views.

The table is virtual (`tui_table.CallTable`, a Line API ScrollView): it holds no rows,
only a row count, and renders the lines on screen from the filtered view when they
are painted, so appending, filtering or toggling costs nothing per row kept. Memory is
bounded by `max_rows`: past it, the oldest events leave the in-memory log (they are
in the -w recording, if any) and the status bar says how many.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.timer import Timer
from textual.widgets import Footer, Input, Static

from .compact import CompactLog
from .event import Syscall
from .filtered import FilteredLog
from .filters import Filter, Match, TextFilter, all_of
from .full_log import Aggregator, Source
from .render import fmt_duration, fmt_time, result_cell
from .tui_table import COLUMNS, CallTable

__all__ = ["HIGHLIGHT", "Feed", "ListFeed", "SyscallsApp", "highlighted"]

# column -> the model field whose text it shows (filter spans are per field)
_FIELD = {
    "#": "index",
    "process": "comm",
    "syscall": "name",
    "arguments": "arguments",
    "result": "result",
}
HIGHLIGHT = "bold black on yellow"
FILTER_AT_ONCE = 5_000  # rows: filter at each key up to this, past it once typing pauses
FILTER_DELAY = 0.25  # seconds without a key before a large log is filtered


class Feed(Protocol):
    """Where events come from: `poll()` returns the new ones, `counters()` the drops."""

    def poll(self) -> list[Syscall]: ...

    def counters(self) -> dict[str, int]: ...


class ListFeed:
    """A recording (or any list): everything at the first poll."""

    def __init__(self, events: list[Syscall]) -> None:
        self._events = events

    def poll(self) -> list[Syscall]:
        out, self._events = self._events, []
        return out

    def counters(self) -> dict[str, int]:
        return {}


def highlighted(text: str, field: str, matches: list[Match]) -> Text:
    """The cell text with exactly the filter's spans of this field highlighted."""
    t = Text(text)
    for m in matches:
        if m.field == field:
            t.stylize(HIGHLIGHT, m.start, m.start + m.length)
    return t


class SyscallsApp(App[None]):
    CSS = """
    #main { height: 1fr; }
    #table { width: 3fr; }
    #side { width: 1fr; min-width: 30; }
    #details { height: 1fr; border: round $primary; }
    #progress { height: 1fr; border: round $secondary; }
    #filter { display: none; }
    #filter.shown { display: block; }
    #status { height: 1; background: $panel; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "toggle_compact", "Compact/full"),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "close_filter", "Close filter", show=False),
        Binding("j", "jump", "Start<->end"),
        Binding("e", "next_error", "Next error"),
        Binding("p", "pause", "Pause"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        feed: Feed,
        live: bool = True,
        flt: Filter | None = None,
        max_rows: int = 0,
        spill: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`max_rows`: events kept in memory (0: all); `spill`: the recording that
        holds every event, named in the status bar when older ones leave memory;
        `clock`: the status bar rate's (a test holds it still)."""
        super().__init__()
        self.feed = feed
        self.live = live
        self.max_rows = max_rows
        self.spill = spill
        self.dropped = 0  # events that left memory
        self.agg = Aggregator()
        self.compact_log = CompactLog(self.agg.log)
        self.compact = True
        self.paused = False
        self.base_filter = flt
        self.text_filter: TextFilter | None = None
        self._applied: TextFilter | None = None  # the text filter the view has
        self._filter_timer: Timer | None = None
        self.view = self._new_view()
        self._dirty = True
        self.events = 0
        self._held: list[Syscall] = []  # events arrived while paused
        self._clock = clock
        self._rate_events = 0
        self._rate_t = clock()
        self.rate = 0.0
        self.warning: str | None = None  # shown once the screen is up (a damaged recording)

    # ---- layout ------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter (lower case: any case; /re/ for a regex)", id="filter")
        with Horizontal(id="main"):
            yield CallTable(self.cells, id="table")
            with Vertical(id="side"):
                yield Static("", id="details")
                yield Static("", id="progress")
        yield Static("", id="status")
        yield Footer()

    @property
    def table(self) -> CallTable:
        return self.query_one(CallTable)

    def on_mount(self) -> None:
        table = self.table
        self.query_one("#details", Static).border_title = "details"
        self.query_one("#progress", Static).border_title = "in progress"
        self.tick()
        self.set_interval(0.05, self.tick)
        table.focus()
        if self.warning:
            self.notify(self.warning, severity="error", timeout=30)

    # ---- the model -----------------------------------------------------------------

    @property
    def source(self) -> Source:
        return self.compact_log if self.compact else self.agg.log

    def _filter(self) -> Filter | None:
        return all_of([self.base_filter, self.text_filter])

    def _new_view(self) -> FilteredLog:
        view = FilteredLog(self.source, self._filter())
        view.on_change(self._changed)
        return view

    def _changed(self, what: str, row: int) -> None:
        self._dirty = True
        if what == "dropped":  # `row` rows left the front: keep the cursor on its call
            with contextlib.suppress(NoMatches):
                table = self.table
                table.cursor_row = max(table.cursor_row - row, 0)
                table.scroll_to(y=max(table.scroll_y - row, 0), animate=False, immediate=True)

    def tick(self) -> None:
        with contextlib.suppress(NoMatches):  # a timer firing while the screen is torn down
            self._tick()

    def _tick(self) -> None:
        new = self.feed.poll()
        self.events += len(new)
        if self.paused:  # held back: the table (rendered from the model) stays as it is
            self._held.extend(new)
            new = []
        elif self._held:
            new, self._held = self._held + new, []
        for sc in new:
            self.agg.add(sc)
        if self.max_rows and len(self.agg.log) - self.agg.log.first > self.max_rows:
            self.trim()
        self._rate_events += len(new)
        now = self._clock()
        if now - self._rate_t >= 1.0:
            self.rate = self._rate_events / (now - self._rate_t)
            self._rate_events, self._rate_t = 0, now
        if self._dirty and not self.paused:
            self.refresh_table()
        self.refresh_side()

    # ---- rendering -----------------------------------------------------------------

    def cells(self, row: int) -> list[Text]:
        sc = self.view[row]
        matches = self.view.matches(row)
        texts = {
            "#": str(sc.index),
            "time": fmt_time(sc.timestamp_ns),
            "process": sc.comm,
            "pid:tid": f"{sc.pid}:{sc.tid}",
            "syscall": sc.name if sc.is_start or self.compact else f"{sc.name} (end)",
            "arguments": sc.arguments,
            "result": result_cell(sc),
            "duration": fmt_duration(sc.duration_ns),
        }
        out = []
        for col in COLUMNS:
            field = _FIELD.get(col, "")
            t = highlighted(texts[col], field, matches)
            if col == "pid:tid":  # pid and tid spans, shifted into "pid:tid"
                pid = str(sc.pid)
                for m in matches:
                    if m.field == "pid":
                        t.stylize(HIGHLIGHT, m.start, m.start + m.length)
                    elif m.field == "tid":
                        off = len(pid) + 1 + m.start
                        t.stylize(HIGHLIGHT, off, off + m.length)
            if col == "result" and sc.failed:
                t.stylize("red")
            out.append(t)
        return out

    def refresh_table(self) -> None:
        """The table shows the filtered view: only its row count is set here; the
        lines on screen are rendered from the view when painted."""
        table = self.table
        n = len(self.view)
        at_end = table.cursor_row >= table.row_count - 1
        table.set_row_count(n)
        if at_end and n and self.live and not self.paused:
            table.move_cursor(n - 1)  # follow the tail while the cursor is on it
        self._dirty = False

    def trim(self) -> None:
        """Bound memory: past `max_rows` events, the oldest tenth leaves memory (the
        log, the compact log and the view drop their front: the cost is what is
        dropped). A call open across the cut loses its start. They are in the
        recording (`spill`) when recording."""
        log = self.agg.log
        held = len(log) - log.first
        cut = len(log) - self.max_rows * 9 // 10
        self.agg.drop_before(cut)
        self.dropped += held - (len(log) - log.first)
        self._dirty = True

    def refresh_side(self) -> None:
        table = self.table
        details = self.query_one("#details", Static)
        if 0 <= table.cursor_row < len(self.view):
            sc = self.view[table.cursor_row]
            lines = [
                f"#{sc.index}  {sc.name}",
                f"time     {fmt_time(sc.timestamp_ns)}",
                f"process  {sc.comm} ({sc.pid}:{sc.tid})",
            ]
            lines += [f"arg{i}     {a}" for i, a in enumerate(sc.args)]
            if sc.fd_path:
                lines.append(f"fd path  {sc.fd_path}")
            lines.append(f"result   {result_cell(sc) or '-'}")
            if sc.duration_ns >= 0:
                lines.append(f"duration {fmt_duration(sc.duration_ns)}")
            lines.append(f"start #{sc.start_index}  end #{sc.end_index}")
            details.update("\n".join(lines))
        else:
            details.update("")
        now_ns = time.time_ns() if self.live else self._last_ts()
        progress = [
            f"{sc.comm}({sc.tid}) {sc.name} {max(now_ns - sc.timestamp_ns, 0) // 1000}us"
            for sc in self.agg.open_calls()[-20:]
        ]
        self.query_one("#progress", Static).update("\n".join(progress))
        c = self.feed.counters()
        status = (
            f" {'compact' if self.compact else 'full'} | {len(self.view)}/"
            f"{len(self.source) - self.source.first} rows"
            f" | {self.events} events | {self.rate:.0f}/s | lost {c.get('lost', 0)}"
        )
        if c.get("not_shown"):
            status += f" | {c['not_shown']} not shown (screen too slow; in {self.spill})"
        if self.dropped:
            where = f"in {self.spill}" if self.spill else "not recorded: use -w"
            status += f" | {self.dropped} older events dropped from memory ({where})"
        if self.text_filter is not None:
            status += f" | filter: {self.query_one(Input).value}"
        if self.paused:
            status += " | PAUSED"
        self.query_one("#status", Static).update(status)

    def _last_ts(self) -> int:
        rows = self.agg.log.rows
        return rows[-1].timestamp_ns if rows else 0

    # ---- actions -------------------------------------------------------------------

    def _rebuild(self, keep_index: int | None = None) -> None:
        self.view.close()
        self.view = self._new_view()
        self.refresh_table()
        if keep_index is not None:
            self.goto_index(keep_index)
        self.refresh_side()

    def selected(self) -> Syscall | None:
        row = self.table.cursor_row
        return self.view[row] if 0 <= row < len(self.view) else None

    def goto_index(self, index: int) -> bool:
        """Move the cursor to the row showing event `index` (or the call holding it)."""
        row = self._row_of_index(index)
        if row < 0:
            return False
        self.table.move_cursor(row)
        return True

    def _row_of_index(self, index: int) -> int:
        """Row of event `index` in the view (in the compact log, the call holding it);
        a bisection over the source positions, not a scan of the rows."""
        pos = self.compact_log.row_of_index(index) if self.compact else self.agg.log.position(index)
        return self.view.row_of(pos) if pos >= 0 else -1

    def action_toggle_compact(self) -> None:
        sc = self.selected()
        self.compact = not self.compact
        self._rebuild(sc.index if sc else None)

    def action_filter(self) -> None:
        box = self.query_one(Input)
        box.add_class("shown")
        box.focus()

    def action_close_filter(self) -> None:
        box = self.query_one(Input)
        box.remove_class("shown")
        self.table.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        value = event.value
        old = self.text_filter
        if not value:
            self.text_filter = None
        else:
            regex = len(value) > 2 and value.startswith("/") and value.endswith("/")
            try:
                self.text_filter = TextFilter(value[1:-1] if regex else value, regex)
            except Exception:  # an incomplete regex while typing: keep the last one
                return
        if self._filter_timer is not None:
            self._filter_timer.stop()
            self._filter_timer = None
        else:
            self._applied = old
        if len(self.source) <= FILTER_AT_ONCE:
            self._apply_filter()
        else:  # a large log: filter once typing pauses, not at every key
            self._filter_timer = self.set_timer(FILTER_DELAY, self._apply_filter)

    def _apply_filter(self) -> None:
        self._filter_timer = None
        new, old = self.text_filter, self._applied
        self._applied = new
        if new is not None and new.narrows(old):
            # typing on: only the rows shown can still match
            self.view.narrow(self._filter())
            self.refresh_table()
            self.refresh_side()
            return
        self._rebuild()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_close_filter()

    def on_call_table_row_highlighted(self, event: Any) -> None:
        with contextlib.suppress(NoMatches):
            self.refresh_side()

    def action_jump(self) -> None:
        """From a start to its end and back (full log); in the compact log, from a
        call to the same call in the full log is one row: toggle to full to see both."""
        sc = self.selected()
        if sc is None:
            return
        other = sc.end_index if sc.is_start and not self.compact else sc.start_index
        if self.compact:
            other = sc.end_index if sc.start_index == sc.index else sc.start_index
            self.compact = False
            self._rebuild()
        if other >= 0 and not self.goto_index(other):
            self.notify(f"#{other} is filtered out", severity="warning")
        elif other < 0:
            self.notify("the other half of this call was not seen", severity="warning")

    def action_next_error(self) -> None:
        table = self.table
        for row in range(table.cursor_row + 1, len(self.view)):
            if self.view[row].failed:
                table.move_cursor(row)
                return
        self.notify("no failed call below", severity="information")

    def action_pause(self) -> None:
        """Freeze the table (capture goes on; events are held and shown on resume)."""
        self.paused = not self.paused
        if not self.paused:
            self._tick()
        self.refresh_side()
