"""Every error Meridian raises on purpose, in one tree.

MeridianError                 one line a person can act on; `exit_code` for the CLI
├── UsageError                bad input on the command line (exit 2)
├── EnvironmentProblem        the host cannot run the tool as it is (exit 2)
│   ├── PermissionProblem     not root / missing CAP_BPF + CAP_PERFMON
│   ├── NoBTF                 no /sys/kernel/btf/vmlinux
│   ├── TracefsMissing        tracefs absent and cannot be mounted
│   ├── ObjectMissing         the compiled BPF object is not built
│   ├── LibbpfMissing         no libbpf.so.1 on the system
│   ├── ExtraMissing          an optional Python extra is not installed
│   └── NoLBR                 branch records asked for, and the CPU records none
├── NotSupported              a kernel feature is absent; tools catch it and fall back
└── BpfError                  a libbpf call failed: call, errno, detail
    ├── VerifierError         the verifier rejected a program (log tail attached)
    └── MapFull               a map update failed for lack of room
"""

from __future__ import annotations

import errno as _errno
import os
from collections.abc import Sequence

__all__ = [
    "BpfError",
    "EnvironmentProblem",
    "ExtraMissing",
    "LibbpfMissing",
    "MapFull",
    "MeridianError",
    "NoBTF",
    "NoLBR",
    "NotSupported",
    "ObjectMissing",
    "PermissionProblem",
    "TracefsMissing",
    "UsageError",
    "VerifierError",
]


class MeridianError(Exception):
    """Base: the message is one line that says what to do."""

    exit_code = 1


class UsageError(MeridianError):
    exit_code = 2


class EnvironmentProblem(MeridianError):
    exit_code = 2


class PermissionProblem(EnvironmentProblem):
    def __init__(self, what: str = "loading BPF programs") -> None:
        super().__init__(f"{what} needs root or CAP_BPF+CAP_PERFMON: run with sudo")


class NoBTF(EnvironmentProblem):
    def __init__(self, path: str = "/sys/kernel/btf/vmlinux") -> None:
        super().__init__(
            f"kernel has no BTF at {path}: use a kernel built with CONFIG_DEBUG_INFO_BTF=y"
        )


class TracefsMissing(EnvironmentProblem):
    """tracefs is neither mounted nor mountable here (a container without the host's):
    `detail` says why the mount failed, `strategies` which need it (their tracepoint/
    programs or legacy kprobes), `others` why the rest were refused."""

    FIX = "mount -t tracefs tracefs /sys/kernel/tracing, or mount the host's into the container"

    def __init__(self, detail: str = "", strategies: Sequence[str] = (), others: str = "") -> None:
        self.detail = detail
        extra = f" ({detail})" if detail else ""
        if strategies:
            who = "strategy" if len(strategies) == 1 else "strategies"
            verb = "needs" if len(strategies) == 1 else "need"
            what = (
                f"{who} {', '.join(strategies)} {verb} tracefs at /sys/kernel/tracing, "
                "which is not mounted and could not be"
            )
        else:
            what = "tracefs is not mounted at /sys/kernel/tracing and could not be"
        tail = f" (the others are refused: {others})" if others else ""
        super().__init__(f"{what}{extra}: {self.FIX}{tail}")


class ObjectMissing(EnvironmentProblem):
    def __init__(self, path: str) -> None:
        super().__init__(f"BPF object {path} is not built: run make bpf (or make run)")


class LibbpfMissing(EnvironmentProblem):
    def __init__(self) -> None:
        super().__init__("libbpf.so.1 (>= 1.0) not found: apt-get install libbpf1")


class ExtraMissing(EnvironmentProblem):
    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs an optional part: pip install 'meridian-ebpf[{extra}]'")


class NoLBR(EnvironmentProblem):
    """Branch records (LBR) asked for where the PMU records none: the message says
    why (the probe's errno) and what to do."""


class NotSupported(MeridianError):
    """A kernel feature this host lacks; `reason` says why, `fix` what would help."""

    exit_code = 2

    def __init__(self, feature: str, reason: str, fix: str = "") -> None:
        self.feature = feature
        self.reason = reason
        self.fix = fix
        tail = f"; {fix}" if fix else ""
        super().__init__(f"{feature} is not supported here: {reason}{tail}")


class BpfError(MeridianError):
    """A libbpf or bpf(2) call failed."""

    def __init__(self, call: str, err: int, detail: str = "") -> None:
        self.call = call
        self.errno = err
        self.detail = detail
        name = _errno.errorcode.get(err, str(err))
        msg = f"{call} failed: {name} ({os.strerror(err)})"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        if err in (_errno.EPERM, _errno.EACCES) and os.geteuid() != 0:
            self.args = (f"{msg}: needs root or CAP_BPF+CAP_PERFMON, run with sudo",)
            self.exit_code = 2


class VerifierError(BpfError):
    def __init__(self, program: str, err: int, log_tail: list[str]) -> None:
        self.program = program
        self.log_tail = log_tail
        tail = " | ".join(line.strip() for line in log_tail[-3:] if line.strip())
        super().__init__(f"loading program {program}", err, f"verifier said: {tail}")


class MapFull(BpfError):
    def __init__(self, map_name: str) -> None:
        super().__init__(f"update of map {map_name}", _errno.E2BIG, "map is full")
