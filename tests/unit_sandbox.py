"""A systemd service's sandbox without systemd, for hosts where systemd is not PID 1
(containers, CI runners, this project's VMs): `python unit_sandbox.py UNIT -- ARGV...`
runs ARGV as the unit's [Service] section would, as far as its hardening goes, then
execs it. Every key of the section must be one this file knows (`KNOWN`): an option
added to a unit without being emulated here is an error, not an option silently left
out of the test.

What it does, in systemd's order (src/core/namespace.c of systemd 252, Debian 12's,
whose tables the lists below follow):

- a mount namespace (a slave of the host's) and, with ProtectHostname=, a UTS one;
- PrivateTmp= (empty /tmp and /var/tmp), PrivateDevices= (a /dev with null, zero,
  full, random, urandom, tty, pts, shm and nothing else), ProtectSystem=strict
  (every mount read-only but /proc, /sys, /dev and the home directories),
  ProtectHome=read-only, ProtectKernelTunables= (/sys, /proc/sys and the others
  read-only, /proc/kallsyms and /proc/kcore inaccessible), ProtectControlGroups=,
  ProtectKernelModules=, ProtectKernelLogs=, ReadOnlyPaths=, InaccessiblePaths= and
  StateDirectory= (created as systemd does, writable); "inaccessible" is an empty
  mode-000 file or directory mounted over the path, as systemd's /run/systemd/inaccessible;
- the resource limits (Limit*=; one the host's hard limit does not allow, without
  CAP_SYS_RESOURCE, is lowered to that limit, and said on stderr);
- NoNewPrivileges=, UMask=, then the seccomp filters of MemoryDenyWriteExecute=,
  RestrictAddressFamilies=, RestrictNamespaces=, LockPersonality=,
  SystemCallArchitectures=native, SystemCallFilter= (allow or deny lists, with
  SystemCallErrorNumber=EPERM; its @groups as this host's systemd-analyze lists them),
  RestrictSUIDSGID=, RestrictRealtime=, ProtectClock=, ProtectKernelModules=,
  ProtectKernelLogs=, ProtectHostname= and PrivateDevices=, through libseccomp
  (unit_seccomp.py builds them, after seccomp-util.c's tables);
- exec of setpriv with CapabilityBoundingSet= as the bounding set and no inheritable
  capabilities, which execs ARGV as root's uid: its capabilities are the bounding set.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import shlex
import shutil
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

from unit_seccomp import build_filters, syscall_filter

__all__ = ["KNOWN", "Unit", "parse_unit", "syscall_filter"]

# [Service] keys: emulated here, or about the process's life and output (the test
# runs and stops the process itself; Restart= is checked by the test, not emulated).
KNOWN = {
    "Type", "ExecStart", "Restart", "RestartSec", "StandardOutput", "StandardError",
    "Environment", "LimitMEMLOCK", "StateDirectory", "StateDirectoryMode",
    "CapabilityBoundingSet", "NoNewPrivileges", "ProtectSystem", "ProtectHome",
    "PrivateTmp", "PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules",
    "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock", "ProtectHostname",
    "ReadOnlyPaths", "InaccessiblePaths", "SystemCallFilter", "SystemCallErrorNumber",
    "RestrictAddressFamilies", "RestrictNamespaces", "LockPersonality",
    "MemoryDenyWriteExecute", "SystemCallArchitectures", "RestrictSUIDSGID",
    "RestrictRealtime", "UMask",
}  # fmt: skip


@dataclass
class Unit:
    """A unit file's sections: key -> every value it was given, in order."""

    sections: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def values(self, key: str, section: str = "Service") -> list[str]:
        return self.sections.get(section, {}).get(key, [])

    def value(self, key: str, section: str = "Service") -> str | None:
        """The last assignment, as systemd reads a single-valued key."""
        got = self.values(key, section)
        return got[-1] if got else None

    def flag(self, key: str) -> bool:
        return (self.value(key) or "no").lower() in ("yes", "true", "on", "1")

    def words(self, key: str) -> list[str]:
        """A list-valued key: every assignment's words (an empty one resets the list)."""
        out: list[str] = []
        for v in self.values(key):
            out = [] if not v.strip() else [*out, *v.split()]
        return out

    def exec_start(self) -> list[str]:
        (line,) = self.values("ExecStart")
        return shlex.split(line)


def parse_unit(text: str) -> Unit:
    """systemd's unit file syntax: [Section], Key=Value, # and ; comments, a trailing
    backslash continuing a line."""
    unit = Unit()
    section: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.sections.setdefault(line[1:-1], {})
            continue
        if section is None or "=" not in line:
            raise ValueError(f"not a unit file line: {raw!r}")
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


