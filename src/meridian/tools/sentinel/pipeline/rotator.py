"""PMU rotation: a mode's event groups take turns on the PMU, one `rotation_window`
each, because a CPU has only a few counters. An event is sampled in the windows of
the groups that hold it (as opened: a fallback may make several events one), so a
sample of it stands for `groups / groups holding it` as many over the whole time:
`shares()`, one factor of each event's sample scale (pipeline/scales.py).

The safety level limits the events opened per group (`set_max_events`): a group then
opens the events that rank first (`rank`, the lowest first; the runtime's is
modes.shed_rank), and among equal ranks those written first, in the group's order.

Generic over the event type: the runtime passes `EventSpec` groups, tests any value.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

__all__ = ["PmuRotator", "keep", "rotation_shares"]

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def rotation_shares(opened: Sequence[Iterable[K]]) -> dict[K, float]:
    """What each group of a rotation really samples, in turn -> each event's rotation
    factor: the number of groups over the number whose turn samples it (an event in
    one of three groups: 3; in both of two: 1). Events in no group are absent."""
    held = Counter(k for group in opened for k in set(group))
    return {k: len(opened) / n for k, n in held.items()}


def keep(group: Sequence[T], n: int | None, rank: Callable[[T], int] | None = None) -> list[T]:
    """At most `n` events of `group` (None or 0: all): those of the lowest `rank`,
    among equal ranks those written first (no rank: the first n), in the group's order."""
    if not n or len(group) <= n:
        return list(group)
    if rank is None:
        return list(group[:n])
    chosen = sorted(range(len(group)), key=lambda i: (rank(group[i]), i))[:n]
    return [group[i] for i in sorted(chosen)]


class PmuRotator(Generic[T]):
    """Round-robin over event groups; `tick(now)` returns the new group when it turns.
    `max_events` limits the events of a group, keeping those `rank` puts first."""

    def __init__(
        self,
        groups: Sequence[Sequence[T]],
        window_ns: int,
        clock: Callable[[], int] = time.monotonic_ns,
        max_events: int | None = None,
        rank: Callable[[T], int] | None = None,
    ) -> None:
        if window_ns <= 0:
            raise ValueError(f"rotation window must be above 0 ns, got {window_ns}")
        self.window_ns = window_ns
        self.clock = clock
        self.max_events = max_events
        self.rank = rank
        self.groups: list[list[T]] = []
        self.index = 0
        self.started = 0
        self.set_groups(groups)

    def set_groups(self, groups: Sequence[Sequence[T]], now: int | None = None) -> list[T]:
        """New groups (a mode change, the control plane's pmu-config): start again at
        the first one; returns it."""
        if not groups or not all(groups):
            raise ValueError("the rotator needs at least one group, each with an event")
        self.groups = [list(g) for g in groups]
        self.index = 0
        self.started = self.clock() if now is None else now
        return self.current()

    def set_max_events(self, n: int | None) -> list[T] | None:
        """Limit the events opened per group (safety level); the current group when
        that changes what is open, else None."""
        before = self.current()
        self.max_events = n
        after = self.current()
        return after if after != before else None

    def current(self) -> list[T]:
        """The events of the current group opened under the limit."""
        return self._trimmed(self.groups[self.index])

    def schedule(self) -> list[list[T]]:
        """Every group as it is opened in its turn (trimmed by the safety level)."""
        return [self._trimmed(g) for g in self.groups]

    def shares(self, opened: Callable[[list[T]], Iterable[K]]) -> dict[K, float]:
        """`rotation_shares` of this rotation; `opened` gives what a group really
        samples (after fallbacks)."""
        return rotation_shares([opened(g) for g in self.schedule()])

    def _trimmed(self, group: list[T]) -> list[T]:
        return keep(group, self.max_events, self.rank)

    def tick(self, now: int | None = None) -> list[T] | None:
        """The next group when the current one has had its window, else None. One step
        per call: a late tick does not skip groups."""
        now = self.clock() if now is None else now
        if len(self.groups) < 2 or now - self.started < self.window_ns:
            return None
        self.index = (self.index + 1) % len(self.groups)
        self.started = now
        return self.current()
