"""The Textual UI of `meridian syscalls`, headless with Pilot, on a replayed recording:
compact/full toggle, filter with highlighting, start/end jumps, next error, pause."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textual")

from rich.text import Text
from textual.coordinate import Coordinate
from textual.widgets import Static

from meridian.tools.syscalls.event import Syscall
from meridian.tools.syscalls.recording_file import Recorder, read_events
from meridian.tools.syscalls.tui import HIGHLIGHT, ListFeed, SyscallsApp
from meridian.tools.syscalls.tui_table import COLUMNS, CallTable

T0 = 1_700_000_000_000_000_000


def events() -> list[Syscall]:
    def s(i: int, name: str, args: tuple[str, ...], comm: str = "cat", pid: int = 7) -> Syscall:
        paths = tuple(a.strip('"') for a in args if a.startswith('"'))
        return Syscall(i, name, T0 + i * 1000, comm, pid, pid, args, is_start=True, paths=paths)

    def e(
        i: int, name: str, res: int, text: str, us: int, comm: str = "cat", pid: int = 7
    ) -> Syscall:
        return Syscall(
            i, name, T0 + us * 1000, comm, pid, pid, result=res, result_text=text,
            have_result=True, is_end=True,
        )  # fmt: skip

    return [
        s(0, "openat", ("AT_FDCWD", '"/etc/passwd"', "O_RDONLY")),
        s(1, "stat", ('"/home"', "0x1"), "ls", 8),
        e(2, "stat", 0, "0", 4, "ls", 8),
        e(3, "openat", 3, "3", 9),
        s(4, "openat", ("AT_FDCWD", '"/nope"', "O_RDONLY")),
        e(5, "openat", -2, "-2 ENOENT", 6),
        s(6, "exit_group", ("0",)),
    ]


def run_app(app: SyscallsApp, body: Callable[[Any, SyscallsApp], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=(160, 30)) as pilot:
            await pilot.pause()
            await body(pilot, app)

    asyncio.run(main())


def table(app: SyscallsApp) -> CallTable:
    return app.query_one(CallTable)


def cell(app: SyscallsApp, row: int, col: str) -> Any:
    return table(app).get_cell_at(Coordinate(row, COLUMNS.index(col)))


def column(app: SyscallsApp, col: str) -> list[str]:
    return [str(cell(app, r, col)) for r in range(table(app).row_count)]


pytestmark = pytest.mark.usefixtures("utc")  # conftest's: restored after each test


def test_compact_and_full(tmp_path: Path) -> None:
    rec = tmp_path / "r.jsonl"
    with Recorder(rec) as r:
        for ev in events():
            r.write(ev)

    async def body(pilot: Any, app: SyscallsApp) -> None:
        assert column(app, "#") == ["0", "1", "4", "6"]
        assert column(app, "result") == ["3", "0", "-2 ENOENT", "?"]
        assert column(app, "duration") == ["9us", "3us", "2us", ""]  # end - start
        await pilot.press("c")
        assert column(app, "#") == ["0", "1", "2", "3", "4", "5", "6"]
        assert column(app, "syscall")[3] == "openat (end)"
        status = str(app.query_one("#status", Static).render())
        assert "full | 7/7 rows | 7 events" in status
        progress = str(app.query_one("#progress", Static).render())
        assert progress == ""  # exit_group is not waiting for anything

    run_app(SyscallsApp(ListFeed(list(read_events(rec))), live=False), body)


def test_filter_highlights_spans() -> None:
    async def body(pilot: Any, app: SyscallsApp) -> None:
        await pilot.press("slash")
        await pilot.press(*"passwd")
        await pilot.pause()
        assert column(app, "#") == ["0"]
        args = cell(app, 0, "arguments")
        assert isinstance(args, Text)
        spans = [(s.start, s.end, str(s.style)) for s in args.spans]
        assert spans == [(16, 22, HIGHLIGHT)]
        await pilot.press("enter")
        await pilot.press("slash", "ctrl+u")
        await pilot.press(*"/^(ls|cat)$/")
        await pilot.pause()
        assert column(app, "#") == ["0", "1", "4", "6"]
        assert [(s.start, s.end) for s in cell(app, 1, "process").spans] == [(0, 2)]

    run_app(SyscallsApp(ListFeed(events()), live=False), body)


def test_jump_and_next_error() -> None:
    async def body(pilot: Any, app: SyscallsApp) -> None:
        await pilot.press("e")
        assert table(app).cursor_row == 2  # the failing openat
        await pilot.press("j")  # to its end, in the full log
        assert not app.compact
        assert column(app, "#")[table(app).cursor_row] == "5"
        await pilot.press("j")  # and back to its start
        assert column(app, "#")[table(app).cursor_row] == "4"
        details = str(app.query_one("#details", Static).render())
        assert "#4  openat" in details and "start #-1  end #5" in details

    run_app(SyscallsApp(ListFeed(events()), live=False), body)


def test_pause_freezes_the_table() -> None:
    evs = events()
    feed = ListFeed(evs[:2])

    async def body(pilot: Any, app: SyscallsApp) -> None:
        assert column(app, "result") == ["?", "?"]
        await pilot.press("p")
        feed._events = evs[2:]
        await pilot.pause(0.2)
        assert column(app, "result") == ["?", "?"]  # frozen
        assert "PAUSED" in str(app.query_one("#status", Static).render())
        await pilot.press("p")
        await pilot.pause(0.2)
        assert column(app, "result") == ["3", "0", "-2 ENOENT", "?"]

    run_app(SyscallsApp(feed, live=True), body)


SNAPSHOT = Path(__file__).parent / "snapshots" / "syscalls_tui.svg"


def test_main_screen_snapshot() -> None:
    """The main screen as SVG, compared with the kept snapshot (UPDATE_SNAPSHOTS=1 to
    rewrite it after an intended change). Taken once the screen has settled: on a
    loaded machine the footer's keys come a few frames after the first pause. The
    status bar's rate is the events of the last second, by the clock: held still, it
    stays 0/s (a start slower than a second made it 6/s)."""
    import os

    async def body(pilot: Any, app: SyscallsApp) -> None:
        for _ in range(100):  # 5 s at most
            if app.query("FooterKey"):
                break
            await pilot.pause(0.05)
        await pilot.pause()
        svg = app.export_screenshot()
        if os.environ.get("UPDATE_SNAPSHOTS") == "1":
            SNAPSHOT.parent.mkdir(exist_ok=True)
            SNAPSHOT.write_text(svg)
        assert SNAPSHOT.exists(), f"no snapshot {SNAPSHOT}: run with UPDATE_SNAPSHOTS=1"
        assert svg == SNAPSHOT.read_text()

    run_app(SyscallsApp(ListFeed(events()), live=False, clock=lambda: 1000.0), body)


def test_memory_cap_drops_the_oldest_and_says_so() -> None:
    """Past --max-rows the oldest tenth of the events leaves memory (with the rows made
    from them); a call open after the cut still pairs; the status bar says how many
    left and names the recording that has them."""
    evs = events()
    feed = ListFeed(evs[:5])  # 0 openat, 1 stat, 2 stat end, 3 openat end, 4 openat

    async def body(pilot: Any, app: SyscallsApp) -> None:
        assert app.dropped == 2  # 5 > 4: down to 3 (4 * 9 // 10)
        assert [sc.index for sc in app.agg.log] == [2, 3, 4]
        assert column(app, "#") == ["4"]  # the calls of 0 and 1 went with their starts
        status = str(app.query_one("#status", Static).render())
        assert "2 older events dropped from memory (in rec.raw)" in status
        feed._events = evs[5:]
        await pilot.pause(0.2)
        assert app.dropped == 4 and [sc.index for sc in app.agg.log] == [4, 5, 6]
        assert column(app, "#") == ["4", "6"]
        assert column(app, "result") == ["-2 ENOENT", "?"]  # 4 paired with its end 5

    run_app(SyscallsApp(feed, live=True, max_rows=4, spill="rec.raw"), body)


def test_damaged_recording_shows_what_was_read_and_says_so() -> None:
    app = SyscallsApp(ListFeed(events()[:5]), live=False)
    app.warning = "r.jsonl: line 6 is truncated: the recording is damaged"

    async def body(pilot: Any, app: SyscallsApp) -> None:
        assert column(app, "syscall") == ["openat", "stat", "openat"]
        assert [n.message for n in app._notifications] == [app.warning]

    run_app(app, body)
