"""Shared by the exporter tests: a transport's recording `send`, a free loopback port,
and a wait for a condition."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from meridian.export.transport import Sent


def wait_for(pred: Callable[[], bool], seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while not pred() and time.monotonic() < end:
        time.sleep(0.01)
    return pred()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeSend:
    """A transport's `send`: answers from `answers` in turn (the last one repeats),
    records (body, timeout) of every call, and waits for `gate` first if given."""

    def __init__(self, *answers: Sent, gate: threading.Event | None = None) -> None:
        self.answers = list(answers) or [Sent(True)]
        self.calls: list[tuple[bytes, float]] = []
        self.gate = gate

    def __call__(self, body: bytes, timeout: float) -> Sent:
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append((body, timeout))
        return self.answers[min(len(self.calls), len(self.answers)) - 1]
