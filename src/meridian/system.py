"""The host around the tools: privileges, tracefs, BTF, locked-memory limit."""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import subprocess
from pathlib import Path

from .errors import NoBTF, PermissionProblem, TracefsMissing

__all__ = [
    "ensure_ready",
    "ensure_tracefs",
    "has_bpf_privileges",
    "kernel_btf_has",
    "kernel_btf_path",
    "raise_memlock",
    "tracefs_mounted",
]

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39
TRACEFS = Path("/sys/kernel/tracing")
TRACEFS_UNDER_DEBUGFS = Path("/sys/kernel/debug/tracing")  # where libbpf looks first
KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")


def effective_caps(status: str = "/proc/self/status") -> int:
    for line in Path(status).read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def has_bpf_privileges(status: str = "/proc/self/status") -> bool:
    caps = effective_caps(status)
    if caps & (1 << CAP_SYS_ADMIN):
        return True
    return bool(caps & (1 << CAP_BPF)) and bool(caps & (1 << CAP_PERFMON))


def kernel_btf_path() -> Path:
    return KERNEL_BTF


@functools.cache
def _kernel_btf_names() -> bytes:
    try:
        return KERNEL_BTF.read_bytes()
    except OSError:
        return b""


def kernel_btf_has(name: str) -> bool:
    """Does the kernel's BTF name `name` (a function, a kfunc, btf_trace_<tracepoint>)?"""
    return b"\0" + name.encode() + b"\0" in _kernel_btf_names()


def tracefs_mounted(root: Path = TRACEFS) -> Path | None:
    """Where tracefs is mounted already (its own place, or under debugfs), else None:
    nothing is mounted here."""
    for candidate in (root, TRACEFS_UNDER_DEBUGFS):
        try:
            if (candidate / "events").is_dir():
                return candidate
        except PermissionError:
            raise PermissionProblem(f"reading {candidate}") from None
    return None


def ensure_tracefs(root: Path = TRACEFS) -> Path:
    """tracefs, mounted at `root` when it is not there yet. Only tracepoint programs
    (libbpf reads each one's id there) and legacy kprobes need it; where it cannot be
    mounted (no CAP_SYS_ADMIN, a read-only /sys) TracefsMissing says why."""
    found = tracefs_mounted(root)
    if found is not None:
        return found
    try:
        proc = subprocess.run(
            ["mount", "-t", "tracefs", "tracefs", str(root)], capture_output=True, text=True
        )
    except OSError as exc:  # no mount(8) in the container
        raise TracefsMissing(f"mount: {exc.strerror}") from None
    if proc.returncode != 0 or not (root / "events").is_dir():
        said = proc.stderr.strip().splitlines()
        raise TracefsMissing(
            said[0].rstrip(".") if said else f"mount exited with {proc.returncode}"
        )
    return root


def raise_memlock() -> None:
    """Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK."""
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_MEMLOCK, unlimited)


def ensure_ready() -> None:
    """What every tool needs before it loads a program, told plainly when missing.
    Not tracefs: choosing a strategy that needs it mounts it (bpf/features.py), so
    tp_btf and fentry run in a container without it."""
    if not has_bpf_privileges():
        raise PermissionProblem()
    if not KERNEL_BTF.exists():
        raise NoBTF(str(KERNEL_BTF))
    raise_memlock()


def online_cpu_count() -> int:
    return len(os.sched_getaffinity(0))
