"""Why this kernel refuses a kind of BPF program, from facts the host states itself:
the lockdown mode (securityfs), the kernel's build configuration (/proc/config.gz or
/boot/config-*), and what tracefs offers. A probe only sees an errno (EPERM, ENOENT);
these facts tell a user which other host would do better."""

from __future__ import annotations

import functools
import gzip
import os
import platform
import subprocess
from pathlib import Path

from ..system import TRACEFS

__all__ = [
    "SECURITYFS",
    "ensure_securityfs",
    "fentry_reason",
    "kernel_config",
    "kprobe_reason",
    "lockdown",
]

SECURITYFS = Path("/sys/kernel/security")


def ensure_securityfs(root: Path = SECURITYFS) -> bool:
    """Mount securityfs (where the lockdown mode is read) when it is not there yet,
    as doctor does for tracefs. False when it cannot be mounted."""
    if (root / "lsm").exists():
        return True
    try:
        subprocess.run(["mount", "-t", "securityfs", "securityfs", str(root)], capture_output=True)
    except OSError:  # no mount(8): the mode is then unknown, as without securityfs
        return False
    return (root / "lsm").exists()


def lockdown(root: Path = SECURITYFS) -> str | None:
    """The kernel's lockdown mode (the bracketed word of `lockdown`: none, integrity or
    confidentiality), or None when the kernel has no lockdown LSM or securityfs is not
    mounted."""
    try:
        text = (root / "lockdown").read_text()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def _config_sources() -> list[Path]:
    return [Path("/proc/config.gz"), Path(f"/boot/config-{platform.release()}")]


@functools.cache
def kernel_config() -> tuple[str, dict[str, str]] | None:
    """The running kernel's build configuration: where it was read, and CONFIG_X -> value
    ("n" for `# CONFIG_X is not set`). None when the host does not publish it."""
    for path in _config_sources():
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode(errors="replace")
        values: dict[str, str] = {}
        for line in text.splitlines():
            if line.startswith("CONFIG_") and "=" in line:
                key, _, value = line.partition("=")
                values[key] = value
            elif line.startswith("# CONFIG_") and line.endswith(" is not set"):
                values[line.split()[1]] = "n"
        return str(path), values
    return None


def _config_says(option: str) -> str | None:
    """`option=value (from where)` when the configuration is published, else None."""
    config = kernel_config()
    if config is None:
        return None
    where, values = config
    value = values.get(option, "n")
    return f"{option}={value}" if value != "n" else f"{option} is not set ({where})"


def kprobe_reason(tracefs: Path = TRACEFS) -> str:
    """Why kprobes do not attach, in the kernel's own terms: no kprobe support at all
    (CONFIG_KPROBES unset, no kprobe_events in tracefs), or what else is known."""
    events = tracefs / "kprobe_events"
    config = _config_says("CONFIG_KPROBES")
    if not events.exists() and (tracefs / "events").is_dir():
        said = f"; {config}" if config else ""
        return (
            f"this kernel has no kprobe support: {events} does not exist{said}; a kernel "
            "built with CONFIG_KPROBES=y (every mainstream distribution kernel) will run it"
        )
    if config and "not set" in config:
        return f"this kernel has no kprobe support: {config}"
    if not (tracefs / "events").is_dir():
        return f"tracefs is not mounted at {tracefs}: whether {events} exists is unknown"
    return f"{events} exists: kprobes are built in, the refusal is elsewhere"


def fentry_reason() -> str:
    """Why fentry/fexit may be refused to root: the lockdown mode, and whether the
    kernel has BPF trampolines (ftrace direct calls) at all."""
    parts = []
    mode = lockdown()
    if mode is None:
        parts.append("lockdown mode unknown (no securityfs/lockdown)")
    elif mode == "none":
        parts.append("the kernel is not locked down")
    else:
        parts.append(f"the kernel is locked down ({mode}, {SECURITYFS / 'lockdown'})")
    direct = _config_says("CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS")
    if direct and "not set" in direct:
        parts.append(f"no BPF trampolines: {direct}")
    elif direct:
        parts.append(
            f"BPF trampolines are built in ({direct}): a security policy (lockdown or an "
            "LSM) refuses them"
        )
    if os.geteuid() != 0:
        parts.append("not running as root")
    better = "a host without lockdown (lockdown=none, e.g. no Secure Boot enforcement)"
    return "; ".join(parts) + f"; {better} with BTF will run it"
