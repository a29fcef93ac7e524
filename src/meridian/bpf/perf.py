"""perf_event_open(2) for software and hardware events, one fd per CPU, for
perf_event programs (page faults, CPU clock, PMU counters)."""

from __future__ import annotations

import os
import struct

from ..errors import BpfError, NotSupported
from . import _libbpf as L

__all__ = ["PerfEvent", "online_cpus", "open_per_cpu", "perf_event_attr"]

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7; the kernel accepts any known size
FLAG_DISABLED, FLAG_FREQ = 1 << 0, 1 << 10
PERF_FLAG_FD_CLOEXEC = 1 << 3


class PerfEvent:
    """Names of the common events: (type, config)."""

    CPU_CYCLES = (PERF_TYPE_HARDWARE, 0)
    INSTRUCTIONS = (PERF_TYPE_HARDWARE, 1)
    CACHE_MISSES = (PERF_TYPE_HARDWARE, 3)
    BRANCH_MISSES = (PERF_TYPE_HARDWARE, 5)
    CPU_CLOCK = (PERF_TYPE_SOFTWARE, 0)
    PAGE_FAULTS = (PERF_TYPE_SOFTWARE, 2)
    CONTEXT_SWITCHES = (PERF_TYPE_SOFTWARE, 3)
    PAGE_FAULTS_MIN = (PERF_TYPE_SOFTWARE, 5)
    PAGE_FAULTS_MAJ = (PERF_TYPE_SOFTWARE, 6)


def perf_event_attr(
    ev_type: int, config: int, sample_period: int = 0, freq: int = 0, disabled: bool = False
) -> bytes:
    """A `struct perf_event_attr`: sample every `sample_period` events, or `freq` per second."""
    flags = (FLAG_DISABLED if disabled else 0) | (FLAG_FREQ if freq else 0)
    head = struct.pack("<IIQQQQQ", ev_type, ATTR_SIZE, config, freq or sample_period, 0, 0, flags)
    return head + bytes(ATTR_SIZE - len(head))


def online_cpus(path: str = "/sys/devices/system/cpu/online") -> list[int]:
    """CPU numbers from a list such as `0-3,6`."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return list(range(os.cpu_count() or 1))
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def open_per_cpu(
    event: tuple[int, int], sample_period: int = 0, freq: int = 0, pid: int = -1
) -> list[int]:
    """One fd per online CPU; closes what it opened if any CPU fails."""
    attr = perf_event_attr(event[0], event[1], sample_period, freq)
    fds: list[int] = []
    try:
        for cpu in online_cpus():
            fd = L.perf_event_open(attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)
            if fd < 0:
                err = -fd
                if event[0] == PERF_TYPE_HARDWARE and err in (2, 95, 19):  # ENOENT, EOPNOTSUPP
                    raise NotSupported(
                        "hardware perf events",
                        f"perf_event_open refused ({os.strerror(err)})",
                        "use bare metal or a VM with a virtual PMU",
                    )
                raise BpfError(
                    f"perf_event_open(type={event[0]}, config={event[1]}, cpu={cpu})", err
                )
            fds.append(fd)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds
