"""perf_event_open(2) for software and hardware events, one fd per CPU, for
perf_event programs (page faults, CPU clock, PMU counters, precise memory events).

`perf_event_attr` writes the kernel's `struct perf_event_attr`
(include/uapi/linux/perf_event.h, PERF_ATTR_SIZE_VER7 = 128 bytes):

    off  field                      off  field
      0  u32 type                    56  u64 config1 (bp_addr, kprobe_func)
      4  u32 size                    64  u64 config2 (bp_len)
      8  u64 config                  72  u64 branch_sample_type
     16  u64 sample_period|freq      80  u64 sample_regs_user
     24  u64 sample_type             88  u32 sample_stack_user, s32 clockid
     32  u64 read_format             96  u64 sample_regs_intr
     40  u64 flags (bit fields)     104  u32 aux_watermark, u16 sample_max_stack
     48  u32 wakeup_events          112  u32 aux_sample_size, u32 reserved
     52  u32 bp_type                120  u64 sig_data

Flag bits at offset 40: disabled 0, inherit 1, pinned 2, exclusive 3, exclude_user 4,
exclude_kernel 5, exclude_hv 6, exclude_idle 7, ..., freq 10, ..., precise_ip 15-16.
"""

from __future__ import annotations

import os
import struct

from ..errors import BpfError, NotSupported
from . import _libbpf as L

__all__ = [
    "PerfEvent",
    "online_cpus",
    "open_attr_per_cpu",
    "open_per_cpu",
    "perf_event_attr",
    "read_times",
]

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW = 0, 1, 3, 4
ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7; the kernel accepts any known size
FLAG_DISABLED, FLAG_FREQ = 1 << 0, 1 << 10
FLAG_EXCLUDE_HV = 1 << 6
PRECISE_IP_SHIFT = 15  # two bits: 0 arbitrary skid ... 3 zero skid
PERF_FLAG_FD_CLOEXEC = 1 << 3

# sample_type bits (enum perf_event_sample_format)
SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME, SAMPLE_ADDR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
SAMPLE_CALLCHAIN, SAMPLE_CPU, SAMPLE_PERIOD = 1 << 5, 1 << 7, 1 << 8
SAMPLE_BRANCH_STACK, SAMPLE_WEIGHT, SAMPLE_DATA_SRC = 1 << 11, 1 << 14, 1 << 15
SAMPLE_PHYS_ADDR = 1 << 19

# read_format bits (enum perf_event_read_format): read() then gives the count and
# the event's enabled and running times, in that order
FORMAT_TOTAL_TIME_ENABLED, FORMAT_TOTAL_TIME_RUNNING = 1 << 0, 1 << 1
FORMAT_TIMES = FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING

# branch_sample_type bits (enum perf_branch_sample_type)
BRANCH_USER, BRANCH_KERNEL, BRANCH_HV, BRANCH_ANY = 1 << 0, 1 << 1, 1 << 2, 1 << 3

# Event types a host may lack (no PMU, a VM): perf_event_open says ENOENT, ENODEV or
# EOPNOTSUPP for them, and the caller falls back to a software event.
_PMU_TYPES = (PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW)
_NO_PMU_ERRNOS = (2, 19, 95)  # ENOENT, ENODEV, EOPNOTSUPP


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
    ev_type: int,
    config: int,
    sample_period: int = 0,
    freq: int = 0,
    disabled: bool = False,
    *,
    sample_type: int = 0,
    precise_ip: int = 0,
    config1: int = 0,
    branch_sample_type: int = 0,
    read_format: int = 0,
) -> bytes:
    """A `struct perf_event_attr`: sample every `sample_period` events, or `freq` per
    second. `precise_ip` (0-3) asks for PEBS/IBS skid control; `branch_sample_type`
    (LBR) implies PERF_SAMPLE_BRANCH_STACK in `sample_type`; `read_format`
    FORMAT_TIMES has read() give the enabled and running times (`read_times`)."""
    if not 0 <= precise_ip <= 3:
        raise ValueError(f"precise_ip is 0..3, not {precise_ip}")
    flags = (FLAG_DISABLED if disabled else 0) | (FLAG_FREQ if freq else 0)
    flags |= precise_ip << PRECISE_IP_SHIFT
    if branch_sample_type:
        sample_type |= SAMPLE_BRANCH_STACK
    head = struct.pack(
        "<IIQQQQQIIQQQ",
        ev_type,
        ATTR_SIZE,
        config,
        freq or sample_period,
        sample_type,
        read_format,
        flags,
        0,  # wakeup_events
        0,  # bp_type
        config1,
        0,  # config2
        branch_sample_type,
    )
    return head + bytes(ATTR_SIZE - len(head))


def read_times(fd: int) -> tuple[int, int, int]:
    """(count, time_enabled, time_running) of a perf event opened with read_format
    FORMAT_TIMES (and no other read_format bit). An event multiplexed with others on
    too few counters runs less than it is enabled: enabled / running is the factor
    its count or samples are short by."""
    data = os.read(fd, 24)
    if len(data) != 24:
        raise OSError(f"perf event read gave {len(data)} bytes, not 24")
    count, enabled, running = struct.unpack("<QQQ", data)
    return count, enabled, running


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
    return open_attr_per_cpu(attr, pid=pid)


def open_attr_per_cpu(attr: bytes, pid: int = -1, cpus: list[int] | None = None) -> list[int]:
    """One fd per CPU (default: every online CPU, in order) for a ready-made attr;
    closes what it opened if any CPU fails. A PMU event the host cannot count raises
    NotSupported (callers fall back to a software event)."""
    ev_type, _size, config = struct.unpack_from("<IIQ", attr, 0)
    fds: list[int] = []
    try:
        for cpu in online_cpus() if cpus is None else cpus:
            fd = L.perf_event_open(attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)
            if fd < 0:
                err = -fd
                if ev_type in _PMU_TYPES and err in _NO_PMU_ERRNOS:
                    raise NotSupported(
                        "hardware perf events",
                        f"perf_event_open refused ({os.strerror(err)})",
                        "use bare metal or a VM with a virtual PMU",
                    )
                raise BpfError(
                    f"perf_event_open(type={ev_type}, config={config:#x}, cpu={cpu})", err
                )
            fds.append(fd)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds
