"""Raw syscall arguments and results to the text users know from strace: open flags
as O_RDONLY|O_CLOEXEC, modes in octal, AT_FDCWD, fds with their path (3</etc/passwd>),
quoted path strings, and errors as -2 ENOENT. Pure functions of integers and strings."""

from __future__ import annotations

import errno as _errno
from collections.abc import Mapping, Sequence

from .out_params import output_text
from .signatures import OUT_KINDS, signature

__all__ = [
    "AT_FDCWD",
    "decode_args",
    "decode_result",
    "errno_name",
    "flags_text",
    "open_flags",
    "quote",
]

AT_FDCWD = -100
O_ACCMODE = 0o3
_O_CREAT = 0o100
_O_TMPFILE = 0o20200000
_O_SYNC = 0o4010000

_OPEN_BITS: tuple[tuple[int, str], ...] = (
    (0o100, "O_CREAT"),
    (0o200, "O_EXCL"),
    (0o400, "O_NOCTTY"),
    (0o1000, "O_TRUNC"),
    (0o2000, "O_APPEND"),
    (0o4000, "O_NONBLOCK"),
    (_O_SYNC, "O_SYNC"),  # __O_SYNC|O_DSYNC, before O_DSYNC alone
    (0o10000, "O_DSYNC"),
    (0o20000, "O_ASYNC"),
    (0o40000, "O_DIRECT"),
    (0o100000, "O_LARGEFILE"),
    (_O_TMPFILE, "O_TMPFILE"),  # __O_TMPFILE|O_DIRECTORY, before O_DIRECTORY alone
    (0o200000, "O_DIRECTORY"),
    (0o400000, "O_NOFOLLOW"),
    (0o1000000, "O_NOATIME"),
    (0o2000000, "O_CLOEXEC"),
    (0o10000000, "O_PATH"),
)
_AT_BITS = (
    (0x100, "AT_SYMLINK_NOFOLLOW"),
    (0x200, "AT_REMOVEDIR"),
    (0x400, "AT_SYMLINK_FOLLOW"),
    (0x800, "AT_NO_AUTOMOUNT"),
    (0x1000, "AT_EMPTY_PATH"),
    (0x2000, "AT_STATX_FORCE_SYNC"),
    (0x4000, "AT_STATX_DONT_SYNC"),
    (0x8000, "AT_RECURSIVE"),
)
_AMODE_BITS = ((4, "R_OK"), (2, "W_OK"), (1, "X_OK"))
_RENAME_BITS = ((1, "RENAME_NOREPLACE"), (2, "RENAME_EXCHANGE"), (4, "RENAME_WHITEOUT"))
_PROT_BITS = ((1, "PROT_READ"), (2, "PROT_WRITE"), (4, "PROT_EXEC"))
_MAP_TYPES = {1: "MAP_SHARED", 2: "MAP_PRIVATE", 3: "MAP_SHARED_VALIDATE"}
_MAP_BITS = (
    (0x10, "MAP_FIXED"),
    (0x20, "MAP_ANONYMOUS"),
    (0x100, "MAP_GROWSDOWN"),
    (0x800, "MAP_DENYWRITE"),
    (0x1000, "MAP_EXECUTABLE"),
    (0x2000, "MAP_LOCKED"),
    (0x4000, "MAP_NORESERVE"),
    (0x8000, "MAP_POPULATE"),
    (0x10000, "MAP_NONBLOCK"),
    (0x20000, "MAP_STACK"),
    (0x40000, "MAP_HUGETLB"),
    (0x100000, "MAP_FIXED_NOREPLACE"),
)
_FAMILIES = {1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK", 17: "AF_PACKET"}
_SOCK_TYPES = {1: "SOCK_STREAM", 2: "SOCK_DGRAM", 3: "SOCK_RAW", 5: "SOCK_SEQPACKET"}
_SOCK_BITS = ((0o4000, "SOCK_NONBLOCK"), (0o2000000, "SOCK_CLOEXEC"))
_WHENCE = {0: "SEEK_SET", 1: "SEEK_CUR", 2: "SEEK_END", 3: "SEEK_DATA", 4: "SEEK_HOLE"}


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _s64(v: int) -> int:
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= 1 << 63 else v


def flags_text(value: int, bits: Sequence[tuple[int, str]], zero: str = "0") -> str:
    """`A|B|0x40` for the known bits of `value` and what remains, `zero` for 0."""
    parts = []
    rest = value
    for bit, name in bits:
        if rest & bit == bit:
            parts.append(name)
            rest &= ~bit
    if rest:
        parts.append(hex(rest))
    return "|".join(parts) if parts else zero


def open_flags(value: int) -> str:
    value &= 0xFFFFFFFF
    acc = {0: "O_RDONLY", 1: "O_WRONLY", 2: "O_RDWR"}.get(value & O_ACCMODE, "O_ACCMODE")
    rest = flags_text(value & ~O_ACCMODE, _OPEN_BITS, zero="")
    return f"{acc}|{rest}" if rest else acc


def quote(s: str) -> str:
    """A C string literal, as strace prints paths."""
    if s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape")))
    out.append('"')
    return "".join(out)


def _ptr(v: int) -> str:
    return "NULL" if v == 0 else hex(v & 0xFFFFFFFFFFFFFFFF)


def _fd(v: int, path: str) -> str:
    fd = _s32(v)
    return f"{fd}<{path}>" if path and fd >= 0 else str(fd)


def _one(kind: str, v: int, string: str | None, fd_path: str) -> str:
    if kind in ("path", "str"):
        return quote(string) if string is not None else _ptr(v)
    if kind == "fd":
        return _fd(v, fd_path)
    if kind == "dirfd":
        return "AT_FDCWD" if _s32(v) == AT_FDCWD else _fd(v, fd_path)
    if kind == "oflags":
        return open_flags(v)
    if kind == "pflags":  # pipe2: O_* bits without an access mode
        return flags_text(v & 0xFFFFFFFF, _OPEN_BITS)
    if kind == "family":
        return _FAMILIES.get(v & 0xFFFFFFFF, str(_s32(v)))
    if kind == "socktype":
        v &= 0xFFFFFFFF
        rest = flags_text(v & ~0xF, _SOCK_BITS, zero="")
        base = _SOCK_TYPES.get(v & 0xF, str(v & 0xF))
        return f"{base}|{rest}" if rest else base
    if kind == "mode":
        return f"0{v & 0o7777:03o}"
    if kind == "atflags":
        return flags_text(v & 0xFFFFFFFF, _AT_BITS)
    if kind == "amode":
        return flags_text(v & 7, _AMODE_BITS, zero="F_OK")
    if kind == "whence":
        return _WHENCE.get(v & 0xFFFFFFFF, str(_s32(v)))
    if kind == "renflags":
        return flags_text(v & 0xFFFFFFFF, _RENAME_BITS)
    if kind == "prot":
        return flags_text(v & 0xFFFFFFFF, _PROT_BITS, zero="PROT_NONE")
    if kind == "mflags":
        v &= 0xFFFFFFFF
        kind_name = _MAP_TYPES.get(v & 0xF, hex(v & 0xF))
        rest = flags_text(v & ~0xF, _MAP_BITS, zero="")
        return f"{kind_name}|{rest}" if rest else kind_name
    if kind == "int":
        return str(_s32(v))
    if kind == "uint":
        return str(v & 0xFFFFFFFF)
    if kind == "size":
        return str(v & 0xFFFFFFFFFFFFFFFF)
    if kind == "off":
        return str(_s64(v))
    if kind == "ptr" or kind in OUT_KINDS:
        return _ptr(v)
    return hex(v & 0xFFFFFFFFFFFFFFFF)  # hex and unknown kinds


def decode_args(
    name: str,
    raw: Sequence[int],
    strings: Mapping[int, str | None],
    fd_path: str = "",
    output: bytes = b"",
) -> tuple[str, ...]:
    """Decoded arguments of `name`. `strings` maps argument positions to the user
    string the kernel read (None: it could not be read); `fd_path` is the path of the
    fd argument; `output` the bytes of the output argument read at exit (an end's;
    b"": shown as its address). The mode of open/openat is shown only when O_CREAT or
    O_TMPFILE is set, as strace does."""
    kinds = signature(name)
    out = [
        _one(kind, raw[i] if i < len(raw) else 0, strings.get(i), fd_path)
        for i, kind in enumerate(kinds)
    ]
    if output:
        for i, kind in enumerate(kinds):
            text = output_text(kind, output) if kind in OUT_KINDS else None
            if text is not None:
                out[i] = text
    if name in ("open", "openat") and len(raw) > kinds.index("oflags"):
        flags = raw[kinds.index("oflags")]
        if not (flags & _O_CREAT or flags & _O_TMPFILE == _O_TMPFILE):
            out.pop()
    return tuple(out)


def errno_name(err: int) -> str:
    return _errno.errorcode.get(err, f"E{err}")


def decode_result(name: str, ret: int) -> str:
    """`3`, `-2 ENOENT`, or an address for mmap."""
    ret = _s64(ret)
    if -4095 <= ret < 0:
        return f"{ret} {errno_name(-ret)}"
    if name == "mmap":
        return hex(ret & 0xFFFFFFFFFFFFFFFF)
    return str(ret)
