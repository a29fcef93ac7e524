"""Argument kinds of the file-system syscalls: which argument is a path (read from
user memory by the kernel program), an fd (resolved to a path in the kernel), flags,
a mode, an output the call fills in (read by the kernel at exit). The kernel program
learns the string, fd and output positions from this table."""

from __future__ import annotations

from functools import lru_cache

__all__ = [
    "EXTRA_SIGNATURES",
    "FD_KINDS",
    "OUT_KINDS",
    "SIGNATURES",
    "STRING_KINDS",
    "Kind",
    "fd_position",
    "out_position",
    "signature",
    "string_positions",
]

Kind = str
# path: a user path string; str: another user string (xattr name, memfd name);
# fd / dirfd (AT_FDCWD or an fd); oflags (O_*); mode (octal); atflags (AT_*);
# amode (F_OK, R_OK|W_OK); whence (SEEK_*); renflags (RENAME_*); prot (PROT_*);
# mflags (MAP_*); pflags (pipe2's O_*); family (AF_*); socktype (SOCK_*);
# int, uint, size, off: numbers; ptr: an address (0x..., NULL);
# outputs, read at a successful exit (else shown as an address): fds (int[2]),
# statbuf (struct stat), statxbuf (struct statx).
STRING_KINDS = frozenset({"path", "str"})
FD_KINDS = frozenset({"fd", "dirfd"})
# Output kinds and their enum syscalls_out value (bpf/syscalls.h).
OUT_KINDS: dict[Kind, int] = {"fds": 1, "statbuf": 2, "statxbuf": 3}

