"""The seccomp filters of unit_sandbox.py's sandbox: what MemoryDenyWriteExecute=,
RestrictAddressFamilies=, RestrictNamespaces=, LockPersonality=,
SystemCallArchitectures=, SystemCallFilter=, RestrictSUIDSGID=, RestrictRealtime=,
ProtectClock=, ProtectKernelModules=, ProtectKernelLogs=, ProtectHostname= and
PrivateDevices= refuse, as libseccomp filters for unit_sandbox.py to load just before
its exec. The tables below follow systemd 252's src/shared/seccomp-util.c (Debian 12's).
A module of its own so that unit_sandbox.py is the namespaces, mounts and limits: this
is the one part that speaks to libseccomp.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import subprocess
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unit_sandbox import Unit

__all__ = ["Filter", "build_filters", "syscall_filter"]

SCMP_ACT_ALLOW = 0x7FFF0000
CMP_NE, CMP_GE, CMP_EQ, CMP_GT, CMP_MASKED_EQ = 1, 5, 4, 6, 7
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000
AF_MAX = 46
FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16, "AF_PACKET": 17}
NS_FLAGS = [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000]
CLOCK = ["adjtimex", "clock_adjtime", "clock_adjtime64", "clock_settime", "clock_settime64",
         "settimeofday"]  # fmt: skip
RAW_IO = ["ioperm", "iopl", "pciconfig_iobase", "pciconfig_read", "pciconfig_write",
          "s390_pci_mmio_read", "s390_pci_mmio_write"]  # fmt: skip
MODULE = ["delete_module", "finit_module", "init_module"]
# RestrictSUIDSGID=: each call's mode argument (seccomp-util.c's seccomp_restrict_sxid)
SXID_MODE_ARG = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "mkdir": 1, "mkdirat": 2,
                 "mknod": 1, "mknodat": 2, "creat": 1}  # fmt: skip
# RestrictRealtime=: SCHED_OTHER, SCHED_BATCH and SCHED_IDLE stay; every other policy
# below SCHED_IDLE (FIFO, RR, ISO) and every one above it (DEADLINE) is refused
SCHED_IDLE, REALTIME = 5, [1, 2, 4]


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def act_errno(err: int) -> int:
    return 0x00050000 | (err & 0xFFFF)


class Filter:
    def __init__(self, default: int = SCMP_ACT_ALLOW) -> None:
        self.lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
        self.lib.seccomp_init.restype = ctypes.c_void_p
        self.lib.seccomp_init.argtypes = [ctypes.c_uint32]
        self.lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ArgCmp),
        ]  # fmt: skip
        self.lib.seccomp_load.argtypes = [ctypes.c_void_p]
        self.lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        self.ctx = self.lib.seccomp_init(default)  # native architecture only
        if not self.ctx:
            raise OSError("seccomp_init failed")

    def rule(self, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return  # no such system call on this architecture
        arr = (ArgCmp * len(cmps))(*(ArgCmp(*c) for c in cmps)) if cmps else None
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(cmps), arr)
        if rc != 0:
            raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")

    def deny(self, names: Iterable[str], err: int = errno.EPERM) -> None:
        for name in names:
            self.rule(act_errno(err), name)

    def load(self) -> None:
        rc = self.lib.seccomp_load(self.ctx)
        if rc != 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")


def syscall_group(name: str) -> set[str]:
    """A systemd system call group (@system-service) with the groups in it expanded,
    as this host's systemd defines it."""
    out = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    calls: set[str] = set()
    for line in out.splitlines()[1:]:  # the first is the group's own name
        word = line.strip()
        if word.startswith("@"):
            calls |= syscall_group(word)
        elif word and not word.startswith("#"):
            calls.add(word)
    return calls


def syscall_names(words: Iterable[str]) -> set[str]:
    return set().union(*(syscall_group(w) if w.startswith("@") else {w} for w in words))


def syscall_filter(unit: Unit) -> tuple[bool, set[str]] | None:
    """SystemCallFilter= as systemd reads it: (an allow list?, its calls). The first
    assignment decides which kind; an allow list starts with @default, as systemd's
    does; a later assignment of the other kind (~ or not) takes its calls out."""
    specs = unit.values("SystemCallFilter")
    if not specs:
        return None
    allow = not specs[0].startswith("~")
    calls = syscall_group("@default") if allow else set()
    for spec in specs:
        names = syscall_names(spec.removeprefix("~").split())
        calls = calls | names if spec.startswith("~") != allow else calls - names
    return allow, calls


