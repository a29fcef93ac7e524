"""What this kernel allows, found without meridian's own probes: tracefs, securityfs,
the kernel configuration, and bpftool loading tiny programs it compiled apart. The
strategy tests compare each tool's choice with the strategy these facts predict."""

from __future__ import annotations

import functools
import gzip
import os
import platform
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bpfbuild import compile_bpf

from meridian.bpf import Strategy

TRACEFS = Path("/sys/kernel/tracing")
SECURITYFS = Path("/sys/kernel/security")

_PROGRAMS = {
    "tp_btf": 'SEC("tp_btf/sched_switch")\nint BPF_PROG(p, bool preempt)',
    "fentry": 'SEC("fentry/vfs_read")\nint BPF_PROG(p, struct file *f)',
    "tracepoint": 'SEC("tracepoint/syscalls/sys_enter_getppid")\nint p(void *ctx)',
}
_HEAD = "#include <vmlinux.h>\n#include <bpf/bpf_helpers.h>\n#include <bpf/bpf_tracing.h>\n"


def bpftool_loads(kind: str) -> bool:
    """Does the kernel load a trivial `kind` program (compiled here, loaded by bpftool)?"""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / f"{kind}.bpf.c"
        src.write_text(
            f'{_HEAD}{_PROGRAMS[kind]} {{ return 0; }}\nchar L[] SEC("license") = "GPL";\n'
        )
        obj = compile_bpf(src, Path(d) / f"{kind}.bpf.o")
        pin = Path(f"/sys/fs/bpf/meridian_test_{kind}_{os.getpid()}")
        r = subprocess.run(["bpftool", "prog", "load", str(obj), str(pin)], capture_output=True)
        pin.unlink(missing_ok=True)
        return r.returncode == 0


@functools.cache
def bpftool_probe() -> str:
    return subprocess.run(
        ["bpftool", "feature", "probe", "kernel"], capture_output=True, text=True, check=True
    ).stdout


def lockdown_mode() -> str:
    """The bracketed word of /sys/kernel/security/lockdown (securityfs mounted first)."""
    if not (SECURITYFS / "lsm").exists():
        subprocess.run(["mount", "-t", "securityfs", "securityfs", str(SECURITYFS)], check=True)
    text = (SECURITYFS / "lockdown").read_text()
    return next(w.strip("[]") for w in text.split() if w.startswith("["))


def config_kprobes() -> str | None:
    """CONFIG_KPROBES's line in the published kernel config, or None if unpublished."""
    for path in (Path("/proc/config.gz"), Path(f"/boot/config-{platform.release()}")):
        if path.exists():
            raw = path.read_bytes()
            text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()
            for line in text.splitlines():
                if line in ("CONFIG_KPROBES=y", "# CONFIG_KPROBES is not set"):
                    return line
            return "# CONFIG_KPROBES is not set"
    return None


@functools.cache
def features() -> dict[str, bool]:
    """Each feature a strategy may need, decided apart from meridian.bpf.features."""
    probe = bpftool_probe()
    return {
        "tracepoint": (TRACEFS / "events/syscalls/sys_enter_getppid").is_dir()
        and bpftool_loads("tracepoint"),
        "tp_btf": bpftool_loads("tp_btf"),
        "fentry": bpftool_loads("fentry"),
        # kprobe programs load everywhere; attaching needs the kernel's kprobe events.
        "kprobe": (TRACEFS / "kprobe_events").exists(),
        "perf_event": "program_type perf_event is available" in probe,
        "ringbuf": "map_type ringbuf is available" in probe,
    }


@functools.cache
def btf_names() -> frozenset[str]:
    """`KIND name` of every type in the kernel's BTF, as bpftool dumps it."""
    out = subprocess.run(
        ["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and line.startswith("["):
            names.add(f"{parts[1]} {parts[2].strip(chr(39))}")
    return frozenset(names)


def hook_in_btf(section: str) -> bool:
    """Is the function (fentry) or BTF tracepoint (tp_btf) of `section` in the BTF?"""
    kind, _, name = section.partition("/")
    if kind == "tp_btf":
        return f"TYPEDEF btf_trace_{name}" in btf_names()
    return f"FUNC {name}" in btf_names()


def expected_strategy(
    strategies: Sequence[Strategy], sections: dict[str, str] | None = None
) -> str:
    """The first strategy whose needs the independent facts grant (and, given the
    program -> section map, whose hooks the kernel's BTF has)."""
    have = features()
    sections = sections or {}
    return next(
        s.name
        for s in strategies
        if all(have[f] for f in s.needs)
        and all(hook_in_btf(sections[p]) for p in s.programs if p in sections)
    )
