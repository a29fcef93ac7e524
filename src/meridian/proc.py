"""/proc and /sys lookups as small pure functions; the roots are parameters so tests
run against fixture trees."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ProcStat",
    "comm_of",
    "dev_major",
    "dev_minor",
    "device_name",
    "kallsyms_address",
    "kernel_data_addresses",
    "kernel_dev",
    "parse_device",
    "parse_stat",
    "proc_start",
    "proc_stat",
    "queue_limits",
    "start_environment",
    "start_wall_ns",
    "thread_slots",
]

MINORBITS = 20


def kernel_dev(major: int, minor: int) -> int:
    """The kernel's internal dev_t (what tracepoints and bpf programs see)."""
    return (major << MINORBITS) | minor


def dev_major(dev: int) -> int:
    return dev >> MINORBITS


def dev_minor(dev: int) -> int:
    return dev & ((1 << MINORBITS) - 1)


def device_name(dev: int, sys_root: str | Path = "/sys") -> str:
    """`loop0`, `vda`, `nvme0n1p1` for a kernel dev_t; `major:minor` when /sys has no name."""
    mm = f"{dev_major(dev)}:{dev_minor(dev)}"
    link = Path(sys_root) / "dev" / "block" / mm
    try:
        for line in (link / "uevent").read_text().splitlines():
            if line.startswith("DEVNAME="):
                return line.split("=", 1)[1].rsplit("/", 1)[-1]
    except OSError:
        pass
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        pass
    # A container's /sys may hide /sys/dev/block (podman mounts a tmpfs over it) while
    # /sys/class/block still lists the disks, each with its major:minor in `dev`.
    try:
        for disk in (Path(sys_root) / "class" / "block").iterdir():
            with contextlib.suppress(OSError):
                if (disk / "dev").read_text().strip() == mm:
                    return disk.name
    except OSError:
        pass
    return mm


def queue_limits(dev: int, sys_root: str | Path = "/sys") -> dict[str, int]:
    """What the disk's queue can hold, from sysfs (a partition's is its disk's): the
    block layer's `nr_requests` and the hardware's depth, each per hardware queue
    (`device/queue_depth` for SCSI and SATA, else the tags of the first hardware queue),
    and the number of hardware queues. Only what sysfs has."""
    base = Path(sys_root) / "dev" / "block" / f"{dev_major(dev)}:{dev_minor(dev)}"
    if not (base / "queue").is_dir():
        base = base / ".."  # a partition: /sys/dev/block/8:1/.. is sda
    out: dict[str, int] = {}
    hctxs = sorted(base.glob("mq/*/nr_tags"))
    for name, path in (
        ("nr_requests", base / "queue" / "nr_requests"),
        ("hw_queue_depth", base / "device" / "queue_depth"),
        ("hw_queue_depth", hctxs[0] if hctxs else None),
    ):
        if path is None or name in out:
            continue
        with contextlib.suppress(OSError, ValueError):
            out[name] = int(path.read_text())
    if hctxs:
        out["hw_queues"] = len(hctxs)
    return out


def parse_device(text: str, sys_root: str | Path = "/sys") -> int:
    """`loop0`, `/dev/loop0` or `7:0` to a kernel dev_t; ValueError names what is wrong."""
    spec = text.strip()
    if ":" in spec:
        major, _, minor = spec.partition(":")
        if not (major.isdigit() and minor.isdigit()):
            raise ValueError(f"device {text!r} is not MAJOR:MINOR")
        return kernel_dev(int(major), int(minor))
    name = spec.removeprefix("/dev/")
    dev_file = Path(sys_root) / "class" / "block" / name / "dev"
    try:
        major, _, minor = dev_file.read_text().strip().partition(":")
        return kernel_dev(int(major), int(minor))
    except (OSError, ValueError):
        known = sorted(p.name for p in (Path(sys_root) / "class" / "block").glob("*"))
        hint = f" (known: {', '.join(known[:12])})" if known else ""
        raise ValueError(f"no block device {text!r}{hint}") from None


