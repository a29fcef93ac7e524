"""The call table of the `meridian syscalls` terminal UI (Textual): a virtual table
that holds no rows, only a row count, and renders the lines on screen from a
`cells(row)` function when they are painted, so appending, filtering or toggling
costs nothing per row kept."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.coordinate import Coordinate
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

__all__ = ["COLUMNS", "CallTable"]

COLUMNS = ("#", "time", "process", "pid:tid", "syscall", "arguments", "result", "duration")
# Column widths; "arguments" takes what the others leave (at least its minimum).
WIDTHS = {
    "#": 7,
    "time": 15,
    "process": 12,
    "pid:tid": 12,
    "syscall": 12,
    "arguments": 30,
    "result": 12,
    "duration": 9,
}
HEADER_STYLE = Style(bold=True, color="bright_white", bgcolor="grey23")
CURSOR_STYLE = Style(color="black", bgcolor="cyan")
ZEBRA_STYLE = Style(bgcolor="grey11")


class CallTable(ScrollView, can_focus=True):
    """A virtual table: `row_count` rows whose cells come from `cells(row)` only when
    painted. A header line, a row cursor moved with the arrow and page keys, and a
    `RowHighlighted` message when the cursor moves."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First", show=False),
        Binding("end", "edge(1)", "Last", show=False),
    ]

    class RowHighlighted(Message):
        def __init__(self, row: int) -> None:
            super().__init__()
            self.cursor_row = row

    def __init__(self, cells: Any, id: str | None = None) -> None:
        super().__init__(id=id)
        self._cells = cells  # row -> list[Text], one per column
        self.row_count = 0
        self.cursor_row = 0

    # ---- the data ----------------------------------------------------------------

    def set_row_count(self, n: int) -> None:
        self.row_count = n
        if self.cursor_row >= n:
            self.cursor_row = max(n - 1, 0)
        self.virtual_size = Size(self._total_width(), n + 1)
        self.refresh()

    def get_cell_at(self, coord: Coordinate) -> Text:
        cells: list[Text] = self._cells(coord.row)
        return cells[coord.column]

    def move_cursor(self, row: int) -> None:
        row = min(max(row, 0), max(self.row_count - 1, 0))
        changed = row != self.cursor_row
        self.cursor_row = row
        self._scroll_to_cursor()
        self.refresh()
        if changed:
            self.post_message(self.RowHighlighted(row))

    def _scroll_to_cursor(self) -> None:
        height = max(self.scrollable_content_region.height - 1, 1)
        top = round(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + height:
            self.scroll_to(y=self.cursor_row - height + 1, animate=False, immediate=True)

    # ---- keys --------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        page = max(self.scrollable_content_region.height - 2, 1)
        self.move_cursor(self.cursor_row + direction * page)

    def action_edge(self, last: int) -> None:
        self.move_cursor(self.row_count - 1 if last else 0)

    # ---- rendering ---------------------------------------------------------------

    def _widths(self) -> list[int]:
        fixed = sum(w for c, w in WIDTHS.items() if c != "arguments") + len(WIDTHS) - 1
        args = max(WIDTHS["arguments"], self.scrollable_content_region.width - fixed)
        return [args if c == "arguments" else WIDTHS[c] for c in COLUMNS]

    def _total_width(self) -> int:
        return sum(self._widths()) + len(COLUMNS) - 1

    def _line(self, texts: list[Text], style: Style) -> Strip:
        line = Text(no_wrap=True, overflow="crop")
        for i, (t, w) in enumerate(zip(texts, self._widths(), strict=True)):
            if i:
                line.append(" ")
            cell = t.copy()
            cell.truncate(w, overflow="ellipsis", pad=True)
            line.append_text(cell)
        segments = list(line.render(self.app.console))
        strip = Strip(segments).apply_style(style)
        return strip

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        scroll_x = round(self.scroll_x)
        if y == 0:
            strip = self._line([Text(c) for c in COLUMNS], HEADER_STYLE)
        else:
            row = round(self.scroll_y) + y - 1
            if row >= self.row_count:
                return Strip([Segment(" " * width)])
            style = CURSOR_STYLE if row == self.cursor_row else ZEBRA_STYLE if row % 2 else Style()
            strip = self._line(self._cells(row), style)
        return strip.crop_extend(scroll_x, scroll_x + width, None)

    def on_resize(self) -> None:
        self.virtual_size = Size(self._total_width(), self.row_count + 1)
