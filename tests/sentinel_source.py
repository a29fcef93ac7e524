"""Shared by the sentinel kernel tests: the cpu-clock event and a reader that drains a
KernelSource's samples on a thread."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from meridian.tools.sentinel.sources.kernel import KernelSource
from meridian.tools.sentinel.sources.pmu_events import LOGICAL

CLOCK = [LOGICAL["cpu-clock"]]


def drain(src: KernelSource, stop: threading.Event, out: list[np.ndarray[Any, Any]]) -> None:
    while not stop.is_set():
        samples, _ = src.poll(0.05)
        out.append(samples)