def kallsyms_address(data: bytes, name: bytes) -> int:
    """The address of a kernel symbol (not a module's) in a kallsyms text, 0 when it
    is not there or the text hides addresses."""
    at = data.find(b" " + name + b"\n")
    if at < 0:
        return 0
    line = data[data.rfind(b"\n", 0, at) + 1 : at].split()
    try:
        return int(line[0], 16)
    except (IndexError, ValueError):
        return 0


def kernel_data_addresses(
    names: tuple[str, ...], kallsyms: str | Path = "/proc/kallsyms"
) -> dict[str, int]:
    """Addresses of kernel variables, 0 for each that kallsyms does not list (it lists
    data symbols only with CONFIG_KALLSYMS_ALL) or shows as 0 (kptr_restrict)."""
    try:
        data = Path(kallsyms).read_bytes()
    except OSError:
        data = b""
    return {n: kallsyms_address(data, n.encode()) for n in names}


def start_environment(environ: str | Path = "/proc/self/environ") -> dict[bytes, bytes]:
    """The environment this process was started with, for the commands it launches to
    run as they would without it. Python's C-locale coercion (PEP 538) sets LC_CTYPE
    before any Python code runs, and libraries may set more; setenv builds a new
    environment elsewhere in memory, so /proc/self/environ (the exec's own copy) still
    holds the original. Entries without a name (no `=`, or `=` first) cannot be passed
    on by exec from Python and are left out; a repeated name keeps its first value, as
    getenv reads it. Without /proc: the environment as it is now."""
    try:
        raw = Path(environ).read_bytes()
    except OSError:
        return dict(os.environb)
    env: dict[bytes, bytes] = {}
    for entry in raw.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if name and eq:
            env.setdefault(name, value)
    return env


def comm_of(pid: int, proc_root: str | Path = "/proc") -> str | None:
    try:
        return (Path(proc_root) / str(pid) / "comm").read_text().strip()
    except OSError:
        return None


CLOCK_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    """What of /proc/PID/stat tells a process from the next one under its pid: the
    start time in clock ticks since boot (field 22: pid reuse changes it), and where
    its code and stack start (fields 26 and 28: an exec moves them; 0 when hidden)."""

    start: int
    start_code: int = 0
    start_stack: int = 0


def parse_stat(raw: bytes) -> ProcStat | None:
    """The text of /proc/PID/stat parsed; None when it is not one. The comm (field 2,
    in parentheses) may hold spaces and parentheses itself: it ends at the last ')'."""
    head, paren, tail = raw.rpartition(b")")
    fields = tail.split()  # field 3 (state) first: field N is fields[N - 3]
    if not paren or b"(" not in head or len(fields) < 20:
        return None
    try:
        start = int(fields[19])
        code = int(fields[23]) if len(fields) > 23 else 0
        stack = int(fields[25]) if len(fields) > 25 else 0
    except ValueError:
        return None
    return ProcStat(start, code, stack)


def proc_stat(pid: int, proc_root: str | Path = "/proc") -> ProcStat | None:
    """/proc/PID/stat of a process, in one read(); None when there is no such process."""
    try:
        fd = os.open(os.path.join(proc_root, str(pid), "stat"), os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_stat(raw)


def proc_start(pid: int, proc_root: str | Path = "/proc") -> int | None:
    """A process's start time in clock ticks since boot, as io's kernel keys carry it
    (32 bits); None when there is no such process."""
    stat = proc_stat(pid, proc_root)
    return None if stat is None else stat.start & 0xFFFFFFFF


def start_wall_ns(start_ticks: int) -> int:
    """A process start (clock ticks since boot) as Unix time in ns."""
    boot = time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return boot + start_ticks * CLOCK_TICK_NS


def thread_slots(proc_root: str | Path = "/proc", cap: int = 1 << 18) -> int:
    """Size of a BPF array with one slot per thread, indexed by TID modulo its size:
    the power of two that covers pid_max (so no two live threads share a slot), at
    most `cap`; `cap` when pid_max cannot be read."""
    try:
        pid_max = int(Path(proc_root, "sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return cap
    return min(cap, 1 << max(pid_max - 1, 1).bit_length())