SIGNATURES: dict[str, tuple[Kind, ...]] = {
    "open": ("path", "oflags", "mode"),
    "openat": ("dirfd", "path", "oflags", "mode"),
    "openat2": ("dirfd", "path", "ptr", "size"),
    "creat": ("path", "mode"),
    "close": ("fd",),
    "close_range": ("uint", "uint", "uint"),
    "read": ("fd", "ptr", "size"),
    "write": ("fd", "ptr", "size"),
    "pread64": ("fd", "ptr", "size", "off"),
    "pwrite64": ("fd", "ptr", "size", "off"),
    "readv": ("fd", "ptr", "int"),
    "writev": ("fd", "ptr", "int"),
    "preadv": ("fd", "ptr", "int", "off"),
    "pwritev": ("fd", "ptr", "int", "off"),
    "preadv2": ("fd", "ptr", "int", "off", "off", "hex"),
    "pwritev2": ("fd", "ptr", "int", "off", "off", "hex"),
    "lseek": ("fd", "off", "whence"),
    "stat": ("path", "statbuf"),
    "lstat": ("path", "statbuf"),
    "fstat": ("fd", "statbuf"),
    "newfstatat": ("dirfd", "path", "statbuf", "atflags"),
    "statx": ("dirfd", "path", "atflags", "hex", "statxbuf"),
    "statfs": ("path", "ptr"),
    "fstatfs": ("fd", "ptr"),
    "access": ("path", "amode"),
    "faccessat": ("dirfd", "path", "amode"),
    "faccessat2": ("dirfd", "path", "amode", "atflags"),
    "readlink": ("path", "ptr", "size"),
    "readlinkat": ("dirfd", "path", "ptr", "size"),
    "mkdir": ("path", "mode"),
    "mkdirat": ("dirfd", "path", "mode"),
    "mknod": ("path", "mode", "uint"),
    "mknodat": ("dirfd", "path", "mode", "uint"),
    "rmdir": ("path",),
    "unlink": ("path",),
    "unlinkat": ("dirfd", "path", "atflags"),
    "rename": ("path", "path"),
    "renameat": ("dirfd", "path", "dirfd", "path"),
    "renameat2": ("dirfd", "path", "dirfd", "path", "renflags"),
    "link": ("path", "path"),
    "linkat": ("dirfd", "path", "dirfd", "path", "atflags"),
    "symlink": ("path", "path"),
    "symlinkat": ("path", "dirfd", "path"),
    "chmod": ("path", "mode"),
    "fchmod": ("fd", "mode"),
    "fchmodat": ("dirfd", "path", "mode"),
    "fchmodat2": ("dirfd", "path", "mode", "atflags"),
    "chown": ("path", "int", "int"),
    "fchown": ("fd", "int", "int"),
    "lchown": ("path", "int", "int"),
    "fchownat": ("dirfd", "path", "int", "int", "atflags"),
    "utimensat": ("dirfd", "path", "ptr", "atflags"),
    "truncate": ("path", "off"),
    "ftruncate": ("fd", "off"),
    "fallocate": ("fd", "int", "off", "off"),
    "chdir": ("path",),
    "fchdir": ("fd",),
    "getcwd": ("ptr", "size"),
    "getdents64": ("fd", "ptr", "size"),
    "getdents": ("fd", "ptr", "size"),
    "fsync": ("fd",),
    "fdatasync": ("fd",),
    "sync_file_range": ("fd", "off", "off", "uint"),
    "flock": ("fd", "int"),
    "dup": ("fd",),
    "dup2": ("fd", "int"),
    "dup3": ("fd", "int", "oflags"),
    "fcntl": ("fd", "int", "hex"),
    "sendfile": ("fd", "fd", "ptr", "size"),
    "copy_file_range": ("fd", "ptr", "fd", "ptr", "size", "uint"),
    "mmap": ("ptr", "size", "prot", "mflags", "fd", "off"),
    "execve": ("path", "ptr", "ptr"),
    "execveat": ("dirfd", "path", "ptr", "ptr", "atflags"),
    "exit": ("int",),
    "exit_group": ("int",),
    "umask": ("mode",),
    "getxattr": ("path", "str", "ptr", "size"),
    "lgetxattr": ("path", "str", "ptr", "size"),
    "fgetxattr": ("fd", "str", "ptr", "size"),
    "setxattr": ("path", "str", "ptr", "size", "int"),
    "lsetxattr": ("path", "str", "ptr", "size", "int"),
    "fsetxattr": ("fd", "str", "ptr", "size", "int"),
    "listxattr": ("path", "ptr", "size"),
    "llistxattr": ("path", "ptr", "size"),
    "flistxattr": ("fd", "ptr", "size"),
    "removexattr": ("path", "str"),
    "lremovexattr": ("path", "str"),
    "fremovexattr": ("fd", "str"),
    "inotify_add_watch": ("fd", "path", "hex"),
    "memfd_create": ("str", "uint"),
}

# Calls outside the default (file-system) set that make fds, decoded when traced
# (-e or --all): their fd arrays read at exit.
EXTRA_SIGNATURES: dict[str, tuple[Kind, ...]] = {
    "pipe": ("fds",),
    "pipe2": ("fds", "pflags"),
    "socketpair": ("family", "socktype", "int", "fds"),
}

_GENERIC: tuple[Kind, ...] = ("hex",) * 6


def signature(name: str) -> tuple[Kind, ...]:
    """Argument kinds; a syscall outside both tables (--all) shows 6 hex words."""
    return SIGNATURES.get(name) or EXTRA_SIGNATURES.get(name, _GENERIC)


@lru_cache(maxsize=1024)
def string_positions(name: str) -> tuple[int, ...]:
    """Positions of user strings the kernel reads (at most 2)."""
    return tuple(i for i, k in enumerate(signature(name)) if k in STRING_KINDS)[:2]


@lru_cache(maxsize=1024)
def fd_position(name: str) -> int:
    """Position of the fd the kernel resolves to a path (the first fd/dirfd), or -1."""
    for i, k in enumerate(signature(name)):
        if k in FD_KINDS:
            return i
    return -1


@lru_cache(maxsize=1024)
def out_position(name: str) -> tuple[int, int]:
    """Position of the output the kernel reads at exit and its enum syscalls_out
    value, or (-1, 0)."""
    for i, k in enumerate(signature(name)):
        if k in OUT_KINDS:
            return i, OUT_KINDS[k]
    return -1, 0
