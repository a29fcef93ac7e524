"""The terminal UI of `meridian syscalls` (Textual, the `tui` extra): a live table of
calls (compact) or events (full), a filter box with highlighted matches, jumps between
a start and its end, next error, pause, a details pane, the calls still in progress
and a status bar with the event rate and the drops. Keyboard only; the footer shows
the bindings.

The app reads events from a `Feed` (the kernel capture, or a recording) and pushes
them through the same model as the plain views.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, ClassVar, Protocol

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import DataTable, Footer, Input, Static

from ..syscalls import Aggregator, CompactLog, FilteredLog, Syscall
from ..syscalls.filters import AllOf, Filter, Match, TextFilter
from ..syscalls.fmt import fmt_duration, fmt_time
from ..syscalls.log import Source

__all__ = ["Feed", "ListFeed", "SyscallsApp"]

COLUMNS = ("#", "time", "process", "pid:tid", "syscall", "arguments", "result", "duration")
# column -> the model field whose text it shows (filter spans are per field)
_FIELD = {
    "#": "index",
    "process": "comm",
    "syscall": "name",
    "arguments": "arguments",
    "result": "result",
}
HIGHLIGHT = "bold black on yellow"


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


def _result(sc: Syscall) -> str:
    if sc.have_result:
        return sc.result_text
    return "?" if sc.is_start and sc.end_index < 0 else ""


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

    def __init__(self, feed: Feed, live: bool = True, flt: Filter | None = None) -> None:
        super().__init__()
        self.feed = feed
        self.live = live
        self.agg = Aggregator()
        self.compact_log = CompactLog(self.agg.log)
        self.compact = True
        self.paused = False
        self.base_filter = flt
        self.text_filter: TextFilter | None = None
        self._rebuild_needed = False
        self._modified: set[int] = set()
        self.view = self._new_view()
        self._dirty = True
        self.events = 0
        self._rate_events = 0
        self._rate_t = time.monotonic()
        self.rate = 0.0

    # ---- layout ------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter (lower case: any case; /re/ for a regex)", id="filter")
        with Horizontal(id="main"):
            yield DataTable(id="table", cursor_type="row", zebra_stripes=True)
            with Vertical(id="side"):
                yield Static("", id="details")
                yield Static("", id="progress")
        yield Static("", id="status")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for col in COLUMNS:
            table.add_column(col, key=col)
        self.query_one("#details", Static).border_title = "details"
        self.query_one("#progress", Static).border_title = "in progress"
        self.tick()
        self.set_interval(0.05, self.tick)
        table.focus()

    # ---- the model -----------------------------------------------------------------

    @property
    def source(self) -> Source:
        return self.compact_log if self.compact else self.agg.log

    def _filter(self) -> Filter | None:
        parts = [f for f in (self.base_filter, self.text_filter) if f is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else AllOf(parts)

    def _new_view(self) -> FilteredLog:
        view = FilteredLog(self.source, self._filter())
        view.on_change(self._changed)
        return view

    def _changed(self, what: str, row: int) -> None:
        self._dirty = True
        if what in ("inserted", "removed"):
            self._rebuild_needed = True
        elif what == "modified":
            self._modified.add(row)

    def tick(self) -> None:
        with contextlib.suppress(NoMatches):  # a timer firing while the screen is torn down
            self._tick()

    def _tick(self) -> None:
        new = self.feed.poll()
        for sc in new:
            self.agg.add(sc)
        self.events += len(new)
        self._rate_events += len(new)
        now = time.monotonic()
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
            "result": _result(sc),
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
        """Rows kept in step with the filtered view: new rows appended, modified rows
        updated in place, a full rebuild when rows were inserted or removed."""
        table = self.query_one(DataTable)
        n = len(self.view)
        keys = [
            str(p) for p in self.view.visible[table.row_count if not self._rebuild_needed else 0 :]
        ]
        if self._rebuild_needed or table.row_count > n:
            cursor = table.cursor_row
            table.clear()
            keys = [str(p) for p in self.view.visible]
            for i in range(n):
                table.add_row(*self.cells(i), key=keys[i])
            if n:
                table.move_cursor(row=min(max(cursor, 0), n - 1))
        else:
            for row in sorted(self._modified):
                if row < table.row_count:
                    key = str(self.view.visible[row])
                    for col, cell in zip(COLUMNS, self.cells(row), strict=True):
                        table.update_cell(key, col, cell)
            at_end = table.cursor_row >= table.row_count - 1
            first = table.row_count
            for i in range(first, n):
                table.add_row(*self.cells(i), key=keys[i - first])
            if at_end and n and self.live:
                table.move_cursor(row=n - 1)  # follow the tail while the cursor is on it
        self._dirty = self._rebuild_needed = False
        self._modified.clear()

    def refresh_side(self) -> None:
        table = self.query_one(DataTable)
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
            lines.append(f"result   {_result(sc) or '-'}")
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
            f" {'compact' if self.compact else 'full'} | {len(self.view)}/{len(self.source)} rows"
            f" | {self.events} events | {self.rate:.0f}/s | lost {c.get('lost', 0)}"
        )
        if self.text_filter is not None:
            status += f" | filter: {self.query_one(Input).value}"
        if self.paused:
            status += " | PAUSED"
        self.query_one("#status", Static).update(status)

    def _last_ts(self) -> int:
        return self.agg.log[len(self.agg.log) - 1].timestamp_ns if len(self.agg.log) else 0

    # ---- actions -------------------------------------------------------------------

    def _rebuild(self, keep_index: int | None = None) -> None:
        self.view = self._new_view()
        self._rebuild_needed = True
        self.refresh_table()
        if keep_index is not None:
            self.goto_index(keep_index)
        self.refresh_side()

    def selected(self) -> Syscall | None:
        row = self.query_one(DataTable).cursor_row
        return self.view[row] if 0 <= row < len(self.view) else None

    def goto_index(self, index: int) -> bool:
        """Move the cursor to the row showing event `index` (or the call holding it)."""
        for row, sc in enumerate(self.view):
            if sc.index == index or (self.compact and index in (sc.start_index, sc.end_index)):
                self.query_one(DataTable).move_cursor(row=row)
                return True
        return False

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
        self.query_one(DataTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        value = event.value
        if not value:
            self.text_filter = None
        else:
            regex = len(value) > 2 and value.startswith("/") and value.endswith("/")
            try:
                self.text_filter = TextFilter(value[1:-1] if regex else value, regex)
            except Exception:  # an incomplete regex while typing: keep the last one
                return
        self._rebuild()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_close_filter()

    def on_data_table_row_highlighted(self, event: Any) -> None:
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
        table = self.query_one(DataTable)
        for row in range(table.cursor_row + 1, len(self.view)):
            if self.view[row].failed:
                table.move_cursor(row=row)
                return
        self.notify("no failed call below", severity="information")

    def action_pause(self) -> None:
        """Freeze the table (capture goes on into the log; nothing is lost)."""
        self.paused = not self.paused
        if not self.paused:
            self.refresh_table()
        self.refresh_side()