# ---- mounts --------------------------------------------------------------------------

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME = 32, 1024, 2048
MS_BIND, MS_MOVE, MS_REC = 4096, 8192, 16384
MS_SLAVE, MS_RELATIME, MS_STRICTATIME = 1 << 19, 1 << 21, 1 << 24
CLONE_NEWNS, CLONE_NEWUTS = 0x00020000, 0x04000000
KEEP = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = [None if s is None else s.encode() for s in (src, target, fstype)]
    _check(_libc.mount(*enc, flags, data.encode() or None), f"mount {target}")


def mounts() -> list[tuple[str, int]]:
    """(mount point, its per-mount flags to keep) of every mount, in mount order."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        keep = 0
        for opt in fields[5].split(","):
            keep |= KEEP.get(opt, 0)
        out.append((point, keep))
    return out


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def remount_one(point: str, keep: int, read_only: bool) -> None:
    flags = MS_REMOUNT | MS_BIND | keep | (MS_RDONLY if read_only else 0)
    try:
        mount(None, point, None, flags)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.EACCES):  # a mount hidden by another
            raise


def remount(top: str, read_only: bool) -> None:
    """Every mount at `top` or below it read-only (or writable again); `top` is made a
    mount of its own first when it is not one."""
    if top not in {p for p, _ in mounts()}:
        mount(top, top, None, MS_BIND | MS_REC)
    for point, keep in mounts():
        if under(point, top):
            remount_one(point, keep, read_only)


class Inaccessible:
    """Empty mode-000 nodes (a file, a directory) to mount over a path, made in the
    private /tmp and unlinked when done: the mounts keep them."""

    def __init__(self) -> None:
        self.dir = Path("/tmp/.inaccessible")
        self.dir.mkdir(mode=0)
        (self.dir / "reg").touch(mode=0)
        (self.dir / "dir").mkdir(mode=0)

    def over(self, path: str, optional: bool) -> None:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if optional:
                return
            raise
        node = self.dir / ("dir" if stat.S_ISDIR(mode) else "reg")
        mount(str(node), path, None, MS_BIND)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)

    def done(self) -> None:
        (self.dir / "reg").unlink()
        (self.dir / "dir").rmdir()
        self.dir.rmdir()


def private_dev() -> None:
    """systemd's PrivateDevices= /dev: the harmless nodes, a new devpts, the host's
    /dev/shm, the /proc/self/fd links; moved over /dev."""
    staging = "/tmp/.dev"
    os.mkdir(staging)
    mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NOEXEC | MS_STRICTATIME, "mode=0755")
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        Path(staging, name).touch()
        mount(f"/dev/{name}", f"{staging}/{name}", None, MS_BIND)
    os.mkdir(f"{staging}/pts")
    pts = "newinstance,ptmxmode=0666,mode=620"
    mount("devpts", f"{staging}/pts", "devpts", MS_NOSUID | MS_NOEXEC, pts)
    os.symlink("pts/ptmx", f"{staging}/ptmx")
    os.mkdir(f"{staging}/shm")
    mount("/dev/shm", f"{staging}/shm", None, MS_BIND | MS_REC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, f"{staging}/{name}")
    mount(staging, "/dev", None, MS_MOVE)
    os.rmdir(staging)


# ProtectKernelTunables= (namespace.c's protect_kernel_tunables_*_table)
TUNABLES_RO = ["/proc/acpi", "/proc/apm", "/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq",
               "/proc/latency_stats", "/proc/mtrr", "/proc/scsi", "/proc/sys",
               "/proc/sysrq-trigger", "/proc/timer_stats", "/sys"]  # fmt: skip
TUNABLES_GONE = ["/proc/kallsyms", "/proc/kcore"]
HOME = ["/home", "/run/user", "/root"]


def paths(unit: Unit, key: str) -> list[tuple[str, bool]]:
    """A path list key's (path, optional): a leading '-' ignores a missing path."""
    return [(p.lstrip("-"), p.startswith("-")) for p in unit.words(key)]


