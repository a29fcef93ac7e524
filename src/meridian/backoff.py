"""The one backoff of every retry loop (OTLP logs and metrics, sentinel's store):
exponential, capped, with jitter.

The jitter keeps agents that lost the same collector or store at once from coming
back to it in step; the cap keeps a long outage from delaying the first try after it
ends by more than `cap`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """The delays between tries: after n failures in a row (n from 1) the next try
    waits `base * 2**(n-1)`, at most `cap`, times a random factor in
    [1 - jitter, 1 + jitter], and never more than `cap`. `reset()` (a success)
    starts again from `base`. `rand` (uniform in [0, 1)) is injectable so that tests
    get the same delays every run."""

    def __init__(
        self,
        base: float,
        cap: float,
        jitter: float = 0.2,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if base <= 0 or cap <= 0 or not 0 <= jitter < 1:
            raise ValueError(f"backoff base {base}, cap {cap} or jitter {jitter} out of range")
        self.base, self.cap, self.jitter, self.rand = base, cap, jitter, rand
        self.failures = 0  # in a row, since the last success

    def failed(self) -> float:
        """One more failure: the seconds to wait before the next try."""
        nominal = min(self.base * 2.0 ** min(self.failures, 64), self.cap)
        self.failures += 1
        return min(nominal * (1.0 + self.jitter * (2.0 * self.rand() - 1.0)), self.cap)

    def reset(self) -> None:
        """A success: the next failure waits `base` again."""
        self.failures = 0
