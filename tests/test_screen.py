"""The live screen that `io --top` and sentinel's live table draw on: frames drawn
over the last one and cut to the terminal, the alternate screen left exactly once,
on any exit."""

from __future__ import annotations

import io
import os
import re
import shutil

import pytest

from meridian.screen import ENTER, EOL, EOS, HOME, LEAVE, Screen, frame, terminal_size
from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.window import FlowStat, Window, WindowInfo


class Out(io.StringIO):
    """A stream that counts its flushes: what is drawn must reach the terminal now."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_frame_cuts_each_line_and_clears_what_the_last_one_left() -> None:
    text = frame(["header", "a" * 50, ""], cols=10)
    assert text == f"{HOME}header{EOL}\n{'a' * 10}{EOL}\n{EOL}\n{EOS}"


def test_a_screen_enters_draws_and_leaves_once() -> None:
    out = Out()
    s = Screen(out, size=lambda: (80, 24))
    s.enter()
    s.draw(frame(["one"], 80))
    assert out.flushes == 2 and s.size() == (80, 24)
    s.leave()
    s.leave()  # a second close (Ctrl-C, then the normal end) writes nothing
    assert out.getvalue() == f"{ENTER}{HOME}one{EOL}\n{EOS}{LEAVE}"
    assert out.flushes == 3 and not s.entered


def test_the_screen_is_left_on_ctrl_c() -> None:
    out = Out()
    with pytest.raises(KeyboardInterrupt), Screen(out) as s:
        s.draw(frame(["x"], 80))
        raise KeyboardInterrupt
    assert out.getvalue().startswith(ENTER) and out.getvalue().endswith(LEAVE)


def test_leave_without_enter_writes_nothing() -> None:
    out = Out()
    Screen(out).leave()
    assert out.getvalue() == ""


def test_terminal_size_is_columns_then_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "get_terminal_size", lambda: os.terminal_size((132, 43)))
    assert terminal_size() == (132, 43)


class Names:
    def flow(self, flow_id: int) -> FlowKey | None:
        return None

    def function(self, function_id: int) -> str:
        return f"fn{function_id}"

    def stack(self, stack_id: int) -> list[str]:
        return []


def test_sentinel_live_view_draws_each_window_but_the_final_one() -> None:
    from meridian.tools.sentinel.outputs.live import LiveView

    out = Out()
    view = LiveView(out, Names(), size=lambda: (60, 10))
    info = WindowInfo(seconds=1.0, mode="sentinel", source="mock")
    stats = [FlowStat(0, 0, 0, samples=3, norm_cost=1.0, functions={7: 1.0})]
    window = Window(0, 0, 1, info, None, stats)
    view.on_window(window)  # not started: nothing drawn
    view.start()
    view.on_window(window)
    view.on_window(Window(1, 1, 2, info, None, stats, final=True))
    view.close()
    view.close()
    text = out.getvalue()
    assert text.startswith(ENTER) and text.endswith(LEAVE)
    assert text.count(HOME) == 1 and text.count(LEAVE) == 1
    assert "fn7" in text
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", x) for x in text.split("\n")]
    assert max(len(x) for x in lines) == 60  # the head line, cut to the terminal