def build_filters(unit: Unit) -> list[Filter]:
    """The seccomp filters: one of rules that refuse (the calls an option forbids),
    and SystemCallFilter='s allow list, whose default refuses, if there is one. The
    kernel runs every filter loaded: the most restrictive answer wins."""
    filters = []
    f = Filter()
    used = False
    eperm = act_errno(errno.EPERM)
    if unit.flag("MemoryDenyWriteExecute"):
        wx = PROT_EXEC | PROT_WRITE
        f.rule(eperm, "mmap", (2, CMP_MASKED_EQ, wx, wx))
        f.rule(eperm, "mprotect", (2, CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC))
        f.rule(eperm, "pkey_mprotect", (2, CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC))
        f.rule(eperm, "shmat", (2, CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC))
        used = True
    families = unit.words("RestrictAddressFamilies")
    if families:
        if families[0].startswith("~"):
            raise SystemExit("unit_sandbox: a RestrictAddressFamilies= deny list is not emulated")
        allowed = {FAMILIES[name] for name in families}
        refuse = act_errno(errno.EAFNOSUPPORT)
        for fam in range(AF_MAX):
            if fam not in allowed:
                f.rule(refuse, "socket", (0, CMP_EQ, fam, 0))
        f.rule(refuse, "socket", (0, CMP_GE, AF_MAX, 0))
        used = True
    namespaces = unit.value("RestrictNamespaces")
    if namespaces is not None:
        if namespaces != "yes":
            raise SystemExit(f"unit_sandbox: RestrictNamespaces={namespaces} is not emulated")
        f.deny(["setns"])
        for flag in NS_FLAGS:
            f.rule(eperm, "unshare", (0, CMP_MASKED_EQ, flag, flag))
            f.rule(eperm, "clone", (0, CMP_MASKED_EQ, flag, flag))  # x86-64, arm64: arg 0
        f.deny(["clone3"], errno.ENOSYS)  # flags in a struct: glibc falls back to clone
        used = True
    if unit.flag("LockPersonality"):
        f.rule(eperm, "personality", (0, CMP_NE, 0, 0))  # PER_LINUX only
        used = True
    arch = unit.value("SystemCallArchitectures")
    if arch not in (None, "native"):
        raise SystemExit(f"unit_sandbox: SystemCallArchitectures={arch} is not emulated")
    used = used or arch == "native"  # the filter's only architecture: others are killed
    chosen = syscall_filter(unit)
    if chosen is not None:
        if unit.value("SystemCallErrorNumber") != "EPERM":
            raise SystemExit("unit_sandbox: SystemCallFilter= needs SystemCallErrorNumber=EPERM")
        allow, calls = chosen
        if allow:
            only = Filter(eperm)
            for name in sorted(calls):
                only.rule(SCMP_ACT_ALLOW, name)
            filters.append(only)
        else:
            f.deny(calls)
            used = True
    if unit.flag("RestrictSUIDSGID"):
        for bit in (stat.S_ISUID, stat.S_ISGID):
            for name, arg in SXID_MODE_ARG.items():
                f.rule(eperm, name, (arg, CMP_MASKED_EQ, bit, bit))
            f.rule(eperm, "open", (1, CMP_MASKED_EQ, os.O_CREAT, os.O_CREAT),
                   (2, CMP_MASKED_EQ, bit, bit))  # fmt: skip
            f.rule(eperm, "openat", (2, CMP_MASKED_EQ, os.O_CREAT, os.O_CREAT),
                   (3, CMP_MASKED_EQ, bit, bit))  # fmt: skip
        f.deny(["openat2"], errno.ENOSYS)  # its mode is in a struct: glibc falls back
        used = True
    if unit.flag("RestrictRealtime"):
        for policy in REALTIME:
            f.rule(eperm, "sched_setscheduler", (1, CMP_EQ, policy, 0))
        f.rule(eperm, "sched_setscheduler", (1, CMP_GT, SCHED_IDLE, 0))
        used = True
    for key, names in (("ProtectClock", CLOCK), ("ProtectKernelModules", MODULE),
                       ("ProtectKernelLogs", ["syslog"]), ("PrivateDevices", RAW_IO),
                       ("ProtectHostname", ["sethostname", "setdomainname"])):  # fmt: skip
        if unit.flag(key):
            f.deny(names)
            used = True
    return [f, *filters] if used else filters
