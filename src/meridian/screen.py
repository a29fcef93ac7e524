"""A live screen in plain ANSI, no TUI library: what `io --top` and sentinel's live
table draw on. The alternate screen keeps the frames out of the terminal's
scrollback; each frame is written over the last from the top left (every line
cleared to its end, and what is below the frame cleared), so nothing flickers; the
main screen comes back as it was on leave, Ctrl-C included."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TextIO

__all__ = ["ENTER", "EOL", "EOS", "HOME", "LEAVE", "Screen", "frame", "terminal_size"]

ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
LEAVE = "\x1b[?25h\x1b[?1049l"  # cursor shown, main screen back
HOME = "\x1b[H"
EOL = "\x1b[K"  # erase to the end of the line
EOS = "\x1b[J"  # erase below


def terminal_size() -> tuple[int, int]:
    """(columns, lines) of the terminal, looked up again for each frame (resizes)."""
    size = shutil.get_terminal_size()
    return size.columns, size.lines


def frame(lines: Sequence[str], cols: int) -> str:
    """The text that draws `lines` over the previous frame, each cut to `cols`."""
    return HOME + "\n".join(x[:cols] + EOL for x in lines) + "\n" + EOS


class Screen:
    """The alternate screen on `out`: `enter()`, a `draw()` per frame, `leave()`
    (once; again it writes nothing). As a context manager it leaves on any exit."""

    def __init__(self, out: TextIO, size: Callable[[], tuple[int, int]] = terminal_size) -> None:
        self.out = out
        self.size = size
        self.entered = False

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def enter(self) -> None:
        self._write(ENTER)
        self.entered = True

    def draw(self, text: str) -> None:
        """One frame (from `frame()`)."""
        self._write(text)

    def leave(self) -> None:
        if self.entered:
            self.entered = False
            self._write(LEAVE)

    def __enter__(self) -> Screen:
        self.enter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.leave()
