"""Ctrl-C and SIGTERM held back for a critical stretch, then delivered as usual."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["signals_held"]

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held(ignore: bool = False) -> Iterator[None]:
    """Ctrl-C and SIGTERM are noted, not acted on, until the block ends; then the first
    one is raised again with the handlers that were there (a KeyboardInterrupt for the
    tools). Around a libbpf call: its print callback runs Python inside ctypes, which
    swallows an exception raised there, and the run would go on as if never asked to
    end; around a drain, so what was drained is recorded whole. With `ignore`, they are
    dropped (a second Ctrl-C while stopping). Handlers are swapped, not masked: a
    process-directed signal goes to any thread that does not block it, and Python runs
    its handler in the main thread at the next bytecode, wherever that is. Off the main
    thread (where Python never runs signal handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def note(signum: int, frame: Any) -> None:
        seen.append(signum)

    saved = {s: signal.getsignal(s) for s in _HELD}
    for s in _HELD:
        signal.signal(s, signal.SIG_IGN if ignore else note)
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    if seen:
        signal.raise_signal(seen[0])
