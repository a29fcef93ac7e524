"""Says what is wrong with storage on stderr at most once a minute per kind of trouble,
whatever the number of batches that meet it: a long outage is a few lines, and each
line says how many more times it happened since the last one."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Reporter"]


class Reporter:
    def __init__(
        self,
        err: TextIO | None = None,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        prefix: str = "meridian sentinel: storage: ",
    ) -> None:
        self.err = err
        self.interval = interval
        self.clock = clock
        self.prefix = prefix
        self.lines: list[str] = []  # everything said, for status and tests
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}
        self._mu = threading.Lock()

    def say(self, key: str, message: str) -> bool:
        """Print `message` unless `key` was said less than `interval` ago; True when
        printed."""
        now = self.clock()
        with self._mu:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._quiet[key] = self._quiet.get(key, 0) + 1
                return False
            self._last[key] = now
            more = self._quiet.pop(key, 0)
            line = self.prefix + message
            if more:
                line += f" ({more} more since the last report)"
            self.lines.append(line)
            del self.lines[:-100]
        err = self.err if self.err is not None else sys.stderr
        with contextlib.suppress(OSError, ValueError):  # stderr closed: counters say it
            print(line, file=err, flush=True)
        return True
