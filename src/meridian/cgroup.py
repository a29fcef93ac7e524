"""cgroup v2 directories named on the command line (--cgroup), resolved to the id the
kernel's programs compare (bpf_get_current_cgroup_id(): the directory's inode number)
and its depth below the root (for "this cgroup or below it"). One resolver for every
tool."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import UsageError

__all__ = ["Cgroup", "cgroup2_mounts", "resolve"]


@dataclass(frozen=True)
class Cgroup:
    id: int
    depth: int  # components below the cgroup2 root: 0 is the root
    path: str  # the directory, under a cgroup2 mount


def cgroup2_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points of the cgroup v2 hierarchy (the unified one)."""
    out = []
    try:
        with open(mountinfo) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    out.append(left.split()[4].replace("\\040", " "))
    except OSError:
        pass
    return out


def resolve(path: str, mountinfo: str = "/proc/self/mountinfo") -> Cgroup:
    """The cgroup v2 directory `path` names: a directory under a cgroup2 mount, or a
    path as /proc/PID/cgroup shows it (relative to the root). A one-line error naming
    the mount otherwise."""
    mounts = cgroup2_mounts(mountinfo)
    if not mounts:
        raise UsageError(
            "--cgroup needs cgroup v2, and no cgroup2 file system is mounted "
            "(mount -t cgroup2 none /sys/fs/cgroup)"
        )
    for m in mounts:
        rel = os.path.relpath(os.path.realpath(path), m) if os.path.isabs(path) else path
        if rel == "." or not rel.startswith(".."):
            break
    else:
        rel = path
    for m in mounts:
        full = os.path.normpath(os.path.join(m, rel.lstrip("/")))
        if os.path.isfile(os.path.join(full, "cgroup.procs")):
            depth = 0 if full == os.path.normpath(m) else len(os.path.relpath(full, m).split("/"))
            return Cgroup(os.stat(full).st_ino, depth, full)
    raise UsageError(
        f"--cgroup: {path!r} is not a cgroup v2 directory (cgroup2 is mounted at {mounts[0]})"
    )