def set_up_mounts(unit: Unit) -> None:
    flags = CLONE_NEWNS | (CLONE_NEWUTS if unit.flag("ProtectHostname") else 0)
    _check(_libc.unshare(flags), "unshare")
    mount(None, "/", None, MS_REC | MS_SLAVE)
    if not unit.flag("PrivateTmp"):
        raise SystemExit("unit_sandbox: the emulation needs PrivateTmp=yes (its scratch space)")
    for tmp in ("/tmp", "/var/tmp"):
        mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV | MS_STRICTATIME, "mode=1777")
    if unit.flag("PrivateDevices"):
        private_dev()
    gone = Inaccessible()
    system = unit.value("ProtectSystem") or "no"
    if system != "strict":
        raise SystemExit(f"unit_sandbox: ProtectSystem={system} is not emulated (strict is)")
    writable = ["/proc", "/sys", "/dev", "/tmp", "/var/tmp", *HOME]
    for point, keep in mounts():
        if not any(under(point, top) for top in writable):
            remount_one(point, keep, read_only=True)
    home = unit.value("ProtectHome") or "no"
    if home not in ("read-only", "no"):
        raise SystemExit(f"unit_sandbox: ProtectHome={home} is not emulated")
    if home == "read-only":
        for p in HOME:
            if os.path.exists(p):
                remount(p, read_only=True)
    if unit.flag("ProtectKernelTunables"):
        for p in TUNABLES_RO:
            if os.path.exists(p):
                remount(p, read_only=True)
        for p in TUNABLES_GONE:
            gone.over(p, optional=True)
    if unit.flag("ProtectControlGroups"):
        remount("/sys/fs/cgroup", read_only=True)
    if unit.flag("ProtectKernelModules"):
        gone.over("/usr/lib/modules", optional=True)
    if unit.flag("ProtectKernelLogs"):
        gone.over("/proc/kmsg", optional=True)
        gone.over("/dev/kmsg", optional=True)
    for p, optional in paths(unit, "ReadOnlyPaths"):
        if os.path.exists(p):
            remount(p, read_only=True)
        elif not optional:
            raise SystemExit(f"unit_sandbox: ReadOnlyPaths={p}: no such path (226/NAMESPACE)")
    for p, optional in paths(unit, "InaccessiblePaths"):
        gone.over(p, optional)
    for d in state_dirs(unit):
        remount(str(d), read_only=False)
    gone.done()


def state_dirs(unit: Unit) -> list[Path]:
    return [Path("/var/lib", d) for d in unit.words("StateDirectory")]


def make_state_dirs(unit: Unit) -> list[Path]:
    """StateDirectory= as systemd makes them (on the host, before the namespace): the
    directories that did not exist, outermost first, for the caller to remove."""
    made: list[Path] = []
    mode = int(unit.value("StateDirectoryMode") or "0755", 8)
    for d in state_dirs(unit):
        for p in [*reversed(d.parents[: len(d.parents) - 3]), d]:  # below /var/lib
            if not p.exists():
                p.mkdir()
                made.append(p)
        d.chmod(mode)
    return made


# ---- resource limits -----------------------------------------------------------------


def set_limits(unit: Unit) -> None:
    value = unit.value("LimitMEMLOCK")
    if value is None:
        return
    want = resource.RLIM_INFINITY if value == "infinity" else int(value)
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (want, want))
    except (ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        print(
            f"unit_sandbox: LimitMEMLOCK={value} not allowed here (no CAP_SYS_RESOURCE); "
            f"the hard limit {hard} stays",
            file=sys.stderr,
        )
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))


# ---- the whole -------------------------------------------------------------------------

PR_SET_NO_NEW_PRIVS = 38


def caps(unit: Unit) -> list[str]:
    """CapabilityBoundingSet= as setpriv's names (cap_bpf -> bpf)."""
    return [c.lower().removeprefix("cap_") for c in unit.words("CapabilityBoundingSet")]


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: unit_sandbox.py UNIT -- ARGV...")
    unit_path, _, *command = argv
    unit = parse_unit(Path(unit_path).read_text())
    unknown = set(unit.sections.get("Service", {})) - KNOWN
    if unknown:
        raise SystemExit(f"unit_sandbox: not emulated: {', '.join(sorted(unknown))}")
    make_state_dirs(unit)
    set_up_mounts(unit)
    set_limits(unit)
    if unit.flag("NoNewPrivileges"):
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    setpriv = ["setpriv", "--inh-caps=-all"]
    if unit.values("CapabilityBoundingSet"):
        setpriv.append("--bounding-set=-all" + "".join(f",+{c}" for c in caps(unit)))
    exe = shutil.which("setpriv")
    if exe is None:
        raise SystemExit("unit_sandbox: setpriv is not installed (util-linux)")
    umask = unit.value("UMask")
    if umask is not None:
        os.umask(int(umask, 8))
    for f in build_filters(unit):
        f.load()
    os.execv(exe, [*setpriv, "--", *command])


if __name__ == "__main__":
    main(sys.argv[1:])
